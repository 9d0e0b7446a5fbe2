"""The contributor's loop leaves out, unimported, only the files none of whose tests it could
choose: a file it skips wrongly is a test nobody runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import pytest_ignore_collect


class _Config:
    def __init__(self, chosen: str) -> None:
        self.chosen = chosen

    def getoption(self, name: str) -> Any:
        assert name == "-m"
        return self.chosen


def _ignored(tmp_path: Path, source: str, chosen: str) -> bool:
    path = tmp_path / "test_x.py"
    path.write_text("import pytest\n" + source)
    return pytest_ignore_collect(path, _Config(chosen)) is True


LOOP = "not slow and not browser"


def test_a_file_marked_slow_as_a_whole_is_not_imported_by_the_loop(tmp_path):
    assert _ignored(tmp_path, "pytestmark = pytest.mark.slow\n", LOOP)
    assert _ignored(tmp_path, "pytestmark = [pytest.mark.kernel, pytest.mark.slow]\n", LOOP)


def test_a_file_is_imported_when_any_run_could_choose_it(tmp_path):
    assert not _ignored(tmp_path, "pytestmark = pytest.mark.slow\n", "slow")
    assert not _ignored(tmp_path, "pytestmark = pytest.mark.slow\n", "")
    assert not _ignored(tmp_path, "def test_a(): pass\n", LOOP)
    assert not _ignored(tmp_path, "pytestmark = pytest.mark.gpu\n", LOOP)


def test_a_test_marked_inside_a_slow_file_keeps_the_file_for_its_own_mark(tmp_path):
    source = "pytestmark = pytest.mark.slow\n@pytest.mark.gpu\ndef test_a(): pass\n"
    assert not _ignored(tmp_path, source, "gpu")
    assert _ignored(tmp_path, source, LOOP)


def test_a_file_that_does_not_parse_is_collected_so_its_error_is_shown(tmp_path):
    assert not _ignored(tmp_path, "pytestmark = pytest.mark.slow\ndef (:\n", LOOP)
