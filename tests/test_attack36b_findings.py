"""What the attack36b round found still broken on two surfaces issue 36 just fixed: the
retention search's untracked-container pass (its budget) and ``%%gpumem --trace``'s labels
read from the cell's own text. Each test states a promise that failed before its fix."""

from __future__ import annotations

import gc
import time
from typing import Any

from .fakes import FakeTensor, GiB


# -- the untracked-container pass: bounded by the search's budget ---------------------------------
def _storage(t: Any) -> Any:
    return ("cuda:0", t._nbytes, ("cuda:0", id(t))) if type(t) is FakeTensor else None


def _search_cpu_s(junk: dict[str, Any], budget_s: float) -> tuple[float, float, Any]:
    """A search for a tensor only an object array in the namespace holds (so the untracked
    pass runs), beside ``junk``; timed on this thread's CPU clock, which other processes'
    load does not move (the search reads the same clock for its budget). Also the CPU one C
    pass over the whole heap takes here: the search cannot stop inside one, and it makes three
    before it first reads its clock (the first level's referrers, the heap's listing, the
    untracked pass's first slice), so after a whole suite has grown the heap to 1,750,000
    objects it took 0.13-0.16 s against 0.06 s in a fresh process, and 0.25-0.29 s under
    load: the test measured the heap the earlier tests left, not the untracked pass."""
    import numpy as np

    from gpumem_nb.holders.retention import RootContext, Search

    arr = np.empty(1, dtype=object)
    arr[0] = FakeTensor(GiB)
    gc.collect()  # tuples and dicts of atoms become untracked, as in a long session
    gc.disable()
    try:
        # The namespace is young: the collector lists it in the heap's first chunk, which the
        # pass reads whatever the clock says (a heap under 65,536 objects is all first chunk).
        ns = {"emb": arr, "names": [], **junk}
        search = Search(_storage, RootContext(user_ns=ns), budget_s=budget_s,
                        clock=time.thread_time)
        tensor = arr[0]
        t0 = time.thread_time()
        gc.get_referrers(tensor)
        heap_pass_s = time.thread_time() - t0
        t0 = time.thread_time()
        outcome = search.run([tensor])
        return time.thread_time() - t0, heap_pass_s, outcome
    finally:
        gc.enable()


def test_one_huge_untracked_tuple_keeps_the_search_within_its_budget():
    took, heap_pass_s, outcome = _search_cpu_s({"big": (None,) * 5_000_000}, budget_s=0.05)
    assert took < 0.25 + 3 * heap_pass_s, f"{took:.2f} s of CPU for a 0.05 s budget"
    assert outcome.cut.endswith("was not searched"), outcome.cut  # the cut is said


def test_one_untracked_dict_of_three_million_atoms_keeps_the_search_within_its_budget():
    junk = {"d": dict.fromkeys(range(3_000_000))}
    took, heap_pass_s, outcome = _search_cpu_s(junk, budget_s=0.05)
    assert took < 0.25 + 3 * heap_pass_s, f"{took:.2f} s of CPU for a 0.05 s budget"
    # The cut is said, by whichever pass the budget ran out in (on a loaded machine, before
    # the untracked pass even starts), and the tensor is never said found.
    assert outcome.cut.endswith(("was not searched", "budget ran out")), outcome.cut
    assert [r.state for r in outcome.retained] == ["not searched"]


def test_object_arrays_of_millions_of_items_keep_the_search_within_its_budget():
    import numpy as np

    junk = {f"a{i}": np.full(2_000_000, None, dtype=object) for i in range(4)}
    took, heap_pass_s, outcome = _search_cpu_s(junk, budget_s=0.05)
    assert took < 0.25 + 3 * heap_pass_s, f"{took:.2f} s of CPU for a 0.05 s budget"
    assert outcome.cut.endswith("was not searched"), outcome.cut  # the cut is said


# -- %%gpumem --trace: each line labelled as written ----------------------------------------------
def _traced_sites(shell: Any, body: str) -> list[tuple[str, int, str]]:
    """The traced cell's sites still alive at its end: (file, line, label)."""
    from gpumem_nb.kernel import current_monitor

    shell.run_cell("%%gpumem --trace -q --top 20\n" + body, store_history=True)
    traced = current_monitor(shell).last_trace
    assert traced is not None
    return [(sb.site.filename, sb.site.line, sb.label)
            for d in traced.devices for sb in d.alive_at_end]


def _clear_user(shell: Any, *names: str) -> None:
    for name in names:
        shell.user_ns.pop(name, None)


def test_a_function_from_an_earlier_cell_with_a_u2028_is_labelled_with_its_own_line(loaded):
    loaded.run_cell("s = '\u2028'\n"
                    "def make():\n"
                    "    return cuda.tensor(8 * MiB)\n", store_history=True)
    ((_, line, label),) = _traced_sites(loaded, "m = make()\n")
    assert line == 3
    assert label == "cell line 3 in make: return cuda.tensor(8 * MiB)  (from cell line 1)", \
        label
    _clear_user(loaded, "s", "make", "m")


def test_a_nested_traced_cells_lines_are_labelled_as_written_in_the_outer_report(loaded):
    sites = _traced_sites(loaded, "%%gpumem --trace -q --top 20\n"
                                  "s = '\u2028'\n"
                                  "x = cuda.tensor(MiB)\n")
    assert [label for _, _, label in sites] == ["cell line 2: x = cuda.tensor(MiB)"], sites
    _clear_user(loaded, "s", "x")


def test_a_traced_line_holding_an_escape_sequence_is_shown_printable(loaded):
    from gpumem_nb import trace
    from gpumem_nb.kernel import current_monitor

    loaded.run_cell("%%gpumem --trace -q\n"
                    "a1 = cuda.tensor(64 * MiB); s = '\x1b[2J'\n", store_history=True)
    report = trace.views(current_monitor(loaded).last_trace)[0]
    for text in (str(report), report._repr_html_()):
        assert "a1 = cuda.tensor(64 * MiB)" in text
        assert "\x1b" not in text
    _clear_user(loaded, "a1", "s")


def test_traced_lines_of_100000_characters_keep_the_report_small(loaded):
    from gpumem_nb import trace
    from gpumem_nb.kernel import current_monitor

    body = "".join(f"a{i} = cuda.tensor(MiB); s = '{'x' * 100_000}'\n" for i in range(5))
    loaded.run_cell("%%gpumem --trace -q\n" + body, store_history=True)
    report = trace.views(current_monitor(loaded).last_trace)[0]
    text, page = str(report), report._repr_html_()
    assert "cell line 1: a0 = cuda.tensor(MiB)" in text
    assert len(text) < 50_000 and len(page) < 50_000, (len(text), len(page))
    _clear_user(loaded, "s", *(f"a{i}" for i in range(5)))


def test_a_body_that_rebinds_the_transformer_list_leaves_no_transformer_behind(loaded):
    before = list(loaded.input_transformers_post)
    try:
        loaded.run_cell("%%gpumem --trace -q\n"
                        "ip = get_ipython()\n"
                        "ip.input_transformers_post = list(ip.input_transformers_post)\n"
                        "x = cuda.tensor(MiB)\n", store_history=True)
        assert loaded.input_transformers_post == before
    finally:
        loaded.input_transformers_post = before
        _clear_user(loaded, "ip", "x")
