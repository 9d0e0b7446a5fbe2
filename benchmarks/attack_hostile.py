"""Attack the newer features afresh and count what breaks (issue 16's closing check).

Runs IPython's real shell with the project's fake GPU (tests/fakes.py), the sampler live:

- hostile messages: exceptions built from fragments of real OOM texts (repeated, truncated,
  whitespace and digit runs, huge figures), of several types, some whose ``__str__`` raises;
- hostile files for ``%%gpumem --trace --save``: a symbolic link, a FIFO with no reader, a
  directory, /dev/null, a missing directory, a NUL, an empty name, an over-long name;
- a Run All of cells (idle, allocating, freeing, raising) with ``%reload_ext`` and
  ``%unload_ext``/``%load_ext`` dropped in at random;
- two kernels (processes) saving their own settings into one file while a third reads it.

Prints one JSON object of counts; any count under "broken" above zero is a failure (exit 1).

    python benchmarks/attack_hostile.py [--cells 3000] [--messages 1500] [--seed 16]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes import (  # noqa: E402
    FakeCuda,
    FakeCudaDevice,
    FakeGpu,
    FakePynvml,
    OutOfMemoryError,
    fake_torch,
)

GiB, MiB = 1 << 30, 1 << 20
REAL = [
    "CUDA out of memory. Tried to allocate 1.22 GiB (GPU 0; 10.92 GiB total capacity; "
    "8.86 GiB already allocated; 1.05 GiB free; 482.53 MiB cached)",
    "CUDA out of memory. Tried to allocate 400.00 GiB. GPU 0 has a total capacity of 139.80 GiB "
    "of which 134.29 GiB is free. Including non-PyTorch memory, this process has 5.51 GiB "
    "memory in use. Of the allocated memory 5.00 GiB is allocated by PyTorch, and 0 bytes is "
    "reserved by PyTorch but unallocated.",
    "Allocation on device 0 would exceed allowed memory. (out of memory)\nCurrently allocated"
    "     : 5.00 GiB\nRequested               : 400.00 GiB\nDevice limit            : "
    "139.80 GiB\nFree (according to CUDA): 133.22 GiB\nPyTorch limit (set by user-supplied "
    "memory fraction)\n                        : 17179869184.00 GiB",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
]
RUNS = [" ", "\n", "\t", "9", "1.", "(", ")", ";", ":", "(GPU 0;", "PyTorch limit",
        "Tried to allocate 1 B", " GiB"]


class BrokenStr(RuntimeError):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


def hostile_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.5:
            t = rng.choice(REAL)
            a, b = sorted(rng.randint(0, len(t)) for _ in range(2))
            parts.append((t[a:b] or t) * rng.choice((1, 1, 2, 50)))
        else:
            parts.append(rng.choice(RUNS) * rng.choice((1, 10, 300, 1200, 20_000)))
    if rng.random() < 0.05:
        parts.append(" " * 10_000_000)
    if rng.random() < 0.1:
        parts.insert(0, REAL[1].replace("400.00", "9" * rng.choice((400, 5000))))
    return "".join(parts)


def make_shell() -> tuple[Any, FakeCuda]:
    from gpumem_nb.kernel import monitor as monitor_mod
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource

    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", bus_id="00000000:3B:00.0")]
    nvml = FakePynvml(gpus)
    cuda = FakeCuda([FakeCudaDevice("a"), FakeCudaDevice("b")], initialized=True)
    cuda.link(gpus)
    sys.modules["torch"] = fake_torch(cuda)
    monitor_mod.make_source = lambda: LiveSource(nvml=NvmlSource(module=nvml))  # type: ignore
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_cell("%load_ext gpumem_nb")
    shell.run_cell("%gpumem config --interval 0.05")
    shell.user_ns.update(cuda=cuda, GiB=GiB, MiB=MiB, BrokenStr=BrokenStr,
                         OutOfMemoryError=OutOfMemoryError)
    return shell, cuda


HOOK_S: dict[str, float] = {"max_post_run_cell_s": 0.0, "max_pre_run_cell_s": 0.0}


def time_hooks() -> None:
    """Time the extension's own cell hooks (IPython's traceback printing is not ours)."""
    from gpumem_nb.kernel import Monitor

    for name in ("pre_run_cell", "post_run_cell"):
        real = getattr(Monitor, name)

        @functools.wraps(real)
        def timed(self: Any, arg: Any, _real: Any = real, _key: str = f"max_{name}_s") -> None:
            t0 = time.perf_counter()
            try:
                _real(self, arg)
            finally:
                HOOK_S[_key] = max(HOOK_S[_key], round(time.perf_counter() - t0, 4))

        setattr(Monitor, name, timed)


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def current_monitor(shell: Any) -> Any:
    from gpumem_nb.magics import current_monitor as current

    return current(shell)


def attack_messages(shell: Any, n: int, rng: random.Random) -> dict[str, Any]:
    counts = {"cells": 0, "slow_hooks_over_50ms": 0, "max_cell_s": 0.0,
              "user_errors_explained": 0, "typed_ooms_explained": 0, "typed_ooms": 0,
              "cells_not_recorded": 0, "gpumem_tracebacks": 0}
    for i in range(n):
        text = hostile_text(rng)
        kind = rng.choice(["ValueError", "RuntimeError", "OutOfMemoryError", "BrokenStr"])
        shell.user_ns["msg"] = text
        m = current_monitor(shell)
        m.oom.last = None
        before = len(m.history)
        body = f"raise {kind}(msg)" if kind != "BrokenStr" else "raise BrokenStr()"
        magic = rng.random() < 0.2
        HOOK_S["max_post_run_cell_s"] = 0.0
        t0 = time.perf_counter()
        result = shell.run_cell(("%%gpumem -q\n" if magic else "") + body,
                                store_history=not magic, cell_id=f"msg-{i}")
        dt = time.perf_counter() - t0
        counts["cells"] += 1
        counts["max_cell_s"] = max(counts["max_cell_s"], round(dt, 3))
        counts["slow_hooks_over_50ms"] += HOOK_S["max_post_run_cell_s"] > 0.05
        err = result.error_in_exec
        if magic and err is not None:
            counts["gpumem_tracebacks"] += 1  # %%gpumem itself raised
        explained = m.oom.last is not None
        if kind == "ValueError" and explained:
            counts["user_errors_explained"] += 1
        if kind == "OutOfMemoryError":
            counts["typed_ooms"] += 1
            counts["typed_ooms_explained"] += explained
        if not magic:
            m.flush()
            counts["cells_not_recorded"] += len(m.history) == before
    return counts


def attack_files(shell: Any, tmp: Path) -> dict[str, Any]:
    from IPython.core.error import UsageError

    victim = tmp / "victim.txt"
    victim.write_text("precious")
    (tmp / "link.pickle").symlink_to(victim)
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    names = {"symlink": str(tmp / "link.pickle"), "fifo": str(tmp / "fifo"),
             "directory": str(tmp / "dir"), "device": "/dev/null",
             "missing_directory": str(tmp / "no" / "x.pickle"), "nul": "'a\0b'",
             "empty": "''", "too_long": "x" * 5000, "valid": str(tmp / "ok.pickle")}
    counts: dict[str, Any] = {"usage_errors": 0, "saved": 0, "hangs": 0, "other_errors": 0,
                              "victim_changed": 0, "temp_files_left": 0}
    for label, name in names.items():
        done = threading.Event()
        outcome: list[str] = []

        def attempt(name: str = name, outcome: list[str] = outcome,
                    done: threading.Event = done) -> None:
            try:
                shell.run_cell_magic("gpumem", f"-q --trace --save {name}",
                                     "x = cuda.tensor(MiB)")
                outcome.append("ran")
            except UsageError:
                outcome.append("usage")
            except BaseException as e:
                outcome.append(f"error {type(e).__name__}")
            done.set()

        threading.Thread(target=attempt, daemon=True).start()
        if not done.wait(10):
            counts["hangs"] += 1
            continue
        counts["usage_errors"] += outcome == ["usage"]
        counts["other_errors"] += outcome[0].startswith("error")
        if label == "valid" and (tmp / "ok.pickle").read_bytes()[:2] == b"\x80\x04":
            counts["saved"] += 1
    counts["victim_changed"] = int(victim.read_bytes() != b"precious")
    counts["temp_files_left"] = sum(p.name.endswith(".tmp") for p in tmp.iterdir())
    counts["recording_left_on"] = int(shell.user_ns["cuda"].history is not None)
    return counts


def attack_run_all(shell: Any, n: int, rng: random.Random) -> dict[str, Any]:
    cells = ["pass", "x = 1", "t = cuda.tensor(64 * MiB)", "t = None",
             "raise ValueError('plain')", "keep = [cuda.tensor(32 * MiB) for _ in range(3)]"]
    expected: list[str] = []
    reloads = 0
    for i in range(n):
        r = rng.random()
        if r < 0.02:
            shell.run_cell("%reload_ext gpumem_nb", store_history=True)
            reloads += 1
            continue
        if r < 0.03:
            shell.run_cell("%unload_ext gpumem_nb\n%load_ext gpumem_nb", store_history=True)
            reloads += 1
            continue
        source = f"{rng.choice(cells)}  # {i}"
        shell.run_cell(source, store_history=True, cell_id=f"c{i % 40}")
        expected.append(source)
    time.sleep(0.5)
    m = current_monitor(shell)
    m.flush()
    seen = {r.source_preview for r in m.history.records()}
    false_outside = [v for v in m.verdicts if v.cause == "outside PyTorch"]
    return {"cells": len(expected), "reloads": reloads,
            "records_missing": sum(s[:60] not in seen for s in expected),
            "outside_pytorch_flags_without_outside_growth": len(false_outside),
            "sampler_threads": sum(t.name == "gpumem_nb-sampler" and t.is_alive()
                                   for t in threading.enumerate())}


SAVER = """\
import sys
from gpumem_nb.kernel import Monitor
from gpumem_nb.settings import load_config
m = Monitor(shell=None, config=load_config())
key, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    if key == "interval":
        m.configure(interval_s=float(i % 59 + 1), save=True)
    elif key == "threshold":
        m.configure(threshold_bytes=i * 2**20, save=True)
    else:
        m.configure(peak="reset" if i % 2 else "preserve", save=True)
m.sampler.stop()
"""
READER = """\
import json, sys, time
path, bad, reads = sys.argv[1], 0, 0
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        text = open(path).read()
    except FileNotFoundError:
        continue
    reads += 1
    try:
        json.loads(text)
    except ValueError:
        bad += 1
print(json.dumps({"reads": reads, "partial_reads": bad}))
"""


def attack_settings(tmp: Path, saves: int) -> dict[str, Any]:
    path = tmp / "shared.json"
    (tmp / "saver.py").write_text(SAVER)
    (tmp / "reader.py").write_text(READER)
    env = {**os.environ, "GPUMEM_NB_CONFIG": str(path), "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, str(tmp / "reader.py"), str(path), "8"],
                              env=env, stdout=subprocess.PIPE, text=True)
    procs = [subprocess.Popen([sys.executable, str(tmp / "saver.py"), key, str(saves)],
                              env=env) for key in ("interval", "threshold", "peak")]
    failed = sum(p.wait(300) != 0 for p in procs)
    out, _ = reader.communicate(timeout=60)
    final = json.loads(path.read_text())
    want = {"interval_s": float(saves % 59 + 1), "threshold_bytes": saves * 2**20,
            "peak": "reset" if saves % 2 else "preserve"}
    return {"kernels": 3, "saves_each": saves, "failed_kernels": failed,
            "keys_lost_or_stale": sum(final.get(k) != v for k, v in want.items()),
            **json.loads(out or "{}")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=3000)
    ap.add_argument("--messages", type=int, default=1500)
    ap.add_argument("--saves", type=int, default=60)
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    warnings = Warnings()
    logging.getLogger("gpumem_nb").addHandler(warnings)
    time_hooks()
    shell, _ = make_shell()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(_Null()), \
            contextlib.redirect_stderr(_Null()):
        tmp = Path(d)
        report: dict[str, Any] = {
            "messages": attack_messages(shell, args.messages, rng),
            "files": attack_files(shell, tmp),
            "run_all_with_reloads": attack_run_all(shell, args.cells, rng),
            "settings_two_kernels": attack_settings(tmp, args.saves),
        }
    statm = sum(1 for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")
                and os.path.realpath(f"/proc/self/fd/{fd}").endswith("/statm"))
    from gpumem_nb.kernel import Monitor

    gc.collect()
    report["leaks"] = {"statm_fds": statm,
                       "monitors_alive": sum(isinstance(o, Monitor) for o in gc.get_objects())}
    report["contained_failures_logged"] = [w[:160] for w in warnings.lines]
    report["hooks"] = dict(HOOK_S)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    msg, files = report["messages"], report["files"]
    run_all, st = report["run_all_with_reloads"], report["settings_two_kernels"]
    report["broken"] = {
        "slow_hooks_over_50ms": msg["slow_hooks_over_50ms"],
        "user_errors_explained": msg["user_errors_explained"],
        "typed_ooms_not_explained": msg["typed_ooms"] - msg["typed_ooms_explained"],
        "cells_not_recorded": msg["cells_not_recorded"],
        "gpumem_tracebacks": msg["gpumem_tracebacks"] + files["other_errors"],
        "save_hangs": files["hangs"], "victim_changed": files["victim_changed"],
        "bad_names_accepted": 8 - files["usage_errors"], "valid_not_saved": 1 - files["saved"],
        "temp_files_left": files["temp_files_left"],
        "recording_left_on": files["recording_left_on"],
        "records_missing": run_all["records_missing"],
        "extra_sampler_threads": run_all["sampler_threads"] - 1,
        "settings_keys_lost": st["keys_lost_or_stale"] + st["failed_kernels"],
        "settings_partial_reads": st.get("partial_reads", 0),
        "statm_fds_over_one": max(report["leaks"]["statm_fds"] - 1, 0),
        "monitors_over_one": max(report["leaks"]["monitors_alive"] - 1, 0),
    }
    print(json.dumps(report, indent=2))
    return 1 if any(report["broken"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
