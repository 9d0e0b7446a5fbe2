"""Is a history's fit monotonic in the room? The cells of ``gpu_session.py``'s
``kv_cache_growth_by_cat`` written as a synthetic history (16 tensors grown by ``torch.cat``
for 600 steps, the last 300 with a float32 copy and a softmax; B as on an H100 of
85,017,493,504 bytes), its ``--fit`` minimum, then the replay capped from +2% of that minimum
down in 0.2% steps, and from it down to -40% in 0.5% steps. No GPU, no torch:

    python benchmarks/whatif_fit_shape_cpu.py [--out benchmarks/results/whatif_fit_shape_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpumem_nb.whatif import api as w
from gpumem_nb.whatif.config import parse_settings
from gpumem_nb.whatif.fit import _room_limits
from gpumem_nb.whatif.replay import compile_trace, replay
from tests.whatif_expected import KV_TOTAL_BYTES as TOTAL_BYTES
from tests.whatif_expected import kv_cat_growth as kv_history


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    h = kv_history()
    res = w.whatif(h.snapshot(), [""], fit=True, capacity_bytes=TOTAL_BYTES,
                   total_bytes=TOTAL_BYTES)
    need = res.fit.rows[0].min_bytes
    assert need is not None
    trace, s = compile_trace(h.entries), parse_settings("")
    scan = []
    for step in range(31):
        at = 0.02 - 0.002 * step
        room = int(need * (1 + at))
        r = replay(trace, s, limits=_room_limits(s, room), start_segments=[], stop_at_oom=True,
                   device_total_bytes=TOTAL_BYTES)
        scan.append({"at": round(at, 4), "room_bytes": room, "fits": not r.oom})
    wide = []
    for step in range(81):
        at = -0.005 * step
        r = replay(trace, s, limits=_room_limits(s, int(need * (1 + at))), start_segments=[],
                   stop_at_oom=True, device_total_bytes=TOTAL_BYTES)
        wide.append(not r.oom)
    doc = {"events": len(h.entries), "fit_min_bytes": need,
           "fit_replays": res.fit.rows[0].replays, "scan": scan,
           "picture": "".join("F" if x["fits"] else "." for x in scan),
           "picture_means": "from +2% of the minimum down to -4% in 0.2% steps; F fits",
           "wide_picture": "".join("F" if f else "." for f in wide),
           "wide_means": "from the minimum down to -40% in 0.5% steps; F fits"}
    print(json.dumps({k: v for k, v in doc.items() if k != "scan"}))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
