"""The suite's own fixtures and hooks (tests/conftest.py), for the tests of the tutorial
machinery too: each test leaves the process as it found it and never touches the developer's
settings file, a file whose every test ``-m`` deselects is not imported, and GPU and Binder
tests run only when asked for.

This folder is no package (``tests`` is the suite's), so pytest imports its files by their
names, with this folder on ``sys.path``; the repository root goes there too, for ``tests``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import *  # noqa: E402, F403
