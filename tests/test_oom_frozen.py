"""Bytes kept by objects ``gc.freeze()`` froze: the permanent generation is out of the
collector's and the holder search's view, so the explanation names it as the likely place
and advises unfreezing, without ever unfreezing (observing changes nothing)."""

from __future__ import annotations

import gc

from gpumem_nb.oom import CAUSE_HELD, OomFacts, classify, next_steps

from .fakes import GiB
from .helpers import run
from .test_oom import last, world  # noqa: F401  (the fixture, by name)


def _facts(frozen: int) -> OomFacts:
    return OomFacts(device=0, requested_bytes=50 * GiB, total_bytes=80 * GiB,
                    free_bytes=40 * GiB, allocated_bytes=36 * GiB, reserved_bytes=36 * GiB,
                    measured_at="failure", unreachable_bytes=36 * GiB,
                    cell_start_bytes=36 * GiB, frozen_objects=frozen)


def test_bytes_not_found_after_gc_freeze_name_the_frozen_objects_and_advise_unfreeze():
    # KINDS8 gc_freeze_keeps_pending_cycles: garbage cycles holding 35 GiB were frozen; the
    # explanation said only "reachable from nothing the scan walks" and advised `who --gc`,
    # which cannot see the permanent generation either.
    f = _facts(1234)
    causes = classify(f, [])
    held = [c for c in causes if c.kind == CAUSE_HELD]
    assert held and "1,234 objects frozen by gc.freeze()" in held[0].summary
    assert "out of the collector's and the search's view" in held[0].summary
    steps = next_steps(f, causes, [], None)
    unfreeze = [a for a in steps if "gc.unfreeze()" in a.code]
    assert unfreeze and f"`{unfreeze[0].code}`" in unfreeze[0].text
    assert unfreeze[0].nbytes is None  # the frozen objects may be live: not promised


def test_without_gc_freeze_no_frozen_place_is_named():
    f = _facts(0)
    causes = classify(f, [])
    assert not any("gc.freeze" in c.summary for c in causes)
    assert not any("unfreeze" in a.code for a in next_steps(f, causes, [], None))


def test_frozen_garbage_at_an_oom_is_named_and_explaining_never_unfreezes(world):  # noqa: F811
    # End to end: cycles holding 60 GiB frozen, then an OOM. The permanent generation keeps
    # them through every gc.collect(); the explanation must say where, and leave it frozen.
    run(world.shell, "class Node:\n    pass\n"
                     "def make():\n    n = Node(); n.me = n; n.t = cuda.tensor(60 * GiB)\n"
                     "make()")
    gc.freeze()
    try:
        run(world.shell, "y = cuda.tensor(100 * GiB)")
        e = last(world.shell)
        # Observing changed nothing: the cycle is still frozen and still holds its 60 GiB
        # (an unfreeze and a collection would have freed it). The count itself falls as
        # frozen objects die by reference counting, so it is not compared.
        assert gc.get_freeze_count() > 0 and e.facts.frozen_objects > 0
        assert world.cuda.devices[0].allocated == 60 * GiB
        text = str(e)
        assert "frozen by gc.freeze()" in text and "gc.unfreeze(); gc.collect()" in text, text
    finally:
        gc.unfreeze()
        gc.collect()


def test_the_interpreters_own_permanent_objects_are_not_called_a_users_freeze(monkeypatch):
    """Python 3.12 reports a few hundred objects in the permanent generation with no freeze
    (375 on 3.12.1): on the H100 the explanation named them as the likely holder."""
    import gc

    from gpumem_nb.oom import gcwindow

    monkeypatch.setattr(gcwindow, "_FREEZE_BASELINE", 375)
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 375)
    assert gcwindow.frozen_objects() == 0
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 1_609)
    assert gcwindow.frozen_objects() == 1_234
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 0)  # unfrozen
    assert gcwindow.frozen_objects() == 0
