"""A new user's small stumbles: a typo gets the word meant, a flag is honoured, nothing is
silent, and a notebook from a GPU machine still runs on a laptop."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from gpumem_nb.kernel import current_monitor
from gpumem_nb.units import format_bytes

from .fakes import MiB
from .helpers import magic


@pytest.mark.parametrize(("line", "meant"), [
    ("histroy", "did you mean 'history'?"),
    ("clenaup", "did you mean 'cleanup'?"),
    ("sumary", "did you mean 'summary'?"),
])
def test_a_misspelt_subcommand_gets_the_one_meant(loaded, line, meant):
    with pytest.raises(UsageError) as e:
        magic(loaded, line)
    assert str(e.value) == f"%gpumem has no subcommand '{line}'; {meant}"


def test_a_word_close_to_no_subcommand_still_points_to_the_list(loaded):
    with pytest.raises(UsageError, match=r"no subcommand 'frobnicate'; try %gpumem\? for"):
        magic(loaded, "frobnicate")


@pytest.mark.parametrize(("line", "meant"), [
    ("config --intervall 2", "%gpumem config: unrecognized arguments: --intervall 2; "
                             "did you mean '--interval'?"),
    ("cleanup --dryrun", "%gpumem cleanup: unrecognized arguments: --dryrun; "
                         "did you mean '--dry-run'?"),
    ("watch --replya=bundled", "%gpumem watch: unrecognized arguments: --replya=bundled; "
                               "did you mean '--replay'?"),
])
def test_a_misspelt_flag_gets_the_subcommands_own_flag(loaded, line, meant):
    with pytest.raises(UsageError) as e:
        magic(loaded, line)
    assert str(e.value) == meant


def test_a_misspelt_cell_magic_flag_gets_the_one_meant(loaded):
    with pytest.raises(UsageError, match="did you mean '--reset-peak'"):
        loaded.run_cell_magic("gpumem", "--reset-peaks", "pass")


def test_history_as_a_dataframe_honours_n_in_cells_not_rows(shell, two_fake_gpus, capsys):
    pytest.importorskip("pandas")
    loaded = shell
    loaded.run_cell("%load_ext gpumem_nb", store_history=True)
    for i in range(5):
        loaded.run_cell(f"x{i} = {i}", store_history=True)
    everything = magic(loaded, "history -o")
    last_two = magic(loaded, "history -n 2 -o")
    assert len(everything) >= 5
    assert len(last_two) == 4  # two cells, a row for each of the two GPUs
    assert set(last_two["device"]) == {0, 1}
    assert list(last_two["execution_count"]) == list(everything["execution_count"])[-4:]


def test_cell_magic_naming_gpu_0_without_a_gpu_runs_the_cell_and_says_so(shell, no_gpu,
                                                                         capsys):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    capsys.readouterr()
    shell.run_cell_magic("gpumem", "--device 0", "ran = 41 + 1")
    out = capsys.readouterr().out.splitlines()
    assert shell.user_ns["ran"] == 42
    assert out[0] == ("gpumem: --device 0: there is no GPU 0: this process sees no GPU; the "
                      "cell runs all the same, measured without that GPU.")
    assert len(out) == 2  # that line, then the cell's own report


def test_oom_o_without_an_oom_says_there_was_none(loaded, capsys):
    assert magic(loaded, "oom -o") is None
    assert "no CUDA out-of-memory error has reached a cell yet" in capsys.readouterr().out


def test_threshold_in_decimal_units_echoes_what_was_typed_beside_its_value(loaded, capsys):
    magic(loaded, "config --threshold 512MB")
    out = capsys.readouterr().out
    assert "gpumem: threshold 512MB = 488.28 MiB (512,000,000 bytes)" in out


def test_threshold_typed_as_it_is_shown_is_not_echoed_twice(loaded, capsys):
    magic(loaded, "config --threshold 64.00MiB")
    assert "gpumem: threshold" not in capsys.readouterr().out
    # Not echoed because it was applied and is shown as typed, not because it was dropped.
    assert current_monitor(loaded).config.threshold_bytes == 64 * MiB
    assert format_bytes(64 * MiB).replace(" ", "") == "64.00MiB"
