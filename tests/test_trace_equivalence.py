"""The one-pass trace analysis gives what the two-pass replay gave (tests/trace_reference.py),
on histories shaped as torch writes them and on odd ones: the report's sites, bytes and
counts, the peak, the OOM, the timeline's points, the skipped count, the window.

The fast analysis reads a frame once per analysis by identity, remembers stacks by their
frame objects, and rebuilds who was live at an instant from each allocation's span: each of
those could give another site or another number if it were wrong."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpumem_nb.trace import analyze

from .trace_reference import reference_analyze

TORCH = "/opt/venv/lib/python3.12/site-packages/torch/"
IPY = "/opt/venv/lib/python3.12/site-packages/IPython/core/"
SKIP = (TORCH, "/opt/venv/lib/python3.12/site-packages/IPython/")
CELL = "/tmp/ipykernel_77/{}.py"


class Entry(Mapping[str, Any]):
    """A history entry that is a Mapping but not a dict (a user's own recording)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self._d = d

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


def random_history(seed: int, n: int) -> tuple[list[Any], float | None]:
    rng = random.Random(seed)
    pool: dict[tuple[str, int, str], dict[str, Any]] = {}

    def fr(filename: str, line: int, name: str) -> dict[str, Any]:
        # shared by identity, as torch's symbolizer shares them; now and then a copy
        f = pool.setdefault((filename, line, name), {"filename": filename, "line": line,
                                                     "name": name})
        return dict(f) if rng.random() < 0.05 else f

    outer = [fr(IPY + "interactiveshell.py", 3577, "run_code"),
             fr(CELL.format(1), 1, "<module>"),
             fr(IPY + "interactiveshell.py", 3517, "run_ast_nodes")]

    def stack() -> list[Any]:
        kind = rng.randrange(10)
        body = fr(CELL.format(2), rng.randint(1, 4), "<module>")
        if kind == 0:
            return []
        if kind == 1:  # torch and IPython only: no user frame
            return [fr(TORCH + "nn/functional.py", 2000, "linear"), *outer[::2]]
        inner = [fr(TORCH + "nn/modules/linear.py", 125, "forward"),
                 fr("/home/u/model.py", rng.randint(10, 12), "forward")] * rng.randint(0, 2)
        if kind == 2:  # a function of the user's called from a stdlib-free helper file
            inner.insert(0, fr("/home/u/util.py", 5, "helper"))
        frames = [*inner, body, *outer]
        if kind == 3:  # a build that records outermost first
            frames.reverse()
        if kind == 4:  # no cell on the way out
            frames = [*inner, fr("/home/u/run.py", 9, "main")]
        return frames

    odd: list[Any] = [None, "alloc", {"action": "alloc", "addr": 3, "size": "big"},
                      {"action": "alloc", "addr": 4, "size": 8, "time_us": float("nan")},
                      {"action": 7}, {"action": "oom", "size": 10**400},
                      {"action": "alloc", "addr": 5, "size": 8, "frames": 42},
                      {"action": "alloc", "addr": 6, "size": 8,
                       "frames": [{"filename": "f.py", "line": "x", "name": "g"}]},
                      # a bad frame past where the reading stops: read as before, or not
                      {"action": "alloc", "addr": 7, "size": 8, "time_us": None,
                       "frames": [fr(CELL.format(2), 1, "<module>"), "not a frame",
                                  fr(IPY + "interactiveshell.py", 1, "run_code")]},
                      {"action": "alloc", "addr": 8, "size": 8,
                       "frames": [fr(TORCH + "a.py", 1, "f"), "not a frame",
                                  fr(IPY + "interactiveshell.py", 1, "run_code")]}]
    live: list[int] = []
    out: list[Any] = []
    t = 1e12
    since = None
    for i in range(n):
        t += rng.choice((0, 1, 5, 30))
        if since is None and i == n // 3 and rng.random() < 0.6:
            since = t  # the cell starts here: earlier entries are not its own
        r = rng.random()
        if r < 0.02:
            out.append(rng.choice(odd))
        elif r < 0.45 or not live:
            addr = rng.choice(live) if live and rng.random() < 0.03 else rng.randrange(1 << 40)
            e = {"action": "alloc", "addr": addr, "size": rng.choice((0, 512, 4096, 1 << 20)),
                 "stream": 0, "time_us": t, "frames": stack()}
            out.append(Entry(e) if rng.random() < 0.02 else e)
            live.append(addr)
        elif r < 0.85:
            addr = live.pop(rng.randrange(len(live)))
            out.append({"action": "free_requested", "addr": addr, "size": 0, "time_us": t})
            if rng.random() < 0.9:
                out.append({"action": "free_completed", "addr": addr, "size": 0,
                            "time_us": t + 1})
        elif r < 0.92:  # completed without a request (a history that skipped those)
            addr = live.pop(rng.randrange(len(live)))
            out.append({"action": "free_completed", "addr": addr, "size": 0, "time_us": t})
        elif r < 0.95:
            out.append({"action": "oom", "size": rng.randrange(1 << 30), "time_us": t,
                        "device_free": 0})
        elif r < 0.97:
            out.append({"action": "segment_alloc", "addr": rng.randrange(1 << 40),
                        "size": 2 << 20, "time_us": t, "frames": stack()})
        else:
            out.append({"action": "alloc", "size": 64, "time_us": rng.choice((t, None))})
    return out, since


@pytest.mark.parametrize("seed", range(40))
def test_the_one_pass_analysis_gives_what_the_two_pass_replay_gave(seed):
    entries, since = random_history(seed, 300 if seed % 4 else 4000)
    top = 3 if seed % 5 == 0 else 5
    fast = analyze(entries, since_us=since, skip=SKIP, top=top)
    assert fast == reference_analyze(entries, since_us=since, skip=SKIP, top=top)
    assert fast.allocations  # the histories exercise the report, not an empty one


def test_a_stack_seen_again_with_another_middle_frame_is_read_again():
    """Two stacks with the same innermost and outermost frame and depth: the second must
    not be answered from the first's reading."""
    lib = {"filename": TORCH + "nn/modules/linear.py", "line": 125, "name": "forward"}
    end = {"filename": IPY + "interactiveshell.py", "line": 3577, "name": "run_code"}
    a = {"filename": "/home/u/model.py", "line": 10, "name": "forward"}
    b = {"filename": "/home/u/model.py", "line": 20, "name": "forward"}
    cell = {"filename": CELL.format(3), "line": 4, "name": "<module>"}
    entries = [{"action": "alloc", "addr": 1, "size": 100, "time_us": 1.0,
                "frames": [lib, a, cell, end]},
               {"action": "alloc", "addr": 2, "size": 300, "time_us": 2.0,
                "frames": [lib, b, cell, end]}]
    d = analyze(entries, skip=SKIP)
    assert [(s.site.line, s.nbytes) for s in d.at_peak] == [(20, 300), (10, 100)]
    assert d == reference_analyze(entries, skip=SKIP)
