"""F2 again: `%gpumem whatif --trace FILE` with bombs and hostile files the 2026-12-05 round
did not try. Each attack runs in a forked child (time, VmHWM peak).

    PYTHONPATH=. python benchmarks/attack36/f2_whatif_unpack.py
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pickle
import sys
import zipfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import (
    Cell,
    MiB,
    attack,
    make_shell,
    one_sentence,
    private_home,
    summary,
)
from tests.whatif_history import History

HOME = private_home()
SHELL = make_shell()
BOUND = 256 * MiB


def valid_snapshot() -> dict:
    h = History()
    a = h.alloc(16 * MiB)
    h.alloc(8 * MiB)
    h.free(a)
    return h.snapshot()


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 9)


def gz_stream(path: Path, head: bytes, filler: bytes, n: int, tail: bytes) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(packer.compress(head))
        for _ in range(n):
            f.write(packer.compress(filler))
        f.write(packer.compress(tail) + packer.flush())


def whatif(path: str) -> dict:
    c = Cell(SHELL, f"%gpumem whatif --trace {path}")
    sentence = c.usage_sentence()
    return {"usage_error": c.usage_error, "error": repr(c.error)[:300],
            "sentence": sentence[:400], "sentence_len": len(sentence),
            "traceback": c.traceback_shown, "printed_chars": len(c.text),
            "bundles": len(c.bundles), "cell_s": round(c.seconds, 3)}


def refused(limit_mib: float = 4 * 256):
    def ok(r: dict) -> bool:
        return (r.get("usage_error") and one_sentence(r["sentence"]) and not r["traceback"]
                and r["peak_mib"] - r["rss_before_mib"] < limit_mib and r["seconds"] < 30)
    return ok


def answered_or_refused(limit_mib: float = 4 * 256):
    def ok(r: dict) -> bool:
        fine = (r.get("usage_error") and one_sentence(r["sentence"])) or (
            r.get("error") == "None" and r["bundles"] + r["printed_chars"] > 0)
        return (bool(fine) and not r["traceback"]
                and r["peak_mib"] - r["rss_before_mib"] < limit_mib and r["seconds"] < 30)
    return ok


def main() -> int:
    d = HOME / "f2"
    d.mkdir()
    S = "F2 whatif --trace"

    # 1. Nested gzip: the outer layer unpacks to a gzip file that itself unpacks to 4 GiB.
    inner = d / "inner.gz"
    gz_stream(inner, b"", b"\0" * MiB, 4096, b"")
    nested = d / "nested.json.gz"
    nested.write_bytes(gz(gz(inner.read_bytes())))
    attack(S, f"gzip(gzip(gzip 4 GiB of NUL)) {nested.stat().st_size} B",
           lambda: whatif(str(nested)), refused())

    # 2. Many gzip members, each small, concatenated: past the bound only all together.
    members = d / "members.json.gz"
    one = gz(b" " * (4 * MiB))
    members.write_bytes(gz(json.dumps(valid_snapshot()).encode()) + one * 80)
    attack(S, f"80 concatenated gzip members of 4 MiB of spaces ({members.stat().st_size} B)",
           lambda: whatif(str(members)), refused())

    # 3. 200,000 empty gzip members (a file of 4 MB): the unpacker's per-member cost.
    empties = d / "empties.json.gz"
    empties.write_bytes(gz(json.dumps(valid_snapshot()).encode()) + gz(b"") * 200_000)
    attack(S, f"a valid history then 200,000 empty gzip members ({empties.stat().st_size} B)",
           lambda: whatif(str(empties)), answered_or_refused())

    # 4. A gzip header whose FNAME field never ends (40 MB, no NUL).
    fname = d / "fname.json.gz"
    fname.write_bytes(b"\x1f\x8b\x08\x08\0\0\0\0\0\xff" + b"A" * (40 * MiB))
    attack(S, "gzip header with a 40 MB FNAME and no NUL", lambda: whatif(str(fname)),
           refused())

    # 5. gzip of one JSON string just inside the bound (top level a string, not a dict).
    big_str = d / "bigstr.json.gz"
    gz_stream(big_str, b'"', b"x" * MiB, 250, b'"')
    attack(S, "gzip of a single 250 MiB JSON string", lambda: whatif(str(big_str)),
           refused(limit_mib=3 * 256))

    # 6. gzip of a valid history holding one 250 MiB string, as a pickle (BINUNICODE8).
    head = pickle.dumps(valid_snapshot(), protocol=4)
    snap = valid_snapshot()
    snap["junk"] = "x" * (250 * MiB)
    pk = pickle.dumps(snap, protocol=5)
    del snap
    big_pk = d / "bigstr.pickle.gz"
    big_pk.write_bytes(gz(pk))
    del pk, head
    attack(S, "gzip'd pickle of a history + a 250 MiB string",
           lambda: whatif(str(big_pk)), answered_or_refused(limit_mib=3 * 256))

    # 7. A DUP bomb: one object, then 250 MiB of DUP ('2') opcodes, then APPENDS: 8 bytes of
    # stack per byte of file, under the unpickler's 16x growth ratio; 2 GiB from 250 KB.
    dup = d / "dup.pickle.gz"
    gz_stream(dup, b"\x80\x02]q\x00(N", b"2" * MiB, 250, b"e.")
    attack(S, f"gzip'd pickle: MARK, None, 250 MiB of DUP, APPENDS ({dup.stat().st_size} B)",
           lambda: whatif(str(dup)), refused(limit_mib=4 * 256))

    # 8. NONE bomb, the same shape with 'N' (None pushed, 1 byte -> 8 bytes).
    nones = d / "none.pickle.gz"
    gz_stream(nones, b"\x80\x02](", b"N" * MiB, 250, b"e.")
    attack(S, f"gzip'd pickle: 250 MiB of NONE then APPENDS ({nones.stat().st_size} B)",
           lambda: whatif(str(nones)), refused(limit_mib=4 * 256))

    # 9. Other codecs: bz2, xz, zip, zlib without gzip header (bombs of 1 GiB each).
    raw = json.dumps(valid_snapshot()).encode() + b" " * (64 * MiB)
    for label, data in (("bz2", bz2.compress(raw)), ("xz", lzma.compress(raw)),
                        ("zlib", zlib.compress(raw, 9))):
        p = d / f"snap.json.{label}"
        p.write_bytes(data)
        attack(S, f"{label} of a 64 MiB padded history ({p.stat().st_size} B)",
               lambda p=p: whatif(str(p)), refused())
    zp = d / "snap.zip"
    with zipfile.ZipFile(zp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("snap.json", raw)
    attack(S, f"zip of a 64 MiB padded history ({zp.stat().st_size} B)",
           lambda: whatif(str(zp)), refused())

    # 10. Deep nesting inside a pickle (the unpickler needs no recursion to build it): a
    # frames list, then the segments, 1,000,000 lists deep, written as opcodes by hand.
    def deep_pickle(path: Path, key_path: str) -> None:
        snap = valid_snapshot()
        if key_path == "frames":
            snap["device_traces"][0][0]["frames"] = "PLACEHOLDER"
        else:
            snap["segments"] = "PLACEHOLDER"
        data = pickle.dumps(snap, protocol=2)
        n = 1_000_000
        deep_ops = b"]" * (n + 1) + b"a" * n
        path.write_bytes(data.replace(b"X\x0b\x00\x00\x00PLACEHOLDER", deep_ops, 1))
    deep_p = d / "deep.pickle"
    deep_pickle(deep_p, "frames")
    attack(S, "pickle with a 1,000,000-deep frames list in one entry",
           lambda: whatif(str(deep_p)), answered_or_refused())
    deep_s = d / "deep_segments.pickle"
    deep_pickle(deep_s, "segments")
    attack(S, "pickle whose segments is a 1,000,000-deep list",
           lambda: whatif(str(deep_s)), answered_or_refused())

    # 11. Lone surrogates and ESC in the names a report shows (JSON \ud800 escapes).
    s = valid_snapshot()
    for e in s["device_traces"][0]:
        e["frames"] = [{"filename": "\ud800evil\x1b[2J\u2028.py", "line": 1,
                        "name": "f\udfff\u202e"}]
    s["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "\ud800\x1b[31m"
    sur = d / "surrogates.json"
    sur.write_text(json.dumps(s))

    def surrogates() -> dict:
        r = whatif(str(sur))
        # What a kernel would send: every bundle encoded to JSON then UTF-8 as jupyter does.
        c = Cell(SHELL, f"%gpumem whatif --trace {sur}")
        bad = 0
        for b in c.bundles:
            try:
                json.dumps(b, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                bad += 1
        try:
            c.text.encode("utf-8")
            r["text_utf8"] = True
        except UnicodeEncodeError:
            r["text_utf8"] = False
        r["bundles_not_utf8"] = bad
        r["raw_esc_printed"] = "\x1b" in c.text
        return r
    attack(S, "JSON history whose frames and setting hold lone surrogates, ESC, U+2028",
           surrogates, lambda r: answered_or_refused()(r) and r["text_utf8"]
           and r["bundles_not_utf8"] == 0 and not r["raw_esc_printed"])

    # 12. Sizes as huge ints (4,000 digits, under Python's 4,300-digit limit), inf, NaN.
    for label, size in (("a 4,000-digit size", "9" * 4000), ("a 5,000-digit size", "9" * 5000),
                        ("size Infinity", "Infinity"), ("size NaN", "NaN"),
                        ("size -1e308", "-1e308")):
        txt = json.dumps(valid_snapshot()).replace('"size": 16777216', f'"size": {size}', 1)
        p = d / f"size_{len(size)}_{size[:3]}.json"
        p.write_text(txt)
        attack(S, f"history entry with {label}", lambda p=p: whatif(str(p)),
               answered_or_refused())

    # 13. A file name with ESC, a newline and U+202E: the refusal must not print them raw.
    evil = d / "e\x1b[31mvil\u202eno.json"
    evil.write_text("{not json")

    def evil_name() -> dict:
        SHELL.user_ns["evil_path"] = str(evil)
        c = Cell(SHELL, "%gpumem whatif --trace $evil_path")
        s = c.usage_sentence()
        return {"usage_error": c.usage_error, "sentence": s, "raw_esc": "\x1b" in s,
                "raw_bidi": "\u202e" in s, "traceback": c.traceback_shown}
    attack(S, "a damaged file whose name holds ESC and U+202E", evil_name,
           lambda r: r["usage_error"] and not r["raw_esc"] and not r["raw_bidi"])
    return summary("f2_whatif_unpack")


if __name__ == "__main__":
    sys.exit(main())
