"""The autograd graph walk's cost on a GPT-2 of about 200 M parameters (transformers, built
from a config): `who` over Out[n] keeping logits and their graphs, and the OOM explanation of
a step that fails inside its forward (the failure raised by a forward hook, so this runs on
CPU torch too; on the GPU machine use benchmarks/gpu_diagnosis.py for the real OOMs).

    python benchmarks/bench_graph.py [--tokens 128] [--batch 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, ".")

from benchmarks.common import emit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()

    import torch
    from IPython.testing.globalipapp import start_ipython
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpumem_nb.magics import current_monitor

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = GPT2Config(n_embd=1024, n_layer=12, n_head=16, n_positions=1024)
    with torch.device(dev):
        model = GPT2LMHeadModel(cfg)
    ip = start_ipython()
    ip.run_cell("%load_ext gpumem_nb", store_history=True)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.tokens), device=dev)
    ip.user_ns.update(model=model, ids=ids, torch=torch,
                      opt=torch.optim.AdamW(model.parameters()))
    for _ in range(3):
        ip.run_cell("model(ids).logits", store_history=True)  # Out keeps each, with its graph
    mon: Any = current_monitor(ip)
    results: dict[str, Any] = {"device": dev, "params_m": round(
        sum(p.numel() for p in model.parameters()) / 1e6, 1), "batch": args.batch,
        "tokens": args.tokens}

    times, graph = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        report = ip.run_line_magic("gpumem", "who -o")
        times.append(time.perf_counter() - t0)
        graph.append(mon.last_scan_graph)
    outs = [h for h in report.holders if h.name.startswith("Out[")]
    results.update(
        who_ms_median=round(statistics.median(times) * 1e3, 2),
        who_graph_ms_median=round(statistics.median(g[0] for g in graph) * 1e3, 2),
        graph_nodes=graph[0][1],
        out_holders=[[h.name, h.nbytes, h.graph_bytes, h.graph_nodes] for h in outs])

    # A step that fails in its last block's forward, its activations and graph still held.
    class Stop(torch.OutOfMemoryError):
        pass

    def fail(*_: Any) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "139.80 GiB of which 1.37 GiB is free. Of the allocated memory 134.60 GiB is "
            "allocated by PyTorch, and 778.00 MiB is reserved by PyTorch but unallocated.")

    handle = model.transformer.h[-1].register_forward_hook(fail)
    explain = []
    try:
        for _ in range(args.rounds):
            ip.run_cell("loss = model(ids, labels=ids).loss", store_history=True)
            e = mon.oom.last
            explain.append((e.added_s, e.stage_s))
    finally:
        handle.remove()
    results["explain_ms_median"] = round(statistics.median(a for a, _ in explain) * 1e3, 2)
    results["explain_stages_ms_last"] = {k: round(v * 1e3, 2) for k, v in explain[-1][1].items()}
    emit("bench_graph", results)


if __name__ == "__main__":
    main()
