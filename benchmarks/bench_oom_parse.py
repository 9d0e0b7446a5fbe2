"""The OOM parser on 10 MB messages (issue 16: at most 5 ms each).

Every exception a cell raises goes through ``find_cuda_oom`` and, when it may be an OOM,
``parse_oom_message``. A message of any length must cost a bounded time: the parser reads
only the head and tail of a long text, with patterns that take linear time.

    python benchmarks/bench_oom_parse.py
"""

from __future__ import annotations

import functools
import sys

sys.path.insert(0, ".")

from benchmarks.common import emit, time_calls

BUDGET_MS = 5.0
SIZE = 10_000_000

NATIVE = (
    "CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total capacity of 139.80 GiB "
    "of which 134.29 GiB is free. Including non-PyTorch memory, this process has 5.51 GiB "
    "memory in use. Of the allocated memory 5.00 GiB is allocated by PyTorch, and 0 bytes is "
    "reserved by PyTorch but unallocated.")


def messages() -> dict[str, str]:
    head = "CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 1 B"
    return {
        "classic_whitespace_run": head + " " * SIZE + "\nb\nc)",
        "digit_run": "CUDA out of memory. Tried to allocate " + "1" * SIZE,
        "repeated_pytorch_limit": "Allocation on device 0 would exceed allowed memory."
                                  + "PyTorch limit " * (SIZE // 14),
        "repeated_gpu_heads": "CUDA out of memory. Tried to allocate 1 B (GPU 1;" * (SIZE // 50),
        "native_then_tail": NATIVE + "\n" + "x" * SIZE,
        "tail_then_native": "x" * SIZE + "\n" + NATIVE,
        "plain_error": "ValueError text " * (SIZE // 16),
    }


def main() -> None:
    from gpumem_nb.oom import find_cuda_oom, parse_oom_message

    results: dict[str, object] = {"message_chars": SIZE, "budget_ms": BUDGET_MS}
    worst = 0.0
    for name, text in messages().items():
        exc = RuntimeError(text)
        parse = time_calls(functools.partial(parse_oom_message, text), n=30, warmup=3)
        find = time_calls(functools.partial(find_cuda_oom, exc), n=30, warmup=3)
        results[name] = {"parse_median_ms": round(parse["median_us"] / 1e3, 3),
                         "parse_p99_ms": round(parse["p99_us"] / 1e3, 3),
                         "find_cuda_oom_median_ms": round(find["median_us"] / 1e3, 3)}
        worst = max(worst, parse["median_us"] / 1e3, find["median_us"] / 1e3)
    results["worst_median_ms"] = round(worst, 3)
    results["within_budget"] = worst <= BUDGET_MS
    emit("bench_oom_parse", results)
    if worst > BUDGET_MS:
        sys.exit(f"over budget: {worst:.3f} ms > {BUDGET_MS} ms")


if __name__ == "__main__":
    main()
