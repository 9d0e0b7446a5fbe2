"""In a real Jupyter kernel (jupyter_client, no GPU): `%gpumem whatif --trace` of a history whose
recorded PYTORCH_CUDA_ALLOC_CONF holds a lone surrogate and an ESC, and `%gpumem watch --replay`
of a trace whose child's cmdline holds the same. What reaches the client, and does the kernel
stay up?

    PYTHONPATH=. python benchmarks/attack36/kernel_surrogate.py
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.whatif_history import History  # noqa: E402

MiB = 1 << 20


def files(d: Path) -> tuple[Path, Path]:
    h = History()
    a = h.alloc(16 * MiB)
    h.alloc(8 * MiB)
    h.free(a)
    snap = h.snapshot()
    snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "\ud800\x1b[31m"
    w = d / "setting.json"
    w.write_text(json.dumps(snap))
    body = json.loads((ROOT / "gpumem_nb" / "data" / "h200_session.json").read_text())
    body["samples"] = body["samples"][:20]
    for s in body["samples"]:
        for dev in s["devices"]:
            dev["nvml"]["children"] = [{"pid": 7, "nbytes": MiB, "cmdline": "C\ud800\x1b[2J",
                                        "role": "other"}]
    r = d / "child.json"
    r.write_text(json.dumps(copy.deepcopy(body)))
    return w, r


def run(kc, code: str, timeout_s: float = 60) -> dict:
    msg_id = kc.execute(code)
    out = {"status": None, "outputs": [], "raw_esc": False, "surrogate_or_replacement": False}
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        t = msg["msg_type"]
        if t in ("stream", "display_data", "execute_result", "error"):
            text = json.dumps(msg["content"], ensure_ascii=False)
            out["outputs"].append(t)
            out["raw_esc"] |= "\x1b[31m" in text or "\x1b[2J" in text
            out["surrogate_or_replacement"] |= "\ufffd" in text or "\\ud800" in text
            if t == "error":
                out["error"] = msg["content"]["ename"] + ": " + msg["content"]["evalue"][:200]
        if t == "status" and msg["content"]["execution_state"] == "idle":
            out["status"] = "idle"
            break
    return out


def main() -> int:
    from jupyter_client.manager import start_new_kernel

    d = Path(tempfile.mkdtemp(prefix="a36k-"))
    w, r = files(d)
    env = dict(os.environ, HOME=str(d), GPUMEM_NB_CONFIG=str(d / "c.json"),
               PYTHONPATH=str(ROOT))
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        res = {"load": run(kc, "%load_ext gpumem_nb"),
               "whatif": run(kc, f"%gpumem whatif --trace {w}"),
               "replay": run(kc, f"%gpumem watch --replay {r}"),
               "after": run(kc, "1 + 1")}
        res["kernel_alive"] = km.is_alive()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    print(json.dumps(res, indent=1, ensure_ascii=True))
    bad = (res["whatif"]["raw_esc"] or res["replay"]["raw_esc"] or "error" in res["whatif"]
           or "error" in res["replay"] or not res["kernel_alive"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
