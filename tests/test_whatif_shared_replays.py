"""Settings that act alike on a history share its replays: a ``max_split_size_mb`` above every
block the history can make never marks one oversize, so its rows and its fit are the
defaults'. The shared answer must be the one a replay of its own gives, and a
``max_split_size_mb`` that some block reaches must still be replayed on its own."""

from __future__ import annotations

import random
from typing import Any

from gpumem_nb.whatif.api import whatif

MiB = 1 << 20


def _snapshot(sizes: tuple[int, ...], n: int = 600, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    live: list[tuple[int, int]] = []
    addr, t = 1 << 40, 1e6
    for _ in range(n):
        t += 5.0
        if live and rng.random() < 0.45:
            a, size = live.pop(rng.randrange(len(live)))
            for action in ("free_requested", "free_completed"):
                out.append({"action": action, "addr": a, "size": size, "stream": 0,
                            "time_us": t})
            continue
        size = rng.choice(sizes)
        out.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": t})
        live.append((addr, size))
        addr += 1 << 30
    return {"segments": [], "device_traces": [out],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _fit_row(snap: dict[str, Any], settings: list[str], label: str) -> Any:
    w = whatif(snap, settings, fit=True)
    return next(r for r in w.fit.rows if r.label == label), w


def _replays_made(monkeypatch: Any, snap: dict[str, Any], settings: list[str]) -> int:
    """Every replay a what-if with ``--fit`` makes: its rows' and its capped ones."""
    from gpumem_nb.whatif import api, fit

    made = []
    for module in (api, fit):
        real = module.replay
        monkeypatch.setattr(module, "replay",
                            lambda *a, _real=real, **k: made.append(1) or _real(*a, **k))
    whatif(snap, settings, fit=True)
    monkeypatch.undo()
    return len(made)


def test_a_max_split_no_block_reaches_shares_the_defaults_replays_and_answer(monkeypatch):
    snap = _snapshot((512, 65536, 700_000, 3 * MiB, 12 * MiB))
    shared, w = _fit_row(snap, ["", "max_split_size_mb:128"], "max_split_size_mb:128")
    alone, w1 = _fit_row(snap, ["max_split_size_mb:128"], "max_split_size_mb:128")
    assert shared.replays == 0 and shared.note.startswith("as defaults") and not alone.note
    # Shared, not replayed again: the pair costs what the defaults alone cost.
    assert _replays_made(monkeypatch, snap, ["", "max_split_size_mb:128"]) == \
        _replays_made(monkeypatch, snap, [""])
    assert shared.min_bytes == alone.min_bytes  # and the same answer a replay gives
    assert w[1].peak_reserved_bytes == w1[0].peak_reserved_bytes


def test_a_max_split_some_block_reaches_is_replayed_on_its_own():
    snap = _snapshot((8 * MiB, 150 * MiB, 300 * MiB), n=300, seed=1)
    row, _w = _fit_row(snap, ["", "max_split_size_mb:128"], "max_split_size_mb:128")
    alone, _ = _fit_row(snap, ["max_split_size_mb:128"], "max_split_size_mb:128")
    assert not row.note
    assert row.min_bytes == alone.min_bytes


def test_a_max_split_above_every_segment_shares_though_twice_the_largest_request_reaches_it():
    # Without roundup_power2_divisions a 64 MiB request makes a 66 MiB segment at most: twice
    # the request (130 MiB) was the bound for every setting, and max_split_size_mb:128 was
    # replayed again for the defaults' answer.
    snap = _snapshot((8 * MiB, 64 * MiB + 4096, 30 * MiB), n=300, seed=2)
    shared, w = _fit_row(snap, ["", "max_split_size_mb:128"], "max_split_size_mb:128")
    alone, w1 = _fit_row(snap, ["max_split_size_mb:128"], "max_split_size_mb:128")
    assert shared.note.startswith("as defaults") and not alone.note
    assert shared.min_bytes == alone.min_bytes
    assert w[1].peak_reserved_bytes == w1[0].peak_reserved_bytes
    # Rounded by powers of two, the same request may reach it: replayed on its own.
    rounded, _ = _fit_row(snap, ["roundup_power2_divisions:2",
                                 "roundup_power2_divisions:2,max_split_size_mb:128"],
                          "roundup_power2_divisions:2,max_split_size_mb:128")
    assert not rounded.note
