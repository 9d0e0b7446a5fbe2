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

# Sizes follow the card (issue 36: a child asking 100 GiB failed on an 80 GB H100). The tests
# were written for the H200, whose torch.cuda.mem_get_info()[1] is 139.8 GiB; in a child,
# ``GiB = scaled_gib(total)`` keeps each size's share of the card.
H200_TOTAL_BYTES = 139.8 * 2**30


def scaled_gib(total_bytes: int) -> int:
    """The H200's GiB on a card of ``total_bytes``: 2**30 on the H200, else in proportion, a
    multiple of 2 MiB (the native allocator's segment granule, so that ``40 * GiB`` still holds
    exactly 40 blocks of ``GiB``). ``benchmarks/gpu_diagnosis3.py`` scales the same way."""
    scale = total_bytes / H200_TOTAL_BYTES
    if abs(scale - 1) < 0.005:
        return 2**30
    return max(1, round(2**30 * scale / 2**21)) * 2**21


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
