"""Issue 25 on the GPU: the session what-if, the fit search and a traced cell's cost, each
against real runs in fresh kernels and processes.

    python3 benchmarks/gpu_session.py OUT_DIR [--only trace|session|fit|rerecord] [--dry-run]

About 2 minutes for everything on one H200 (``--only rerecord``: the sessions' recordings
and one trace kernel again, 14 s). Run from the repository root with the wheelhouse's
jupyter_client/ipykernel on the path.

Writes ``whatif_session_h200.json`` (sessions x settings: ``real_peak_bytes``,
``predicted_peak_bytes``, ``real_oom``, ``predicted_oom``; fit checks:
``fit_plus_2pct_oom``, ``fit_minus_2pct_oom``) and ``trace_cost_h200.json`` (``added_ms``
of a kernel's first and a later traced cell at 1, 10,000 and 100,000 history entries, split
as the footer splits it; the recording's cost per allocation; the first snapshot's profile).

Sessions: multi-cell workloads whose peak or OOM the earlier cells decide, recorded under the
defaults with ``%gpumem record on`` in a real kernel, replayed with ``%gpumem whatif
--session``, then run for real in fresh kernels under each setting. Every kernel and process
caps itself with ``set_per_process_memory_fraction`` (``CAP``), so several run at once.
``--dry-run`` runs the kernel machinery on this machine with the workloads' sources checked
only (no torch here).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GiB = 1 << 30
MiB = 1 << 20
CAP = 24 * GiB  # what each session's kernel may reserve
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128",
            "roundup_power2_divisions:4", "garbage_collection_threshold:0.6")
FIT_SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:128")
PARALLEL = 4  # at once: 4 x at most 30 GiB stay inside the H200's 139 GiB

PRELUDE = """\
import torch, json, random, sys, time
G, M = 1 << 30, 1 << 20
_total = torch.cuda.get_device_properties(0).total_memory
if {cap}:
    torch.cuda.set_per_process_memory_fraction({cap} / _total)
def E(n):
    return torch.empty(int(n), dtype=torch.uint8, device="cuda")
"""

# Each: cells whose later allocations land in what the earlier ones left.
SESSIONS: dict[str, list[str]] = {
    # Sixteen 1 GiB tensors, every other freed, 600 MiB ones split the freed blocks: the
    # last cell's 9 GiB finds 3.3 GiB stranded in segments it cannot release.
    "split_blocks_then_big": [
        "a = [E(1 * G) for _ in range(16)]",
        "del a[::2]\nb = [E(600 * M) for _ in range(8)]",
        "c = E(9 * G)",
    ],
    # A model's weights, then batches of growing and shrinking size, keeping small outputs.
    "varying_batches_kept_outputs": [
        "w = E(4 * G)\nfor s in (1, 2, 3):\n    x = [E(s * 300 * M) for _ in range(4)]\n    del x",
        "keep = []\nfor s in (5, 4, 6, 2):\n    x = [E(s * 250 * M) for _ in range(3)]\n"
        "    keep.append(E(64 * M))\n    del x",
        "for s in (7, 3, 8):\n    x = [E(s * 300 * M) for _ in range(3)]\n    del x",
    ],
    # Random sizes, a slice of some kept, then large requests past them.
    "random_sizes_kept_slices": [
        "rng = random.Random(1)\nkeep = []\nfor i in range(300):\n"
        "    t = E(rng.randint(1, 64) * M)\n    if i % 3 == 0:\n"
        "        keep.append(E(rng.randint(1, 4) * M))\n    del t",
        "big = [E(rng.randint(100, 900) * M) for _ in range(12)]\ndel big[::3]",
        "for _ in range(6):\n    x = E(rng.randint(1000, 4000) * M)\n    del x",
    ],
    # 16,000 small allocations with random lifetimes over two cells, then a large one.
    "small_random_lifetimes_then_big": [
        "rng = random.Random(2)\nlive = {}\n"
        "sizes = (512, 4096, 65536, 262144, 1 << 20, 3 << 20, 9 << 20)\n"
        "for i in range(8000):\n    live[i] = E(rng.choice(sizes))\n"
        "    if rng.random() < 0.5:\n        live.pop(rng.choice(list(live)))",
        "for i in range(8000, 16000):\n    live[i] = E(rng.choice(sizes) * 2)\n"
        "    if rng.random() < 0.55:\n        live.pop(rng.choice(list(live)))",
        "x = E(10 * G)\ny = E(2 * G)",
    ],
    # A cache emptied mid-session, then requests that the emptied cache no longer serves.
    "empty_cache_between": [
        "xs = [E(700 * M) for _ in range(20)]\ndel xs[1::2]",
        "torch.cuda.empty_cache()\nys = [E(1500 * M) for _ in range(5)]",
        "del ys[::2]\nz = E(5 * G)",
    ],
}
# Fit workloads: the sessions without a cap (the search needs the whole work recorded).
FIT_WORKLOADS = ("split_blocks_then_big", "varying_batches_kept_outputs",
                 "random_sizes_kept_slices", "small_random_lifetimes_then_big")

WHATIF_CELL = """\
_r = get_ipython().run_line_magic("gpumem", "whatif --session {confs} -o")
print("@@" + json.dumps({{"rows": [{{"setting": x.setting, "label": x.label,
    "peak": x.peak_reserved_bytes, "oom": x.oom, "current": x.current}} for x in _r],
    "capacity": _r.capacity_bytes,
    "notes": list(_r.notes), "entries": _r.entries, "elapsed_s": _r.elapsed_s}}))
"""
def _payload(text: str) -> Any:
    for line in text.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return None


def _kernel(env_extra: dict[str, str], cells: list[str], timeout_s: float = 150
            ) -> list[dict[str, Any]]:
    from benchmarks.bench_kernel import Kernel

    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(env_extra)
    with tempfile.TemporaryDirectory() as d:
        k = Kernel(Path(d), env, timeout_s)
        out = []
        try:
            for code in cells:
                t0 = time.perf_counter()
                c = k.run(code, check=False)
                out.append({"status": c.status, "output": c.output,
                            "wall_s": time.perf_counter() - t0,
                            "oom": "OutOfMemoryError" in c.output})
        finally:
            k.km.shutdown_kernel(now=True)
            k.kc.stop_channels()
    return out


def _python(code: str, env_extra: dict[str, str] | None = None, timeout_s: float = 150) -> Any:
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, timeout=timeout_s)
    got = _payload(p.stdout)
    if got is None:
        return {"error": (p.stdout + p.stderr)[-3000:]}
    return got


# ------------------------------------------------------------------------------------------
# Sessions
# ------------------------------------------------------------------------------------------
def record_session(name: str) -> dict[str, Any]:
    confs = " ".join(f"--conf {s}" for s in SETTINGS if s)
    cells = [PRELUDE.format(cap=CAP), "%load_ext gpumem_nb", "%gpumem record on",
             *SESSIONS[name], WHATIF_CELL.format(confs=confs), "%gpumem record off"]
    res = _kernel({}, cells)
    got = _payload(res[-2]["output"])
    return {"name": name, "recording": [{"status": r["status"], "oom": r["oom"],
                                         "output": r["output"][-600:]} for r in res],
            "prediction": got}


def real_session(name: str, setting: str) -> dict[str, Any]:
    env = {"PYTORCH_ALLOC_CONF": setting} if setting else {}
    cells = [PRELUDE.format(cap=CAP), *SESSIONS[name],
             'print("@@" + json.dumps({"peak": torch.cuda.max_memory_reserved()}))']
    res = _kernel(env, cells)
    got = _payload(res[-1]["output"]) or {}
    return {"name": name, "setting": setting, "real_peak_bytes": got.get("peak"),
            "real_oom": any(r["oom"] for r in res[1:-1]),
            "cell_errors": [r["output"][-300:] for r in res if r["status"] != "ok"]}


# ------------------------------------------------------------------------------------------
# Fit
# ------------------------------------------------------------------------------------------
FIT_RECORD = """\
import json, sys, torch
sys.path.insert(0, {root!r})
torch.cuda.init()
from gpumem_nb.session import SessionRecorder
import gpumem_nb
rec = SessionRecorder()
msg = rec.start()
exec({prelude!r})
for _cell in {cells!r}:
    exec(_cell)
got = rec.snapshot()
r = gpumem_nb.whatif(got.snapshot, {settings!r}, fit=True)
print("@@" + json.dumps({{"start": msg, "total": _total, "entries": r.entries,
    "rows": [{{"setting": f.setting, "min_bytes": f.min_bytes, "replays": f.replays}}
             for f in r.fit.rows], "elapsed_s": r.elapsed_s}}))
"""
FIT_REAL = """\
import json, torch
exec({prelude!r})
torch.cuda.set_per_process_memory_fraction({fraction!r})
oom = False
try:
    for _cell in {cells!r}:
        exec(_cell)
except torch.OutOfMemoryError:
    oom = True
print("@@" + json.dumps({{"oom": oom, "peak": torch.cuda.max_memory_reserved(),
                          "allowed": int({fraction!r} * _total)}}))
"""


def record_fit(name: str) -> dict[str, Any]:
    code = FIT_RECORD.format(root=str(Path(__file__).resolve().parents[1]),
                             prelude=PRELUDE.format(cap=0), cells=SESSIONS[name],
                             settings=list(FIT_SETTINGS))
    return {"name": name, **_python(code)}


def real_fit(name: str, setting: str, fraction: float) -> dict[str, Any]:
    code = FIT_REAL.format(prelude=PRELUDE.format(cap=0), cells=SESSIONS[name],
                           fraction=fraction)
    env = {"PYTORCH_ALLOC_CONF": setting} if setting else {}
    return _python(code, env)


# ------------------------------------------------------------------------------------------
# A traced cell's cost
# ------------------------------------------------------------------------------------------
def _body(n: int) -> str:
    if n <= 1:
        return "x = torch.empty(1024, device='cuda')"
    return f"for _ in range({n // 3}):\n    t = torch.empty(4096, device='cuda')\n    del t"


# The garbage collector's passes since the last reading (a full pass walks every object the
# kernel holds, the previous traced cell's snapshot among them): why a later traced cell
# could cost more than the first.
GC_WATCH = """\
import gc
_gc = {"passes": 0, "full": 0, "s": 0.0, "t0": 0.0}
def _gc_watch(phase, info):
    if phase == "start":
        _gc["t0"] = time.perf_counter()
    else:
        _gc["passes"] += 1
        _gc["full"] += info["generation"] == 2
        _gc["s"] += time.perf_counter() - _gc["t0"]
gc.callbacks.append(_gc_watch)
"""
READ_TRACE = """\
from gpumem_nb.magics import current_monitor
_t = current_monitor().last_trace
print("@@" + json.dumps({"entries": _t.entries, "added_ms": _t.added_s * 1e3,
    "snapshot_ms": _t.snapshot_s * 1e3, "switch_ms": _t.switch_s * 1e3,
    "ours_ms": _t.ours_s * 1e3, "inductor_imported": "torch._inductor" in sys.modules,
    "cell_gc_ms": _gc["s"] * 1e3, "cell_gc_passes": _gc["passes"],
    "cell_full_gc_passes": _gc["full"], "gc_objects": len(gc.get_objects())}))
_gc.update(passes=0, full=0, s=0.0)
"""
RECORD_COST = """\
def _loop(n=50000):
    t0 = time.perf_counter()
    for _ in range(n):
        t = torch.empty(4096, device="cuda")
        del t
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n
_off = min(_loop() for _ in range(2))
get_ipython().run_line_magic("gpumem", "record on")
_on = min(_loop() for _ in range(2))
_t0 = time.perf_counter()
_s = current_monitor().session.snapshot()
_snap_ms = (time.perf_counter() - _t0) * 1e3
get_ipython().run_line_magic("gpumem", "record off")
print("@@" + json.dumps({"alloc_free_pair_off_us": _off * 1e6, "alloc_free_pair_on_us": _on * 1e6,
    "added_us_per_alloc_free_pair": (_on - _off) * 1e6, "session_entries": _s.entries,
    "session_snapshot_ms": _snap_ms}))
"""


def trace_kernel(n: int, cost: bool = True) -> dict[str, Any]:
    cell = "%%gpumem --trace -q\n" + _body(n)
    cells = ["%load_ext gpumem_nb\nimport torch, json, sys, time\ntorch.zeros(1, device='cuda')\n"
             + GC_WATCH, cell, READ_TRACE, cell, READ_TRACE]
    if n <= 1 and cost:
        cells.append(RECORD_COST)
    res = _kernel({}, cells)
    first, later = _payload(res[2]["output"]), _payload(res[4]["output"])
    out: dict[str, Any] = {"history_entries_asked": n, "first": first, "later": later,
                           "cell_wall_s": [round(r["wall_s"], 3) for r in res]}
    if n <= 1 and cost:
        out["recording_cost"] = _payload(res[5]["output"]) or res[5]["output"][-800:]
    return out


def rerecord(out: Path) -> None:
    """The sessions recorded again (their real runs do not depend on gpumem_nb), with a
    kernel's first and later traced cell: each result written as it comes."""
    from concurrent.futures import as_completed

    got: dict[str, Any] = {"recordings": [], "trace": None}
    with ProcessPoolExecutor(max_workers=6) as pool:
        jobs = {pool.submit(record_session, n): n for n in SESSIONS}
        jobs[pool.submit(trace_kernel, 1, False)] = "trace"
        for f in as_completed(jobs):
            r = f.result()
            if jobs[f] == "trace":
                got["trace"] = r
            else:
                got["recordings"].append(r)
            (out / "rerecord.json").write_text(json.dumps(got, indent=1))
            print("got", jobs[f], flush=True)


RAW_FIRST_SNAPSHOT = """\
import cProfile, io, json, pstats, sys, time, torch
torch.zeros(1, device="cuda")
torch.cuda.memory._record_memory_history("all", context="alloc", stacks="python",
                                         max_entries=100000)
x = torch.empty(1024, device="cuda")
before = "torch._inductor" in sys.modules
{setup}
prof = cProfile.Profile()
t0 = time.perf_counter()
prof.enable()
with ctx():
    s = torch.cuda.memory._snapshot()
prof.disable()
first = time.perf_counter() - t0
t0 = time.perf_counter()
with ctx():
    torch.cuda.memory._snapshot()
second = time.perf_counter() - t0
buf = io.StringIO()
pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(12)
print("@@" + json.dumps({{"first_snapshot_ms": first * 1e3, "second_snapshot_ms": second * 1e3,
    "inductor_imported_before": before, "inductor_imported_after": "torch._inductor" in sys.modules,
    "entries": len(s["device_traces"][0]), "profile_top": buf.getvalue()[-4000:]}}))
"""
PLAIN_CTX = "import contextlib\nctx = contextlib.nullcontext"
OUR_CTX = ("sys.path.insert(0, {root!r})\nfrom gpumem_nb.trace import inductor_lookup_skipped\n"
           "ctx = lambda: inductor_lookup_skipped(sys.modules)")
IMPORT_INDUCTOR = """\
import json, time, torch
t0 = time.perf_counter()
import torch._inductor
print("@@" + json.dumps({"import_torch_inductor_ms": (time.perf_counter() - t0) * 1e3}))
"""


def raw_snapshot(kind: str) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parents[1])
    if kind == "import":
        return {"kind": kind, **_python(IMPORT_INDUCTOR)}
    setup = PLAIN_CTX if kind == "torch_as_is" else OUR_CTX.format(root=root)
    return {"kind": kind, **_python(RAW_FIRST_SNAPSHOT.format(setup=setup))}


# ------------------------------------------------------------------------------------------
def _close(a: int | None, b: int | None) -> bool | None:
    if a is None or b is None:
        return None
    return abs(a - b) <= max(0.01 * max(a, b), 20 * MiB)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--only", choices=("trace", "session", "fit", "rerecord"))
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        for cells in SESSIONS.values():
            for c in cells:
                compile(c, "<cell>", "exec")
        for n in (1, 10_000):
            compile(_body(n), "<cell>", "exec")
        for src in (RECORD_COST, READ_TRACE, GC_WATCH, IMPORT_INDUCTOR,
                    RAW_FIRST_SNAPSHOT.format(setup=PLAIN_CTX),
                    FIT_REAL.format(prelude="", cells=[], fraction=0.5),
                    FIT_RECORD.format(root="", prelude="", cells=[], settings=[]),
                    PRELUDE.format(cap=CAP), WHATIF_CELL.format(confs="")):
            compile(src, "<src>", "exec")
        res = _kernel({}, ["print('@@' + '{\"ok\": 1}')", "1/0", "print('@@{}')"], 60)
        print(json.dumps([{k: v for k, v in r.items() if k != "output"} for r in res]))
        print("dry run: sources compile and the kernel machinery runs")
        return 0
    t_start = time.perf_counter()
    if args.only == "rerecord":
        rerecord(out)
        print(f"done in {time.perf_counter() - t_start:.0f} s")
        return 0
    pool = ProcessPoolExecutor(max_workers=PARALLEL)
    trace_doc: dict[str, Any] = {}
    if args.only in (None, "trace"):
        # The cost figures are timed alone, three fresh kernels at once at most.
        raws = list(pool.map(raw_snapshot, ("torch_as_is", "with_gpumem_nb_skip", "import")))
        kernels = list(pool.map(trace_kernel, (1, 10_000, 100_000)))
        rows = []
        for k in kernels:
            for which in ("first", "later"):
                r = k.get(which) or {}
                rows.append({"history_entries": r.get("entries"), "cell": which,
                             "added_ms": r.get("added_ms"), "snapshot_ms": r.get("snapshot_ms"),
                             "switch_ms": r.get("switch_ms"), "ours_ms": r.get("ours_ms"),
                             "inductor_imported": r.get("inductor_imported"),
                             "cell_gc_ms": r.get("cell_gc_ms"),
                             "cell_full_gc_passes": r.get("cell_full_gc_passes")})
        rec_cost = kernels[0].get("recording_cost")
        trace_doc = {"device": "1x H200", "rows": rows, "kernels": kernels,
                     "first_snapshot_raw": raws, "recording_cost": rec_cost,
                     "targets_ms": {"limit": 200, "goal": 50}}
        (out / "trace_cost_h200.json").write_text(json.dumps(trace_doc, indent=1))
        print("trace:", json.dumps(rows), json.dumps(rec_cost), flush=True)
        print("raw:", json.dumps([{k: v for k, v in r.items() if k != "profile_top"}
                                  for r in raws]), flush=True)
    session_doc: dict[str, Any] = {"device": "1x H200", "cap_bytes": CAP,
                                   "settings": list(SETTINGS)}
    if args.only in (None, "session", "fit"):
        names = list(SESSIONS) if args.only != "fit" else []
        fit_names = list(FIT_WORKLOADS) if args.only != "session" else []
        recs = [pool.submit(record_session, n) for n in names]
        fits = [pool.submit(record_fit, n) for n in fit_names]
        recorded = [f.result() for f in recs]
        fit_rec = [f.result() for f in fits]
        real_jobs = {(n, s): pool.submit(real_session, n, s) for n in names for s in SETTINGS}
        fit_jobs = {}
        for fr in fit_rec:
            total = fr.get("total")
            for row in fr.get("rows") or ():
                need = row.get("min_bytes")
                if not need or not total:
                    continue
                for sign, k in ((+1, "plus"), (-1, "minus")):
                    frac = min(need * (1 + sign * 0.02) / total, 1.0)
                    fit_jobs[(fr["name"], row["setting"], k)] = (
                        frac, pool.submit(real_fit, fr["name"], row["setting"], frac))
        compared = []
        for rec in recorded:
            pred = rec.get("prediction") or {}
            prow = pred.get("rows") or []
            for i, s in enumerate(SETTINGS):
                real = real_jobs[(rec["name"], s)].result()
                p = prow[i] if i < len(prow) else {}
                compared.append({
                    "session": rec["name"], "setting": s or "defaults",
                    "real_peak_bytes": real["real_peak_bytes"],
                    "predicted_peak_bytes": p.get("peak"), "real_oom": real["real_oom"],
                    "predicted_oom": p.get("oom"),
                    "peak_within_1pct_or_20mib": None if real["real_oom"] or p.get("oom")
                    else _close(real["real_peak_bytes"], p.get("peak")),
                    "oom_call_right": (p.get("oom") == real["real_oom"])
                    if p.get("oom") is not None else None,
                    "real_cell_errors": real["cell_errors"]})
        checks = []
        for fr in fit_rec:
            for row in fr.get("rows") or ():
                key = (fr["name"], row["setting"])
                if (*key, "plus") not in fit_jobs:
                    continue
                fp, plus = fit_jobs[(*key, "plus")]
                fm, minus = fit_jobs[(*key, "minus")]
                rp, rm = plus.result(), minus.result()
                checks.append({"workload": fr["name"], "setting": row["setting"] or "defaults",
                               "predicted_min_bytes": row["min_bytes"],
                               "replays": row.get("replays"),
                               "fraction_plus_2pct": fp, "fraction_minus_2pct": fm,
                               "fit_plus_2pct_oom": rp.get("oom"),
                               "fit_minus_2pct_oom": rm.get("oom"),
                               "right": rp.get("oom") is False and rm.get("oom") is True,
                               "plus_run": rp, "minus_run": rm})
        session_doc.update(compared=compared, fit_checks=checks,
                           recordings=recorded, fit_recordings=fit_rec)
        peaks = [c["peak_within_1pct_or_20mib"] for c in compared
                 if c["peak_within_1pct_or_20mib"] is not None]
        calls = [c["oom_call_right"] for c in compared if c["oom_call_right"] is not None]
        session_doc["summary"] = {
            "peaks_within": f"{sum(peaks)}/{len(peaks)}", "oom_calls_right":
            f"{sum(calls)}/{len(calls)}",
            "fit_checks_right": f"{sum(c['right'] for c in checks)}/{len(checks)}"}
        (out / "whatif_session_h200.json").write_text(json.dumps(session_doc, indent=1))
        print("summary:", json.dumps(session_doc["summary"]), flush=True)
        for c in compared:
            print(c["session"], c["setting"], c["real_peak_bytes"], c["predicted_peak_bytes"],
                  c["real_oom"], c["predicted_oom"], flush=True)
        for c in checks:
            print("fit", c["workload"], c["setting"], c["predicted_min_bytes"],
                  c["fit_plus_2pct_oom"], c["fit_minus_2pct_oom"], flush=True)
    pool.shutdown()
    print(f"done in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
