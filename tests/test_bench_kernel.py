"""The real-kernel benchmark (benchmarks/bench_kernel.py) keeps working: a short run on the
fake GPUs produces complete, finite figures. No timing is asserted; the figures are printed
so a CI log shows them (``pytest -s``)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from benchmarks import bench_kernel, kernel_probe

pytestmark = pytest.mark.slow  # a benchmark script run in a real kernel

SHORT = ["--rounds", "1", "--cells", "8", "--warmup", "2", "--gap-s", "0.02",
         "--tensors", "200"]


def finite_summary(d: dict[str, Any], n: int) -> None:
    assert d["n"] == n, d
    for key in ("median", "p90", "mean", "min", "max"):
        assert math.isfinite(d[key]) and d[key] > 0, (key, d)
    assert d["min"] <= d["median"] <= d["p90"] <= d["max"], d


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in the results JSON")

    return json.loads(text, parse_constant=refuse)


def check_config(s: dict[str, Any], cells: int) -> None:
    hooks = s["hooks_us"]
    assert sum(hooks["callbacks_wrapped"].values()) >= 1, hooks  # found the extension's hooks
    assert hooks["cells_without_hook_record"] == 0
    assert hooks["callbacks_escaping_timers"] == 0
    finite_summary(hooks["total"], cells)
    for metric in ("exec_us", "busy_idle_us", "roundtrip_us"):
        finite_summary(s[metric]["without"], cells)
        finite_summary(s[metric]["with"], cells)
        assert math.isfinite(s[metric]["added_median"]), s[metric]
    assert s["cells_measured_per_arm"] == {"without": cells, "with": cells}
    for arm in ("without", "with"):
        assert s["kernel_cpu_per_cell_us"][arm]["n"] == 1
        assert math.isfinite(s["kernel_cpu_per_cell_us"][arm]["median"])
    (added,) = s["exec_added_median_per_round_us"]
    assert math.isfinite(added)
    assert [r["arm"] for r in s["per_round"]] == ["without", "with"]


@pytest.mark.kernel
def test_bench_kernel_on_one_fake_gpu_reports_every_figure_with_training(tmp_path, capsys):
    out = tmp_path / "one.json"
    bench_kernel.main([*SHORT, "--fakes", "1", "--train", "--train-steps", "100",
                       "--out", str(out)])
    printed = capsys.readouterr().out
    result = strict_json(out.read_text())
    assert list(result["configs"]) == ["fakes_1gpu"]
    s = result["configs"]["fakes_1gpu"]
    check_config(s, cells=8)
    for arm in ("without", "with", "with_interval_0.05"):
        finite_summary(s["train_step_us"][arm], 100)
    assert result["train"]["kind"] == "cpu" and result["train"]["param"] > 0
    assert result["kernel"]["gpumem_nb_file"].startswith(str(bench_kernel.ROOT))
    assert "200 fake CUDA tensors" in s["notes"]
    with capsys.disabled():
        print("\n" + printed)


@pytest.mark.kernel
def test_bench_kernel_compares_one_and_eight_fake_gpus(tmp_path, capsys):
    out = tmp_path / "eight.json"
    bench_kernel.main([*SHORT, "--fakes", "8", "--out", str(out)])
    printed = capsys.readouterr().out
    result = strict_json(out.read_text())
    assert list(result["configs"]) == ["fakes_1gpu", "fakes_8gpu"]
    for s in result["configs"].values():
        check_config(s, cells=8)
    assert "watching GPU 0" in result["configs"]["fakes_8gpu"]["load_output"][0]
    assert "7: NVIDIA H200" in result["configs"]["fakes_8gpu"]["load_output"][0]
    flat = result["flatness"]
    assert math.isfinite(flat["ratio"]) and flat["ratio"] > 0
    with capsys.disabled():
        print("\n" + printed)


def test_hook_timers_wrap_only_the_extensions_callbacks_in_place(shell, fake_gpu):
    """The benchmark's in-place timers must find the extension's callbacks wherever it
    registers them, leave other callbacks alone, keep the order, and be undoable."""
    def other(*args: Any) -> None:
        pass

    shell.events.register("pre_run_cell", other)
    try:
        shell.run_cell("%load_ext gpumem_nb")
        before = {e: list(shell.events.callbacks[e]) for e in kernel_probe.CELL_EVENTS}
        ours = {e: [cb for cb in cbs if kernel_probe._module_of(cb).startswith("gpumem_nb")]
                for e, cbs in before.items()}
        assert any(ours.values())  # whichever cell events the extension uses
        wrapped = kernel_probe.wrap_hooks(shell)
        assert wrapped == {e: len(v) for e, v in ours.items() if v}
        after = shell.events.callbacks
        for e, cbs in before.items():
            assert [getattr(cb, "__wrapped__", cb) for cb in after[e]] == cbs
        assert other in after["pre_run_cell"]
        kernel_probe.HOOK_NS.clear()
        shell.run_cell("x = 1")
        (rec,) = kernel_probe.HOOK_NS.values()
        assert set(rec) == set(wrapped) and all(ns > 0 for ns in rec.values())
        assert kernel_probe.unwrapped_hooks(shell) == 0
    finally:
        kernel_probe.unwrap_hooks(shell)
        shell.events.unregister("pre_run_cell", other)
    assert {e: list(shell.events.callbacks[e]) for e in kernel_probe.CELL_EVENTS} == {
        e: [cb for cb in cbs if cb is not other] for e, cbs in before.items()}
