from __future__ import annotations

import pytest

from gpumem_nb.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "n"),
    [("512MB", 512_000_000), ("2GiB", 2 << 30), ("1e9", 10**9), ("64 MiB", 64 << 20),
     ("0", 0), ("1.5gb", 1_500_000_000), ("100", 100)],
)
def test_sizes_in_every_documented_form_parse(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["lots", "", "-1GB", "5 parsecs", "GB"])
def test_bad_sizes_are_refused_with_a_sentence(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_format_bytes_uses_binary_units_and_dash_for_unknown():
    assert format_bytes(int(1.49 * (1 << 30))) == "1.49 GiB"
    assert format_bytes(None) == "—"
    assert format_bytes(64 << 20, signed=True) == "+64.00 MiB"
    assert format_bytes(-(64 << 20)) == "-64.00 MiB"


def test_format_bytes_never_raises_on_a_huge_or_odd_size():
    # A history entry of 10**400 bytes overflowed float division; 10**5000 the int-to-text
    # limit.
    for n in (10**400, -(10**5000), 2**80):
        assert "more than 1 YiB" in format_bytes(n)
    assert format_bytes(2**64) == "16777216.00 TiB"
    assert format_bytes(float("nan")) == format_bytes(float("inf")) == "—"
    assert format_bytes("12") == "—"  # type: ignore[arg-type]
    assert format_bytes(512.0) == "512 B"
