"""On the real GPU: an OOM in the very cell that starts CUDA is measured by the allocator's OOM
observer, queued on torch's CUDA start-up when gpumem_nb was loaded (torch imported, CUDA not
started); under cudaMallocAsync nothing is queued and CUDA starts as usual. Each in a fresh
IPython process: the allocator backend is chosen when torch is imported, and "CUDA not started
yet" holds only in a fresh process.

Run: ``pytest -m gpu tests/gpu/test_oom_observer_first_cell_gpu.py -s``
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from .helpers import NVML_BEFORE, fresh

pytestmark = pytest.mark.gpu

# The allocator's settings are set in the child before torch is imported: c10 reads
# PYTORCH_CUDA_ALLOC_CONF when it is set at all (even empty) and only otherwise
# PYTORCH_ALLOC_CONF, so an empty inherited PYTORCH_CUDA_ALLOC_CONF would hide the latter.
# The failing request, 10**15 bytes (909 TiB), is larger than any GPU: sizing it from
# torch.cuda.mem_get_info would start CUDA before the cell does.
CHILD = NVML_BEFORE + """
        import json, os
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        os.environ.pop("PYTORCH_ALLOC_CONF", None)
        os.environ.update(CONF)
        import torch
        from IPython.testing.globalipapp import start_ipython
        from gpumem_nb.magics import current_monitor
        from gpumem_nb.sources.torch import OOM_OBSERVER_ATTR
        # The backend, read as gpumem_nb reads it before CUDA starts: it must start nothing.
        backend = torch._C._cuda_getAllocatorBackend()
        read_started = torch.cuda.is_initialized() or used() != before
        ip = start_ipython()
        ip.user_ns["torch"] = torch
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        ip.run_cell("a = 1", store_history=True)
        watch = current_monitor(ip).oom
        status_before = watch.observer_status
        untouched = not torch.cuda.is_initialized() and used() == before
        attached_before = hasattr(torch._C, OOM_OBSERVER_ATTR)
        first = ip.run_cell(FIRST_CELL, store_history=True)
        e = watch.last
        out = {"backend": backend, "read_started": read_started, "untouched": untouched,
               "status_before": status_before, "attached_before": attached_before,
               "status_after": watch.observer_status,
               "initialized": torch.cuda.is_initialized(),
               "first_error": type(first.error_in_exec).__name__
                              if first.error_in_exec is not None else "",
               "source": e.source if e is not None else "",
               "measured_at": e.facts.measured_at if e is not None else "",
               "requested": e.facts.requested_bytes if e is not None else None,
               "cause": e.cause if e is not None else ""}
        if SECOND_CELL:
            second = ip.run_cell(SECOND_CELL, store_history=True)
            e = watch.last
            out.update(second_error=type(second.error_in_exec).__name__
                                    if second.error_in_exec is not None else "",
                       second_source=e.source if e is not None else "",
                       status_after=watch.observer_status)
        print(json.dumps(out))
"""

IMPOSSIBLE = "x = torch.empty(10**15, dtype=torch.uint8, device='cuda')"


def child(conf: dict[str, str], first_cell: str, second_cell: str = "") -> Any:
    code = (f"CONF = {conf!r}\nFIRST_CELL = {first_cell!r}\nSECOND_CELL = {second_cell!r}\n"
            + textwrap.dedent(CHILD))
    r = fresh(code)
    print(r)
    return r


def test_an_oom_in_the_cell_that_starts_cuda_is_measured_by_the_observer():
    r = child({}, IMPOSSIBLE)
    assert r["backend"] == "native" and not r["read_started"], r
    assert r["untouched"] and not r["attached_before"], r  # queued: nothing started
    assert r["status_before"] == "queued: attaches when CUDA starts", r
    assert r["first_error"] == "OutOfMemoryError" and r["initialized"], r
    assert r["source"].startswith("Measured at the failure by the allocator's OOM observer"), r
    assert "did not see this one" not in r["source"] and r["measured_at"] == "failure", r
    assert abs(r["requested"] - 10**15) < 4 << 20 and r["cause"] == "impossible", r
    assert r["status_after"] == "attached", r


def test_pytorch_cuda_alloc_conf_wins_over_pytorch_alloc_conf_for_the_queue():
    # Both set: torch takes PYTORCH_CUDA_ALLOC_CONF's backend (native here), so the observer
    # is queued, and sees the first cell's OOM.
    r = child({"PYTORCH_CUDA_ALLOC_CONF": "backend:native",
               "PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"}, IMPOSSIBLE)
    assert r["backend"] == "native", r
    assert r["status_before"] == "queued: attaches when CUDA starts", r
    assert r["source"].startswith("Measured at the failure by the allocator's OOM observer"), r


def test_under_cudamallocasync_nothing_is_queued_and_cuda_starts_fine():
    # Queued, the attachment would raise inside torch.cuda._lazy_init, and torch would turn
    # the user's first CUDA call into a DeferredCudaCallError.
    r = child({"PYTORCH_ALLOC_CONF": "backend:cudaMallocAsync"},
              "x = torch.ones(1, device='cuda')", IMPOSSIBLE)
    assert r["backend"] == "cudaMallocAsync" and not r["read_started"], r
    assert r["untouched"] and not r["attached_before"], r
    assert r["status_before"] == \
        "not queued: the cudaMallocAsync allocator has no OOM observer", r
    assert r["first_error"] == "" and r["initialized"], r  # CUDA started fine
    assert r["second_error"] == "OutOfMemoryError", r
    assert r["second_source"].startswith("From the error message"), r
    assert r["status_after"].startswith("not available: RuntimeError: cudaMallocAsync"), r
