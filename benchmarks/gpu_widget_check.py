"""The live chart on a real GPU, through a real kernel: count the widget updates that arrive
on IOPub during a 10 s training cell, then compare what the chart shows with
torch.cuda.memory_allocated / memory_reserved.

    python benchmarks/gpu_widget_check.py
"""

from __future__ import annotations

import json
import sys
import time

sys.path.insert(0, ".")

from benchmarks.common import emit

TRAIN = """
import time, torch
model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())
t_end = time.monotonic() + 10
steps = 0
while time.monotonic() < t_end:
    x = torch.randn(4096, 8192, device='cuda')
    model(x).square().mean().backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    steps += 1
torch.cuda.synchronize()
print(steps)
"""

CHECK = """
import json, time, torch
from gpumem_nb.magics import current_monitor
from gpumem_nb.units import format_bytes
mon = current_monitor()
mon.sampler.request_tick(); time.sleep(1.0)
w = mon.widget
alloc, reserved = torch.cuda.memory_allocated(0), torch.cuda.memory_reserved(0)
last = {k: float(ys[-1]) for k, (xs, ys) in w.chart.recent.items() if ys and ys[-1] is not None}
print(json.dumps({
    "memory_allocated": alloc, "memory_reserved": reserved,
    "chart_allocated_gib": last["allocated"], "chart_reserved_gib": last["reserved"],
    "torch_allocated_gib": alloc / 2**30, "torch_reserved_gib": reserved / 2**30,
    "header_shows_allocated": format_bytes(alloc) in w.header.value,
    "header_shows_reserved": format_bytes(reserved) in w.header.value,
    "draws": w.draws}))
"""


def main() -> None:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        for code in ("%load_ext gpumem_nb", "%gpumem watch"):
            kc.execute_interactive(code, timeout=120, output_hook=lambda m: None)
        msg_id = kc.execute(TRAIN)
        updates: list[float] = []
        bytes_sent = 0
        t0 = time.monotonic()
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update":
                updates.append(time.monotonic() - t0)
                bytes_sent += len(json.dumps(msg["content"], default=str)) + sum(
                    len(b) for b in msg.get("buffers", []))
            if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "idle"):
                break
        cell_s = time.monotonic() - t0
        out: list[str] = []
        kc.execute_interactive(CHECK, timeout=120, output_hook=lambda m: out.append(
            m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        check = json.loads("".join(out).strip().splitlines()[-1])
        seconds = sorted({int(t) for t in updates})
        emit("gpu_widget_check", {
            "training_cell_s": round(cell_s, 2),
            "widget_update_messages_during_cell": len(updates),
            "distinct_seconds_with_updates": len(seconds),
            "comm_kb_per_s_during_cell": round(bytes_sent / cell_s / 1000, 2),
            **check,
        })
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
