"""What a snapshot file may grow to once it is read, bounded in bytes before it is held: a
gzip file's unpacked bytes, and the memory a JSON text takes once parsed (issue 36, F2)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import gpumem_nb
from gpumem_nb.whatif import api as w
from gpumem_nb.whatif import unpack
from gpumem_nb.whatif.snapshot import COMPACT_FORMAT, MAX_HISTORY_ENTRIES

from .fakes import MiB
from .helpers import whatif
from .whatif_history import History


def _history_with_a_string(path: Path, string_bytes: int) -> None:
    """A valid history plus one string of ``string_bytes``, gzip'd a MiB at a time (the file
    is about a thousandth of that)."""
    h = History()
    h.free(h.alloc(16 * MiB))
    head = json.dumps(h.snapshot())[:-1] + ', "junk": "'
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    with open(path, "wb") as f:
        f.write(packer.compress(head.encode()))
        for _ in range(string_bytes // MiB):
            f.write(packer.compress(b"x" * MiB))
        f.write(packer.compress(b'"}') + packer.flush())


def test_a_small_gzip_file_that_unpacks_past_the_bound_is_refused_holding_no_more_than_it(
        loaded, tmp_path):
    # The review's file: 0.99 MB that unpacked to a 970 MiB string took 31 s and 2.9 GiB,
    # and was accepted (the chunks kept then joined, and json.loads a third copy).
    path = tmp_path / "bomb.json.gz"
    _history_with_a_string(path, unpack.MAX_UNPACKED_BYTES + 16 * MiB)
    assert path.stat().st_size < MiB
    tracemalloc.start()
    try:
        with pytest.raises(UsageError) as e:
            whatif(loaded, f"--trace {path}")
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == (f"{path} unpacks to more than 256.00 MiB, more than any "
                            "snapshot a what-if replays")
    assert peak_bytes < 1.25 * unpack.MAX_UNPACKED_BYTES


def test_a_file_just_inside_the_bound_is_read_holding_its_text_at_most_twice(tmp_path):
    # The bytes are let go before the parse: the text is held as bytes and a str, then as
    # a str and the one string parsed out of it, never all three at once.
    path = tmp_path / "big.json.gz"
    _history_with_a_string(path, 64 * MiB)
    tracemalloc.start()
    try:
        r = gpumem_nb.whatif(str(path), [""])
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r[0].peak_reserved_bytes == 16 * MiB
    assert peak_bytes < 2.25 * 64 * MiB


def test_json_of_short_strings_that_would_parse_into_a_gigabyte_is_refused_before_it_is_parsed(
        tmp_path):
    # 12 bytes of memory per byte of text, and no bracket to count: the bound that counted
    # brackets let this 79 MiB take 1.3 GiB (then said the history was empty).
    path = tmp_path / "strings.json.gz"
    text = b'{"segments": [], "device_traces": [[]], "junk": [' + b'"ab",' * 16_500_000 + b"0]}"
    path.write_bytes(gzip.compress(text, 1))
    tracemalloc.start()
    try:
        with pytest.raises(w.SnapshotError) as e:
            gpumem_nb.whatif(str(path), [""])
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == (f"{path} is refused: parsing its 78.68 MiB of JSON would take "
                            "about 1.38 GiB of memory, more than the 1.00 GiB a what-if "
                            "allows")
    assert peak_bytes < 1.25 * len(text)  # the unpacked text, and nothing parsed


@pytest.mark.parametrize("text", [
    b"[" + b'"ab",' * 50_000 + b'"ab"]',
    b"[" + b"{}," * 50_000 + b"{}]",
    b"[" + b"[1]," * 50_000 + b"[1]]",
    b"[" + b"[1,2,3,4,5]," * 50_000 + b"[]]",
    b"[" + b"0.5," * 50_000 + b"0.5]",
    b"[" + b"123456789012345," * 50_000 + b"1]",
    b"{" + b",".join(b'"k%d":1' % i for i in range(50_000)) + b"}",
    b"[" + b'{"a":"bc"},' * 50_000 + b"{}]",
    b"[" + b'{"filename":"/a/b.py","line":12,"name":"f"},' * 50_000 + b"{}]",
    b'["' + b"a" * MiB + b'"]',
    b'["' + b"a" * MiB + b'\\ud83d\\ude00"]',  # one escaped emoji: 4 bytes a character
    ('["' + "a" * MiB + "\U0001f600\"]").encode(),
    b"[" * 400 + b"]" * 400,
], ids=["short-strings", "empty-dicts", "one-item-lists", "five-item-lists", "floats",
        "large-ints", "many-keys", "one-key-dicts", "frames", "long-string",
        "escaped-emoji", "raw-emoji", "nested"])
def test_the_estimate_of_a_json_parse_is_never_below_what_it_takes(text):
    estimate = unpack.json_cost(text).estimate_bytes
    tracemalloc.start()
    try:
        obj = json.loads(unpack.json_text(text, "x"))
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert obj is not None
    assert peak_bytes <= estimate, (peak_bytes, estimate)


def test_a_compact_trace_at_the_entry_bound_fits_both_bounds():
    # What the bounds are for: the largest history a what-if replays, as the compact JSON
    # trace the GPU validation writes, unpacks within the bound and parses within its own.
    n = MAX_HISTORY_ENTRIES
    trace = {"format": COMPACT_FORMAT, "segments": [], "device_traces_columns": [{
        "action": ["free_completed"] * n, "addr": list(range(1 << 46, (1 << 46) + n)),
        "size": [20 * MiB] * n, "stream": [0] * n,
        "time_us": [1.7e15 + 10.5 * i for i in range(n)]}]}
    text = json.dumps(trace).encode()
    assert len(text) < unpack.MAX_UNPACKED_BYTES / 4
    assert unpack.json_cost(text).estimate_bytes < unpack.MAX_JSON_MEMORY_BYTES / 2
