"""The tutorials cannot teach a falsehood (issue 20).

Three rules bind a tutorial's text to what its own cells measured:

- **a quoted number is printed beside it**: every number with a unit in a markdown cell (B,
  KiB…TiB, KB…TB, bytes, ns…s, seconds, %) must be printed, with the same value and unit, by
  an output of the code cell right above or right below that markdown cell. The prose may drop
  trailing zeros ("60 GiB" for a printed "60.00 GiB", "1,024 MiB" for "1024 MiB") and nothing
  else: "1 GiB" is not "1.49 GiB", nor "1024.00 MiB";
- **a claim is checked where it is measured**: a code cell that calls ``claim(...)``
  (``notebooks/claims.py``) must show a ``✓`` line in its outputs, and none shows
  ``✗ CLAIM FAILED``; each tutorial checks at least one claim;
- **the notebook is its source, executed at the commit it names**: same cells, same ids, and
  the ``sources_sha256`` the runner recorded is the digest of the package and tutorial
  sources at that commit (this checkout's, or an earlier commit's that git still holds, in
  which case the README must say that the tutorials ran on older code).

The tests on the executed notebooks read ``notebooks/NN_*.ipynb`` as committed. Only the GPU
machine can produce those (``python notebooks/run_tutorials.py OUT_DIR``), so after any change
to ``gpumem_nb/`` or a tutorial's source they fail until the tutorials are executed again
there. The tests of the checkers run anywhere, and show that each rule can fail.
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def load_runner() -> Any:
    spec = importlib.util.spec_from_file_location("run_tutorials",
                                                  NOTEBOOKS / "run_tutorials.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = load_runner()
SOURCES = RUNNER.tutorial_sources()
NAMES = [p.stem for p in SOURCES]

# Units a quantity can carry; written forms that name the same unit map to one.
UNITS = {
    "B": "B", "byte": "B", "bytes": "B", "KiB": "KiB", "MiB": "MiB", "GiB": "GiB",
    "TiB": "TiB", "KB": "kB", "kB": "kB", "MB": "MB", "GB": "GB", "TB": "TB",
    "ns": "ns", "µs": "µs", "μs": "µs", "us": "µs", "ms": "ms", "s": "s", "second": "s",
    "seconds": "s", "%": "%",
}
_UNIT_RE = "|".join(sorted((re.escape(u) for u in UNITS), key=len, reverse=True))
# A number not glued to a word or another number ("H200", "v2.6" and "cu130" are no
# quantities), thousands separators allowed, then its unit as a whole word.
QUANTITY = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)[ \u00a0\u202f]?(" + _UNIT_RE
    + r")(?!\w)")
CODE_SPAN = re.compile(r"`[^`]*`")  # `max_split_size_mb:128` is a name, not a quantity
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TAGS = re.compile(r"<[^>]+>")
HELD, FAILED = "✓", "✗ CLAIM FAILED"
CLAIM_CALL = re.compile(r"^\s*claim\(", re.MULTILINE)
MARKERS = re.compile(r"DEPENDS\(|TODO-GPU")


@dataclass(frozen=True)
class Quantity:
    text: str
    value: Decimal
    unit: str

    @property
    def decimals(self) -> int:
        exponent = self.value.as_tuple().exponent
        return -exponent if isinstance(exponent, int) and exponent < 0 else 0

    def quotes(self, printed: Quantity) -> bool:
        """This prose figure is the printed one, up to trailing zeros: "60 GiB" quotes
        "60.00 GiB"; "1.5 GiB" does not quote "1.49 GiB", nor "1 GiB" "1024.00 MiB"."""
        return (self.unit == printed.unit and printed.decimals >= self.decimals
                and printed.value == self.value)


def quantities(text: str) -> list[Quantity]:
    text = CODE_SPAN.sub(" ", HTML_COMMENT.sub(" ", text))
    return [Quantity(m.group(0), Decimal(m.group(1).replace(",", "")), UNITS[m.group(2)])
            for m in QUANTITY.finditer(text)]


def output_text(cell: Any) -> str:
    """Everything a reader sees in a cell's outputs: streams, plain text, HTML as text,
    errors."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            parts += [out.get("ename", ""), out.get("evalue", ""), *out.get("traceback", [])]
        parts.append(str(out.get("text", "")))
        data = out.get("data", {})
        for mime in ("text/plain", "text/markdown"):
            parts.append(str(data.get(mime, "")))
        if "text/html" in data:
            parts.append(html.unescape(TAGS.sub(" ", str(data["text/html"]))))
    return ANSI.sub("", "\n".join(parts))


def unquoted_numbers(nb: Any) -> list[str]:
    """The prose's quantities that neither neighbouring code cell printed."""
    missing = []
    cells = nb.cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        beside = [c for c in cells[max(i - 1, 0):i] + cells[i + 1:i + 2] if c.cell_type == "code"]
        printed = [q for c in beside for q in quantities(output_text(c))]
        for q in quantities(cell.source):
            if not any(q.quotes(p) for p in printed):
                missing.append(f"{cell.get('id', i)}: {q.text!r}")
    return missing


def unchecked_claims(nb: Any) -> list[str]:
    """Cells that call claim() but show no ✓ line, or show a failed claim."""
    problems = []
    for cell in nb.cells:
        if cell.cell_type != "code" or not CLAIM_CALL.search(cell.source):
            continue
        lines = output_text(cell).splitlines()
        if any(line.startswith(FAILED) for line in lines):
            problems.append(f"{cell.id}: a claim failed")
        elif not any(line.startswith(HELD) for line in lines):
            problems.append(f"{cell.id}: claims, but printed no ✓ line")
    return problems


def executed(name: str) -> Any:
    path = NOTEBOOKS / f"{name}.ipynb"
    assert path.exists(), (f"{path.name} is missing: execute the tutorials on the GPU machine "
                           "(python notebooks/run_tutorials.py OUT_DIR)")
    return nbformat.read(path, as_version=4)


# -- the executed tutorials ------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_the_executed_tutorial_is_exactly_its_source(name):
    source = RUNNER.load_source(NOTEBOOKS / f"{name}.py")
    ran = executed(name)
    assert [(c.id, c.cell_type, c.source) for c in ran.cells] == [
        (c.id, c.cell_type, c.source) for c in source.cells], (
        f"{name}: the notebook is not its source: execute it again")


@pytest.mark.parametrize("name", NAMES)
def test_every_number_in_the_prose_is_printed_by_the_cell_beside_it(name):
    missing = unquoted_numbers(executed(name))
    assert not missing, f"{name}: prose numbers that the cell above or below did not print: " \
                        f"{missing}"


@pytest.mark.parametrize("name", NAMES)
def test_every_claim_of_the_prose_was_checked_by_the_cell_that_measured_it(name):
    nb = executed(name)
    assert any(CLAIM_CALL.search(c.source) for c in nb.cells if c.cell_type == "code"), (
        f"{name} checks no claim")
    problems = unchecked_claims(nb)
    assert not problems, f"{name}: {problems}"


PROVENANCE = ("gpu", "gpu_count", "mig", "driver", "cuda_driver_api", "cuda_runtime", "torch",
              "ipython", "ipykernel", "gpumem_nb", "python", "commit", "executed",
              "sources_sha256")


@pytest.mark.parametrize("name", NAMES)
def test_the_executed_tutorial_records_what_produced_it_and_it_is_that_commit(name):
    """GPU, driver, CUDA, torch, IPython, gpumem_nb, commit, a clean tree and the date; and the
    digest of the sources it ran, which must be the digest of the commit it names: the
    outputs are that code's, nothing edited by hand since."""
    meta = executed(name).metadata.get("gpumem_nb", {})
    missing = [k for k in PROVENANCE if meta.get(k) in (None, "", "none")]
    assert not missing, f"{name}: metadata lacks {missing}: {meta}"
    assert "H200" in meta["gpu"], meta
    assert meta.get("tree_clean") is True, f"{name}: executed from a tree with changes: {meta}"
    if meta["sources_sha256"] == RUNNER.sources_digest():
        return
    at_commit = RUNNER.sources_digest_at(meta["commit"])
    if at_commit is None:
        pytest.skip(f"this clone cannot read commit {meta['commit']} (shallow?)")
    assert meta["sources_sha256"] == at_commit, (
        f"{name}: its recorded sources are neither this checkout's nor commit "
        f"{meta['commit']}'s")


STALE_NOTICE = re.compile(r"executed at `([0-9a-f]{7,40})`; gpumem_nb has changed since")


def test_the_readme_says_when_the_tutorials_ran_on_older_code():
    """Outputs of an earlier gpumem_nb are still real GPU output, but a reader must be told
    that they are not this checkout's: the README names the commit, and only while true."""
    stale = sorted({executed(n).metadata["gpumem_nb"]["commit"] for n in NAMES
                    if executed(n).metadata["gpumem_nb"]["sources_sha256"]
                    != RUNNER.sources_digest()})
    said = STALE_NOTICE.findall((ROOT / "README.md").read_text())
    if stale:
        assert said, f"the tutorials ran at {stale}, older code, and the README does not say so"
        assert all(any(c.startswith(s) or s.startswith(c) for s in said) for c in stale), (
            stale, said)
    else:
        assert not said, "the README says the tutorials ran on older code; they ran on this"


def test_a_commits_sources_digest_is_the_checkouts_when_nothing_changed():
    import subprocess

    try:
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "gpumem_nb", "notebooks"], capture_output=True, text=True,
                               check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("no git here")
    if any(line[3:].startswith("gpumem_nb/") or re.fullmatch(r"notebooks/[^/]+\.py", line[3:])
           for line in dirty.splitlines()):
        pytest.skip("the package or a tutorial has uncommitted changes")
    assert RUNNER.sources_digest_at("HEAD") == RUNNER.sources_digest()


@pytest.mark.parametrize("name", NAMES)
def test_the_saved_tutorial_is_at_most_1_MB(name):
    size = (NOTEBOOKS / f"{name}.ipynb").stat().st_size
    assert size <= 1_000_000, f"{name}.ipynb is {size:,} bytes"


@pytest.mark.parametrize("name", NAMES)
def test_every_chart_in_a_saved_tutorial_carries_a_static_image(name):
    """GitHub's renderer shows no widget and no plotly JSON: a picture must be in the bundle."""
    for cell in executed(name).cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            charts = {"application/vnd.plotly.v1+json", RUNNER.WIDGET_VIEW} & set(data)
            if charts:
                assert {"image/png", "image/svg+xml"} & set(data), (
                    f"{name} cell {cell.id}: {sorted(charts)} without a static image")


@pytest.mark.parametrize("name", NAMES)
def test_no_tutorial_still_waits_on_unlanded_code_or_a_gpu_figure(name):
    """DEPENDS(issue N) and TODO-GPU mark text written before the code or the GPU run it needs;
    the lead settles each one (from the first GPU run) before the final execution."""
    text = (NOTEBOOKS / f"{name}.py").read_text()
    found = [ln.strip() for ln in text.splitlines() if MARKERS.search(ln)]
    assert not found, f"{name}: {found}"


# -- the sources -------------------------------------------------------------------------------
def test_every_tutorial_has_a_source_with_stable_unique_ids():
    assert len(SOURCES) >= 9, NAMES
    for path in SOURCES:
        nb = RUNNER.load_source(path)  # raises on a cell without an id, or a duplicate
        prefix = path.stem[:2] + "-"
        assert all(c.id.startswith(prefix) for c in nb.cells), path.name


def test_every_notebook_in_the_folder_has_a_source():
    stray = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in NAMES)
    assert not stray, f"notebooks without a source: {stray}"


# -- the checkers ------------------------------------------------------------------------------
def notebook(*cells: tuple[str, str]) -> Any:
    """("md", text) or ("out", printed) cells, in order."""
    nb = nbformat.v4.new_notebook()
    for i, (kind, text) in enumerate(cells):
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell("x")
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        cell.id = f"c{i}"
        nb.cells.append(cell)
    return nb


PRINTED = "20000×20000 float32: 1.49 GiB = 1.60 GB (the article: about 3 GB)\n"


def test_a_number_the_cell_beside_it_did_not_print_fails():
    assert unquoted_numbers(notebook(("out", PRINTED), ("md", "It takes 1.49 GiB."))) == []
    assert unquoted_numbers(notebook(("md", "It takes 1.6 GB."), ("out", PRINTED))) == []
    for wrong in ("1.5 GiB", "1 GiB", "1.6 GiB", "3.05 GB", "2 GiB", "1,526 MiB", "512 B",
                  "430 ms", "15 %", "8 bytes", "2 seconds"):
        missing = unquoted_numbers(notebook(("out", PRINTED), ("md", f"It takes {wrong}.")))
        assert len(missing) == 1 and wrong in missing[0], (wrong, missing)


def test_a_number_printed_by_a_cell_further_away_fails():
    nb = notebook(("out", PRINTED), ("md", "Intro."), ("md", "It takes 1.49 GiB."),
                  ("out", "nothing"))
    assert unquoted_numbers(nb) == ["c2: '1.49 GiB'"]


def test_the_prose_may_drop_trailing_zeros_and_separators_only():
    printed = "reserved 1024 MiB; held 60.00 GiB; blocked 431 ms; 12.50% of the GPU; 8 bytes"
    for prose in ("1,024 MiB", "60 GiB", "60.0 GiB", "431 ms", "12.5%", "12.50 %", "8 bytes",
                  "8 B"):
        assert unquoted_numbers(notebook(("out", printed), ("md", f"It was {prose}."))) == [], \
            prose
    for prose in ("1 GiB", "0.43 s", "13 %", "60.01 GiB"):
        assert unquoted_numbers(notebook(("out", printed), ("md", f"It was {prose}."))) != [], \
            prose


def test_names_code_and_comments_are_not_quantities():
    text = ("H200, v2.6, cu130, Python 3.14, 20000×20000, a 4-byte tensor, 2 steps, 100M "
            "parameters, `max_split_size_mb:128`, `2 GiB`, protocol 4, %gpumem "
            "<!-- TODO-GPU: 3 GiB -->")
    assert quantities(text) == []
    assert [q.text for q in quantities("+256 MiB, (2 MiB), 0.76 GB and 4 bytes.")] == [
        "256 MiB", "2 MiB", "0.76 GB", "4 bytes"]


def test_a_tutorial_without_its_outputs_fails_both_rules():
    """As a tutorial is before execution (or with its outputs stripped): its quoted numbers and
    its claims have nothing to rest on."""
    for name in ("01_allocated_reserved_nvidia_smi", "04_out_of_memory"):
        bare = RUNNER.load_source(NOTEBOOKS / f"{name}.py")
        assert unquoted_numbers(bare), name
        assert unchecked_claims(bare), name


def test_a_failed_or_missing_check_is_caught():
    nb = nbformat.v4.new_notebook()
    held, failed, silent = (nbformat.v4.new_code_cell('claim(x, "it holds")') for _ in range(3))
    held.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ it holds\n")]
    failed.outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="✓ one\n✗ CLAIM FAILED: it holds (x = 0)\n")]
    for i, cell in enumerate((held, failed, silent)):
        cell.id = f"c{i}"
    nb.cells = [held, failed, silent]
    assert unchecked_claims(nb) == ["c1: a claim failed", "c2: claims, but printed no ✓ line"]


def test_claims_py_raises_with_the_sentence_and_the_values(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("claims", NOTEBOOKS / "claims.py")
    assert spec is not None and spec.loader is not None
    claims = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(claims)
    claims.claim(True, "reserved fell to 0 B")
    assert capsys.readouterr().out == "✓ reserved fell to 0 B\n"
    with pytest.raises(claims.ClaimFailed) as err:
        claims.claim(False, "reserved fell to 0 B", reserved="2.00 MiB")
    assert "reserved fell to 0 B" in str(err.value) and "reserved = 2.00 MiB" in str(err.value)
    monkeypatch.setenv("TUTORIAL_CLAIMS", "report")
    claims.claim(False, "peak is exact", exact=False)
    assert capsys.readouterr().out.startswith("✗ CLAIM FAILED: peak is exact (exact = False)")
    assert claims.near(100, 104, within=4) and not claims.near(100, 105, within=4)
    assert claims.near(100, 101, rel=0.01) and not claims.near(100, 102, rel=0.01)


def test_a_source_loads_with_its_ids_and_a_reported_failure_is_listed(tmp_path):
    src = tmp_path / "09_demo.py"
    src.write_text('# %% [markdown] id="09-00"\n# Text.\n\n# %% id="09-01"\nx = 1\n')
    nb = RUNNER.load_source(src)
    assert [(c.id, c.cell_type) for c in nb.cells] == [("09-00", "markdown"), ("09-01", "code")]
    assert nb.cells[1].outputs == [] and "jupytext" not in nb.metadata
    reported = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("claim(...)")
    cell.id = "09-00"
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="✗ CLAIM FAILED: peak is exact (exact = False)\n")]
    reported.cells = [cell]
    assert RUNNER.failed_claims(reported) == [
        "09-00: ✗ CLAIM FAILED: peak is exact (exact = False)"]


@pytest.mark.kernel
def test_the_runner_stops_a_notebook_at_a_failed_claim_names_it_and_saves_what_ran(tmp_path):
    import shutil

    work = tmp_path / "src"
    work.mkdir()
    shutil.copy(NOTEBOOKS / "claims.py", work / "claims.py")
    src = work / "09_demo.py"
    src.write_text('# %% id="09-00"\nfrom claims import claim\nclaim(True, "it holds")\n\n'
                   '# %% id="09-01"\nclaim(False, "reserved fell to 0 B", reserved="2.00 MiB")'
                   '\n\n# %% id="09-02"\nprint("never runs")\n')
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RUNNER.ClaimError, match=r"09_demo cell 09-01: .*reserved fell to 0 B"):
        RUNNER.run(src, out)  # the kernel starts in the source's folder, beside claims.py
    saved = nbformat.read(out / "09_demo.ipynb", as_version=4)
    assert [c.execution_count for c in saved.cells] == [1, 2, None]
    assert "✓ it holds" in output_text(saved.cells[0])
    assert "ClaimFailed" in output_text(saved.cells[1])
    # Saved as far as it got, it still says what produced it (and its chart was ended).
    assert saved.metadata["gpumem_nb"]["sources_sha256"], saved.metadata


def test_a_source_without_ids_or_with_a_duplicate_is_refused(tmp_path):
    src = tmp_path / "09_demo.py"
    src.write_text("# %%\nx = 1\n")
    with pytest.raises(ValueError, match="no id"):
        RUNNER.load_source(src)
    src.write_text('# %% id="09-00"\nx = 1\n\n# %% id="09-00"\ny = 2\n')
    with pytest.raises(ValueError, match="duplicate"):
        RUNNER.load_source(src)


def test_heavy_widget_state_is_left_out_with_its_views_and_light_state_kept():
    nb = nbformat.v4.new_notebook()
    heavy = {"model_name": "AnyModel", "state": {"_esm": "x" * 300_000}}
    box = {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_fig"]}}
    light = {"model_name": "AnyModel", "state": {"_esm": "export default {}"}}
    nb.metadata["widgets"] = {RUNNER.WIDGET_STATE: {"state": {"fig": heavy, "box": box,
                                                              "chart": light}}}
    cell = nbformat.v4.new_code_cell("%gpumem watch")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        RUNNER.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
        "image/svg+xml": "<svg/>", "text/plain": "chart"}),
        nbformat.v4.new_output("display_data", data={
            RUNNER.WIDGET_VIEW: {"model_id": "chart", "version_major": 2, "version_minor": 0},
            "text/plain": "chart"})]
    nb.cells = [cell]
    assert sorted(RUNNER.drop_heavy_widget_state(nb)) == ["AnyModel", "VBoxModel"]
    assert set(nb.metadata["widgets"][RUNNER.WIDGET_STATE]["state"]) == {"chart"}
    first, second = cell.outputs
    assert set(first["data"]) == {"image/svg+xml", "text/plain"}  # the picture is shown
    assert RUNNER.WIDGET_VIEW in second["data"]
    assert len(json.dumps(nb)) < 10_000


def test_the_sources_digest_changes_with_the_package_and_the_tutorials(tmp_path):
    for rel in ("gpumem_nb/a.py", "gpumem_nb/data/trace.json", "gpumem_nb/livechart.js",
                "notebooks/00_x.py", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("1")
    first = RUNNER.sources_digest(tmp_path)
    (tmp_path / "README.md").write_text("2")
    assert RUNNER.sources_digest(tmp_path) == first  # docs do not change outputs
    for rel in ("gpumem_nb/a.py", "gpumem_nb/data/trace.json", "gpumem_nb/livechart.js",
                "notebooks/00_x.py"):
        (tmp_path / rel).write_text("changed")
        assert RUNNER.sources_digest(tmp_path) != first, rel
        first = RUNNER.sources_digest(tmp_path)
