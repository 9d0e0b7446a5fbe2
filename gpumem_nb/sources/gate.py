"""One reading of the live sources at a time, and none started while one hangs.

NVML can hang: a GPU falling off the bus or a wedged driver keeps the calling thread inside
the library until the driver answers, which may be never. A thread cannot be killed, so each
reader that joins a hung call is one more thread stuck for good: every ``%gpumem``, status
and cleanup left a stuck ``gpumem_nb-read`` thread, every ``%reload_ext`` a stuck sampler.
The gate keeps that number at one:

- a reading enters the gate and leaves it when it returns; a second reader waits its turn
  (readings take milliseconds);
- once the reading inside has taken longer than ``stuck_s``, it is taken for hung, and every
  other reader is turned away at once (its NVML figures unknown), until it returns: then the
  next reader goes in as before.

There is one gate per process (``LIVE``): every monitor, a reloaded one included, reads the
same driver. The replay's sampler reads a file and takes no gate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["LIVE", "STUCK_S", "ReadGate"]

# A reading inside the gate this long is taken for hung (an H200's slowest, a first process
# listing, takes well under 10 ms).
STUCK_S = 1.0


class ReadGate:
    def __init__(self, stuck_s: float = STUCK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stuck_s = stuck_s
        self._clock = clock
        self._cond = threading.Condition()
        self._since: float | None = None  # when the reading inside began

    def enter(self, wait_s: float) -> bool:
        """Go in, waiting at most ``wait_s`` for the reading inside to return; False (at
        once, when the one inside is already taken for hung) when it does not. A caller that
        entered must ``leave()``, from whichever thread ends the reading."""
        deadline = self._clock() + max(wait_s, 0.0)
        with self._cond:
            while self._since is not None:
                now = self._clock()
                limit = min(deadline, self._since + self.stuck_s)
                if now >= limit:
                    return False
                self._cond.wait(limit - now)
            self._since = self._clock()
            return True

    def wait_free(self, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, until no reading is inside (hung or not); True when
        none is. For a start that must wait its turn behind a hung reading."""
        deadline = self._clock() + max(timeout_s, 0.0)
        with self._cond:
            while self._since is not None:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def leave(self) -> None:
        with self._cond:
            self._since = None
            self._cond.notify_all()

    def hung_s(self) -> float | None:
        """How long the reading inside has taken, once it is taken for hung; else None."""
        since = self._since
        if since is None:
            return None
        inside = self._clock() - since
        return inside if inside >= self.stuck_s else None


LIVE = ReadGate()
