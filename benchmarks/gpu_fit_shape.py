"""Is a session's fit monotonic in the room? One session recorded in a fresh IPython shell
(``gpu_session.fc_record``), its history kept (``session_<name>.pkl.gz``, frames left out),
then real runs capped at fractions of the predicted minimum, one process at a time.

    python3 benchmarks/gpu_fit_shape.py OUT [--session kv_cache_growth_by_cat]
        [--at -0.04,-0.03,-0.02,-0.01,0,0.01] [--budget-s 240]

A real run that fits below a cap at which another runs out says the search for "the"
minimum assumes an order the allocator does not keep."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_session as g


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--session", default="kv_cache_growth_by_cat")
    ap.add_argument("--at", default="-0.04,-0.03,-0.02,-0.01,0,0.01")
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    out = Path(args.out)
    t0 = time.perf_counter()
    keep = out / f"session_{args.session}.pkl.gz"
    os.environ["GPUMEM_KEEP_SNAPSHOT"] = str(keep)
    rec = g.fc_record(args.session, 120.0)
    doc: dict = {"session": args.session, "record": rec, "runs": []}
    fit = {r["setting"]: r for r in rec.get("fit") or ()}
    need = (fit.get("") or {}).get("min_bytes")
    total = rec.get("total")
    for d in (float(x) for x in args.at.split(",")):
        if not need or not total or time.perf_counter() - t0 > args.budget_s - 40:
            doc["runs"].append({"at": d, "skipped": True})
            continue
        frac = min(need * (1 + d) / total, 1.0)
        r = g.fc_real(args.session, "", frac, 45.0)
        doc["runs"].append({"at": d, "fraction": frac, **r})
        print(json.dumps(doc["runs"][-1]), flush=True)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / f"fit_shape_{args.session}.json").write_text(json.dumps(doc, indent=1))
    print("predicted min", need, "total", total, "wall", doc["wall_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
