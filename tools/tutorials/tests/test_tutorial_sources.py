"""The tutorials' sources, checked here before the GPU machine executes them (issue 28).

Only the GPU machine can execute the tutorials, and it is lent for minutes at a time: a cell
that reads an attribute gpumem_nb renamed, or a helper that miscounts, would only show there,
as a failed run. These tests read the sources as the runner does and check, without a GPU:

- every tutorial parses and plans (``run_tutorials.py --dry-run``);
- every attribute of gpumem_nb's results that the tutorials read still exists, under the name
  they use (the package changes under them);
- the helpers the new tutorials define give the right figures on made-up inputs.
"""

from __future__ import annotations

import ast
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from test_tutorial_prose import NOTEBOOKS, ROOT, RUNNER

# The tutorial machinery (the notebooks' sources and their pairing), not the extension.
pytestmark = pytest.mark.slow


def cell_function(name: str, cell_id: str, function: str, namespace: dict[str, Any]) -> Any:
    """The function ``function`` as a tutorial's cell defines it, defined in ``namespace``
    (the cell's other statements are not run)."""
    cell = next(c for c in RUNNER.load_source(NOTEBOOKS / f"{name}.py").cells if c.id == cell_id)
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(cell.source))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    exec(compile(ast.Module([node], []), f"{name} cell {cell_id}", "exec"), namespace)
    return namespace[function]


def test_every_tutorial_parses_and_plans_without_a_kernel(capsys):
    assert RUNNER.main(["--dry-run", "unused-out-dir"]) == 0
    out = capsys.readouterr().out
    for source in RUNNER.tutorial_sources():
        assert source.stem in out
    assert f"{len(RUNNER.tutorial_sources())} tutorials parse" in out


def test_a_syntax_error_in_a_cell_is_found_by_the_dry_run_not_on_the_gpu(tmp_path):
    src = tmp_path / "99_broken.py"
    src.write_text('# %% id="99-00"\nx = (1,\n')
    with pytest.raises(SyntaxError, match=r"99_broken\.py cell 99-00"):
        RUNNER.plan([src], timings=tmp_path / "none.json")


def fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_results_the_tutorials_read_still_have_the_names_they_read():
    """09-13, 09-18, 08-19 read whatif's fit rows; 10-09, 11-09 the OOM explanation; 12 the
    NVML reading's children and the cluster's rows; 07-22 the trace's own peak."""
    from gpumem_nb.cluster import ROW_OK, ClusterReading, WorkerGpu
    from gpumem_nb.kernel import Monitor
    from gpumem_nb.model import ROLE_DATALOADER, ChildProcess, NvmlReading
    from gpumem_nb.oom.advice import OomExplanation
    from gpumem_nb.oom.causes import CAUSE_PRIVATE_POOL, Cause
    from gpumem_nb.trace import DeviceTrace, TraceResult
    from gpumem_nb.whatif.fit import Fit, FitRow
    from gpumem_nb.whatif.report import WhatIf, WhatIfRow

    assert {"min_bytes", "setting"} <= fields(FitRow) and callable(FitRow.fits)
    assert "rows" in fields(Fit)
    assert {"fit", "rows"} <= fields(WhatIf)
    assert {"current", "peak_reserved_bytes", "inactive_split_bytes"} <= fields(WhatIfRow)
    assert "causes" in fields(OomExplanation) and "kind" in fields(Cause)
    assert CAUSE_PRIVATE_POOL == "memory pool"  # 10-09 compares the kind with this text
    assert {"other_processes_bytes", "children", "children_bytes"} <= fields(NvmlReading)
    assert {"pid", "nbytes", "role"} <= fields(ChildProcess)
    assert isinstance(ChildProcess.label, property)
    assert ROLE_DATALOADER == "DataLoader worker"  # 12-07 compares the role with this text
    assert {"rows"} <= fields(ClusterReading) and ROW_OK == "ok"
    assert {"worker", "pid", "status", "allocated_bytes", "process_bytes", "uuid"} <= \
        fields(WorkerGpu)
    assert callable(Monitor.learn_child_roles) and callable(Monitor.read)
    assert "devices" in fields(TraceResult) and "snapshot_s" in fields(TraceResult)
    assert "peak_bytes" in fields(DeviceTrace)


def test_the_explanations_the_tutorials_quote_are_the_words_gpumem_nb_writes():
    """10-09 looks for "CUDA graph <name>" and "empty_cache() cannot release it" in a pool's
    cause; 11-09 for "growing <size> per generated token" in the KV cache's line and for
    "max_new_tokens" in the advice. Worded otherwise, the tutorial's claim would fail on the
    GPU machine instead of here."""
    from gpumem_nb.oom import causes
    from gpumem_nb.oom.facts import POOL_GRAPH, PoolUse
    from gpumem_nb.oom.site import CacheUse, FailureSite
    from gpumem_nb.units import format_bytes

    pool = PoolUse((1, 0), POOL_GRAPH, 80 << 30, 64 << 20, owner="big_graph")
    summary = causes._pool_cause(pool, True).summary
    assert "the CUDA graph big_graph" in summary and "empty_cache() cannot release it" in summary
    per_token = 2 * 12 * 512 * 1024 * 4
    site = FailureSite(in_generate=True, cache=CacheUse("traceback: generate() locals", 20 << 30,
                                                        400, per_token))
    assert f"growing {format_bytes(per_token)} per generated token" in " ".join(site.lines())
    assert "max_new_tokens" in (ROOT / "gpumem_nb" / "oom" / "advice.py").read_text()


def test_a_kv_cache_is_read_whatever_transformers_made_it():
    """11-01's cache_tensors: a cache with ``layers`` (transformers >= 4.56), with
    ``key_cache`` lists, or a legacy tuple of (key, value) pairs, gives the same tensors."""
    tensor = SimpleNamespace
    keys = [tensor(nbytes=4096) for _ in range(3)]
    values = [tensor(nbytes=4096) for _ in range(3)]
    cache_tensors = cell_function("11_generation_kv_cache", "11-01", "cache_tensors", {})
    layered = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v)
                                      for k, v in zip(keys, values, strict=True)])
    listed = SimpleNamespace(key_cache=keys, value_cache=values)
    legacy = tuple(zip(keys, values, strict=True))
    for cache in (layered, listed, legacy):
        found = cache_tensors(cache)
        assert sorted(map(id, found)) == sorted(map(id, keys + values)), cache
        assert sum(t.nbytes for t in found) == 6 * 4096


def test_a_private_pool_is_told_from_the_default_pool_by_its_segments():
    """10-01's pools(): segments of pool (0, 0) are the shared cache; others sum per pool."""
    segments = [{"segment_pool_id": (0, 0), "total_size": 2 << 20},
                {"segment_pool_id": (1, 0), "total_size": 64 << 20},
                {"segment_pool_id": (1, 0), "total_size": 64 << 20},
                {"segment_pool_id": (0, 2), "total_size": 20 << 20},
                {"total_size": 8 << 20}]  # an older snapshot without the key: default pool
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(memory_snapshot=lambda: segments))
    pools = cell_function("10_graphs_and_compile", "10-01", "pools", {"torch": fake_torch})
    assert pools() == {(1, 0): 128 << 20, (0, 2): 20 << 20}


def test_consecutive_streams_are_saved_merged_as_jupyterlab_keeps_them():
    """08 at b27572d opened marked modified: three stderr outputs in a row, which JupyterLab's
    model merges into one; the runner saves them merged, before the outputs' digest."""
    import nbformat
    from test_tutorial_prose import RUNNER

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="a\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="b\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="c\n"),
                    nbformat.v4.new_output("display_data", data={"text/plain": "d"}),
                    nbformat.v4.new_output("stream", name="stdout", text="e\n")]
    nb.cells = [cell]
    RUNNER.merge_streams(nb)
    assert [(o.output_type, o.get("name"), o.get("text")) for o in cell.outputs] == [
        ("stream", "stderr", "a\nb\n"), ("stream", "stdout", "c\n"),
        ("display_data", None, None), ("stream", "stdout", "e\n")]
