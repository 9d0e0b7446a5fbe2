"""Every form in which a notebook runs out of GPU memory, beside PyTorch's own
``torch.OutOfMemoryError``: CUDA's own allocation failure, the expandable-segments assert that
breaks every later allocation, cuBLAS and cuDNN failing for want of memory, NCCL's, and another
allocator's (CuPy, JAX). Each is recognised by its class's name and module, read through
``userexc`` (no metaclass code runs), and by its message text; torch, CuPy and JAX are never
imported. Each form says what the facts allow, whether the kernel can go on or must be
restarted and why, and the one action that recovers.

The message texts are those of the libraries' sources, each cited beside its pattern (and in
``tests/test_oom_forms.py``); docs/oom-forms.md keeps the table of forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import userexc
from ..errtext import error_str
from ..units import format_bytes
from .message import _OOM_CHAIN_CAP, _window, is_cuda_oom

__all__ = [
    "CLEANUP",
    "KEY_CUBLAS",
    "KEY_CUDA",
    "KEY_CUDNN",
    "KEY_CUPY",
    "KEY_EXPANDABLE",
    "KEY_JAX",
    "KEY_LIBRARY",
    "KEY_NCCL",
    "OomForm",
    "find_oom",
    "oom_form",
]

KEY_CUDA = "cuda runtime"
KEY_EXPANDABLE = "expandable segments assert"
KEY_CUBLAS = "cublas"
KEY_CUDNN = "cudnn"
KEY_LIBRARY = "cuda library"  # cuFFT, cuSOLVER, cuRAND: their ALLOC_FAILED statuses
KEY_NCCL = "nccl"
KEY_CUPY = "cupy"
KEY_JAX = "jax"

CLEANUP = "%gpumem cleanup"


@dataclass(frozen=True)
class OomForm:
    """One way of running out of GPU memory that is not PyTorch's allocator's own error."""

    key: str
    what: str  # what failed, in one sentence
    restart: bool  # the kernel must be restarted before CUDA work goes on
    why: str  # why it can go on, or why it must restart
    action: str  # the one step that recovers
    code: str = ""  # the action's code, where it is one line a user types
    certain: bool = True  # False: the library says the same for causes other than memory
    requested_bytes: int | None = None

    def lines(self) -> list[str]:
        out = [self.what]
        if not self.certain:
            out.append("This may not be memory: the library gives the same error for other "
                       "causes; it is read as memory because that is its usual cause.")
        out.append(("The kernel must be restarted: " if self.restart
                     else "The kernel can go on: ") + self.why)
        return out


# -- the texts ---------------------------------------------------------------------------------
# c10/cuda/CUDAException.h (C10_CUDA_CHECK) "CUDA error: " + cudaGetErrorString: for
# cudaErrorMemoryAllocation "out of memory"; the driver API's "CUDA driver error: out of memory"
# (c10/cuda/driver_api.h C10_CUDA_DRIVER_CHECK). Raised as torch.AcceleratorError (torch >= 2.8,
# a RuntimeError) or RuntimeError.
# torch/cuda/__init__.py _lazy_init: a queued call's failure at start-up is re-raised as
# DeferredCudaCallError("CUDA call failed lazily at initialization with error: " + str(e)).
_CUDA = re.compile(r"\s{0,16}(?:CUDA call failed lazily at initialization with error: )?"
                   r"(?:CUDA error: out of memory|CUDA driver error: out of memory"
                   r"|cudaErrorMemoryAllocation)")
# c10/util/Exception.h TORCH_INTERNAL_ASSERT: "<cond> INTERNAL ASSERT FAILED at \"<file>\":<line>,
# please report a bug to PyTorch. "; the condition is ``!handles_.at(i)`` in
# c10/cuda/CUDACachingAllocator.cpp ExpandableSegment::map (pytorch/pytorch#188008).
_EXPANDABLE = re.compile(r"!handles_\.at\(i\) INTERNAL ASSERT FAILED at "
                         r"\"[^\"\n]{0,300}CUDACachingAllocator\.cpp\"")
# aten/src/ATen/cuda/Exceptions.h TORCH_CUDABLAS_CHECK: "CUDA error: " +
# _cublasGetErrorEnum(status) + " when calling `" #EXPR "`".
_CUBLAS = re.compile(r"\s{0,16}CUDA error: CUBLAS_STATUS_ALLOC_FAILED")
# aten/src/ATen/cudnn/Exceptions.h AT_CUDNN_CHECK: "cuDNN error: " + cudnnGetErrorString(status)
# [+ ". This error may appear if you passed in a non-contiguous input." for NOT_SUPPORTED].
# cuDNN 9 names its allocation failures by sub-code: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_
# ALLOCATION_FAILED (raised so on the H100, torch 2.11, benchmarks/results/oom_forms_h100.json).
_CUDNN_ALLOC = re.compile(
    r"\s{0,16}cuDNN error: CUDNN_STATUS_(?:ALLOC_FAILED|\w{0,40}ALLOCATION_FAILED)")
_CUDNN_MAYBE = re.compile(
    r"\s{0,16}(?:cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"
    # aten/src/ATen/native/cudnn/Conv_v8.cpp: the v8 API's heuristics found no engine whose
    # workspace could be allocated.
    r"|(?:GET|FIND) was unable to find an engine to execute this computation)")
# cuFFT/cuSOLVER/cuRAND statuses as PyTorch's checks print them (aten/src/ATen/cuda/Exceptions.h,
# aten/src/ATen/native/cuda/CuFFTUtils.h).
_LIBRARY = re.compile(r"\s{0,16}(?:cuFFT error: CUFFT_ALLOC_FAILED|CUFFT_ALLOC_FAILED"
                      r"|cusolver error: CUSOLVER_STATUS_ALLOC_FAILED"
                      r"|CUSOLVER_STATUS_ALLOC_FAILED|CURAND_STATUS_ALLOCATION_FAILED)")
# torch/csrc/distributed/c10d/NCCLUtils.hpp C10D_NCCL_CHECK: "NCCL error in: <file>:<line>, " +
# ncclGetErrorWithVersion + "\n" + getNcclErrorDetailStr: "ncclUnhandledCudaError: Call to CUDA
# function failed." + "\nLast error:\n" + ncclGetLastError(), which holds NCCL's last WARN:
# src/include/checks.h CUDACHECK "Cuda failure '%s'" (cudaGetErrorString: "out of memory"),
# src/include/alloc.h "Failed to CUDA calloc %ld bytes".
_NCCL = re.compile(r"\bNCCL\b|\bnccl[A-Z]")
_NCCL_MEMORY = re.compile(r"Cuda failure (?:[0-9]{1,4} )?'out of memory'"
                          r"|Failed to CUDA calloc(?: async)? ([0-9]{1,20}) bytes"
                          r"|\bout of memory\b|cudaErrorMemoryAllocation")
# cupy/cuda/memory.pyx OutOfMemoryError: "Out of memory allocating {:,} bytes (allocated so far:
# {:,} bytes)." or "... bytes (allocated so far: {:,} bytes, limit set to: {:,} bytes).";
# cupy_backends/cuda/api/runtime.pyx CUDARuntimeError: "cudaErrorMemoryAllocation: out of memory".
_CUPY = re.compile(r"Out of memory allocating ([0-9,]{1,30}) bytes"
                   r"(?: \(allocated so far: ([0-9,]{1,30}) bytes"
                   r"(?:, limit set to: ([0-9,]{1,30}) bytes)?\))?")
_CUPY_RUNTIME = re.compile(r"\s{0,16}cudaErrorMemoryAllocation: out of memory")
# xla/stream_executor/integrations/tf_allocator_adapter.cc MemoryAllocationError:
# ResourceExhausted("Out of memory while trying to allocate <n> bytes."); absl's status text
# puts "RESOURCE_EXHAUSTED: " first. "Out of host memory ..." is the host's, not the GPU's.
_JAX = re.compile(r"\s{0,16}RESOURCE_EXHAUSTED: (?!Out of host memory)")
_JAX_MEMORY = re.compile(r"[Oo]ut of memory|[Rr]an out of memory|would exceed memory"
                         r"|Error allocating device buffer|to allocate")
_JAX_SIZE = re.compile(r"Out of memory while trying to allocate ([0-9]{1,20}) bytes")


def _module_of(exc: BaseException) -> str:
    module = userexc.class_module(type(exc))
    return module if isinstance(module, str) else ""


def _names(exc: BaseException) -> set[str]:
    return {n for n in (userexc.class_name(c) for c in userexc.mro(type(exc)))
            if isinstance(n, str)}


def _int(digits: str | None) -> int | None:
    if not digits:
        return None
    digits = digits.replace(",", "")
    return int(digits) if digits.isdigit() and len(digits) <= 20 else None


def _from_library(exc: BaseException) -> bool:
    """Raised by PyTorch, CUDA bindings or as a plain RuntimeError (what extensions raise):
    not a user's own class that happens to quote a library's text."""
    return _module_of(exc).split(".")[0] == "torch" or "RuntimeError" in _names(exc)


def _cuda_form(torch_raised: bool) -> OomForm:
    return OomForm(
        KEY_CUDA,
        "CUDA itself could not allocate (cudaErrorMemoryAllocation), outside PyTorch's caching "
        "allocator: creating the CUDA context, a library's handle or workspace, or a "
        "cudaMalloc by an extension or kernel. PyTorch's cache does not give its cached blocks "
        "back for allocations it does not make itself, so what it caches may be what was "
        "missing.",
        restart=False,
        why="an allocation failure is not one of CUDA's sticky errors, so the CUDA context stays "
            "usable. Where it was CUDA's start-up that failed (the session's first CUDA call), "
            "PyTorch tries the start again at the next call; only if a small allocation "
            "(torch.zeros(1, device='cuda')) still fails once memory is free is a restart "
            "needed."
        if torch_raised else
        "an allocation failure is not one of CUDA's sticky errors, so the CUDA context stays "
        "usable.",
        action="Run `%gpumem cleanup` (it returns PyTorch's cached blocks to CUDA, where this "
               "allocation comes from), then run the cell again.",
        code=CLEANUP)


def _expandable_form() -> OomForm:
    return OomForm(
        KEY_EXPANDABLE,
        "PyTorch's expandable-segments allocator failed part-way through mapping GPU memory "
        "for want of memory, and kept the pages it had not mapped as if they were "
        "(pytorch/pytorch#188008): every later allocation that grows that segment fails with "
        "this same assert.",
        restart=True,
        why="the allocator's record of that segment is wrong and nothing in Python repairs it "
            "(empty_cache does not): every allocation over that range fails until the process "
            "ends. Before running the cell again, leave room (a smaller batch), or start "
            "without expandable_segments in PYTORCH_CUDA_ALLOC_CONF, whose failure is a plain, "
            "recoverable out-of-memory error.",
        action="Restart the kernel.")


def _cublas_form() -> OomForm:
    return OomForm(
        KEY_CUBLAS,
        "cuBLAS could not allocate (CUBLAS_STATUS_ALLOC_FAILED): it makes its handle with "
        "CUDA's own allocator, outside PyTorch's cache, at the first matrix product on each "
        "device, stream or thread.",
        restart=False,
        why="the failed call created nothing, and the next matrix product asks cuBLAS for its "
            "handle again.",
        action="Run `%gpumem cleanup` (it returns PyTorch's cached blocks to CUDA so that cuBLAS "
               "can make its handle), then run the cell again.",
        code=CLEANUP)


def _cudnn_form(certain: bool) -> OomForm:
    return OomForm(
        KEY_CUDNN,
        "cuDNN could not get the memory it needs (CUDNN_STATUS_ALLOC_FAILED, or cuDNN 9's "
        "..._ALLOCATION_FAILED)."
        if certain else
        "cuDNN found no algorithm it could run: it says so (CUDNN_STATUS_NOT_SUPPORTED, or no "
        "engine found) when the workspace an algorithm needs cannot be allocated, as well as "
        "for an input layout it cannot handle, which is all PyTorch's message mentions.",
        restart=False,
        why="cuDNN's failure leaves no state behind; the next call chooses its algorithm again.",
        action="Run `%gpumem cleanup`, then run the cell again; if it fails the same way with "
               "memory free, the cause is the input: make it contiguous (x.contiguous())."
        if not certain else
        "Run `%gpumem cleanup` (it returns PyTorch's cached blocks to CUDA), then run the cell "
        "again.",
        code=CLEANUP, certain=certain)


def _library_form() -> OomForm:
    return OomForm(
        KEY_LIBRARY,
        "A CUDA library (cuFFT, cuSOLVER or cuRAND) could not allocate its plan or workspace "
        "with CUDA's own allocator, outside PyTorch's cache.",
        restart=False,
        why="the failed call created nothing; the next one asks the library again.",
        action="Run `%gpumem cleanup` (it returns PyTorch's cached blocks to CUDA), then run "
               "the cell again.",
        code=CLEANUP)


def _nccl_form(requested: int | None) -> OomForm:
    return OomForm(
        KEY_NCCL,
        "NCCL could not allocate GPU memory for its communicator"
        + (f" ({format_bytes(requested)})" if requested else "")
        + ": it allocates its buffers with CUDA's own allocator, outside PyTorch's cache, when "
          "a communicator is made or first used.",
        restart=True,
        why="PyTorch aborts a communicator after an NCCL error and does not use it again, and "
            "re-creating the process group in the same process is not reliable. Leave room "
            "for NCCL before the first collective (it needs more with more peers; "
            "NCCL_BUFFSIZE sets its per-peer buffer).",
        action="Restart the kernel.",
        requested_bytes=requested)


def _cupy_form(requested: int | None, so_far: int | None, limit: int | None) -> OomForm:
    if limit:
        return OomForm(
            KEY_CUPY,
            f"CuPy refused {format_bytes(requested)}: its memory pool holds "
            f"{format_bytes(so_far)} and its own limit is {format_bytes(limit)} "
            "(set_limit or CUPY_GPU_MEMORY_LIMIT); the GPU itself was not asked.",
            restart=False,
            why="CuPy's limit refused the allocation before CUDA was called; nothing changed.",
            action="Raise CuPy's limit (cupy.get_default_memory_pool().set_limit(size=...)) or "
                   "delete CuPy arrays you no longer need, then run the cell again.",
            requested_bytes=requested)
    return OomForm(
        KEY_CUPY,
        "CuPy's memory pool could not get "
        + (format_bytes(requested) if requested else "its allocation")
        + (f" (its arrays held {format_bytes(so_far)})" if so_far is not None else "")
        + ". Before raising, CuPy gave its free blocks back, collected garbage and tried again, "
          "so what is missing is held by live CuPy arrays, by PyTorch's cache or by another "
          "process.",
        restart=False,
        why="the failed allocation changed nothing; CuPy's pool is intact.",
        action="Run `%gpumem cleanup` (it returns PyTorch's cached blocks, which CuPy cannot "
               "use), or delete CuPy arrays you no longer need, then run the cell again.",
        code=CLEANUP, requested_bytes=requested)


def _jax_form(requested: int | None) -> OomForm:
    return OomForm(
        KEY_JAX,
        "JAX (XLA's allocator) could not get "
        + (format_bytes(requested) if requested else "the memory it needed")
        + ". JAX takes 75% of the GPU at its first use by default "
          "(XLA_PYTHON_CLIENT_PREALLOCATE), and its pool and PyTorch's cache cannot lend to "
          "each other.",
        restart=False,
        why="the failed computation left nothing allocated. Only setting "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION takes a "
            "restart: JAX reads them when it starts.",
        action="Delete the JAX arrays you no longer need (del), then run the cell again.",
        requested_bytes=requested)


def oom_form(exc: BaseException) -> OomForm | None:
    """The form of out-of-memory error ``exc`` is, other than PyTorch's allocator's own
    (``torch.OutOfMemoryError`` and the allocator's messages: None), or None when it is no
    out-of-memory error at all. Reads at most a window of the text at each end."""
    names = _names(exc)
    module = _module_of(exc)
    root = module.split(".")[0]
    if root in ("cupy", "cupy_backends"):
        text = _window(error_str(exc))
        m = _CUPY.search(text)
        if "OutOfMemoryError" in names and m is not None:
            return _cupy_form(_int(m.group(1)), _int(m.group(2)), _int(m.group(3)))
        if "OutOfMemoryError" in names or (
                "CUDARuntimeError" in names and _CUPY_RUNTIME.match(text)):
            return _cupy_form(None, None, None)
        return None
    if root in ("jax", "jaxlib") and names & {"XlaRuntimeError", "JaxRuntimeError"}:
        text = _window(error_str(exc))
        if _JAX.match(text) and _JAX_MEMORY.search(text):
            size = _JAX_SIZE.search(text)
            return _jax_form(_int(size.group(1)) if size else None)
        return None
    if "OutOfMemoryError" in names and root == "torch":
        return None  # PyTorch's allocator: the explainer's own ground
    if not (_from_library(exc) or "DistBackendError" in names):
        return None
    text = _window(error_str(exc))
    if _EXPANDABLE.search(text):
        return _expandable_form()
    if _NCCL.search(text):
        m = _NCCL_MEMORY.search(text)
        if m is not None:
            return _nccl_form(_int(m.group(1)) if m.lastindex else None)
        return None
    if _CUBLAS.match(text):
        return _cublas_form()
    if _CUDNN_ALLOC.match(text):
        return _cudnn_form(certain=True)
    if _CUDNN_MAYBE.match(text):
        return _cudnn_form(certain=False)
    if _LIBRARY.match(text):
        return _library_form()
    if _CUDA.match(text):
        return _cuda_form(torch_raised=root == "torch")
    if _JAX.match(text) and _JAX_SIZE.search(text):  # re-raised as a plain RuntimeError
        size = _JAX_SIZE.search(text)
        return _jax_form(_int(size.group(1)) if size else None)
    return None


def find_oom(exc: BaseException | None) -> tuple[BaseException, OomForm | None] | None:
    """The out-of-memory error in ``exc`` or what it chains to, with its form (None for
    PyTorch's allocator's own); None when the chain holds none."""
    for e in userexc.chain(exc, _OOM_CHAIN_CAP):
        form = oom_form(e)
        if form is not None:
            return e, form
        if is_cuda_oom(e):
            return e, None
    return None
