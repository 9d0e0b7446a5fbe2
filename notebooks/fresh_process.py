"""Run a snippet of Python in a fresh process, under a chosen allocator configuration.

PyTorch reads its allocator settings once per process: the backend when torch is imported,
the other options when CUDA starts. Comparing settings therefore takes a new process for
each. The tutorials (03, 04, 05) keep the interesting code in the notebook, as a string, and
use this module only for the plumbing: the snippet prints one JSON object as its last line,
and ``run_fresh`` returns it as a dict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def fresh_env(alloc_conf: str = "", extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with ``alloc_conf`` as the only allocator setting."""
    env = {k: v for k, v in os.environ.items() if k not in CONF_VARS}
    if alloc_conf:
        env["PYTORCH_ALLOC_CONF"] = alloc_conf
    env.update(extra or {})
    return env


def run_fresh(code: str, alloc_conf: str = "", *, extra_env: dict[str, str] | None = None,
              timeout_s: float = 180, check: bool = True) -> dict[str, Any]:
    """Run ``code`` with ``python -c`` under ``alloc_conf`` and return its last JSON line.

    A snippet that fails without printing its JSON raises, with the end of its stderr: a
    tutorial should show the real error, not a guess. With ``check=False`` the failure is
    returned instead, as ``{"error": <the last line of stderr>, "exit": <exit status>}``.
    """
    out = subprocess.run([sys.executable, "-c", code], env=fresh_env(alloc_conf, extra_env),
                         capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines and not check:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": last, "exit": out.returncode}
    if not lines:
        raise RuntimeError(f"the fresh process (PYTORCH_ALLOC_CONF={alloc_conf!r}) exited "
                           f"{out.returncode} without a result:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["warnings"] = [ln for ln in out.stderr.splitlines() if "Warning" in ln]
    return result


def run_fresh_many(code: str, confs: list[str], *,
                   extra_envs: list[dict[str, str]] | None = None, check: bool = True,
                   workers: int = 4) -> list[dict[str, Any]]:
    """``run_fresh`` for each configuration (and extra environment, paired by position), a
    few at a time; the results come back in the order asked.

    Each process reads only its own allocator's statistics, so running them side by side on
    one GPU changes none of the figures compared (timings excepted: none are compared).
    """
    envs = extra_envs if extra_envs is not None else [{} for _ in confs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(
            lambda job: run_fresh(code, job[0], extra_env=job[1], check=check),
            zip(confs, envs, strict=True)))
