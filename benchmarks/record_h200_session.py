"""Record the bundled demo trace (gpumem_nb/data/h200_session.json) on a real GPU.

A scripted notebook-like session, sampled every 0.25 s by the live source: idle, CUDA starts,
weights load, training steps with activation spikes, `del` (the cache keeps the memory),
`empty_cache` (NVML drops), then a re-run accumulation held by a list, and its cleanup.

    python benchmarks/record_h200_session.py OUT.json
"""

from __future__ import annotations

import sys
import time

sys.path.insert(0, ".")


def main(path: str) -> None:
    from gpumem_nb.sampler import Sampler
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.replay import write_trace

    src = LiveSource()
    sampler = Sampler(src, interval_s=0.25)
    sampler.start()
    time.sleep(2.0)  # idle: torch not imported yet
    import torch

    GiB = 1 << 30
    torch.zeros(1, device="cuda")
    time.sleep(1.5)
    weights = torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
    time.sleep(1.5)
    for _ in range(12):  # training steps: activations come and go
        acts = torch.empty(6 * GiB, dtype=torch.uint8, device="cuda")
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU work
        torch.cuda.synchronize()
        del acts
        time.sleep(0.35)
    del weights
    time.sleep(2.0)  # allocated fell, reserved and NVML did not
    torch.cuda.empty_cache()
    time.sleep(2.0)
    kept = []
    for _ in range(6):  # a re-run cell whose results stay referenced
        kept.append(torch.empty(2 * GiB, dtype=torch.uint8, device="cuda"))
        time.sleep(1.0)
    time.sleep(1.0)
    kept.clear()
    time.sleep(1.0)
    torch.cuda.empty_cache()
    time.sleep(2.0)
    sampler.stop()
    name = torch.cuda.get_device_name(0)
    write_trace(path, sampler.samples(), note=(
        f"Recorded on an {name} with torch {torch.__version__}: idle, CUDA start, 8 GiB "
        "weights, 12 steps with 6 GiB activation spikes, del, empty_cache, six re-runs "
        "keeping 2 GiB each, cleanup."))
    print(f"wrote {len(sampler.samples())} samples to {path}")


if __name__ == "__main__":
    main(sys.argv[1])
