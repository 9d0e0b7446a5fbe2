"""``gpumem_nb.on_cell``: each cell's record handed to the user's callback (for W&B,
TensorBoard, MLflow), contained when it raises, and gone with the extension."""

from __future__ import annotations

import logging
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import gpumem_nb
from gpumem_nb.kernel import current_monitor
from gpumem_nb.model import CellRecord

from .fakes import GiB

README = Path(__file__).resolve().parent.parent / "README.md"


def run(ip: Any, source: str) -> Any:
    result = ip.run_cell(source, store_history=True)
    current_monitor(ip).flush()  # the cells the sampler has not recorded yet
    return result


def test_each_cell_reaches_the_callback_as_its_record_with_the_allocators_bytes(loaded):
    seen: list[CellRecord] = []
    handle = gpumem_nb.on_cell(seen.append)
    result = run(loaded, "x = cuda.tensor(2 * GiB)")
    run(loaded, "y = 1")
    assert [r.execution_count for r in seen] == [result.execution_count,
                                                 result.execution_count + 1]
    assert all(isinstance(r, CellRecord) for r in seen)
    (dev,) = seen[0].devices
    assert dev.allocated_after_bytes - dev.allocated_before_bytes == 2 * GiB
    assert seen[0].source_preview.startswith("x = cuda.tensor")
    assert handle.calls == 2 and handle.failures == 0


def test_a_removed_callback_is_called_no_more(loaded):
    seen: list[CellRecord] = []
    handle = gpumem_nb.on_cell(seen.append)
    run(loaded, "a = 1")
    handle.remove()
    handle.remove()  # twice: harmless
    run(loaded, "b = 2")
    assert len(seen) == 1 and not handle.active
    with gpumem_nb.on_cell(seen.append) as scoped:
        run(loaded, "c = 3")
    run(loaded, "d = 4")
    assert len(seen) == 2 and not scoped.active


def test_a_raising_callback_is_reported_once_and_the_others_still_run(loaded, capsys, caplog):
    def broken(rec: CellRecord) -> None:
        raise ValueError("wandb is offline")

    seen: list[CellRecord] = []
    bad = gpumem_nb.on_cell(broken)
    gpumem_nb.on_cell(seen.append)
    caplog.set_level(logging.WARNING, logger="gpumem_nb")
    results = [run(loaded, f"v{i} = {i}") for i in range(3)]
    assert all(r.error_in_exec is None for r in results)
    warned = [r.getMessage() for r in caplog.records if "on_cell callback" in r.getMessage()]
    assert len(warned) == 1 and "ValueError: wandb is offline" in warned[0], warned
    assert bad.failures == 3 and bad.active and bad.last_error == "ValueError: wandb is offline"
    assert len(seen) == 3
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err


def test_the_callbacks_are_cleared_at_unload_and_not_back_after_a_reload(loaded):
    seen: list[CellRecord] = []
    handle = gpumem_nb.on_cell(seen.append)
    loaded.run_cell("%reload_ext gpumem_nb", store_history=True)
    assert not handle.active
    count = len(seen)
    run(loaded, "z = 1")
    assert len(seen) == count
    loaded.run_cell("%unload_ext gpumem_nb", store_history=True)
    with pytest.raises(RuntimeError, match="%load_ext gpumem_nb"):
        gpumem_nb.on_cell(seen.append)


def test_a_callback_that_is_not_callable_is_refused_with_a_sentence(loaded):
    with pytest.raises(TypeError, match="function of one argument"):
        gpumem_nb.on_cell("wandb")  # type: ignore[arg-type]


def readme_example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- on-cell-example -->\s*```python\n(.*?)\n```", text, re.DOTALL)
    assert m, "README.md has no python block after <!-- on-cell-example -->"
    return m.group(1)


def test_the_readmes_wandb_example_logs_each_cell(loaded, monkeypatch):
    logged: list[dict[str, Any]] = []
    wandb = types.ModuleType("wandb")
    wandb.init = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    wandb.log = logged.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    code = readme_example()
    assert len(code.splitlines()) == 5, code
    assert run(loaded, code).error_in_exec is None
    run(loaded, "w = cuda.tensor(3 * GiB)")
    assert logged, "the example logged nothing"
    last = logged[-1]
    assert last["gpu0/peak_GiB"] == pytest.approx(3.0)
    assert last["cell_s"] >= 0
