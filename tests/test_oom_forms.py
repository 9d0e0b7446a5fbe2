"""Out-of-memory errors that are not ``torch.OutOfMemoryError`` (issue 36): each form a
notebook meets is recognised by its class's name and module and its text (torch, CuPy and JAX
are never imported), explained with whether the kernel can go on, and given the one action
that recovers. Before, a CuPy or JAX OOM, NCCL's, cuDNN's NOT_SUPPORTED and the
expandable-segments assert passed unexplained, and a restart-only failure was given cleanup
advice that cannot help.

Every text below is copied from the library source named beside it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from gpumem_nb.oom.forms import (
    KEY_CUBLAS,
    KEY_CUDA,
    KEY_CUDNN,
    KEY_CUPY,
    KEY_EXPANDABLE,
    KEY_JAX,
    KEY_LIBRARY,
    KEY_NCCL,
    find_oom,
    oom_form,
)

from .fakes import GiB


def library_error(module: str, name: str, base: type[BaseException] = RuntimeError) -> type:
    """A class named and placed as the library's own is (``type(e).__module__``)."""
    return type(name, (base,), {"__module__": module})


AcceleratorError = library_error("torch", "AcceleratorError")
DistBackendError = library_error("torch.distributed", "DistBackendError")
TorchOom = library_error("torch", "OutOfMemoryError")
CupyOom = library_error("cupy.cuda.memory", "OutOfMemoryError", MemoryError)
CupyRuntime = library_error("cupy_backends.cuda.api.runtime", "CUDARuntimeError")
XlaRuntimeError = library_error("jaxlib.xla_extension", "XlaRuntimeError")
JaxRuntimeError = library_error("jaxlib._jax", "JaxRuntimeError")

# c10/cuda/CUDAException.cpp c10_cuda_check_implementation: "CUDA error: " +
# cudaGetErrorString(cudaErrorMemoryAllocation) ("out of memory") + the asynchronous-report hint.
CUDA_OOM = ("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
            "some other API call, so the stacktrace below might be incorrect.\nFor debugging "
            "consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable "
            "device-side assertions.\n")
# c10/util/Exception.h TORCH_INTERNAL_ASSERT ("<cond> INTERNAL ASSERT FAILED at \"<file>\":<line>,
# please report a bug to PyTorch. ") on c10/cuda/CUDACachingAllocator.cpp's
# `TORCH_INTERNAL_ASSERT(!handles_.at(i))` (ExpandableSegment::map); line as in
# pytorch/pytorch#188008 (torch 2.14).
EXPANDABLE = ('!handles_.at(i) INTERNAL ASSERT FAILED at "C:\\actions-runner\\_work\\pytorch\\'
              'pytorch\\c10\\cuda\\CUDACachingAllocator.cpp":487, please report a bug to '
              'PyTorch. ')
# aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK.
CUBLAS = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
# aten/src/ATen/cudnn/Exceptions.h AT_CUDNN_CHECK (cudnnGetErrorString gives the status name).
CUDNN_NOT_SUPPORTED = ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you "
                       "passed in a non-contiguous input.")
CUDNN_ALLOC = "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"
# aten/src/ATen/native/cudnn/Conv_v8.cpp (the v8 API's engine search).
CUDNN_NO_ENGINE = "GET was unable to find an engine to execute this computation"
# aten/src/ATen/native/cuda/CuFFTUtils.h CUFFT_CHECK: "cuFFT error: " + _cudaGetErrorEnum.
CUFFT = "cuFFT error: CUFFT_ALLOC_FAILED"
# torch/csrc/distributed/c10d/NCCLUtils.hpp C10D_NCCL_CHECK + getNcclErrorDetailStr; NCCL's
# ncclGetErrorString (src/init.cc) for ncclUnhandledCudaError; its last WARN from
# src/include/checks.h CUDACHECK ("Cuda failure '%s'") or src/include/alloc.h
# ("Failed to CUDA calloc %ld bytes").
NCCL_OOM = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:94, unhandled "
            "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
            "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
            "Cuda failure 'out of memory'")
NCCL_CALLOC = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:94, unhandled "
               "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
               "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
               "Failed to CUDA calloc 536870912 bytes")
NCCL_NOT_MEMORY = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:94, "
                   "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
                   "2.21.5\nncclSystemError: System call (e.g. socket, malloc) or external "
                   "library call failed or device error. \nLast error:\nsocketStartConnect: "
                   "Connect to 10.0.0.2<43417> failed : Connection refused")
# cupy/cuda/memory.pyx OutOfMemoryError.__init__ (both forms); cupy_backends/cuda/api/
# runtime.pyx CUDARuntimeError ("%s: %s" % (cudaGetErrorName, cudaGetErrorString)).
CUPY = "Out of memory allocating 1,073,741,824 bytes (allocated so far: 2,147,483,648 bytes)."
CUPY_LIMIT = ("Out of memory allocating 1,024 bytes (allocated so far: 0 bytes, limit set to: "
              "512 bytes).")
CUPY_RUNTIME = "cudaErrorMemoryAllocation: out of memory"
# xla/stream_executor/integrations/tf_allocator_adapter.cc MemoryAllocationError, as absl's
# status text ("RESOURCE_EXHAUSTED: " + message).
JAX = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes."
JAX_HOST = ("RESOURCE_EXHAUSTED: Out of host memory while trying to allocate 17179869184 bytes. "
            "Please set the environment variable XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB to allocate "
            "larger host memory than the default 64 GB.")

FORMS = [
    (AcceleratorError(CUDA_OOM), KEY_CUDA, False),
    (RuntimeError(CUDA_OOM), KEY_CUDA, False),
    # torch/cuda/__init__.py _lazy_init (DeferredCudaCallError, an Exception of torch's).
    (library_error("torch.cuda", "DeferredCudaCallError", Exception)(
        "CUDA call failed lazily at initialization with error: " + CUDA_OOM), KEY_CUDA, False),
    (RuntimeError(EXPANDABLE), KEY_EXPANDABLE, True),
    (RuntimeError(CUBLAS), KEY_CUBLAS, False),
    (RuntimeError(CUDNN_NOT_SUPPORTED), KEY_CUDNN, False),
    (RuntimeError(CUDNN_ALLOC), KEY_CUDNN, False),
    (RuntimeError(CUDNN_NO_ENGINE), KEY_CUDNN, False),
    (RuntimeError(CUFFT), KEY_LIBRARY, False),
    (DistBackendError(NCCL_OOM), KEY_NCCL, True),
    (DistBackendError(NCCL_CALLOC), KEY_NCCL, True),
    (CupyOom(CUPY), KEY_CUPY, False),
    (CupyOom(CUPY_LIMIT), KEY_CUPY, False),
    (CupyRuntime(CUPY_RUNTIME), KEY_CUPY, False),
    (XlaRuntimeError(JAX), KEY_JAX, False),
    (JaxRuntimeError(JAX), KEY_JAX, False),
]


@pytest.mark.parametrize(("exc", "key", "restart"), FORMS,
                         ids=[f"{type(e).__name__}-{k}-{i}" for i, (e, k, _) in enumerate(FORMS)])
def test_each_form_of_running_out_is_recognised_with_its_restart_and_one_action(exc, key,
                                                                                 restart):
    form = oom_form(exc)
    assert form is not None and form.key == key
    assert form.restart is restart
    assert form.action
    assert ("Restart the kernel" in form.action) is restart
    words = " ".join(form.lines())
    assert ("must be restarted" in words) is restart and ("can go on" in words) is not restart


def test_the_figures_a_message_gives_are_read():
    assert oom_form(CupyOom(CUPY)).requested_bytes == GiB
    limited = oom_form(CupyOom(CUPY_LIMIT))
    assert limited.requested_bytes == 1024 and "limit is 512 B" in limited.what
    assert oom_form(XlaRuntimeError(JAX)).requested_bytes == 16 * GiB
    assert oom_form(DistBackendError(NCCL_CALLOC)).requested_bytes == 512 << 20
    assert not oom_form(RuntimeError(CUDNN_NOT_SUPPORTED)).certain
    assert oom_form(RuntimeError(CUDNN_ALLOC)).certain


@pytest.mark.parametrize("exc", [
    XlaRuntimeError(JAX_HOST),  # the host's memory, not the GPU's
    DistBackendError(NCCL_NOT_MEMORY),  # NCCL failing for another reason
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx(...)`"),
    RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    ValueError(CUDA_OOM),  # a user's error quoting the text
    library_error("__main__", "MyError", Exception)(CUPY),
    library_error("mylib", "OutOfMemoryError", MemoryError)(CUPY),  # not CuPy's class
    RuntimeError("while loading: " + CUDA_OOM),  # quotes it further in
    MemoryError("out of memory"),  # the host's
])
def test_errors_that_only_resemble_a_gpu_oom_are_not_taken_for_one(exc):
    assert oom_form(exc) is None
    assert find_oom(exc) is None


def test_the_form_is_found_behind_a_wrapper_and_torchs_own_oom_stays_torchs():
    try:
        try:
            raise CupyOom(CUPY)
        except MemoryError as inner:
            raise ValueError("step failed") from inner
    except ValueError as outer:
        found = find_oom(outer)
    assert found is not None and found[1] is not None and found[1].key == KEY_CUPY
    torch_oom = TorchOom("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                         "capacity of 79.19 GiB of which 1.00 GiB is free.")
    assert find_oom(torch_oom) == (torch_oom, None)


def test_recognising_every_form_imports_no_gpu_library():
    """Run in a fresh interpreter: the forms are read by class name, module and text only."""
    code = textwrap.dedent(f"""
        import sys
        from gpumem_nb.oom.forms import find_oom
        def cls(module, name, base=RuntimeError):
            return type(name, (base,), {{"__module__": module}})
        errors = [cls("torch", "AcceleratorError")({CUDA_OOM!r}),
                  cls("cupy.cuda.memory", "OutOfMemoryError", MemoryError)({CUPY!r}),
                  cls("jaxlib._jax", "JaxRuntimeError")({JAX!r}),
                  cls("torch.distributed", "DistBackendError")({NCCL_OOM!r}),
                  RuntimeError({EXPANDABLE!r})]
        assert all(find_oom(e) is not None for e in errors)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                        ("torch", "cupy", "cupy_backends", "jax", "jaxlib"))
        assert not loaded, loaded
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


# -- in the notebook: what the cell that failed shows ------------------------------------------
@pytest.mark.parametrize(("exc", "key", "restart"), [
    (AcceleratorError(CUDA_OOM), KEY_CUDA, False),
    (RuntimeError(EXPANDABLE), KEY_EXPANDABLE, True),
    (DistBackendError(NCCL_OOM), KEY_NCCL, True),
    (CupyOom(CUPY), KEY_CUPY, False),
    (XlaRuntimeError(JAX), KEY_JAX, False),
    (RuntimeError(CUDNN_NOT_SUPPORTED), KEY_CUDNN, False),
], ids=["cuda", "expandable", "nccl", "cupy", "jax", "cudnn"])
def test_a_cell_failing_with_another_form_is_explained_with_restart_or_not_and_its_action(
        loaded: Any, capsys: Any, exc: BaseException, key: str, restart: bool):
    loaded.user_ns["err"] = exc
    loaded.run_cell("raise err", store_history=True)
    out = capsys.readouterr().out
    e = loaded.run_line_magic("gpumem", "oom -o")
    assert e is not None and e.kind == key, out
    assert e.restart is restart
    assert e.kind_lines[0] in out
    assert ("The kernel must be restarted" in out) is restart
    assert ("The kernel can go on" in out) is not restart
    first = e.actions[0].text
    assert first in out
    if restart:
        assert [a.text for a in e.actions] == ["Restart the kernel."]
    else:
        assert "Restart the kernel" not in first
    # The next ordinary cell says nothing.
    loaded.run_cell("ok = 1", store_history=True)
    assert "gpumem" not in capsys.readouterr().out


def test_a_cupy_oom_shows_the_size_it_asked_for_in_the_header(loaded, capsys):
    loaded.user_ns["err"] = CupyOom(CUPY)
    loaded.run_cell("raise err", store_history=True)
    out = capsys.readouterr().out
    assert "Asked 1.00 GiB" in out


# -- the GPU script ----------------------------------------------------------------------------
def test_the_gpu_forms_script_plans_every_form_without_torch(tmp_path):
    """``benchmarks/gpu_oom_forms.py --dry-run`` runs here (no torch) and writes its table; a
    broken cell would cost a device call, so every cell is compiled."""
    import json
    from pathlib import Path

    from benchmarks import gpu_oom_forms as script

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_oom_forms.py"),
                           "--dry-run", "--out", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "oom_forms_dry_run.json").read_text())["rows"]
    assert [r["form"] for r in rows] == [f.name for f in script.FORMS]
    assert "| form | produced |" in (tmp_path / "oom_forms_dry_run.md").read_text()
    for f in script.FORMS:
        for cell in (*f.setup, f.fail):
            compile(cell, f.name, "exec")
    compile(script.FILL_SRC, "fill", "exec")
