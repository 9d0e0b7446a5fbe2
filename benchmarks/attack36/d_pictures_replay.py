"""D1-D3 again: pictures that must parse as XML, names that must be cut, and a replay that
must not stall, with hostile inputs the 2026-12-05 round did not try.

    PYTHONPATH=. python benchmarks/attack36/d_pictures_replay.py
"""

from __future__ import annotations

import base64
import copy
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.attack36._harness import (
    Cell,
    attack,
    make_shell,
    one_sentence,
    private_home,
    summary,
)

HOME = private_home()
SHELL = make_shell(load=False)
BUNDLED = json.loads((Path(__file__).resolve().parents[2] / "gpumem_nb" / "data"
                      / "h200_session.json").read_text())
IMG = re.compile(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')


def bundle_problems(bundles: list[dict[str, Any]]) -> dict[str, Any]:
    """Every SVG (as image/svg+xml and inside an <img>) parsed as XML; every text sent as a
    kernel would (JSON then UTF-8); raw ESC / bidi / lone surrogates counted."""
    out = {"svgs": 0, "svg_not_xml": 0, "not_utf8": 0, "raw_esc": 0, "raw_surrogate": 0,
           "bundle_bytes": 0, "first_xml_error": ""}
    for b in bundles:
        svgs = []
        for mime, v in b.items():
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            out["bundle_bytes"] += len(text)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                out["not_utf8"] += 1
            if mime in ("text/plain", "text/html"):
                out["raw_esc"] += "\x1b" in text
                out["raw_surrogate"] += any(0xD800 <= ord(c) <= 0xDFFF for c in text)
            if mime == "image/svg+xml":
                svgs.append(v)
            if mime == "text/html":
                svgs += [base64.b64decode(m).decode("utf-8", "surrogatepass")
                         for m in IMG.findall(v)]
        for svg in svgs:
            out["svgs"] += 1
            try:
                ET.fromstring(svg)
            except ET.ParseError as e:
                out["svg_not_xml"] += 1
                out["first_xml_error"] = out["first_xml_error"] or str(e)
    return out


def clean(r: dict[str, Any], max_bytes: int = 2_000_000) -> bool:
    return (r.get("svg_not_xml", 1) == 0 and r.get("not_utf8", 1) == 0
            and r.get("raw_esc", 1) == 0 and r.get("raw_surrogate", 1) == 0
            and r.get("bundle_bytes", max_bytes + 1) <= max_bytes and not r.get("traceback"))


def trace_file(name: str, mutate: Any, samples: int = 30, compact: bool = False) -> Path:
    body = copy.deepcopy(BUNDLED)
    body["samples"] = body["samples"][:samples]
    mutate(body)
    p = HOME / name
    p.write_text(json.dumps(body, separators=(",", ":") if compact else None))
    return p


def replay(path: Path, ticks: int = 2) -> dict[str, Any]:
    from gpumem_nb.kernel import current_monitor

    SHELL.run_cell("%load_ext gpumem_nb")
    c = Cell(SHELL, f"%gpumem watch --replay {path}")
    r: dict[str, Any] = {"usage_error": c.usage_error, "sentence": c.usage_sentence()[:500],
                         "traceback": c.traceback_shown, "watch_s": round(c.seconds, 3),
                         "error": repr(c.error)[:300]}
    bundles = list(c.bundles)
    mon = current_monitor(SHELL)
    if mon is not None and mon.replay is not None and not c.usage_error:
        mon.replay.sampler.stop()
        for _ in range(ticks):
            mon.replay.sampler.tick()
        bundles.append(mon.widget.plain_bundle())
        r["status_problem"] = (mon.replay.source._rec.problem or "")[:300]
    r.update(bundle_problems(bundles))
    return r


def names(value: str):
    def mutate(body: dict) -> None:
        for s in body["samples"]:
            for d in s["devices"]:
                d["nvml"]["name"] = value
    return mutate


def main() -> int:
    S1, S2, S3 = "D1 picture XML", "D2 name bounds", "D3 watch --replay"

    # -- D1: hostile texts in every replayed text field, and in traced lines -------------
    hostile = {
        "lone surrogates": "GPU \ud800\udfff \udc80",
        "U+2028/2029/NEL": "GPU\u2028line\u2029para\x85nel",
        "NUL+ESC+bidi": "GPU\x00\x1b[2J\u202e\u2066",
        "noncharacters U+1FFFE/U+FDD0": "GPU\U0001fffe\ufdd0\U0010ffff",
        "surrogate pair written as two escapes": "GPU \ud83d\ude00",
    }
    for label, text in hostile.items():
        p = trace_file(f"name_{abs(hash(label))}.json", names(text))
        attack(S1, f"replayed GPU name with {label}", lambda p=p: replay(p), clean)

    def note_and_fields(text: str):
        def mutate(body: dict) -> None:
            body["note"] = text * 50
            for s in body["samples"]:
                for d in s["devices"]:
                    nv = d["nvml"]
                    nv["uuid"], nv["pci_bus_id"], nv["detail"] = text, text, text
                    nv["children"] = [{"pid": 7, "nbytes": 1 << 30, "cmdline": text,
                                       "role": "other"}]
        return mutate
    for label, text in hostile.items():
        p = trace_file(f"fields_{abs(hash(label))}.json", note_and_fields(text))
        attack(S1, f"replayed note, uuid, bus id, detail and a child's cmdline with {label}",
               lambda p=p: replay(p), clean)

    def traced(code: str) -> dict[str, Any]:
        from gpumem_nb.kernel import current_monitor
        from gpumem_nb.trace import TraceTimeline

        SHELL.run_cell("%load_ext gpumem_nb")
        c = Cell(SHELL, code)
        r: dict[str, Any] = {"traceback": c.traceback_shown, "error": repr(c.error)[:300],
                             "cell_s": round(c.seconds, 3)}
        bundles = list(c.bundles)
        t = current_monitor(SHELL).last_trace
        labels = []
        if t is not None:
            for d in t.devices:
                if d.series:
                    view = TraceTimeline(d)
                    bundles.append(view._repr_mimebundle_())
                    labels += [s.label for s in d.series]
        r["labels"] = [x[:120] for x in labels][:8]
        r.update(bundle_problems(bundles))
        return r

    for label, lit in (("U+2028 in a string", "\u2028"), ("U+2029 and NEL", "\u2029\x85"),
                       ("form feed, VT, FS", "\x0c\x0b\x1c"),
                       ("a U+FDD0 noncharacter", "\ufdd0")):
        code = ("%%gpumem --trace -q\n"
                f"a1 = cuda.tensor(64 * MiB); s = '{lit}'\n"
                "b2 = cuda.tensor(32 * MiB)  # second line\n"
                "c3 = cuda.tensor(16 * MiB)  # third line\n")

        def check(r: dict[str, Any]) -> bool:
            # each label should name its own line: the one holding b2 says b2, c3 says c3
            ls = " | ".join(r.get("labels", []))
            return clean(r) and "b2 = cuda.tensor(32" in ls and "c3 = cuda.tensor(16" in ls
        attack(S1, f"traced cell with {label} on its first line", lambda code=code: traced(code),
               check)

    big_line = ("%%gpumem --trace -q\nx1 = cuda.tensor(MiB); s = '" + "\x1b" * 10
                + "y" * 1_000_000 + "'\n")
    attack(S2, "traced cell with a 1,000,000-character line holding ESC",
           lambda: traced(big_line), lambda r: clean(r, 400_000) and r["cell_s"] < 10)

    # -- D2: names and other texts at sizes -------------------------------------------------
    for label, text in (("1 MiB of combining marks after 3 letters", "GPU" + "\u0301" * (1 << 20)),
                        ("1 MiB of U+FDFD (the widest glyph)", "\ufdfd" * (1 << 20)),
                        ("1 MiB of \\x1b (each escaped to 4 chars)", "\x1b" * (1 << 20))):
        p = trace_file(f"bigname_{abs(hash(label))}.json", names(text), samples=10)
        attack(S2, f"replayed GPU name: {label}", lambda p=p: replay(p),
               lambda r: clean(r, 400_000))
    for label, text in (("1 MiB uuid/bus id/detail/cmdline", "u" * (1 << 20)),):
        p = trace_file("bigfields.json", note_and_fields(text), samples=5)
        attack(S2, f"replayed {label} and a 50 MiB note", lambda p=p: replay(p),
               lambda r: clean(r, 400_000))

    def many_children(body: dict) -> None:
        for s in body["samples"]:
            for d in s["devices"]:
                d["nvml"]["children"] = [{"pid": i, "nbytes": 1 << 20, "cmdline": "c" * 200,
                                          "role": "other"} for i in range(20_000)]
    p = trace_file("children.json", many_children, samples=3)
    attack(S2, "replay with 20,000 children of 200-char command lines per sample",
           lambda: replay(p), lambda r: clean(r, 400_000) and r["watch_s"] < 5)

    # -- D3: size and types at the replay's load and while it plays ------------------------
    def one_wide(body: dict) -> None:
        d0 = body["samples"][0]["devices"][0]
        devs = []
        for i in range(120_000):
            d = copy.deepcopy(d0)
            d["index"] = i
            d["nvml"]["nvml_index"] = i
            devs.append(d)
        body["samples"] = [dict(body["samples"][0], devices=devs)]
    p = trace_file("wide.json", one_wide)
    attack(S3, f"one sample of 120,000 GPUs ({p.stat().st_size >> 20} MiB)", lambda: replay(p),
           lambda r: r["watch_s"] < 5 and not r["traceback"]
           and r.get("bundle_bytes", 0) < 2_000_000, timeout_s=240)

    def tiny_many(body: dict) -> None:
        first = body["samples"][:2]
        body["samples"] = first + [{"t_s": 1_000_000 + i} for i in range(3_900_000)]
    p = trace_file("tiny.json", tiny_many, compact=True)
    attack(S3, f"2 good samples then 3,900,000 bare ones ({p.stat().st_size >> 20} MiB)",
           lambda: replay(p), lambda r: r["watch_s"] < 5 and not r["traceback"])

    for where, key in (("first", "t_s"), ("first", "wall_s"), ("later", "wall_s"),
                       ("later", "rss_bytes")):
        def huge(body: dict, where: str = where, key: str = key) -> None:
            i = 0 if where == "first" else 20
            body["samples"][i][key] = "HUGE"
        p = trace_file(f"huge_{where}_{key}.json", huge)
        p.write_text(p.read_text().replace('"HUGE"', "9" * 4000))
        attack(S3, f"a 4,000-digit integer as the {where} sample's {key}",
               lambda p=p: replay(p, ticks=1), lambda r: (not r["traceback"]) and (
                   (r["usage_error"] and one_sentence(r["sentence"])) or r["error"] == "None"))

    def later_huge_thread() -> dict[str, Any]:
        """The sampler thread plays (and checks) a later sample whose wall_s is a
        4,000-digit int: does the thread survive, and is it said?"""
        import threading
        import time as _t

        from gpumem_nb.kernel import current_monitor
        p = HOME / "huge_thread.json"
        body = copy.deepcopy(BUNDLED)
        s0 = body["samples"][5]
        # 6,000 samples 0.1 ms apart: past the 4,096 checked at load, all played in 1 s
        body["samples"] = [dict(copy.deepcopy(s0), t_s=i * 1e-4) for i in range(6000)]
        body["samples"][5000]["wall_s"] = "HUGE"
        p.write_text(json.dumps(body).replace('"HUGE"', "9" * 4000))
        errors: list[str] = []
        threading.excepthook = lambda a: errors.append(f"{a.exc_type.__name__}: {a.exc_value}")
        SHELL.run_cell("%load_ext gpumem_nb")
        c = Cell(SHELL, f"%gpumem watch --replay {p}")
        _t.sleep(3)
        mon = current_monitor(SHELL)
        rp = mon.replay
        alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        c2 = Cell(SHELL, "%gpumem")
        bundle = mon.widget.plain_bundle() if rp is not None else {}
        said = "sample 5,000" in str(bundle.get("text/plain", ""))
        return {"usage_error": c.usage_error, "sentence": c.usage_sentence()[:300],
                "error": repr(c.error)[:200], "traceback": c.traceback_shown or c2.traceback_shown,
                "thread_errors": errors[:3], "threads": alive, "stop_said": said,
                "problem": (rp.source._rec.problem if rp else "")[:300]}
    attack(S3, "the sampler thread reaches a later sample whose wall_s has 4,000 digits",
           later_huge_thread, lambda r: not r["thread_errors"] and not r["traceback"])

    def deep_note(body: dict) -> None:
        body["note"] = "DEEP"
    p = trace_file("deep.json", deep_note)
    p.write_text(p.read_text().replace('"DEEP"', "[" * 100_000 + "]" * 100_000))
    attack(S3, "a trace whose note is a 100,000-deep list", lambda: replay(p),
           lambda r: r["usage_error"] and one_sentence(r["sentence"]) and not r["traceback"])

    def wide_value(body: dict) -> None:
        body["samples"][0]["rss_bytes"] = "WIDE"
    p = trace_file("widevalue.json", wide_value)
    p.write_text(p.read_text().replace('"WIDE"', "[" + ",".join(["1e300"] * 5_000_000) + "]"))
    attack(S3, f"the first sample's rss_bytes a list of 5,000,000 floats "
               f"({p.stat().st_size >> 20} MiB)", lambda: replay(p),
           lambda r: r["usage_error"] and one_sentence(r["sentence"]) and r["watch_s"] < 5)
    return summary("d_pictures_replay")


if __name__ == "__main__":
    sys.exit(main())
