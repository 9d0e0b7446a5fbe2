"""Under cudaMallocAsync the snapshot has no blocks, so cuBLAS's workspaces (ATen keeps one per
handle and stream, from the allocator: 32 MiB on Hopper, and cuBLASLt's) were "not found" in
rows that allocate almost nothing (33 MiB on the H100). Told by their sizes instead, where they
are all that is left."""

from __future__ import annotations

from typing import Any

from gpumem_nb.ledger import workspaces_in_remainder

from .fakes import GiB, MiB
from .test_oom import last, make_world, run

CUBLAS = 32 * MiB
LT = 1 * MiB
ENV: dict[str, str] = {}  # the defaults


def test_a_remainder_of_a_few_workspaces_is_said_as_them() -> None:
    assert workspaces_in_remainder(CUBLAS + LT, ENV) == CUBLAS + LT
    assert workspaces_in_remainder(2 * CUBLAS + 2 * LT + 512, ENV) == 2 * CUBLAS + 2 * LT


def test_a_remainder_that_is_no_sum_of_workspaces_stays_not_found() -> None:
    assert workspaces_in_remainder(CUBLAS - 4096, ENV) == 0
    assert workspaces_in_remainder(3 * GiB, ENV) == 0
    assert workspaces_in_remainder(0, ENV) == 0


def test_cublas_workspaces_under_cudamallocasync_are_named_not_not_found(
        shell: Any, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    w = make_world(monkeypatch, backend="cudaMallocAsync")
    run(shell, "%load_ext gpumem_nb")
    shell.user_ns.update(cuda=w.cuda, GiB=GiB)
    run(shell, "warm = 1")
    # A matmul's workspaces: allocated by ATen from C++, held by no Python object.
    w.cuda.allocate(0, CUBLAS)
    w.cuda.allocate(0, LT)
    capsys.readouterr()
    run(shell, "x = cuda.tensor(400 * GiB)")
    e = last(shell)
    assert e.ledger is not None
    assert e.ledger.workspaces_bytes == CUBLAS + LT, e.ledger
    assert e.ledger.not_found_bytes == 0
    assert "cuBLAS workspaces" in e.ledger.line()
