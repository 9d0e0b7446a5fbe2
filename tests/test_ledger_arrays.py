"""The ledger splits PyTorch's allocated bytes; another library's arrays are never a part.

H200, tutorial 04 at b27572d: a 60 GiB CuPy array was listed as "Of 65.00 MiB allocated on
cuda:0: 60.00 GiB the holders' own tensors".
"""

from __future__ import annotations

from gpumem_nb.ledger import ledger
from gpumem_nb.model import Holder

MiB, GiB = 1 << 20, 1 << 30


def test_a_cupy_array_is_not_counted_in_pytorchs_allocated_bytes_but_said_beside_them():
    holders = [Holder(name="big", kind="variable", device="cuda", nbytes=60 * GiB, arrays=True),
               Holder(name="x", kind="variable", device="cuda:0", nbytes=32 * MiB)]
    led = ledger("cuda:0", 65 * MiB, holders, workspaces_bytes=33 * MiB)
    assert led.holders_bytes == 32 * MiB and led.arrays_bytes == 60 * GiB
    assert led.attributed_bytes == 65 * MiB  # x and the workspaces: every byte, once
    line = led.line()
    assert line.startswith("Of 65.00 MiB allocated on cuda:0: 32.00 MiB the holders' own")
    assert "60.00 GiB in the holders' arrays on a GPU (CuPy-like), outside PyTorch's" in line


def test_without_arrays_the_line_says_nothing_about_them():
    led = ledger("cuda:0", 32 * MiB, [Holder(name="x", kind="variable", device="cuda:0",
                                             nbytes=32 * MiB)])
    assert led.arrays_bytes == 0 and "arrays" not in led.line()
