"""Run a snippet in a fresh Python process and get its JSON answer (a fresh process is the
only way to observe "no CUDA context yet")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Child-process prelude: NVML's device-0 "used" before anything else happens, as `before`, and
# `used()` to read it again. Indented like the snippets it is prepended to.
NVML_BEFORE = """
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        def used(): return pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used
        before = used()"""


def fresh(code: str, env: dict[str, str] | None = None, timeout_s: float = 300) -> Any:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, env=full_env, timeout=timeout_s)
    if out.returncode != 0:
        raise AssertionError(f"child failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])
