"""Validate the allocator what-if against the real allocator, on the GPU machine (issue 18).

    OUT=/some/dir python benchmarks/gpu_whatif.py            # on the GPU machine (<= 240 s)
    OUT=/tmp/dry python benchmarks/gpu_whatif.py --dry-run   # anywhere: CPU, tiny, faked history
    # an out-of-sample check (other seeds, two workloads, no cost probe; about 45 s):
    OUT=/some/dir python benchmarks/gpu_whatif.py --workloads fragmenter,mlp_varbatch \
        --seed 1 --no-cost --budget-s 60

Each workload runs in a fresh process every time:

1. **record**: defaults, allocation history on (no stacks), from an empty allocator. Brings
   back the history (compact: action/addr/size/stream/time_us), the segments at its start
   and the GPU's free/total memory.
2. **real**: once per setting, history off: real peak and end reserved, cudaMalloc/cudaFree
   counts, retries, and the allocator settings torch itself parsed (to check our parser).
3. **oom**: once per setting at a capacity set with ``set_per_process_memory_fraction``,
   chosen from the model's own predictions (made here, between steps 1 and 3) so that some
   settings are predicted to fit and some not: did it really raise?
4. **cost**: what ``_record_memory_history`` costs per allocation, with torch's defaults
   (``stacks='all'``) and with what ``%%gpumem --trace`` asks for (``stacks='python'``).

Everything goes to ``$OUT``, flushed after every run: ``whatif_gpu_results.json`` (all real
figures), ``whatif_gpu_traces.json.gz`` (the recorded histories), ``whatif_gpu_log.txt``.
The comparison with the model is made on the development machine afterwards
(``benchmarks/whatif_compare.py``), so a model fix needs no second GPU run.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from itertools import pairwise
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MiB = 1 << 20
WORKLOADS = ("gpt2_train", "gpt2_generate", "mlp_varbatch", "fragmenter")
# >= 6 settings: defaults, expandable, two max_split_size_mb, roundup_power2_divisions in both
# forms, and the GC threshold (its memory fraction is chosen per workload, see gc_fraction).
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:256",
            "roundup_power2_divisions:4", "roundup_power2_divisions:[32:4,>:2]",
            "garbage_collection_threshold:0.6")
GC_SETTING = "garbage_collection_threshold:0.6"
CHILD_TIMEOUT_S = 150
RESULTS, TRACES, LOG = "whatif_gpu_results.json", "whatif_gpu_traces.json.gz", "whatif_gpu_log.txt"


# ------------------------------------------------------------------------------------------
# Workloads (run in the child). ``small`` shrinks them for the CPU dry run.
# ------------------------------------------------------------------------------------------
def _gpt2(torch: Any, dev: str, small: bool, seed: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2 if small else 8, n_embd=64 if small else 768,
                     n_head=2 if small else 12, n_positions=1024,
                     vocab_size=512 if small else 32000)
    return GPT2LMHeadModel(cfg).to(dev), cfg


def gpt2_train(torch: Any, dev: str, small: bool, seed: int = 0) -> None:
    model, cfg = _gpt2(torch, dev, small, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1 + seed)
    batch = 2 if small else 8
    for seq in ((32, 24, 28) if small else (512, 384, 448, 512)):  # lengths that change
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(dev)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, ids


def gpt2_generate(torch: Any, dev: str, small: bool, seed: int = 0) -> None:
    model, cfg = _gpt2(torch, dev, small, seed)
    model.eval()
    g = torch.Generator().manual_seed(2 + seed)
    ids = torch.randint(0, cfg.vocab_size, (2 if small else 4, 16 if small else 64),
                        generator=g).to(dev)
    with torch.no_grad():  # a KV cache that grows one token at a time
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=8 if small else 160, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    del out


def mlp_varbatch(torch: Any, dev: str, small: bool, seed: int = 0) -> None:
    import random

    torch.manual_seed(3 + seed)
    width = 64 if small else 4096
    model = torch.nn.Sequential(*[m for _ in range(6) for m in (
        torch.nn.Linear(width, width), torch.nn.GELU())]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    rng = random.Random(3 + seed)
    for _ in range(6 if small else 14):
        n = rng.choice((8, 12, 6, 16, 10)) if small else rng.choice(
            (512, 768, 1024, 1280, 1536, 1792, 2048, 2304))
        x = torch.randn(n, width, device=dev)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x


def fragmenter(torch: Any, dev: str, small: bool, seed: int = 0) -> None:
    """Sizes from a heavy-tailed mix, random frees, a few long-lived survivors between."""
    import random

    rng = random.Random(4 + seed)
    unit = 1024 if small else MiB
    live: list[Any] = []
    keep: list[Any] = []
    for step in range(300 if small else 2500):
        if rng.random() < 0.55 or not live:
            mib = rng.choice((0.25, 0.5, 1, 2, 3, 5, 8, 12, 24, 48, 96, 160))
            live.append(torch.empty(int(mib * unit), dtype=torch.uint8, device=dev))
        else:
            x = live.pop(rng.randrange(len(live)))
            if step % 37 == 0:
                keep.append(x)  # survives between later allocations: splits segments
        if len(live) > 120:
            del live[: len(live) // 2]
    del live, keep


WORKLOAD_FNS = {f.__name__: f for f in (gpt2_train, gpt2_generate, mlp_varbatch, fragmenter)}


# ------------------------------------------------------------------------------------------
# The child: one workload, one setting, a fresh process.
# ------------------------------------------------------------------------------------------
class _DryHistory:
    """The CPU dry run's stand-in for CUDA's allocation history: every tensor an op makes,
    freed when its Python object goes (enough to exercise the pipeline, not a real trace)."""

    def __init__(self, torch: Any) -> None:
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode

        self.entries: list[dict[str, Any]] = []
        rec = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes():
                        rec.alloc(t, weakref)
                return out

        self.mode = Mode()
        self._next = 0x7F00_0000_0000

    def alloc(self, t: Any, weakref: Any) -> None:
        addr = self._next
        self._next += 1 << 32
        size = int(t.untyped_storage().nbytes())
        now = time.time() * 1e6
        self.entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                             "time_us": now})

        def gone(entries: list[dict[str, Any]] = self.entries) -> None:
            t_us = time.time() * 1e6
            for action in ("free_requested", "free_completed"):
                entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                                "time_us": t_us})

        weakref.finalize(t, gone)


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    dry = spec["dry"]
    dev = "cpu" if dry else "cuda"
    kind = spec["kind"]
    if kind == "cost":
        return cost_probe(torch) if not dry else {"skipped": "dry run"}
    out: dict[str, Any] = {"kind": kind, "workload": spec["workload"],
                           "setting": spec["setting"], "fraction": spec.get("fraction")}
    start: dict[str, Any] = {}
    dry_history = None
    if not dry:
        torch.cuda.init()
        total = torch.cuda.get_device_properties(0).total_memory
        if spec.get("fraction") is not None:
            torch.cuda.set_per_process_memory_fraction(spec["fraction"], 0)
        if kind == "record":
            free, total_info = torch.cuda.mem_get_info(0)
            start = {"segments": [], "devices": {"0": {
                "free_bytes": free, "total_bytes": total, "total_bytes_mem_get_info": total_info,
                "fraction": torch.cuda.get_per_process_memory_fraction(0)}}}
        if kind in ("record", "real"):
            # History changes nothing the allocator decides; in the real runs it shows where
            # the real allocator's cudaMallocs fell, to find where a prediction went wrong.
            torch.cuda.memory._record_memory_history("all", context=None, stacks="python",
                                                     max_entries=3_000_000)
    elif kind == "record":
        dry_history = _DryHistory(torch)
        start = {"segments": [], "devices": {"0": {"free_bytes": 8 << 30,
                                                   "total_bytes": 8 << 30, "fraction": 1.0}}}
    gc.collect()
    gc.disable()  # cycles are collected once, at the end: the same place in every run
    t0 = time.perf_counter()
    try:
        fn = WORKLOAD_FNS[spec["workload"]]
        if dry_history is not None:
            with dry_history.mode:
                fn(torch, dev, dry, spec.get("seed", 0))
        else:
            fn(torch, dev, dry, spec.get("seed", 0))
        out["oom"] = False
    except torch.OutOfMemoryError as e:
        out["oom"] = True
        out["error"] = str(e).splitlines()[0][:300]
    gc.collect()
    gc.enable()
    out["workload_s"] = round(time.perf_counter() - t0, 3)
    if not dry:
        torch.cuda.synchronize()
        s = torch.cuda.memory_stats(0)
        out.update(
            peak_reserved_bytes=s.get("reserved_bytes.all.peak"),
            end_reserved_bytes=s.get("reserved_bytes.all.current"),
            peak_allocated_bytes=s.get("allocated_bytes.all.peak"),
            inactive_split_peak_bytes=s.get("inactive_split_bytes.all.peak"),
            num_device_alloc=s.get("num_device_alloc"), num_device_free=s.get("num_device_free"),
            num_alloc_retries=s.get("num_alloc_retries"), num_ooms=s.get("num_ooms"),
            total_bytes=total, torch=torch.__version__)
        if kind in ("record", "real"):
            t1 = time.perf_counter()
            snap = torch.cuda.memory._snapshot()
            out["snapshot_s"] = round(time.perf_counter() - t1, 3)
            torch.cuda.memory._record_memory_history(None)
            out.update(_digest(snap))
        else:
            snap = torch.cuda.memory._snapshot()  # history off: segments only, cheap
        out["allocator_settings"] = _plain(snap.get("allocator_settings"))
    else:
        snap = {"segments": [], "device_traces": [dry_history.entries if dry_history else []],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": spec["setting"]}}
        out.update(torch=torch.__version__, total_bytes=8 << 30)
        if kind != "record":
            out.update(_dry_figures(spec))
    if kind == "record":
        from gpumem_nb.whatif.snapshot import START_KEY, compact

        snap[START_KEY] = start
        trace = compact(snap)
        entries = len(trace["device_traces_columns"][0]["action"]) if \
            trace["device_traces_columns"] else 0
        out["entries"] = entries
        out["history_full"] = entries >= 3_000_000
        with gzip.open(spec["trace_path"], "wt") as f:
            json.dump(trace, f)
    return out


def _digest(snap: dict[str, Any], max_events: int = 5000) -> dict[str, Any]:
    """The allocation sequence's fingerprint (the same program must ask for the same sizes
    in every run, or no replay can be exact) and where the allocator called cudaMalloc,
    cudaFree, map or unmap: [allocations so far, action, size, address]."""
    import hashlib

    sizes: list[int] = []
    seg: list[list[Any]] = []
    for e in (snap.get("device_traces") or [[]])[0]:
        a = e.get("action")
        if a == "alloc":
            sizes.append(int(e.get("size", 0)))
        elif isinstance(a, str) and a.startswith("segment_") and len(seg) < max_events:
            seg.append([len(sizes), a, e.get("size"), e.get("addr")])
    return {"allocs": len(sizes),
            "alloc_sizes_sha1": hashlib.sha1(json.dumps(sizes).encode()).hexdigest(),
            "segment_events": seg}


def _dry_figures(spec: dict[str, Any]) -> dict[str, Any]:
    """The dry run has no real allocator: its "real" figures are the model's own replay of
    the faked history, marked as such, so the comparison script runs end to end."""
    from gpumem_nb.whatif import api

    setting = spec["setting"]
    if spec.get("fraction") is not None:
        setting = api.with_setting(setting, "per_process_memory_fraction", repr(spec["fraction"]))
    row = api.whatif(spec["trace_path"], [setting])[0]
    return {"figures_from": "the model (dry run: no real allocator)",
            "peak_reserved_bytes": row.peak_reserved_bytes,
            "end_reserved_bytes": row.end_reserved_bytes,
            "num_device_alloc": row.segment_allocs, "num_device_free": row.segment_frees,
            "oom": bool(row.oom) if spec["kind"] == "oom" else False}


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x if isinstance(x, (int, float, str, bool)) or x is None else repr(x)


def cost_probe(torch: Any) -> dict[str, Any]:
    """µs per allocation+free with history off and on, per way of asking for it; and the
    cheap segments-only snapshot the what-if takes when a trace starts."""
    torch.cuda.init()
    x = torch.empty(1, device="cuda")

    def loop(n: int = 20000) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            y = torch.empty(4096, device="cuda")
            del y
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    loop(2000)
    out: dict[str, Any] = {"off_us": min(loop() for _ in range(3))}
    ways = {"ours: stacks=python, context=alloc": {"context": "alloc", "stacks": "python"},
            "stacks=python, context=all": {"context": "all", "stacks": "python"},
            "torch default: stacks=all, context=all": {"context": "all", "stacks": "all"},
            "no stacks: context=None": {"context": None, "stacks": "python"}}
    for name, kw in ways.items():
        torch.cuda.memory._record_memory_history("all", max_entries=100_000, **kw)
        out[name + " us"] = min(loop() for _ in range(3))
        torch.cuda.memory._record_memory_history(None)
    t0 = time.perf_counter()
    try:
        segs = torch.cuda.memory.memory_snapshot(include_traces=False)
        out["memory_snapshot_include_traces_false"] = True
    except TypeError:
        segs = torch.cuda.memory._snapshot()["segments"]
        out["memory_snapshot_include_traces_false"] = False
    out["segments_snapshot_ms"] = (time.perf_counter() - t0) * 1e3
    out["segments"] = len(segs)
    del x
    return {"kind": "cost", **out}


# ------------------------------------------------------------------------------------------
# The parent: record, choose capacities from the model, run the rest in parallel.
# ------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, out: str, dry: bool, jobs: int, budget_s: float, *,
                 workloads: tuple[str, ...] = WORKLOADS, seed: int = 0,
                 cost: bool = True) -> None:
        self.out, self.dry, self.jobs, self.budget_s = out, dry, jobs, budget_s
        self.workloads, self.seed, self.cost = workloads, seed, cost
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.results: dict[str, Any] = {
            "device": "NVIDIA H200" if not dry else "dry run (CPU, faked history)",
            "dry_run": dry, "settings": list(SETTINGS), "workloads": list(workloads),
            "seed": seed,
            "runs": [], "capacities": {}, "gc_fractions": {}, "predictions": {},
            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.traces: dict[str, Any] = {}
        self.tmp = os.path.join(out, ".tmp") if dry else "/tmp/gpu_whatif_traces"
        os.makedirs(self.tmp, exist_ok=True)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def log(self, text: str) -> None:
        with self.lock, open(os.path.join(self.out, LOG), "a") as f:
            f.write(f"[{time.monotonic() - self.t0:7.1f}s] {text}\n")
        print(text, flush=True)

    def flush(self) -> None:
        with self.lock:
            self.results["elapsed_s"] = round(time.monotonic() - self.t0, 1)
            tmp = os.path.join(self.out, RESULTS + ".part")
            with open(tmp, "w") as f:  # one line per run: small enough to come back whole
                f.write("{" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}"
                                          for k, v in self.results.items() if k != "runs"))
                f.write(',\n"runs": [\n' + ",\n".join(json.dumps(r) for r in
                                                        self.results["runs"]) + "\n]}\n")
            os.replace(tmp, os.path.join(self.out, RESULTS))

    def run_child(self, spec: dict[str, Any]) -> dict[str, Any]:
        label = f"{spec['kind']} {spec.get('workload', '')} [{spec.get('setting', '')}]" + (
            f" fraction={spec['fraction']:.6f}" if spec.get("fraction") else "")
        if self.left_s() < 20:
            res = {**spec, "skipped": "out of the time budget"}
            self.log(f"SKIP {label}: out of time")
        else:
            env = {k: v for k, v in os.environ.items()
                   if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
                                "PYTORCH_ALLOC_CONF")}
            if spec.get("setting"):
                env["PYTORCH_ALLOC_CONF"] = spec["setting"]
            env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
            t0 = time.monotonic()
            try:
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                    json.dumps(spec)], capture_output=True, text=True, env=env,
                                   timeout=min(CHILD_TIMEOUT_S, max(self.left_s(), 10)))
                line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    res = {**spec, "error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
                else:
                    res = {**spec, **json.loads(line[len("RESULT "):])}
            except subprocess.TimeoutExpired:
                res = {**spec, "error": "timed out"}
            res["process_s"] = round(time.monotonic() - t0, 1)
            self.log(f"{'FAIL' if 'error' in res and res.get('oom') is None else 'done'} "
                     f"{label} in {res['process_s']} s"
                     + (f": {res['error'][:300]}" if "error" in res else ""))
        res.pop("trace_path", None)
        res.pop("dry", None)
        with self.lock:
            self.results["runs"].append(res)
        self.flush()
        return res

    def record(self) -> None:
        specs = [{"kind": "record", "workload": w, "setting": "", "dry": self.dry,
                  "seed": self.seed, "trace_path": os.path.join(self.tmp, f"{w}.json.gz")}
                 for w in self.workloads]
        with cf.ThreadPoolExecutor(self.jobs) as pool:
            done = list(pool.map(self.run_child, specs))
        for spec, res in zip(specs, done, strict=True):
            if "error" not in res and os.path.exists(spec["trace_path"]):
                with gzip.open(spec["trace_path"], "rt") as f:
                    self.traces[spec["workload"]] = json.load(f)
        with gzip.open(os.path.join(self.out, TRACES), "wt") as f:
            json.dump({"format": "gpumem-whatif-gpu-traces/1", "workloads": self.traces}, f)

    def plan(self) -> list[dict[str, Any]]:
        """The real runs, and per workload a capacity where the model predicts some settings
        fit and others do not (judged with the model here, before the real OOM runs)."""
        from gpumem_nb.whatif import api

        specs: list[dict[str, Any]] = []
        for w in self.workloads:
            snap = self.traces.get(w)
            if snap is None:
                continue
            from gpumem_nb.whatif.snapshot import expand

            snap = expand(snap)
            total = snap["gpumem_start"]["devices"]["0"]["total_bytes"]
            base = [s for s in SETTINGS if s != GC_SETTING]
            unlimited = api.whatif(snap, base)
            peaks = sorted({r.peak_reserved_bytes for r in unlimited})
            fraction_gc = min(1.0, 1.3 * peaks[-1] / total)
            self.results["gc_fractions"][w] = fraction_gc
            path = os.path.join(self.tmp, f"{w}.json.gz")
            for s in SETTINGS:
                specs.append({"kind": "real", "workload": w, "setting": s, "dry": self.dry,
                              "fraction": fraction_gc if s == GC_SETTING else None,
                              "seed": self.seed, "trace_path": path})
            cap, predicted = choose_capacity(api, snap, base, peaks, total)
            self.results["capacities"][w] = {"capacity_bytes": cap,
                                             "fraction": cap / total, "predicted_oom": predicted}
            self.results["predictions"][w] = {r.label: r.peak_reserved_bytes for r in unlimited}
            specs += [{"kind": "oom", "workload": w, "setting": s, "dry": self.dry,
                       "fraction": cap / total, "seed": self.seed, "trace_path": path}
                      for s in base]
        self.flush()
        return specs

    def run_all(self, specs: list[dict[str, Any]]) -> None:
        if self.cost:
            specs = [{"kind": "cost", "dry": self.dry, "workload": "", "setting": ""}, *specs]
        with cf.ThreadPoolExecutor(self.jobs) as pool:
            list(pool.map(self.run_child, specs))


def choose_capacity(api: Any, snap: dict[str, Any], settings: list[str], peaks: list[int],
                    total: int) -> tuple[int, dict[str, bool]]:
    """Among capacities between the predicted peaks, the one that splits the settings most
    evenly into fitting and not (the model's own call, checked by the real runs)."""
    candidates = [(a + b) // 2 for a, b in pairwise(peaks) if b > a * 1.02]
    candidates += [int(peaks[0] * 0.8), int(peaks[-1] * 1.1)]
    best: tuple[float, int, dict[str, bool]] | None = None
    for cap in candidates:
        f = cap / total
        rows = api.whatif(snap, [api.with_setting(s, "per_process_memory_fraction", repr(f))
                                 for s in settings])
        calls = {s: bool(r.oom) for s, r in zip(settings, rows, strict=True)}
        score = abs(sum(calls.values()) - len(calls) / 2)
        if best is None or score < best[0]:
            best = (score, cap, calls)
    assert best is not None
    return best[1], best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, tiny workloads, a faked history: checks the script end to end")
    ap.add_argument("--jobs", type=int, default=10, help="processes at once (one GPU)")
    ap.add_argument("--budget-s", type=float, default=230.0, help="stop starting runs after")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help="comma-separated, of: " + ", ".join(WORKLOADS))
    ap.add_argument("--seed", type=int, default=0,
                    help="added to every workload's seeds: another run of the same kind")
    ap.add_argument("--no-cost", action="store_true", help="skip the recording-cost probe")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    out = os.environ.get("OUT") or "/tmp/gpu_whatif_out"
    os.makedirs(out, exist_ok=True)
    workloads = tuple(w for w in args.workloads.split(",") if w)
    unknown = [w for w in workloads if w not in WORKLOAD_FNS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    r = Runner(out, args.dry_run, args.jobs, args.budget_s, workloads=workloads,
               seed=args.seed, cost=not args.no_cost)
    r.log(f"gpu_whatif: {len(workloads)} workloads x {len(SETTINGS)} settings, seed {args.seed}, "
          f"{args.jobs} at once, budget {args.budget_s:.0f} s, out {out}")
    r.record()
    specs = r.plan()
    r.run_all(specs)
    r.log(f"finished in {time.monotonic() - r.t0:.1f} s")
    r.flush()


if __name__ == "__main__":
    main()
