"""Give the executed tutorials the ``language_info`` of the Python that will open them, so that
JupyterLab opens them unmodified.

Why the notebooks turned "modified" as soon as a kernel connected (browser review 2026-12-05:
13 of 13, and autosave then rewrote the tracked files):

- on connecting a kernel, JupyterLab's ``NotebookPanel._onKernelChanged`` calls
  ``_updateLanguage(info.language_info)``, which is ``model.setMetadata("language_info", ...)``
  (JupyterLab 4.6.6's ``jlab_core`` bundle);
- ``@jupyter/ydoc``'s ``YNotebook.setMetadata`` returns without a change only when the new
  value deep-equals the stored one (``JSONExt.deepEqual``); any difference is a change, and a
  change marks the document dirty;
- ipykernel's ``IPythonKernel.language_info`` carries the exact interpreter version
  (``sys.version.split()[0]``, e.g. "3.12.3" on the GPU machine, "3.11.7" in the review's lab).

So no stored value satisfies every reader: a notebook opens unmodified exactly under a kernel
whose ``language_info`` equals the one it holds, down to the patch version. The runner saves
the GPU kernel's (the run's Python is also in ``metadata.gpumem_nb.python``, which this leaves
alone). Where the reading environment is built from this repository, Binder, ``binder/postBuild``
runs this with the kernel's own interpreter, and the notebooks then hold what that kernel
reports. Only ``metadata.language_info`` changes; cells, outputs and the run's record do not,
and the file keeps nbformat's layout (one-space indent, sorted keys), so the change is the one
line. A notebook that already matches is not written.

    python tools/kernel_language.py [--check] FOLDER_OR_NOTEBOOK ...

``--check`` writes nothing and exits 1 when a notebook would change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def kernel_language_info() -> dict[str, Any]:
    """What this interpreter's ipykernel reports in its kernel_info reply (without starting
    a kernel: the reply's ``language_info`` is the class's)."""
    from ipykernel.ipkernel import IPythonKernel

    return dict(IPythonKernel.language_info)


def notebook_text(nb: Any) -> str:
    """A notebook's JSON as nbformat writes it."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def retarget(text: str, info: dict[str, Any]) -> str:
    """``text`` (a notebook's JSON) with ``metadata.language_info`` set to ``info``."""
    nb = json.loads(text)
    nb.setdefault("metadata", {})["language_info"] = info
    return notebook_text(nb)


def notebooks(args: list[str]) -> list[Path]:
    found: list[Path] = []
    for arg in args:
        path = Path(arg)
        found += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    return found


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if not args:
        print(__doc__.strip().splitlines()[-3].strip(), file=sys.stderr)
        return 2
    info = kernel_language_info()
    changed = []
    for path in notebooks(args):
        text = path.read_text(encoding="utf-8")
        new = retarget(text, info)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    verb = "would change" if check else "now hold"
    print(f"kernel_language: {len(changed)} notebook(s) {verb} language_info "
          f"{info.get('name')} {info.get('version')}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
