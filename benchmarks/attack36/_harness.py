"""Shared harness for the attack36 scripts: IPython's real shell over the project's fake GPU
(tests/fakes.py), each attack run in a forked child so its time and peak memory (VmHWM, reset
with /proc/self/clear_refs) are its own, and a verdict per attack.

An attack function gets the loaded shell and returns a dict; ``run_cell`` captures what the
cell printed and whether gpumem_nb raised anything but a UsageError.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GiB, MiB = 1 << 30, 1 << 20
RESULTS: list[dict[str, Any]] = []


def private_home() -> Path:
    """A throwaway HOME and settings file, so no developer file is read or written."""
    home = Path(tempfile.mkdtemp(prefix="attack36-home-"))
    os.environ["HOME"] = str(home)
    os.environ["GPUMEM_NB_CONFIG"] = str(home / "gpumem_nb.json")
    os.environ.pop("GPUMEM_NB_AUTO_SHOW", None)
    os.environ.pop("GPUMEM_NB_REPLAY", None)
    return home


def make_shell(load: bool = True) -> Any:
    from gpumem_nb.kernel import monitor as monitor_mod
    from gpumem_nb.sources.live import LiveSource
    from gpumem_nb.sources.nvml import NvmlSource
    from tests.fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, fake_torch

    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    cuda.link([gpu])
    sys.modules["torch"] = fake_torch(cuda)
    monitor_mod.make_source = lambda: LiveSource(nvml=NvmlSource(module=nvml))  # type: ignore
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.displayhook.cache_size = 1000
    if load:
        shell.run_cell("%load_ext gpumem_nb")
    shell.user_ns.update(cuda=cuda, GiB=GiB, MiB=MiB, torch=sys.modules["torch"])
    _SHELLS.append(shell)
    return shell


_SHELLS: list[Any] = []


def _sampler(start: bool) -> None:
    """Forking while the sampler thread holds its lock leaves the child's copy locked
    forever: the parent stops its sampler around each fork, and the child starts its own."""
    from gpumem_nb.kernel import current_monitor

    for shell in _SHELLS:
        m = current_monitor(shell)
        if m is None:
            continue
        if start:
            m.start_sampling()
        else:
            m.stop_sampling()


class Cell:
    """What one cell did: its error, its printed text, its displayed bundles."""

    def __init__(self, shell: Any, code: str) -> None:
        from IPython.core.error import UsageError

        self.bundles: list[dict[str, Any]] = []
        pub = shell.display_pub
        real = pub.publish

        def publish(data: Any, metadata: Any = None, **kw: Any) -> None:
            self.bundles.append(dict(data))

        pub.publish = publish  # type: ignore[method-assign]
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                r = shell.run_cell(code, store_history=True)
        finally:
            pub.publish = real  # type: ignore[method-assign]
        self.seconds = time.perf_counter() - t0
        self.stdout, self.stderr = out.getvalue(), err.getvalue()
        self.error = r.error_in_exec or r.error_before_exec
        self.usage_error = isinstance(self.error, UsageError)
        self.text = self.stdout + self.stderr

    @property
    def traceback_shown(self) -> bool:
        return "Traceback (most recent call last)" in self.text or (
            self.error is not None and not self.usage_error
            and "gpumem_nb" in "".join(traceback.format_tb(self.error.__traceback__)))

    def usage_sentence(self) -> str:
        return str(self.error) if self.usage_error else ""


def vm_hwm_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def attack(surface: str, name: str, fn: Callable[[], dict[str, Any]],
           held: Callable[[dict[str, Any]], bool], timeout_s: float = 300) -> dict[str, Any]:
    """Run ``fn`` in a forked child; its result dict gets seconds, peak_mib (VmHWM after a
    reset at the start) and rss_before_mib, and ``held(result)`` decides the verdict."""
    only = os.environ.get("ATTACK_ONLY")
    if only and only not in name:
        return {}
    r_fd, w_fd = os.pipe()
    _sampler(start=False)
    pid = os.fork()
    if pid == 0:  # child
        os.close(r_fd)
        code = 0
        try:
            _sampler(start=True)
            _reset_peak()
            before = vm_hwm_mib()
            threads_before = threading.active_count()
            t0 = time.perf_counter()
            res = fn()
            res["seconds"] = round(time.perf_counter() - t0, 3)
            res["peak_mib"] = round(vm_hwm_mib(), 1)
            res["rss_before_mib"] = round(before, 1)
            res["stray_threads"] = threading.active_count() - threads_before
        except BaseException as e:  # the attack's own harness failed: say so
            res = {"harness_error": f"{type(e).__name__}: {e}"[:2000],
                   "tb": traceback.format_exc()[-3000:]}
            code = 1
        with os.fdopen(w_fd, "w") as w:
            w.write(json.dumps(res, default=repr))
        os._exit(code)
    os.close(w_fd)
    deadline = time.time() + timeout_s
    with os.fdopen(r_fd) as r:
        data = ""
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                data = r.read()
                break
            if time.time() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                data = json.dumps({"timed_out_s": timeout_s})
                break
            time.sleep(0.05)
    try:
        res = json.loads(data) if data else {"child_died": status}
    except ValueError:
        res = {"child_output": data[:500]}
    ok = "harness_error" not in res and "timed_out_s" not in res and "child_died" not in res
    verdict = "held" if ok and held(res) else "FAILED"
    row = {"surface": surface, "attack": name, "result": verdict, **res}
    RESULTS.append(row)
    short = {k: v for k, v in row.items() if k != "tb"}
    print(json.dumps(short, default=repr)[:1500], flush=True)
    if "tb" in res:
        print(res["tb"], flush=True)
    return row


def summary(out_name: str) -> int:
    failed = [r for r in RESULTS if r["result"] != "held"]
    print(f"== {len(RESULTS)} attacks, {len(failed)} failed")
    out = os.environ.get("ATTACK_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{out_name}.json").write_text(json.dumps(RESULTS, indent=1, default=repr))
    return 1 if failed else 0


def one_sentence(text: str) -> bool:
    """A plain sentence: one line, no control characters, at most 400 characters."""
    return ("\n" not in text.strip() and len(text) <= 400
            and not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in text))
