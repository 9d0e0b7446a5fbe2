"""Issue 24's gaps measured on the H200 (diagnosis2_h200.json): holders the forward walk did
not reach (a class-level attribute, an exception kept in a variable), cuBLAS's cached
workspaces left in "not found", and the cudaMallocAsync verdict that conservation decides."""

from __future__ import annotations

from typing import Any

from gpumem_nb.holders import Scanner
from gpumem_nb.model import Holder

from .fakes import FakeTensor, GiB, MiB, fake_torch


# -- holders the forward walk did not reach ------------------------------------------------------
class CellBottleneck:
    """A class as a notebook cell defines it (its module is __main__)."""

    out_saved: list[Any] = []  # noqa: RUF012 (the class-level cache is what users write)
    scale = 2.0

    def forward(self) -> None:  # a method: no state, never walked as a holder's
        return None


CellBottleneck.__module__ = "__main__"


def test_a_tensor_in_a_user_class_attribute_is_found_through_an_instance():
    # H200, class_attribute_cache: 60 GiB in `Bottleneck.out_saved` stayed 100% "not found".
    CellBottleneck.out_saved.append(FakeTensor(10 * GiB))
    try:
        found = Scanner({"torch": fake_torch()}).scan({"block": CellBottleneck(),
                                                       "other": CellBottleneck()})
        (h,) = found
        assert (h.name, h.nbytes) == ("block", 10 * GiB)
        assert "CellBottleneck.out_saved" in str(h)
    finally:
        CellBottleneck.out_saved.clear()


def test_a_librarys_class_attributes_are_not_entered():
    class LibraryThing:
        cached: list[Any] = []  # noqa: RUF012

    LibraryThing.__module__ = "somelib.things"
    LibraryThing.cached.append(FakeTensor(GiB))
    assert Scanner({"torch": fake_torch()}).scan({"thing": LibraryThing()}) == []


def test_an_exception_kept_in_a_variable_holds_its_frames_locals():
    # H200, exception_kept_in_variable: `err = caught` kept 60 GiB of a finished frame's locals.
    def step() -> None:
        acts = FakeTensor(6 * GiB)  # noqa: F841 (kept by the traceback)
        raise RuntimeError("nan")

    try:
        step()
    except RuntimeError as caught:
        ns = {"err": caught}
    (h,) = Scanner({"torch": fake_torch()}).scan(ns)
    assert (h.name, h.nbytes) == ("err", 6 * GiB)
    ns.clear()


def test_an_exceptions_context_is_followed_too():
    def inner() -> None:
        kept = FakeTensor(3 * GiB)  # noqa: F841
        raise KeyError("x")

    def outer() -> None:
        try:
            inner()
        except KeyError:
            raise ValueError("wrapped") from None

    try:
        outer()
    except ValueError as caught:
        ns = {"err": caught}
    (h,) = Scanner({"torch": fake_torch()}).scan(ns)
    assert h.nbytes == 3 * GiB
    ns.clear()


# -- cudaMallocAsync: the verdict and the split decided by conservation -----------------------
def _generate_under_async() -> Any:
    """The H200 row generate_batch_too_big under cudaMallocAsync (no OOM observer there):
    97.35 GiB allocated at the failure (the message), 65.29 GiB now, the pool 138.97 GiB."""
    from gpumem_nb.oom import OomFacts

    return OomFacts(
        device=0, requested_bytes=16 * GiB, total_bytes=int(139.80 * GiB),
        free_bytes=31 * MiB, allowed_bytes=int(139.80 * GiB),
        allocated_bytes=int(97.35 * GiB), reserved_bytes=int(138.97 * GiB),
        backend="cudaMallocAsync", measured_at="after",
        released_since_bytes=int(32.06 * GiB), computation_bytes=int(64.52 * GiB),
        cell_bytes=int(96.56 * GiB), cell_start_bytes=int(0.79 * GiB))


def test_under_cudamallocasync_a_computation_that_outgrew_the_whole_room_is_the_working_set():
    # H200: "cached by the cudaMallocAsync pool" for a generate() that had allocated 96.5 GiB,
    # because the pool's 41.6 GiB unused (what was free on the GPU included) was compared
    # 4x against it. The native run of the same cell said "working set".
    from gpumem_nb.oom import CAUSE_WORKING_SET, classify

    causes = classify(_generate_under_async())
    assert causes[0].kind == CAUSE_WORKING_SET
    assert causes[0].covers


def test_a_pool_whose_unused_memory_would_serve_many_requests_is_still_not_the_verdict():
    from gpumem_nb.oom import OomFacts, classify
    from gpumem_nb.oom.causes import CAUSE_POOL

    f = OomFacts(device=0, requested_bytes=2 * GiB, total_bytes=140 * GiB, free_bytes=0,
                 allocated_bytes=100 * GiB, reserved_bytes=139 * GiB,
                 backend="cudaMallocAsync", measured_at="after", cell_bytes=60 * GiB)
    # 39 GiB unused: 19 more such requests. The driver reuses that memory, so it is room,
    # never the verdict (issue 26); the 60 GiB the cell made is.
    causes = classify(f)
    assert causes[0].kind != CAUSE_POOL and causes[0].covers
    assert not next(c for c in causes if c.kind == CAUSE_POOL).covers


def test_after_the_fact_what_the_unwinding_freed_is_the_failing_computation_not_not_found():
    # H200: 32.06 GiB (33%) "not found": allocated at the failure, freed as generate()'s
    # frames unwound, before the explanation (cudaMallocAsync has no OOM observer).
    from dataclasses import replace

    from gpumem_nb.oom.watch import explanation_ledger

    f = _generate_under_async()
    failed = Holder(name="traceback: generate() locals", kind="failed call",
                    device="cuda:0", nbytes=int(64.52 * GiB))
    model = Holder(name="model", kind="module", device="cuda:0", nbytes=int(0.77 * GiB))
    led = explanation_ledger(f, [failed, model])
    assert led is not None
    assert led.computation_bytes == int(32.06 * GiB)
    assert led.not_found_bytes <= 0.01 * led.allocated_bytes
    # A replaced traceback could hold the freed bytes: then they are not claimed.
    led = explanation_ledger(replace(f, previous_error="RuntimeError"), [failed, model])
    assert led is not None and led.computation_bytes == 0


# -- cuBLAS's workspaces -------------------------------------------------------------------------
def _block(size: int, state: str = "active_allocated", frames: Any = ()) -> dict[str, Any]:
    return {"size": size, "requested_size": size, "state": state, "frames": list(frames)}


def test_cublas_workspaces_are_named_in_the_ledger_from_the_snapshot_not_left_not_found():
    # H200: 33 MiB (one stream) or 66 MiB "not found" on rows with little allocated, 100% of
    # it: PyTorch's cuBLAS workspace (32 MiB on sm90) and cuBLASLt's (1 MiB), per stream.
    from gpumem_nb.ledger import ledger, workspace_blocks_bytes

    segments = [
        {"device": 0, "segment_pool_id": (0, 0), "blocks": [_block(32 * MiB)]},
        {"device": 0, "segment_pool_id": (0, 0), "blocks": [_block(MiB), _block(MiB, "inactive")]},
        # A user's own 32 MiB tensor, allocated from Python, and one in a graph's pool.
        {"device": 0, "segment_pool_id": (0, 0),
         "blocks": [_block(32 * MiB, frames=[{"filename": "/nb/cell.py", "line": 3}])]},
        {"device": 0, "segment_pool_id": (1, 0), "blocks": [_block(32 * MiB)]},
        {"device": 1, "segment_pool_id": (0, 0), "blocks": [_block(32 * MiB)]},
    ]
    ws = workspace_blocks_bytes(segments, 0, frozenset({32 * MiB, MiB}))
    assert ws == 33 * MiB
    led = ledger("cuda:0", 33 * MiB, [], workspaces_bytes=ws)
    assert led.not_found_bytes == 0 and not led.shows_not_found
    assert "33.00 MiB cuBLAS workspaces" in led.line()
    assert "_cuda_clearCublasWorkspaces" in led.line()


def test_workspaces_never_claim_bytes_a_holder_already_accounts_for():
    from gpumem_nb.ledger import ledger

    h = Holder(name="x", kind="variable", device="cuda:0", nbytes=32 * MiB)
    led = ledger("cuda:0", 40 * MiB, [h], workspaces_bytes=33 * MiB)
    assert led.workspaces_bytes == 8 * MiB
    assert led.attributed_bytes == 40 * MiB


def test_workspace_sizes_follow_cublas_workspace_config_as_pytorch_parses_it():
    from gpumem_nb.ledger import cublas_workspace_sizes

    assert cublas_workspace_sizes({}) == {32 * MiB, 8 * MiB + 128 * 1024, MiB}
    # ":4096:8" is 4096 KiB x 8 = 32 MiB; ":16:8" adds 128 KiB; cuBLASLt's stays 1 MiB.
    assert cublas_workspace_sizes({"CUBLAS_WORKSPACE_CONFIG": ":4096:8:16:8"}) == {
        32 * MiB + 128 * 1024, MiB}
    assert cublas_workspace_sizes({"CUBLAS_WORKSPACE_CONFIG": ":16:8",
                                   "CUBLASLT_WORKSPACE_SIZE": "4096"}) == {128 * 1024}


def test_the_explanation_ledger_carries_the_snapshots_workspaces():
    from dataclasses import replace

    from gpumem_nb.oom.watch import explanation_ledger

    f = replace(_generate_under_async(), backend="native", allocated_bytes=33 * MiB,
                released_since_bytes=0, computation_bytes=0, cell_bytes=0,
                workspaces_bytes=33 * MiB)
    led = explanation_ledger(f, [])
    assert led is not None and led.not_found_bytes == 0


def test_who_and_the_dry_runs_ledgers_name_the_workspaces_from_the_segments():
    from types import SimpleNamespace

    from gpumem_nb.ledger import ledgers_of

    al = SimpleNamespace(allocated_bytes=33 * MiB)
    sample = SimpleNamespace(devices=[SimpleNamespace(index=0, allocator=al)])
    segments = [{"device": 0, "blocks": [_block(32 * MiB), _block(MiB)]}]
    (without,) = ledgers_of(sample, [])
    assert without.not_found_bytes == 33 * MiB
    (led,) = ledgers_of(sample, [], segments)
    assert led.workspaces_bytes == 33 * MiB and led.not_found_bytes == 0


def test_reading_the_segments_for_the_ledger_never_starts_cuda():
    from gpumem_nb.cleanup import allocator_segments

    from .fakes import FakeCuda

    cuda = FakeCuda()
    assert allocator_segments({"torch": fake_torch(cuda)}) is None
    assert not cuda.initialized
    assert not any("snapshot" in c for c in cuda.calls)
