"""A faster replay that predicts something else would be checked against real GPUs no more:
the replay and the fit search are held, every field of every replay (each change of
reserved, each limit check's demand record) and every fit's minimum, to a frozen copy of
the model as it was before its hot loop was inlined (``tests/whatif_frozen``), on many
generated histories: training loops with a side stream and ``empty_cache``, random sizes,
``torch.cat`` growth, random mixes with OOM entries and frees of allocations made before
the history, from an empty GPU and from start segments; unlimited, capped (through the
free-the-cache-and-retry path), stopped at the first OOM, and with progress reported."""

from __future__ import annotations

import dataclasses
import importlib
import random
from typing import Any

import pytest

from gpumem_nb.whatif import fit as fit_now
from gpumem_nb.whatif.allocator import DeviceCachingAllocator, Limits
from gpumem_nb.whatif.config import parse_settings
from gpumem_nb.whatif.replay import compile_trace, replay

from .whatif_expected import cat_growth, random_sizes, training
from .whatif_frozen import capped as capped_frozen
from .whatif_frozen import fit as fit_then
from .whatif_frozen import replay as replay_then
from .whatif_history import History

# The package's ``replay`` is the function: the module is read from sys.modules.
replay_module = importlib.import_module("gpumem_nb.whatif.replay")

MiB = 1 << 20
GiB = 1 << 30
SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:128",
            "roundup_power2_divisions:4", "roundup_power2_divisions:[256:2,>:8]",
            "max_non_split_rounding_mb:64,max_split_size_mb:40",
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
            "max_split_size_mb:32,expandable_segments:True")
START_BASE = 0x7E00_0000_0000


def mixed(seed: int, n: int = 3000) -> tuple[History, list[dict[str, Any]]]:
    """Random sizes on two streams, frees at once or waiting on an event, ``oom`` entries,
    ``empty_cache``, allocations at an address still live (an entry lost), and start
    segments (returned with it; some expandable, some blocks waiting on an event) whose
    blocks the history frees and completes."""
    rng = random.Random(seed)
    h = History()
    segments: list[dict[str, Any]] = []
    start_live: list[tuple[int, int]] = []
    start_waiting: list[tuple[int, int]] = []
    if seed % 2:
        for k in range(rng.randrange(1, 5)):
            base = START_BASE + (k << 32)
            small = rng.random() < 0.3
            expandable = not small and seed % 4 == 3 and k == 0
            total = (2 * MiB) if small else rng.choice((20, 40, 60)) * MiB
            blocks, at = [], base
            while at < base + total:
                size = min(rng.choice((512, 4096, MiB // 2, 2 * MiB, 6 * MiB)), base + total - at)
                state = rng.choice(("active_allocated", "inactive", "active_allocated",
                                    "active_pending_free"))
                blocks.append({"address": at, "size": size, "state": state})
                if state == "active_allocated":
                    start_live.append((at, size))
                elif state == "active_pending_free":
                    start_waiting.append((at, size))
                at += size
            segments.append({"address": base, "total_size": total, "stream": 0, "device": 0,
                             "segment_type": "small" if small else "large",
                             "is_expandable": expandable, "blocks": blocks})
    live: list[tuple[int, int]] = []
    waiting: list[tuple[int, int]] = []
    sizes = (512, 3000, 65536, 700_000, MiB + 512, 3 * MiB, 12 * MiB, 25 * MiB, 150 * MiB)
    while len(h.entries) < n:
        r = rng.random()
        if r < 0.3 and live:
            addr, stream = live.pop(rng.randrange(len(live)))
            if stream and rng.random() < 0.6:
                h.free(addr, stream, completed=False)
                waiting.append((addr, stream))
            else:
                h.free(addr, stream)
        elif r < 0.36 and waiting:
            h.complete(*waiting.pop(rng.randrange(len(waiting))))
        elif r < 0.38 and start_live:
            addr, size = start_live.pop(rng.randrange(len(start_live)))
            h._sizes[addr] = size
            h.free(addr)
        elif r < 0.385:
            h.empty_cache(MiB)
        elif r < 0.387 and start_waiting:
            addr, size = start_waiting.pop(rng.randrange(len(start_waiting)))
            h._entry("free_completed", addr, size, 0)
        elif r < 0.389 and live:
            addr, stream = live[rng.randrange(len(live))]
            h._entry("alloc", addr, rng.choice(sizes), stream)
        elif r < 0.39:
            h._entry("oom", 0, rng.choice(sizes), 0)
        else:
            stream = 7 if rng.random() < 0.15 else 0
            live.append((h.alloc(rng.choice(sizes) + rng.randrange(0, 4096, 512), stream),
                         stream))
    return h, segments


def _histories() -> dict[str, tuple[History, list[dict[str, Any]]]]:
    out: dict[str, tuple[History, list[dict[str, Any]]]] = {}
    for seed in range(3):
        out[f"training_{seed}"] = (training(seed + 10, 3000), [])
        out[f"random_sizes_{seed}"] = (random_sizes(seed + 10, 3000), [])
    for seed in range(6):
        out[f"mixed_{seed}"] = mixed(seed)
    out["cat_growth"] = (cat_growth(64 * MiB + 123 * 512, 40, 3 * MiB), [])
    return out


_HISTORIES = _histories()


def _fields(r: Any) -> dict[str, Any]:
    # Every field, demand_records too (left out of the dataclass's ==).
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}


def _both(h: History, segments: list[dict[str, Any]], setting: str, **kw: Any,
          ) -> tuple[dict[str, Any], dict[str, Any]]:
    s = parse_settings(setting)
    now = replay(compile_trace(h.entries), s, start_segments=segments,
                 device_total_bytes=80 * GiB, **kw)
    then = replay_then.replay(replay_then.compile_trace(h.entries), s, start_segments=segments,
                              device_total_bytes=80 * GiB, **kw)
    return _fields(now), _fields(then)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", sorted(_HISTORIES))
def test_a_replay_gives_every_figure_the_frozen_model_gave(name, setting):
    h, segments = _HISTORIES[name]
    now, then = _both(h, segments, setting)
    assert now == then
    peak = now["peak_reserved_bytes"]
    ticks: list[tuple[int, int]] = []
    for cap in (0.5, 0.7, 0.9):
        room = int(peak * cap)
        limits = Limits(allowed_bytes=room, capacity_bytes=room)
        now, then = _both(h, segments, setting, limits=limits)
        assert now == then
        now, then = _both(h, segments, setting, limits=limits, stop_at_oom=True,
                          progress=lambda i, n: ticks.append((i, n)))
        assert now == then


def _min_room(module: Any, replay_of: Any, h: History, segments: list[dict[str, Any]],
              setting: str) -> tuple[int | None, int]:
    s = parse_settings(setting)
    trace = replay_of.compile_trace(h.entries)
    r = replay_of.replay(trace, s, start_segments=segments, device_total_bytes=80 * GiB)
    return module.min_room(trace, s, start_segments=segments, device=0,
                           start_page_bytes=s.large_segment_size,
                           unlimited_peak_bytes=r.peak_reserved_bytes,
                           peak_allocated_bytes=r.peak_allocated_bytes,
                           device_total_bytes=80 * GiB,
                           unlimited_max_demand_bytes=r.max_demand_bytes,
                           demand_records=r.demand_records)


@pytest.mark.parametrize("setting", ("", "expandable_segments:True",
                                     "roundup_power2_divisions:4", "max_split_size_mb:64"))
@pytest.mark.parametrize("name", ["training_0", "random_sizes_0", "mixed_0", "mixed_1",
                                  "cat_growth"])
def test_a_fit_finds_the_minimum_the_frozen_search_found(name, setting):
    # The package's ``replay`` is the function: the module is read from sys.modules.
    replay_now = importlib.import_module("gpumem_nb.whatif.replay")
    h, segments = _HISTORIES[name]
    got = _min_room(fit_now, replay_now, h, segments, setting)
    assert got == _min_room(fit_then, replay_then, h, segments, setting)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", ["training_0", "random_sizes_1", "mixed_2", "mixed_3"])
def test_the_inline_loops_replay_as_the_models_methods_do(name, setting):
    # An on_event replay takes each event through the model's own methods.
    h, segments = _HISTORIES[name]
    s = parse_settings(setting)
    trace = compile_trace(h.entries)
    for limits in (None, Limits(allowed_bytes=600 * MiB, capacity_bytes=700 * MiB)):
        inline = replay(trace, s, limits=limits, start_segments=segments,
                        device_total_bytes=80 * GiB)
        methods = replay(trace, s, limits=limits, start_segments=segments,
                         device_total_bytes=80 * GiB, on_event=lambda i, m, live: None)
        assert _fields(inline) == _fields(methods)


# -- capped far below the peak: many OOMs, each with its last retry ------------------------
# Each case runs out again and again (the replay carries on past each OOM), so the release
# pass before each one (``release_cached_blocks``), ``release_available_cached_blocks`` and
# the GC run hundreds of times over pools of split blocks. Their outcomes were frozen from
# the model before its release pass kept its releasable blocks apart
# (``whatif_frozen/capped.py``).
CAPPED_SETTINGS = ("", "expandable_segments:True", "max_split_size_mb:64",
                   "garbage_collection_threshold:0.6", "roundup_power2_divisions:4",
                   "garbage_collection_threshold:0.6,expandable_segments:True",
                   "garbage_collection_threshold:0.8,max_split_size_mb:64",
                   "max_split_size_mb:32,expandable_segments:True")
CAPPED_HISTORIES = ("training_0", "random_sizes_0", "random_sizes_1", "mixed_1", "mixed_2",
                    "mixed_3", "cat_growth")
# (the cap as a fraction of the unlimited peak, which limits it sets)
CAPS = ((0.25, "both"), (0.5, "both"), (0.3, "capacity"))


def _capped_run(name: str, setting: str, room: int, which: str, path: str) -> Any:
    h, segments = _HISTORIES[name]
    limits = Limits(allowed_bytes=None if which == "capacity" else room, capacity_bytes=room)
    kw: dict[str, Any] = {}
    if path == "methods":
        kw["on_event"] = lambda i, m, live: None
    elif path == "chunks":
        kw["progress"] = lambda i, n: None
    return lambda: replay(compile_trace(h.entries), parse_settings(setting), limits=limits,
                          start_segments=segments, device_total_bytes=80 * GiB, **kw)


def _capped_cases() -> Any:
    for name in CAPPED_HISTORIES:
        for setting in CAPPED_SETTINGS:
            for frac, which in CAPS:
                yield f"{name}|{setting}|{frac}|{which}", name, setting, frac, which


def freeze_capped() -> None:
    """Write ``whatif_frozen/capped_outcomes.json`` from the model as it is (see there)."""
    out: dict[str, dict[str, Any]] = {}
    for key, name, setting, frac, which in _capped_cases():
        h, segments = _HISTORIES[name]
        peak = replay(compile_trace(h.entries), parse_settings(setting),
                      start_segments=segments, device_total_bytes=80 * GiB).peak_reserved_bytes
        room = int(peak * frac)
        got = capped_frozen.outcome(_capped_run(name, setting, room, which, "inline"))
        out[key] = {"room_bytes": room, **got}
    capped_frozen.write(out)


_CAPPED = capped_frozen.load()


@pytest.mark.parametrize("path", ("inline", "methods", "chunks"))
@pytest.mark.parametrize("key", sorted(_CAPPED))
def test_a_replay_past_many_ooms_gives_what_the_frozen_model_gave(key, path):
    name, setting, _frac, which = key.split("|")
    want = _CAPPED[key]
    got = capped_frozen.outcome(_capped_run(name, setting, want["room_bytes"], which, path))
    assert {"room_bytes": want["room_bytes"], **got} == want


def test_the_capped_cases_run_out_many_times_and_give_segments_back():
    # A case that never ran out, or whose retries never freed anything, would hold the
    # release paths to nothing.
    assert len(_CAPPED) == len(list(_capped_cases()))
    ooms = sorted(v["ooms"] for v in _CAPPED.values())
    assert ooms[len(ooms) // 4] >= 20
    assert sum(v["ooms"] >= 100 for v in _CAPPED.values()) >= len(_CAPPED) // 3
    assert sum(v["segment_frees"] > 0 for v in _CAPPED.values()) >= len(_CAPPED) * 3 // 4


class _Checked(DeviceCachingAllocator):
    """The model, checking at each general step (a request no free block served, a
    deferred free, ``empty_cache``) that each pool's releasable keys are those a walk of
    all its free blocks finds: the inline loops keep them too."""

    checks = 0

    def _check(self) -> None:
        for pool in self.pools.values():
            assert pool.releasable == {k for k, b in pool.blocks.items()
                                       if b.nonrel < b.size}
        _Checked.checks += 1

    def _malloc(self, *args: Any) -> Any:
        self._check()
        got = super()._malloc(*args)
        self._check()
        return got

    def release_cached_blocks(self) -> None:
        self._check()
        super().release_cached_blocks()
        self._check()


@pytest.mark.parametrize("path", ("inline", "methods"))
@pytest.mark.parametrize("setting", CAPPED_SETTINGS)
@pytest.mark.parametrize("name", ("training_0", "random_sizes_0", "mixed_2", "mixed_3"))
def test_each_pool_knows_its_releasable_blocks_on_every_path(name, setting, path, monkeypatch):
    monkeypatch.setattr(replay_module, "DeviceCachingAllocator", _Checked)
    h, segments = _HISTORIES[name]
    before = _Checked.checks
    for room in (None, 300 * MiB):
        _capped_run(name, setting, room, "both", path)() if room else replay(
            compile_trace(h.entries), parse_settings(setting), start_segments=segments,
            device_total_bytes=80 * GiB,
            **({"on_event": lambda i, m, live: None} if path == "methods" else {}))
    assert _Checked.checks > before
