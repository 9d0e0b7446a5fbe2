"""What a ``%%gpumem --trace`` cell costs, split as its footer splits it, on a GPU (issue 37).

    python benchmarks/gpu_trace_cost.py OUT_DIR [--dry-run] [--budget-s 220]

For each history size (about 10,000 and 100,000 entries), a fresh process runs an IPython
InteractiveShell: ``%load_ext gpumem_nb``, ``import torch``, CUDA started by a first cell,
then three traced cells of the same loop (``torch.empty``/``del``: one allocation and two free
entries per turn). Per traced cell it writes what the cell's ``TraceResult`` says:

- ``snapshot_ms``: torch's ``_snapshot()`` (and the segments listed at the start);
- ``switch_ms``: ``_record_memory_history`` on and off;
- ``ours_ms``: gpumem_nb's own analysis (everything else the tracing added);
- ``added_ms``: the whole; ``cell_wall_ms`` the cell as the shell ran it;
- ``new_modules``: the modules first imported during that cell (what the first cell pays);
- for the first and second cell of one more process at 10,000 entries, a cProfile of the
  cell, gpumem_nb's functions first (``profile_top``).

Writes ``trace_cost_<card>.json`` (``h100``, ``h200``...). About 60-90 s on an H100; it starts
no process once ``--budget-s`` would be passed. ``--dry-run`` runs the same driver here on the
fake torch of ``tests/fakes.py`` (no GPU, no torch): the figures are then the CPU's alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = (10_000, 100_000)
CELLS = 3  # traced cells per process: the first, then later ones

DRIVER = """\
import cProfile, io, json, pstats, sys, time
sys.path.insert(0, {root!r})
from IPython.core.interactiveshell import InteractiveShell
{setup}
ip = InteractiveShell.instance()
def cell(src):
    t0 = time.perf_counter()
    r = ip.run_cell(src, store_history=True)
    if not r.success:
        raise SystemExit("cell failed: " + repr(r.error_in_exec or r.error_before_exec))
    return (time.perf_counter() - t0) * 1e3
cell("%load_ext gpumem_nb")
cell({start!r})
from gpumem_nb.kernel import current_monitor
rows = []
for i in range({cells}):
    before = set(sys.modules)
    prof = cProfile.Profile() if i < 2 and {profile} else None
    if prof is not None:
        prof.enable()
    wall_ms = cell("%%gpumem --trace -q\\n" + {body!r})
    if prof is not None:
        prof.disable()
    t = current_monitor(ip).last_trace
    row = {{"cell": "first" if i == 0 else "later", "index": i, "entries": t.entries,
           "added_ms": t.added_s * 1e3, "snapshot_ms": t.snapshot_s * 1e3,
           "switch_ms": t.switch_s * 1e3, "ours_ms": t.ours_s * 1e3,
           "cell_wall_ms": wall_ms,
           "new_modules": sorted(set(sys.modules) - before)}}
    if prof is not None:
        buf = io.StringIO()
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("cumulative").print_stats("gpumem_nb", 25)
        row["profile_top"] = buf.getvalue()[-6000:]
    rows.append(row)
print("@@" + json.dumps({{"rows": rows}}))
"""
REAL_SETUP = "import torch"
REAL_START = "import torch\ntorch.zeros(1, device='cuda')"
REAL_BODY = "for _ in range({turns}):\n    t = torch.empty(4096, device='cuda')\n    del t"
DRY_SETUP = ("from tests.fakes import FakeCuda, fake_torch\n"
             "sys.modules['torch'] = fake_torch(FakeCuda(initialized=True))")
DRY_START = "import torch"
DRY_BODY = "for _ in range({turns}):\n    t = torch.cuda.tensor(4096)\n    del t"
CARD = """\
import json, torch
p = torch.cuda.get_device_properties(0)
print("@@" + json.dumps({"name": p.name, "total": p.total_memory, "torch": torch.__version__}))
"""


def _payload(text: str) -> Any:
    for line in text.splitlines():
        if line.startswith("@@"):
            return json.loads(line[2:])
    return None


def _python(code: str, timeout_s: float) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout_s, cwd=str(ROOT))
    got = _payload(p.stdout)
    return got if got is not None else {"error": (p.stdout + p.stderr)[-3000:]}


def card_slug(name: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100"."""
    for word in name.lower().replace("-", " ").split():
        if word[:1] in "abhlv" and word[1:2].isdigit():
            return word
    return "gpu"


def run(entries: int, *, dry: bool, profile: bool, timeout_s: float) -> dict[str, Any]:
    turns = max(1, entries // 3)
    code = DRIVER.format(root=str(ROOT), setup=DRY_SETUP if dry else REAL_SETUP,
                         start=DRY_START if dry else REAL_START, cells=CELLS,
                         body=(DRY_BODY if dry else REAL_BODY).format(turns=turns),
                         profile=profile)
    return {"entries_asked": entries, "profiled": profile, **_python(code, timeout_s)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget-s", type=float, default=220.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    card = {"name": "CPU (dry run, fake torch)"} if args.dry_run else _python(CARD, 120)
    slug = "dry" if args.dry_run else card_slug(str(card.get("name", "")))
    doc: dict[str, Any] = {"card": card, "targets_ms": {"ours_at_10k": 50, "ours_at_100k": 100},
                           "runs": [], "skipped": []}
    path = out / f"trace_cost_{slug}.json"
    per_run_s = 90.0
    for entries, profile in ((10_000, False), (100_000, False), (10_000, True)):
        left = args.budget_s - (time.perf_counter() - t0)
        if left < per_run_s:
            doc["skipped"].append(f"{entries} entries, profiled={profile} (budget)")
            continue
        doc["runs"].append(run(entries, dry=args.dry_run, profile=profile,
                               timeout_s=min(per_run_s, left)))
        path.write_text(json.dumps(doc, indent=1))
    doc["table"] = [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()
                     if k not in ("profile_top", "new_modules")}
                    | {"new_modules": len(r.get("new_modules") or ())}
                    for run_ in doc["runs"] if not run_.get("profiled")
                    for r in run_.get("rows") or ()]
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(doc, indent=1))
    for r in doc["table"]:
        print(json.dumps(r))
    print("errors:", [r.get("error") for r in doc["runs"] if r.get("error")])
    print(f"wrote {path} in {doc['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
