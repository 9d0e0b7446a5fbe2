"""The documentation holds to what it points at: every relative link lands on a file (and on a
heading or anchor there), the README's command table names every subcommand, flag and choice
the magic's own help lists, and the markers CI and the tools read are where they read them.

The README is the front door; the manual is ``docs/``, one page per feature; the tutorials'
provenance is ``notebooks/README.md``, their machinery ``tools/tutorials/README.md`` and the
maintainers' runbook ``CONTRIBUTING.md``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "notebooks" / "README.md",
         ROOT / "tools" / "tutorials" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`]*`")
# [text](target) and ![alt](target); a target has no spaces (an optional "title" may follow).
LINK = re.compile(r"\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The page without its fenced blocks and code spans, where a bracket is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores
    kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers a repeated heading
        seen[base] = n + 1
    return found


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]  # http:, mailto:


def test_every_page_the_readme_and_the_index_name_exists():
    for name in ("oom", "trace", "whatif", "chart", "processes", "settings", "performance",
                 "architecture", "reliability", "README"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name
    index = (ROOT / "docs" / "README.md").read_text()
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if p.name != "README.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs/README.md does not link {unlisted}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_its_anchor(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            where = dest.relative_to(ROOT)
            broken.append(f"{target}: no heading or anchor '{anchor}' in {where}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


SOURCE_PATH = re.compile(r"\bgpumem_nb/[\w/]+\.(?:py|js|css)\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_source_file_a_page_names_still_exists_after_a_move(page):
    # A page that names gpumem_nb/widget.py after the chart moved to gpumem_nb/chart/ sends a
    # reader to a file that is not there.
    gone = sorted({m for m in SOURCE_PATH.findall(page.read_text()) if not (ROOT / m).exists()})
    assert gone == []


def test_the_link_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## What `empty_cache` gives back\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#what-empty_cache-gives-back) [gone](c.md) "
                    "[bad](a.md#nothing) `[code](c.md)` [web](https://example.org/x)\n"
                    "```\n[fenced](c.md)\n```\n")
    assert relative_links(page) == ["a.md#what-empty_cache-gives-back", "c.md",
                                     "a.md#nothing"]
    assert "what-empty_cache-gives-back" in anchors(tmp_path / "a.md")
    assert "nothing" not in anchors(tmp_path / "a.md")
    assert not (tmp_path / "c.md").exists()


# -- the command table -----------------------------------------------------------------------
def help_sections(text: str) -> dict[str, str]:
    """``%gpumem?``'s help, cut into its sections: each subcommand's usage and options, keyed
    by its name ('%%gpumem' for the cell magic)."""
    sections: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        m = re.match(r"^  (%%gpumem|%gpumem (\w+))\b", line)
        if m:
            key = m.group(2) or m.group(1)
            sections[key] = ""
        elif not line.startswith(" "):
            key = None  # "Cell magic:", the notes after the sections
        if key:
            sections[key] += line + "\n"
    return sections


def help_words(section: str) -> set[str]:
    """A section's flags (its options' list), its positional arguments and every choice."""
    words = set(re.findall(r"^ {6}(-{1,2}[\w-]+)", section, re.MULTILINE))
    usage = re.split(r"\n {6}(?! )", section, maxsplit=1)[0]  # before the description
    for choices in re.findall(r"\{([\w,]+)\}", usage):
        words |= set(choices.split(","))
    words |= {w for w in re.findall(r"\[([A-Z]+)\]", usage)}  # [CLIENT]
    return words


def table_rows(text: str) -> dict[str, str]:
    """The README's command table: each subcommand's (or '%%gpumem''s) first cells, joined."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^\| `(%%?gpumem)([^`]*)`([^|]*(?:\\\|[^|]*)*)\|", line)
        if not m:
            continue
        first = m.group(0)
        if m.group(1) == "%%gpumem":
            names = ["%%gpumem"]
        else:
            lead = re.match(r"\s*(\w+(?:\s*\\\|\s*\w+)*)", m.group(2))
            names = re.split(r"\s*\\\|\s*", lead.group(1)) if lead else ["status"]
        for name in names:
            rows[name] = rows.get(name, "") + first
    return rows


def test_the_command_table_names_every_subcommand_flag_and_choice(loaded: Any):
    help_text = loaded.find_line_magic("gpumem").__doc__
    sections = help_sections(help_text)
    assert {"history", "who", "cleanup", "whatif", "%%gpumem"} <= set(sections), sections
    rows = table_rows(README.read_text())
    missing = sorted(set(sections) - set(rows))
    assert not missing, f"the README's command table has no row for {missing}"
    unnamed = {name: sorted(w for w in help_words(section)
                            if not re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", rows[name]))
               for name, section in sections.items()}
    unnamed = {k: v for k, v in unnamed.items() if v}
    assert not unnamed, f"the README's command table does not name {unnamed}"


def test_the_table_check_reads_the_help_and_the_rows_as_meant():
    help_text = ("Line magic: %gpumem [SUBCOMMAND] [options]\n"
                 "  %gpumem record [--start-cuda] [{on,off,status}]\n"
                 "      record the history\n"
                 "      --start-cuda  start CUDA\n\n"
                 "  %gpumem cluster [-o] [CLIENT]\n      a cluster\n      -o  the reading\n"
                 "Cell magic:\n  %%gpumem [-q]\n      runs the cell\n      -q  quiet\n")
    sections = help_sections(help_text)
    assert {k: help_words(v) for k, v in sections.items()} == {
        "record": {"--start-cuda", "on", "off", "status"}, "cluster": {"-o", "CLIENT"},
        "%%gpumem": {"-q"}}
    rows = table_rows("| `%gpumem` (or `%gpumem status`) | all |\n"
                      "| `%gpumem start \\| stop` | the sampler |\n"
                      "| `%%gpumem [-q]` | a cell |\n")
    assert set(rows) == {"status", "start", "stop", "%%gpumem"}


# -- the markers CI and the tools read -------------------------------------------------------
def fenced_after(text: str, marker: str) -> str:
    """The first ```bash block after the marker, as .ci/run's awk reads it."""
    after = text.split(marker, 1)[1]
    m = re.match(r"\s*```bash\n(.*?)\n```", after, re.DOTALL)
    assert m, f"no ```bash block right after {marker}"
    return m.group(1)


def test_the_readme_keeps_its_two_commands_after_their_markers():
    text = README.read_text()
    lab = fenced_after(text, "<!-- lab-command -->")
    assert "\n" not in lab and "pip install -e '.[lab]'" in lab and "jupyter lab" in lab, lab
    test = fenced_after(text, "<!-- test-command -->")
    assert "\n" not in test and "pip install -q -e '.[test]'" in test, test
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci and "README.md" in ci, "CI reads the README's command"


def test_the_oom_page_lists_every_cause_the_classifier_can_give():
    from gpumem_nb import oom

    text = (ROOT / "docs" / "oom.md").read_text()
    listed = text.split("<!-- oom-causes -->\n", 1)[1].split("\n\n", 1)[0]
    said = re.findall(r"^\d+\. \*\*([^*]+)\*\*", listed, re.MULTILINE)
    causes = {getattr(oom, n) for n in dir(oom) if n.startswith("CAUSE_")}
    # Two verdicts are said in prose, not as list entries: the cudaMallocAsync pool's refusal,
    # which no recipe has produced on the H200, and the fallback when nothing explains it.
    assert set(said) == causes - {oom.CAUSE_POOL, oom.CAUSE_UNKNOWN}, (said, causes)
    assert len(said) == len(set(said)), said


def test_the_what_if_summary_has_one_pair_of_markers_for_its_rewriter():
    """benchmarks/whatif_compare.py --write-docs rewrites what lies between them."""
    text = (ROOT / "docs" / "whatif.md").read_text()
    assert text.count("<!-- whatif-h200:start -->") == 1
    assert text.count("<!-- whatif-h200:end -->") == 1
    assert text.index("<!-- whatif-h200:start -->") < text.index("<!-- whatif-h200:end -->")
