"""Varied histories whose replays were recorded with the model as it was before it was made
fast (issue 37, at 5828ffb): ``tests/data/whatif_expected_replays.json`` holds what each
replay gave then, and ``test_whatif_fast.py`` checks the fast path gives the same, field by
field. ``python -m tests.whatif_expected`` rewrote that file; it must never be rewritten by
code newer than the model it pins."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from .whatif_history import History

MiB = 1 << 20
GiB = 1 << 30
DATA = Path(__file__).parent / "data" / "whatif_expected_replays.json"
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:128",
            "roundup_power2_divisions:4", "garbage_collection_threshold:0.6",
            "max_split_size_mb:32,expandable_segments:True")
FIELDS = ("peak_reserved_bytes", "end_reserved_bytes", "start_reserved_bytes",
          "peak_allocated_bytes", "inactive_split_bytes", "segment_allocs", "segment_frees",
          "num_alloc_retries", "oom", "oom_event", "oom_requested_bytes", "unmatched_frees")


def training(seed: int, n: int = 6000) -> History:
    """Weights that stay, activations freed in reverse, temporaries, small tensors, a batch
    size that changes, a side stream whose frees wait on an event, now and then an
    ``empty_cache``."""
    rng = random.Random(seed)
    h = History()
    for _ in range(20):
        h.alloc(rng.choice((4, 16, 64)) * MiB + rng.randrange(0, MiB, 512))
    batch = 8
    while len(h.entries) < n:
        batch = rng.choice((6, 7, 8, 9, 10)) if rng.random() < 0.2 else batch
        acts = []
        for _ in range(12):
            acts.append(h.alloc(batch * rng.choice((1, 3)) * MiB + rng.randrange(0, MiB, 512)))
            tmp = h.alloc(batch * 2 * MiB)
            small = h.alloc(rng.choice((512, 4096, 65536, 700_000)))
            h.free(tmp)
            h.free(small)
            if rng.random() < 0.1:
                side = h.alloc(5 * MiB, stream=7)
                h.free(side, 7, completed=False)
                h.complete(side, 7)
        for a in reversed(acts):
            g = h.alloc(h._sizes[a])
            h.free(a)
            h.free(g)
        if rng.random() < 0.05:
            h.empty_cache(MiB)
    return h


def random_sizes(seed: int, n: int = 6000) -> History:
    """The review's shape: allocations of 5 sizes in random order, a third of them freed."""
    rng = random.Random(seed)
    h = History()
    live: list[int] = []
    sizes = (512, 65536, 700_000, 3 * MiB, 12 * MiB, 150 * MiB)
    while len(h.entries) < n:
        if live and rng.random() < 0.3:
            h.free(live.pop(rng.randrange(len(live))))
        else:
            live.append(h.alloc(rng.choice(sizes) + rng.randrange(0, 4096)))
    return h


def cat_growth(step: int, n: int, chunk: int) -> History:
    """A tensor grown by ``torch.cat``: each step allocates a piece and the longer tensor,
    then frees the old one and the piece."""
    h = History()
    x = h.alloc(step)
    for i in range(2, n + 1):
        y = h.alloc(chunk)
        nx = h.alloc(i * step)
        h.free(x)
        h.free(y)
        x = nx
    return h


def histories() -> dict[str, History]:
    return {"training_0": training(0), "training_1": training(1),
            "random_sizes_0": random_sizes(0), "random_sizes_1": random_sizes(1),
            "cat_growth": cat_growth(64 * MiB + 123 * 512, 60, 3 * MiB),
            "cat_growth_small_steps": cat_growth(7 * MiB + 4096, 120, 7 * MiB + 4096)}


def cases() -> list[dict[str, Any]]:
    """Each history under each setting: unlimited, and capped at 60% and 85% of the
    unlimited peak (the free-the-cache-and-retry path)."""
    out = []
    for name in histories():
        for setting in SETTINGS:
            for cap in (None, 0.6, 0.85):
                out.append({"history": name, "setting": setting, "cap_of_peak": cap})
    return out


def replay_case(h: History, setting: str, cap_of_peak: float | None,
                unlimited_peak: int | None) -> dict[str, Any]:
    from gpumem_nb.whatif.allocator import Limits
    from gpumem_nb.whatif.config import parse_settings
    from gpumem_nb.whatif.replay import compile_trace, replay

    s = parse_settings(setting)
    trace = compile_trace(h.entries)
    limits = None
    if cap_of_peak is not None:
        assert unlimited_peak is not None
        room = int(unlimited_peak * cap_of_peak)
        limits = Limits(allowed_bytes=room, capacity_bytes=room)
    r = replay(trace, s, limits=limits, start_segments=[], device_total_bytes=80 * GiB)
    out = {f: getattr(r, f) for f in FIELDS}
    out["changes"] = len(r.changes)
    out["changes_sum"] = sum(i * 31 + v for i, v in r.changes) % (1 << 61)
    return out


def compute() -> list[dict[str, Any]]:
    hs = histories()
    peaks: dict[tuple[str, str], int] = {}
    out = []
    for c in cases():
        h = hs[c["history"]]
        key = (c["history"], c["setting"])
        got = replay_case(h, c["setting"], c["cap_of_peak"], peaks.get(key))
        if c["cap_of_peak"] is None:
            peaks[key] = got["peak_reserved_bytes"]
        out.append({**c, "expected": got})
    return out


if __name__ == "__main__":
    DATA.write_text(json.dumps({"model_commit": "5828ffb", "cases": compute()}, indent=1))
    print(f"wrote {DATA}")


KV_TOTAL_BYTES = 85_017_493_504  # the H100's torch.cuda.mem_get_info()[1]


def kv_cat_growth() -> History:
    """``benchmarks/gpu_session.py``'s ``kv_cache_growth_by_cat`` on the H100 it ran on: 16
    tensors grown by ``torch.cat`` for 600 steps, the last 300 with a float32 copy and a
    softmax. Its fit under the defaults is the H100 session's to the byte."""
    b = max(1, int(20 * (KV_TOTAL_BYTES // 100) // (2 * 8 * 16 * 128 * 2 * 600)))
    unit = b * 16 * 128 * 2  # one step of one layer, float16
    h = History()
    k: list[int | None] = [None] * 8
    v: list[int | None] = [None] * 8
    new: int | None = None
    for t in range(600):
        for layer in range(8):
            piece = h.alloc(unit)
            if new is not None:
                h.free(new)
            new = piece
            for cache in (k, v):
                grown = h.alloc(unit * (t + 1))
                old = cache[layer]
                if old is not None:
                    h.free(old)
                cache[layer] = grown
        if t >= 300:
            as_float = h.alloc(b * 16 * (t + 1) * 128 * 4)
            summed = h.alloc(b * 16 * (t + 1) * 4)
            h.free(as_float)
            scores = h.alloc(b * 16 * (t + 1) * 4)
            h.free(summed)
            h.free(scores)
    return h
