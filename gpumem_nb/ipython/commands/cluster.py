"""``cluster``: a Dask cluster's GPUs beside the kernel's (``gpumem_nb.cluster``, imported
only when asked for)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

from ...kernel import Monitor
from ...units import quoted
from ..grammar import Parser, Subcommand

__all__ = ["CLUSTER", "MAX_TIMEOUT_S", "MIN_TIMEOUT_S", "collector"]

# %gpumem cluster --timeout: below this no scheduler answers (a broadcast reaches every worker).
MIN_TIMEOUT_S = 0.1
MAX_TIMEOUT_S = 60.0


def collector(m: Monitor, shell: InteractiveShell, name: str | None) -> Any:
    """The collector for the user's Dask client: the named variable's, else the current
    client's. Any problem is a UsageError with what to do."""
    try:
        from ...cluster import dask_backend
    except ImportError as e:  # a broken install: say so plainly
        raise UsageError(f"the cluster view could not load: {e}") from None
    if name:
        if not name.isidentifier():
            raise UsageError(f"CLIENT is a variable name, not {quoted(name)}")
        user_ns: dict[str, Any] = getattr(shell, "user_ns", {})
        if name not in user_ns:
            raise UsageError(f"there is no variable {quoted(name)} in this notebook")
        client = user_ns[name]
        if not dask_backend.is_client(client):
            if importlib.util.find_spec("distributed") is None:
                raise UsageError(dask_backend.INSTALL_HINT)
            raise UsageError(f"{name} is a {type(client).__name__}, not a "
                             "distributed.Client")
    else:
        try:
            client = dask_backend.default_client()
        except (ImportError, LookupError) as e:
            raise UsageError(str(e)) from None
    if dask_backend.client_closed(client):
        which = name or "the current Dask client"
        raise UsageError(f"{which} is closed: make a new client (client = Client(...)), "
                         "or name an open one: %gpumem cluster NAME")
    return m.cluster_collector(client, dask_backend.DaskCollector)


def _flags(cl: Parser) -> None:
    cl.add_argument("client", nargs="?", metavar="CLIENT",
                    help="the variable holding your distributed.Client (default: the current)")
    cl.add_argument("--timeout", type=float, default=2.0, metavar="S",
                    help="how long to wait for the scheduler (2 s, at most 60); then rows "
                         "read unknown")
    cl.add_argument("-o", action="store_true", help="return the reading")


def cluster(m: Monitor, shell: InteractiveShell, args: argparse.Namespace) -> Any:
    if not MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S:
        raise UsageError(f"--timeout takes seconds from {MIN_TIMEOUT_S:g} to "
                         f"{MAX_TIMEOUT_S:g}")
    from ...cluster import ClusterView

    reading = collector(m, shell, args.client).collect(args.timeout)
    if args.o:
        return reading
    display(ClusterView(reading))
    return None


CLUSTER = Subcommand(
    "cluster", "a Dask cluster's GPUs: one row per worker and GPU (NVML used/total, that\n"
               "worker's own share, its allocator), each GPU counted once", _flags, cluster)
