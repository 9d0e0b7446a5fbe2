"""The advice harness (benchmarks/gpu_diagnosis3.py), on the CPU: the parts that decide what a
GPU row says. Its rows judge whether the OOM explainer's advice frees what it says, so a wrong
threshold, an action run other than as printed, a collection of the harness's own between
steps, or a field missing beside diagnosis2's would make a GPU run say something untrue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from benchmarks import gpu_diagnosis2 as d2
from benchmarks import gpu_diagnosis3 as d3

pytestmark = pytest.mark.slow  # a benchmark script's harness, not the extension

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_diagnosis3.py")
D2_RESULTS = os.path.join(ROOT, "benchmarks", "results", "diagnosis2_h200.json")
GIB = 2**30


@dataclass(frozen=True)
class FakeAction:
    """The fields of ``gpumem_nb.oom.advice.Action`` the harness reads."""

    text: str
    nbytes: int | None = None
    code: str = ""


class Memory:
    """Bytes in use, as the harness's measures read them; a cell's effect changes them."""

    def __init__(self, allocated: int = 0, reserved: int = 0, device: int = 0) -> None:
        self.now = {"allocated": allocated, "reserved": reserved, "device": device}

    def measures(self) -> dict[str, Any]:
        return {name: (lambda name=name: self.now[name]) for name in self.now}


class FakeShell:
    """``run_cell`` that records each cell and applies the effect its code is given."""

    def __init__(self, memory: Memory, effects: dict[str, dict[str, int]] | None = None,
                 errors: dict[str, BaseException] | None = None) -> None:
        self.memory, self.effects, self.errors = memory, effects or {}, errors or {}
        self.cells: list[str] = []

    def run_cell(self, code: str) -> Any:
        self.cells.append(code)
        for name, freed in self.effects.get(code, {}).items():
            self.memory.now[name] -= freed
        return SimpleNamespace(error_in_exec=self.errors.get(code), error_before_exec=None)


def explanation(actions: list[FakeAction], *, allocated: int = 100 * GIB,
                not_found: int | None = 0, named: int | None = 100 * GIB,
                cause: str = "held by your session") -> Any:
    """What the harness reads of an ``OomExplanation``."""
    led = SimpleNamespace(attributed_bytes=allocated - (not_found or 0), capped=False,
                          not_found_bytes=not_found)
    if named is not None:
        led.named_bytes = named
    return SimpleNamespace(
        cause=cause, added_s=0.004, stages_text=lambda: "observer 1.0 (ms)",
        causes=[SimpleNamespace(kind=cause, nbytes=allocated, covers=True)],
        facts=SimpleNamespace(allocated_bytes=allocated), ledger=led, actions=actions)


def ran_row(actions: list[FakeAction], shell: FakeShell | None = None, *,
            kind: str = "closure_keeps_tensors", **expl: Any) -> dict[str, Any]:
    """A row as the child makes it after the failing cell, finished as the parent writes it."""
    k = next(k for k in d2.KINDS if k.kind == kind)
    e = explanation(actions, **expl)
    shell = shell or FakeShell(Memory(allocated=100 * GIB))
    row = d3.base_row(k, "native", "rerun2") | {"reached_failure": True}
    d2.explained(row, e)
    d3.ledger_fields(row, e)
    d3.run_advice(row, e.actions, shell.run_cell, shell.memory.measures())
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_total_bytes": int(79.6 * GIB),
            "gib_bytes": d3.scaled_gib(int(79.6 * GIB)), "torch": "2.11.0", "backend": "native"}
    return d3.finish_row(row | meta | {"wall_s": 1.0}, meta, "abc1234", "test run")


def judged(**row: Any) -> tuple[dict[str, Any], list[str]]:
    base = {"kind": "k", "expected": "held by your session", "verdict": "held by your session",
            "reached_failure": True, "allocated_at_failure_bytes": 10_000,
            "not_found_bytes": 0, "named_bytes": 10_000,
            "advice_steps": [{"code": "del x", "said_bytes": 1000, "freed_bytes": 1000,
                              "in_backticks": True, "error": None}],
            "advice_said_bytes": 1000, "advice_freed_bytes": 1000}
    return d3.checks(base | row)


# ---- the row: every field of diagnosis2's, and the new ones ---------------------------------
def test_a_row_has_every_field_of_diagnosis2s_rows_and_the_new_ones():
    with open(D2_RESULTS) as f:
        d2_fields = {key for r in json.load(f) for key in r}
    memory = Memory(allocated=100 * GIB)
    shell = FakeShell(memory, {"del held": {"allocated": 60 * GIB}})
    row = ran_row([FakeAction("Make the step smaller."),
                   FakeAction("del held (variable, 60.00 GiB): `del held`", 60 * GIB,
                              "del held")], shell)
    missing = (d2_fields | set(d3.D2_FIELDS) | set(d3.NEW_FIELDS)) - set(row)
    assert not missing, f"the row lacks {sorted(missing)}"
    assert set(row["checks"]) == set(d3.CHECKS)
    assert row["advice"] == ["Make the step smaller.",
                             "del held (variable, 60.00 GiB): `del held`"]
    assert row["advice_code"] == ["del held"]
    assert row["advice_said_bytes"] == row["advice_freed_bytes"] == 60 * GIB
    assert row["advice_steps"][0] | {"ms": 0} == {
        "code": "del held", "said_bytes": 60 * GIB, "freed_bytes": 60 * GIB,
        "measured": "allocated", "freed_allocated_bytes": 60 * GIB, "freed_reserved_bytes": 0,
        "freed_device_bytes": 0, "in_text": True, "in_backticks": True, "error": None, "ms": 0}
    assert row["named_bytes"] == 100 * GIB and row["not_found_bytes"] == 0
    assert row["checks"] == {"not_found_le_2pct": True, "named_ge_98pct": True,
                             "advice_freed_ge_95pct": True, "verdict_ok": True}
    assert row["note"] == ""
    assert row["gpu_total_bytes"] == int(79.6 * GIB) and row["commit"] == "abc1234"
    assert row["source"].startswith("https://") and row["set"] == "rerun2"
    json.dumps(row)  # what the parent writes


def test_a_row_that_never_ran_still_has_every_field():
    k = d2.KINDS[0]
    row = d3.finish_row(d3.base_row(k, "expandable", "rerun2") | {"note": "timed out"},
                        {"gpu": "NVIDIA H200", "gpu_total_bytes": int(139.8 * GIB)}, "c", "r")
    assert set(d3.D2_FIELDS) | set(d3.NEW_FIELDS) <= set(row)
    assert row["gpu"] == "NVIDIA H200"  # the run's card, though the child never sent the row
    assert row["checks"] == dict.fromkeys(d3.CHECKS)
    assert row["note"].startswith("timed out; the failing cell was never reached")


def test_a_ledger_before_named_bytes_existed_gives_none_not_a_crash():
    row = ran_row([], named=None)
    assert row["named_bytes"] is None
    assert row["checks"]["named_ge_98pct"] is None
    assert "the ledger has no named_bytes" in row["note"]


# ---- the checks: each threshold and its edges -------------------------------------------------
def test_not_found_of_exactly_2pct_passes_and_a_byte_more_fails():
    assert judged(not_found_bytes=200)[0]["not_found_le_2pct"] is True
    got, notes = judged(not_found_bytes=201)
    assert got["not_found_le_2pct"] is False
    assert any("not found 201 B is 2.0% of 10000 B" in n for n in notes)


def test_named_of_exactly_98pct_passes_and_a_byte_less_fails():
    assert judged(named_bytes=9800)[0]["named_ge_98pct"] is True
    got, notes = judged(named_bytes=9799)
    assert got["named_ge_98pct"] is False
    assert any(n.startswith("named 9799 B") for n in notes)


def test_advice_that_frees_95pct_passes_and_a_byte_less_fails():
    assert judged(advice_freed_bytes=950)[0]["advice_freed_ge_95pct"] is True
    got, notes = judged(advice_freed_bytes=949)
    assert got["advice_freed_ge_95pct"] is False
    assert any("said 1000 B and freed 949 B" in n for n in notes)


def test_advice_that_frees_more_than_it_said_passes():
    assert judged(advice_freed_bytes=5000)[0]["advice_freed_ge_95pct"] is True


def test_nothing_said_and_nothing_run_is_not_a_pass():
    got, notes = judged(advice_steps=[], advice_said_bytes=0, advice_freed_bytes=None,
                        advice_unrun=[{"why": "no code"}])
    assert got["advice_freed_ge_95pct"] is None
    assert "no advice was run: no action has both code and bytes (1 with one and not the "\
        "other)" in notes


def test_advice_that_said_bytes_and_freed_nothing_fails():
    got, _ = judged(advice_freed_bytes=0)
    assert got["advice_freed_ge_95pct"] is False


def test_advice_run_that_said_zero_bytes_is_not_judged():
    got, notes = judged(advice_said_bytes=0, advice_freed_bytes=0)
    assert got["advice_freed_ge_95pct"] is None
    assert any("said it frees 0 B" in n for n in notes)


def test_nothing_allocated_at_the_failure_is_not_a_pass():
    got, notes = judged(allocated_at_failure_bytes=0, not_found_bytes=0, named_bytes=0)
    assert got["not_found_le_2pct"] is None and got["named_ge_98pct"] is None
    assert any("nothing was allocated at the failure" in n for n in notes)


def test_a_row_that_never_reached_its_failing_cell_is_not_judged():
    got, notes = judged(reached_failure=False, verdict=None)
    assert got == dict.fromkeys(d3.CHECKS)
    assert notes == ["the failing cell was never reached: nothing could be checked"]


def test_a_wrong_verdict_fails_and_says_so():
    got, notes = judged(verdict="working set")
    assert got["verdict_ok"] is False
    assert "verdict 'working set', expected 'held by your session'" in notes


def test_a_post_cell_kind_is_judged_on_its_verdict_alone():
    got, notes = judged(expected="own traceback", verdict="own traceback",
                        allocated_at_failure_bytes=None, advice_steps=[])
    assert got == {"not_found_le_2pct": None, "named_ge_98pct": None,
                   "advice_freed_ge_95pct": None, "verdict_ok": True}
    assert any("no OOM explanation" in n for n in notes)


def test_a_missing_post_cell_line_fails_its_verdict():
    got, _ = judged(expected="own traceback", verdict=None, allocated_at_failure_bytes=None)
    assert got["verdict_ok"] is False


# ---- the advice: which actions run, how, and what is measured ------------------------------
def test_only_actions_with_code_and_bytes_run_in_order_exactly_as_printed():
    shell = FakeShell(Memory(allocated=100 * GIB))
    actions = [FakeAction("Make the step smaller."),  # prose: nothing to run
               FakeAction("%gpumem cleanup --out clears Out[3] (8.00 GiB)", 8 * GIB,
                          "%gpumem cleanup --out"),
               FakeAction("Run `x.grad = None` (unsized)", None, "x.grad = None"),
               FakeAction("PID 77 holds 20.00 GiB: stop it.", 20 * GIB),
               FakeAction("`del a, b` frees 3.00 GiB", 3 * GIB, "del a, b")]
    row = ran_row(actions, shell)
    assert shell.cells == ["%gpumem cleanup --out", "del a, b"]  # verbatim, one cell each
    assert row["advice_code"] == ["%gpumem cleanup --out", "del a, b"]
    assert row["advice_said_bytes"] == 11 * GIB
    assert [(u["code"], u["why"]) for u in row["advice_unrun"]] == [
        ("x.grad = None", "no bytes"), ("", "no code")]


def test_actions_of_a_product_without_code_run_nothing():
    class OldAction:  # before Action.code existed
        def __init__(self, text: str, nbytes: int | None) -> None:
            self.text, self.nbytes = text, nbytes

    shell = FakeShell(Memory())
    row: dict[str, Any] = {}
    d3.run_advice(row, [OldAction("del y (60.00 GiB)", 60 * GIB)], shell.run_cell,
                  shell.memory.measures())
    assert shell.cells == [] and row["advice_code"] == [] and row["advice_freed_bytes"] is None


def test_the_harness_never_collects_or_releases_between_advice_steps(monkeypatch: Any):
    calls: list[str] = []

    def collect(*args: Any) -> int:
        calls.append("gc.collect")
        return 0

    def run_cell(code: str) -> Any:
        calls.append(code)
        return shell.run_cell(code)

    monkeypatch.setattr(d3.gc, "collect", collect)
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(
        empty_cache=lambda: calls.append("empty_cache")))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    shell = FakeShell(Memory(allocated=10 * GIB))
    row: dict[str, Any] = {}
    d3.run_advice(row, [FakeAction("`del a`", GIB, "del a"), FakeAction("`del b`", GIB, "del b")],
                  run_cell, shell.memory.measures())
    assert calls == ["del a", "del b"]


def test_a_pool_action_is_measured_in_reserved_memory():
    memory = Memory(allocated=GIB, reserved=81 * GIB)
    code = "del pool; torch.cuda.empty_cache()"
    shell = FakeShell(memory, {code: {"reserved": 80 * GIB}})
    row = ran_row([FakeAction("del pool and every tensor allocated in it (under "
                              f"torch.cuda.use_mem_pool): `{code}` returns its 80.00 GiB.",
                              80 * GIB, code)], shell, kind="mempool_keeps_segment")
    step = row["advice_steps"][0]
    assert step["measured"] == "reserved"
    assert step["freed_bytes"] == 80 * GIB and step["freed_allocated_bytes"] == 0
    assert row["checks"]["advice_freed_ge_95pct"] is True


@pytest.mark.parametrize("text,measured", [
    ("del g (the torch.cuda.CUDAGraph) ... returns its private pool's 80.00 GiB", "reserved"),
    ("torch.compiler.reset() drops ... CUDA graph trees", "reserved"),
    ("The cudaMallocAsync pool still holds 3.00 GiB unused", "reserved"),
    ("%gpumem cleanup --dry-run estimates: 2.00 GiB held by this error's traceback; up to "
     "1.00 GiB unused in the cudaMallocAsync pool (empty_cache trims it).", "allocated"),
    ("Release what other libraries hold in this process (CuPy: "
     "cupy.get_default_memory_pool().free_all_blocks())", "device"),
    ("blob (a CuPy array) holds 34.00 GiB in CuPy's memory pool: `del blob; import cupy; "
     "cupy.get_default_memory_pool().free_all_blocks()`", "device"),
    ("del losses (variable, 40.00 GiB) if you no longer need it.", "allocated"),
    ("PID 812 (python3 worker.py) holds 30.00 GiB: release the object that started it ... for "
     "a multiprocessing pool, pool.close() and pool.join()", "device"),
])
def test_each_action_is_measured_in_the_memory_it_speaks_of(text: str, measured: str):
    assert d3.measured_for(text) == measured


def test_a_step_that_raises_is_recorded_and_said():
    shell = FakeShell(Memory(allocated=GIB), errors={"del gone": NameError("name 'gone'")})
    row = ran_row([FakeAction("`del gone` frees 1.00 GiB", GIB, "del gone")], shell)
    assert row["advice_steps"][0]["error"] == "NameError: name 'gone'"
    assert row["checks"]["advice_freed_ge_95pct"] is False
    assert "`del gone` raised NameError: name 'gone'" in row["note"]


def test_code_the_text_does_not_show_as_code_is_said():
    row = ran_row([FakeAction("del it if you no longer need it.", GIB, "del it"),
                   FakeAction("Drop the cache.", GIB, "cache.clear()")],
                  FakeShell(Memory(allocated=2 * GIB), {"del it": {"allocated": GIB},
                                                        "cache.clear()": {"allocated": GIB}}))
    assert [(s["in_text"], s["in_backticks"]) for s in row["advice_steps"]] == [
        (True, False), (False, False)]
    assert "`del it` is in its text but not between backticks" in row["note"]
    assert "`cache.clear()` is not in its text: the user cannot see what runs" in row["note"]


class Blob:
    """Stands for a tensor: its bytes count as allocated while it lives."""

    live: ClassVar[dict[int, int]] = {}

    def __init__(self, nbytes: int) -> None:
        Blob.live[id(self)] = nbytes
        weakref.finalize(self, Blob.live.pop, id(self), None)


def test_advice_runs_in_a_real_shell_and_frees_only_what_its_own_line_frees(
        shell: Any, no_gpu: Any):
    """A line magic runs as a cell; garbage in a cycle stays until the advice itself collects
    (the harness never does)."""
    import gc

    Blob.live.clear()
    shell.user_ns.update(Blob=Blob)
    shell.run_cell("a = Blob(3 * 2**30)\nc = Blob(2**30)\n"
                   "b = [Blob(2 * 2**30)]\nb.append(b)", store_history=True)
    measures = {"allocated": lambda: sum(Blob.live.values())}
    gc.disable()  # the interpreter's own collection would free the cycle at random
    try:
        row: dict[str, Any] = {}
        d3.run_advice(row, [FakeAction("`del a`", 3 * 2**30, "del a"),
                            FakeAction("`%reset_selective -f ^c$`", 2**30,
                                       "%reset_selective -f ^c$"),
                            FakeAction("`del b`", 2 * 2**30, "del b")],
                      lambda code: shell.run_cell(code, store_history=True), measures)
    finally:
        gc.enable()
    assert [s["freed_bytes"] for s in row["advice_steps"]] == [3 * 2**30, 2**30, 0]
    assert row["advice_freed_bytes"] == 4 * 2**30 and row["advice_said_bytes"] == 6 * 2**30
    assert d3.checks(row | {"reached_failure": True, "expected": "x", "verdict": "x",
                            "allocated_at_failure_bytes": 6 * 2**30})[0][
        "advice_freed_ge_95pct"] is False
    gc.collect()
    assert Blob.live == {}


# ---- the kinds: they compile, and a new one says where and when it comes from ----------------
def test_every_diagnosis2_kind_compiles_under_the_harness():
    assert d3.compile_errors(d2.KINDS) == []
    assert d3.kind_problems(d2.KINDS, new=False) == []


def test_a_cell_that_does_not_compile_is_named_and_a_magic_cell_compiles():
    bad = d2.Kind("broken", "https://example.org/report", "working set",
                  ("%gpumem cleanup\nx = 1",), "y = (", (d2.Step("x", "none", "del x"),))
    errors = d3.compile_errors([bad])
    assert len(errors) == 1 and errors[0].startswith("broken fail: SyntaxError")


def test_a_new_kind_without_a_date_or_a_report_or_a_real_verdict_is_refused():
    k = d2.Kind("undated", "a forum", "too big", (), "y = 1")
    problems = d3.kind_problems([k, k], new=True)
    assert "undated: a new kind says when it was written (written=...)" in problems
    assert "undated: source is no URL of a user report" in problems
    assert any("expected 'too big' is no verdict" in p for p in problems)
    assert "undated: the name is used twice" in problems


def test_every_new_kind_is_out_of_sample_and_fit_to_run():
    kinds = d3.kinds_of("new")
    assert all(k.out_of_sample for k in kinds)
    assert d3.kind_problems(kinds, new=True) == []


# ---- sizes relative to the card ----------------------------------------------------------------
def test_diagnosis2_sizes_are_unchanged_on_the_h200():
    assert d3.scaled_gib(int(139.8 * GIB)) == GIB
    assert d3.scaled_gib(int(139.79 * GIB)) == GIB  # mem_get_info's total, give or take


def test_sizes_keep_their_share_of_a_smaller_card():
    total = int(79.6 * GIB)
    gib = d3.scaled_gib(total)
    assert gib % 2**21 == 0  # 40 * GiB holds exactly 40 blocks of GiB (fragmentation kind)
    assert abs(gib / GIB - 79.6 / 139.8) < 0.002
    assert 200 * gib > total and 60 * gib < total  # impossible stays impossible, 60 fits


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                       ("NVIDIA H100 PCIe", "h100"), ("NVIDIA A100-SXM4-80GB",
                                                                      "a100")])
def test_the_card_names_the_file(name: str, slug: str):
    assert d3.card_slug(name) == slug


# ---- joining calls -------------------------------------------------------------------------------
def test_a_later_call_replaces_only_its_own_rows():
    old = [{"kind": "a", "allocator": "native", "run": "call 1", "verdict": "x"},
           {"kind": "a", "allocator": "expandable", "run": "call 1", "verdict": "x"}]
    new = [{"kind": "a", "allocator": "expandable", "run": "call 2", "verdict": "y"},
           {"kind": "b", "allocator": "native", "run": "call 2"}]
    merged = d3.merge(old, new)
    assert [(r["kind"], r["allocator"], r["run"]) for r in merged] == [
        ("a", "native", "call 1"), ("a", "expandable", "call 2"), ("b", "native", "call 2")]
    assert merged[1]["replaces"] == {"run": "call 1", "verdict": "x"}


# ---- the dry run -------------------------------------------------------------------------------
def _dry(tmp_path: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """The script as the lead runs it, with a torch that cannot be imported."""
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('the dry run imported torch')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "poison"))
    return subprocess.run([sys.executable, SCRIPT, "--dry-run", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def _rows(out: str) -> list[tuple[str, str]]:
    return [(line.split()[0], line.split()[1]) for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in d3.ALLOCATORS]


def test_the_dry_run_lists_every_row_without_torch(tmp_path: Any):
    done = _dry(tmp_path, "--set", "rerun2")
    assert done.returncode == 0, done.stdout + done.stderr
    expected = d3.planned(d3.selected("rerun2"), list(d3.ALLOCATORS))
    assert len(expected) == sum(len(k.allocators) for k in d2.KINDS) == 73
    assert _rows(done.stdout) == expected
    assert "every kind's code compiles" in done.stdout
    assert "estimated in all:" in done.stdout


def test_the_dry_run_obeys_allocators_and_only(tmp_path: Any):
    done = _dry(tmp_path, "--allocators", "cudaMallocAsync",
                "--only", "mempool_keeps_segment,closure_keeps_tensors")
    assert done.returncode == 0, done.stderr
    # mempool_keeps_segment does not exist under cudaMallocAsync (Kind.allocators)
    assert _rows(done.stdout) == [("cudaMallocAsync", "closure_keeps_tensors")]


def test_the_dry_run_of_the_new_set_lists_every_written_kind_under_each_allocator(
        tmp_path: Any):
    done = _dry(tmp_path, "--set", "new")
    assert done.returncode == 0, done.stderr
    assert d3.KINDS3 and all(k.written for k in d3.KINDS3)
    assert sorted(_rows(done.stdout)) == sorted(
        (a, k.kind) for k in d3.KINDS3 for a in k.allocators)


@pytest.mark.parametrize("args,says", [(("--only", "no_such_kind"), "no such kind"),
                                       (("--allocators", "native,cuda"), "no such allocator")])
def test_a_misspelt_kind_or_allocator_is_refused_before_any_device_time(
        tmp_path: Any, args: tuple[str, ...], says: str):
    done = _dry(tmp_path, *args)
    assert done.returncode == 2 and says in done.stderr


# ---- one kind end to end: a real shell and the real extension, over a fake GPU ----------------
def test_a_kind_runs_end_to_end_over_the_real_explanation(shell: Any, monkeypatch: Any,
                                                           capsys: Any):
    """The harness reads the product's real objects (the monitor's oom.last, its actions and
    ledger, who and the dry run): a renamed attribute ends every GPU row in an error note."""
    from .test_oom import make_world

    w = make_world(monkeypatch)
    dev = w.cuda.devices[0]
    kind = d2.Kind("held_blob", "https://example.org/report", "held by your session",
                   ("big = cuda.tensor(100 * GiB)",), "y = cuda.tensor(100 * GiB)",
                   (d2.Step("big", "who:big", "del big"),))

    def fresh() -> None:
        shell.run_cell("%load_ext gpumem_nb", store_history=True)
        shell.user_ns.update(cuda=w.cuda, GiB=GIB)
        shell.run_cell("warm = 1", store_history=True)

    measures = {"allocated": lambda: dev.allocated, "reserved": lambda: dev.reserved,
                "device": lambda: dev.total - w.cuda.device_free(0)}
    row = d3.run_kind(shell, kind, d3.base_row(kind, "native", "new"), fresh=fresh,
                      measures=measures, gib=GIB)
    row = d3.finish_row(row, {}, "c", "r")
    capsys.readouterr()
    assert "traceback" not in row, row.get("traceback")
    assert row["reached_failure"] is True
    assert row["verdict"] == "held by your session" and row["checks"]["verdict_ok"] is True
    assert row["allocated_at_failure_bytes"] == 100 * GIB
    assert row["not_found_bytes"] is not None
    assert row["advice"] and row["advice"][0] == row["first_action"]
    assert len(row["advice_steps"]) == len(row["advice_code"])
    for step in row["advice_steps"]:
        assert step["measured"] in ("allocated", "reserved", "device")
    # diagnosis2's step ran after the advice, on what the advice left
    assert row["holders_after_advice"] is True
    assert [h["name"] for h in row["holders"]] == ["big"]
    # Together they freed the 100 GiB, whichever of them did it.
    assert row["holders"][0]["freed_bytes"] + (row["advice_freed_bytes"] or 0) == 100 * GIB
    json.dumps(row)


def test_a_child_that_dies_leaves_every_row_in_the_file_saying_why(tmp_path: Any):
    """On the device a child can abort (cudaMallocAsync's "uncaptured free" did): the rows it
    never sent are still written, each saying why, with the command that runs them again."""
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('no torch here')\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "poison"),
               GPUMEM_NB_CONFIG=str(tmp_path / "gpumem_nb.json"))
    done = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--allocators", "native",
                           "--only", "closure_keeps_tensors,memory_fraction_cap",
                           "--budget-s", "60", "--commit", "abc1234"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out / "diagnosis3_unknown.json") as f:  # no card: the child never said
        rows = json.load(f)
    assert [(r["kind"], r["allocator"]) for r in rows] == [
        ("closure_keeps_tensors", "native"), ("memory_fraction_cap", "native")]
    for r in rows:
        assert set(d3.D2_FIELDS) | set(d3.NEW_FIELDS) <= set(r)
        assert r["commit"] == "abc1234" and r["checks"] == dict.fromkeys(d3.CHECKS)
        assert r["note"].startswith("the allocator's process ended (rc 1) before it: "
                                    "ImportError: no torch here")
    assert ("not run under native: --allocators native --only "
            "closure_keeps_tensors,memory_fraction_cap") in done.stdout
