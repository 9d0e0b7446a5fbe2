"""Readings on demand: the sources' start on a helper thread, and reads bounded in time.

NVML can hang (a GPU falling off the bus, a wedged driver), so every reading a magic waits on
runs on a helper thread behind the process's read gate (``sources/gate.py``): while one hangs,
no other reading joins it, and the answer is "unknown" at once rather than a second stuck
thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import userexc
from ..errtext import error_str
from ..model import Sample, SourceStatus
from ..oom import first_line
from ..sampler import Sampler
from ..sources import Source
from ..sources.processes import roles_to_learn
from .contain import FailureLog

__all__ = ["ON_DEMAND_READ_TIMEOUT_S", "START_WAIT_S", "Readings"]

ON_DEMAND_READ_TIMEOUT_S = 1.0
# How long %load_ext waits for the sources to start. NVML's start (nvmlInit, then counting
# the devices) takes milliseconds, or, with a wedged driver, forever: it runs on a helper
# thread, and the load answers after this long at most, NVML's figures unknown until then.
START_WAIT_S = 1.5


class Readings:
    """The monitor's reads of its sources: exact allocator figures now, NVML bounded."""

    def __init__(self, source: Source, sampler: Sampler, gate: Any,
                 failures: FailureLog, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        # The clock the sampler's readings are dated by: how old "now" finds the latest one.
        self.clock = clock
        self.sampler = sampler
        # Live readings take the process's gate: while one hangs (a wedged NVML), no other
        # reading joins it on another thread (sources/gate.py).
        self.gate = gate
        self.failures = failures
        self.problem = ""  # why the last on-demand reading is partial, for the magics
        self._start_cancelled = threading.Event()
        self._start_thread: threading.Thread | None = None

    # -- the sources' start ------------------------------------------------------------------
    def start_source(self) -> str:
        """Start the sources on a helper thread, waiting ``START_WAIT_S`` at most; "" when
        they answered, else the sentence saying why NVML's figures are unknown for now.

        The helper takes the read gate, so while its start hangs no reading joins it on
        another thread, and a reload while it hangs adds no second stuck start: the new
        helper waits at the gate, and leaves when its monitor is unloaded.
        """
        done = threading.Event()
        begin = getattr(self.source, "begin_start", None)
        if callable(begin):
            begin()

        def work() -> None:
            try:
                while not self._start_cancelled.is_set():
                    if self.gate.wait_free(0.2) and self.gate.enter(wait_s=0.0):
                        if not self._start_cancelled.is_set():
                            break
                        # Unloaded while it waited, and the gate freed as NVML answered:
                        # starting now would open the closed source again, an nvmlInit
                        # nothing balances.
                        self.gate.leave()
                        return
                else:
                    return
                try:
                    self.source.start()
                except Exception as e:
                    self.failures.contain("start", e)
                finally:
                    self.gate.leave()
            finally:
                done.set()

        self._start_thread = threading.Thread(target=work, name="gpumem_nb-start",
                                              daemon=True)
        self._start_thread.start()
        # A reading already hung inside the gate (a reload while NVML hangs): the start
        # waits behind it, and the load does not.
        hung_before = self.gate.hung_s()
        if done.wait(0.0 if hung_before is not None else START_WAIT_S):
            self._start_thread.join()
            self._start_thread = None
            return ""
        if hung_before is not None:
            return (f"a reading of the GPUs has not returned for {hung_before:.1f} s (NVML "
                    "hangs); NVML's figures show as unknown until it does.")
        return (f"NVML has not answered its start for {START_WAIT_S:g} s (a wedged driver, "
                "or a GPU off the bus, can do this); its figures show as unknown until it "
                "does.")

    def cancel_start(self) -> None:
        """A start still waiting at the gate gives up (the monitor is unloading)."""
        self._start_cancelled.set()

    # -- readings ----------------------------------------------------------------------------
    def read(self, timeout_s: float = ON_DEMAND_READ_TIMEOUT_S, *,
             contain: bool = True) -> Sample:
        """A full reading, for on-demand work (status, cleanup), bounded in time.

        The read runs on a helper thread; if it has not answered in ``timeout_s`` the magic
        goes on with the allocator and host figures only, and NVML's columns read as
        unknown. While a reading hangs (this one, or the sampler's), no helper is started:
        the answer is unknown at once, so there is never more than one stuck thread. A
        reading that fails does the same (``contain=False``: it raises instead, for
        cleanup's report to say why). ``problem`` then holds the one line a magic shows; ""
        otherwise.
        """
        box: list[Sample] = []
        errors: list[BaseException] = []
        t0 = time.monotonic()
        starting = self._start_thread
        if starting is not None and self.gate.hung_s() is None:
            starting.join(timeout_s)  # a start under way that is not (yet) taken for hung
            if not starting.is_alive():
                self._start_thread = None
        if not self.gate.enter(wait_s=max(timeout_s - (time.monotonic() - t0), 0.0)):
            hung = self.gate.hung_s()
            why = (f"a reading of the GPUs has not returned for {hung:.1f} s (NVML hangs)"
                   if hung is not None else f"NVML did not answer within {timeout_s:g} s")
            self.failures.contain("NVML read",
                                  TimeoutError(f"{why}; its figures show as unknown"))
            return self._without_nvml(why)

        def work() -> None:
            try:
                box.append(self.source.read(processes=True))
            except BaseException as e:  # handed to the caller below
                errors.append(e)
            finally:
                self.gate.leave()

        worker = threading.Thread(target=work, name="gpumem_nb-read", daemon=True)
        worker.start()
        worker.join(max(timeout_s - (time.monotonic() - t0), 0.0))
        if box:
            self.problem = ""
            return box[0]
        if errors:
            if not contain:
                raise errors[0]
            e = errors[0]
            self.failures.contain("read", e)
            why = f"reading the GPUs failed ({userexc.type_name(e)}: " \
                  f"{first_line(error_str(e), 120)})"
        else:
            why = f"NVML did not answer within {timeout_s:g} s"
            self.failures.contain("NVML read",
                                  TimeoutError(f"{why}; its figures show as unknown"))
        return self._without_nvml(why)

    def _without_nvml(self, why: str) -> Sample:
        """The allocator and host figures now, NVML's unknown, and the line saying why."""
        self.problem = f"{why}; the columns it feeds show as unknown."
        try:
            hot = self.read_hot()
        except Exception as e:
            self.failures.contain("read_hot", e)
            return Sample(t_s=time.monotonic(), wall_s=time.time(), rss_bytes=None)
        return replace(hot, devices=tuple(replace(d, nvml=None) for d in hot.devices))

    def nvml_latest(self) -> Sample | None:
        """The sampler's latest reading if it is recent enough to stand for "now"; None when
        the sampler is stopped or stuck (a hung NVML call), so the figure reads as unknown
        rather than stale-as-fresh."""
        latest = self.sampler.latest()
        if latest is None or not self.sampler.running:
            return None
        stale_s = max(3 * self.sampler.interval_s, 2.0)
        return latest if self.clock() - latest.t_s <= stale_s else None

    def read_hot(self) -> Sample:
        """Exact allocator figures and RSS now; NVML from the sampler (see ``nvml_latest``)."""
        read_hot = getattr(self.source, "read_hot", None)
        if read_hot is None:
            return self.source.read(processes=False)
        sample: Sample = read_hot(self.nvml_latest())
        return sample

    def status(self) -> SourceStatus:
        """The sources' status, or a plain stand-in when asking fails."""
        try:
            return self.source.status()
        except Exception as e:
            self.failures.contain("status", e)
            return SourceStatus(nvml=f"status unavailable ({type(e).__name__})",
                                torch="unknown", gpu_count=0)

    def learn_child_roles(self) -> None:
        """On demand (main thread): when the sampler has seen children of this kernel whose
        kind is not known, ask torch's own objects which are DataLoader or launched workers
        (see ``ProcessTree.learn_roles``); the next reading names them."""
        tree = getattr(self.source, "processes", None)
        latest = self.sampler.latest()
        if tree is None or latest is None:
            return
        unknown = roles_to_learn(c for d in latest.devices if d.nvml is not None
                                 for c in d.nvml.children)
        if unknown:
            try:
                tree.learn_roles(unknown)
            except Exception as e:
                self.failures.contain("learn_roles", e)
