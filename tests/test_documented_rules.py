"""Two rules the docs state, pinned so that changing either fails a test (the 2026-12-01b
review found both survived mutation): the cell's working set is the OOM verdict only when it
dwarfs every other cause by ``_DWARFS`` (4×), and ``config --device N --save`` never writes the
device to the settings file (the device is per session: another kernel's GPU 0 is not this
one's)."""

from __future__ import annotations

import json
from typing import Any

from gpumem_nb.model import Holder
from gpumem_nb.oom import CAUSE_HELD, CAUSE_WORKING_SET, OomFacts, classify

GiB = 1 << 30
MiB = 1 << 20


def _facts(cell_bytes: int) -> OomFacts:
    # 10 GiB asked with 2 GiB free: 8 GiB missing, which the 10 GiB variable alone covers.
    return OomFacts(device=0, requested_bytes=10 * GiB, total_bytes=140 * GiB,
                    free_bytes=2 * GiB, allocated_bytes=100 * GiB, reserved_bytes=100 * GiB,
                    this_process_bytes=100 * GiB + GiB // 2, cell_bytes=cell_bytes)


HELD = [Holder("x", "variable", "cuda:0", 10 * GiB)]


def test_the_working_set_is_the_verdict_from_four_times_the_next_cause_and_not_below():
    at = classify(_facts(40 * GiB), HELD)
    assert at[0].kind == CAUSE_WORKING_SET, [c.kind for c in at]
    below = classify(_facts(40 * GiB - 64 * MiB), HELD)
    assert below[0].kind == CAUSE_HELD, [c.kind for c in below]


def test_config_device_save_never_writes_the_device_to_the_file(shell, two_fake_gpus,
                                                                 private_settings: Any):
    shell.run_cell("%load_ext gpumem_nb")
    result = shell.run_cell("%gpumem config --device 1 --threshold 3GB --save")
    assert result.error_in_exec is None, result.error_in_exec
    saved = json.loads(private_settings.read_text())
    assert "device" not in saved, saved
    assert saved.get("threshold_bytes") == 3 * 10 ** 9, saved  # the save itself happened
    shell.run_cell("%gpumem config --device 1 --save")  # a device alone: still not saved
    assert "device" not in json.loads(private_settings.read_text())
