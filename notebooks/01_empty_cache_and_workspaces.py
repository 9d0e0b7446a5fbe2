# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] id="01-45"
# # 1, part 2. `empty_cache()`: what it gives back, what it costs, and what stays
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** I deleted my tensors; should I call `torch.cuda.empty_cache()`, and what
# does it cost?
#
# Part 1 ([`01_allocated_reserved_nvidia_smi.ipynb`](01_allocated_reserved_nvidia_smi.ipynb))
# showed that a deleted tensor's memory stays *reserved*: PyTorch's allocator caches its block
# for the next tensor, and NVML still counts it. This notebook gives that memory back and
# measures to whom it goes, what the call costs while the GPU is busy, and what even a full
# cleanup leaves allocated: the first matrix product's workspace.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="01-46"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb

# %% id="01-41"
import os

import pynvml  # from the nvidia-ml-py package: what nvidia-smi reads
import torch
from claims import claim, near, skipped

from gpumem_nb.units import format_bytes as fmt

pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
MiB = 2**20


def nvml_used():
    # Used memory of GPU 0 as nvidia-smi shows it (v2 leaves driver-reserved memory out).
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2).used
    except (AttributeError, TypeError, pynvml.NVMLError):
        return pynvml.nvmlDeviceGetMemoryInfo(gpu).used


def this_process():
    # This process's bytes in NVML's process list; None when it is not listed.
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None


first = torch.zeros(1, device="cuda")  # creates the CUDA context (part 1), in a cell of its own
del first
print(torch.cuda.get_device_name(0))
print(f"NVML used: {fmt(nvml_used())}; PyTorch reserved: {fmt(torch.cuda.memory_reserved())}")

# %% [markdown] id="01-42"
# ## A cached block
#
# As in part 1: a 20000×20000 float32 tensor, then `del`. Its block is a whole segment of its
# own (part 1's rounding rules; the ✓ line checks it), so after `del` the whole segment sits in
# the cache, free for PyTorch's next tensor and still counted by NVML.

# %% id="01-43"
y = torch.randn(20000, 20000, device="cuda")
print(f"a {y.shape[0]}×{y.shape[1]} float32 tensor of {fmt(y.nbytes)}: allocated "
      f"{fmt(torch.cuda.memory_allocated())}, reserved {fmt(torch.cuda.memory_reserved())}")
segment = next(s for s in torch.cuda.memory_snapshot() if s["allocated_size"] >= y.nbytes)
claim(len(segment["blocks"]) == 1 and segment["allocated_size"] == segment["total_size"],
      "its block is the whole segment: nothing of it was split off",
      segment=fmt(segment["total_size"]), tensor=fmt(y.nbytes))

# %% id="01-23"
del y
reserved_before, nvml_before = torch.cuda.memory_reserved(), nvml_used()

# %% [markdown] id="01-24"
# ## `empty_cache()`
#
# `torch.cuda.empty_cache()` hands cached memory back to the driver, and NVML drops by the same
# amount (one article claims it gives nothing back: the `NVML freed` column below and the check
# after it say otherwise). Everything that allocates outside PyTorch's cache can then use
# that memory: other processes, and in this process other libraries (notebook 4's CuPy, NCCL)
# and kernel code loaded later (the first matrix product below grows memory
# outside PyTorch). PyTorch's own requests gain nothing: its allocator reuses the cache, and
# before it reports out of memory it frees the cache itself. `%gpumem cleanup` calls it for you
# and reports what each step freed.
#
# With the native allocator's default segments (this notebook's), it can only return whole
# segments. A segment is one `cudaMalloc`, and `cudaFree` takes the segment's start address
# and frees all of it or nothing, so the allocator frees only cached blocks that were never
# split, i.e. segments with no live block in them (PyTorch's source: "Free all non-split
# cached blocks"). Here `y`'s block was the whole segment, so everything goes back. A free
# block that shares its segment with a live tensor stays cached until that tensor goes:
# notebook 0 shows that case.
#
# The other backends do otherwise. With `expandable_segments:True` a segment is address space
# with pages mapped into it, and `empty_cache` unmaps every free page, split block or not, even
# beside a live tensor (`release_blocks` unmaps each free expandable block; notebook 3 measures
# it). `cudaMallocAsync` keeps no segments of its own: `empty_cache` asks the driver's pool to
# give back what no live allocation uses (`cudaMemPoolTrimTo`). Notebook 5 checks on every
# backend that what `empty_cache` gave back also left this process's NVML line.

# %% id="01-25"
# %gpumem cleanup

# %% id="01-36"
claim(torch.cuda.memory_reserved() == 0
      and near(nvml_before - nvml_used(), reserved_before, within=4 * MiB),
      "empty_cache gave the whole cache back, and NVML fell by the same amount",
      reserved_before=fmt(reserved_before), nvml_fell_by=fmt(nvml_before - nvml_used()))

# %% id="01-26"
# %gpumem

# %% [markdown] id="01-27"
# ## The context keeps growing
#
# The context is not fixed at creation: under lazy loading, each kernel's code arrives at its
# first launch. The first matrix product launches cuBLAS's kernels and PyTorch's own
# matmul-path kernels, whose code counts outside PyTorch, and gives cuBLAS a *workspace*, which
# PyTorch allocates from its own cache. The next cell measures both around the first product
# of this process; its "outside PyTorch" figure mixes cuBLAS's code with PyTorch's, and nothing
# here separates the two.

# %% id="01-28"
def outside_pytorch():
    # This process's NVML line minus what PyTorch reserved; None when NVML lists no line.
    mine = this_process()
    return None if mine is None else mine - torch.cuda.memory_reserved()


a = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
alloc0, outside0 = torch.cuda.memory_allocated(), outside_pytorch()
out = a @ a  # the first matrix product of this process
torch.cuda.synchronize()
grown = torch.cuda.memory_allocated() - alloc0
print(f"first matmul: allocated {fmt(grown, signed=True)}: the product {fmt(out.nbytes)} "
      f"and {fmt(grown - out.nbytes)} that is no tensor of yours")
claim(grown > out.nbytes, "the first product allocates more than its result: a workspace",
      workspace=fmt(grown - out.nbytes))
if outside0 is not None:
    print(f"outside PyTorch: {fmt(outside_pytorch() - outside0, signed=True)}")
    claim(outside_pytorch() > outside0, "the first product also grows memory outside PyTorch",
          outside_pytorch=fmt(outside_pytorch() - outside0, signed=True))
else:
    skipped("the first product also grows memory outside PyTorch",
            "NVML does not list this process")

# %% [markdown] id="01-29"
# The part of `allocated` that is no tensor of yours is cuBLAS's workspace; the end of this
# notebook shows it outliving every tensor. It is also why `%gpumem who` (notebook 2) cannot
# account for every allocated byte: no Python object holds it.
#
# ### `empty_cache()` is not free
#
# It must not release a block the GPU may still be using, so when it has cached blocks to free
# it first waits for the GPU to finish all queued work. The next cell queues 40 large matrix
# products (which return at once: CUDA calls are asynchronous) and times three things: how long
# the queued work takes, `empty_cache()` with nothing cached, and `empty_cache()` with a cached
# block to free.

# %% id="01-30"
import time


def queue_matmuls(n=40):
    for _ in range(n):
        torch.matmul(a, a, out=out)  # writes into `out`: allocates and caches nothing


def ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


torch.cuda.empty_cache()
queue_matmuls()
queued_ms = ms(torch.cuda.synchronize)
queue_matmuls()
nothing_ms = ms(torch.cuda.empty_cache)
torch.cuda.synchronize()
junk = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
del junk  # now a 2 GiB block sits in the cache
queue_matmuls()
cached_ms = ms(torch.cuda.empty_cache)
torch.cuda.synchronize()
print(f"40 queued matmuls: synchronize() waited {queued_ms:.0f} ms")
print(f"empty_cache() with nothing cached returned after {nothing_ms:.2f} ms")
print(f"empty_cache() with {fmt(2 * 2**30)} cached blocked for {cached_ms:.0f} ms")
claim(cached_ms > 100 and cached_ms > 0.5 * queued_ms,
      "with a block to free, empty_cache() blocked behind the queued work (> 100 ms)")
claim(nothing_ms < 10, "with nothing to free, it returned at once (< 10 ms)")

# %% [markdown] id="01-31"
# With a block to free, `empty_cache()` blocked behind the queued work (compare the first and
# third lines); with nothing to free it returned at once. So it is not harmless:
# inside a training loop it stalls the pipeline every time it has something to free. Call it
# between phases. (Measured here on the native allocator; under `cudaMallocAsync` it
# synchronizes the device before trimming its pool, too.)
#
# Its docstring gives it one more purpose: it "may help reduce fragmentation". Returning whole
# free segments lets a later, larger request be served by a fresh `cudaMalloc` instead of
# failing to fit in the cached pieces. The allocator already does this itself, once, when a
# `cudaMalloc` fails (notebook 4 measures that retry), so PyTorch's own requests rarely need
# it; it matters when memory is wanted outside PyTorch's cache: by another process, or by
# another library or kernel code loaded later in this one (notebook 4's CuPy section).
#
# ## What a cleanup cannot free
#
# With every tensor deleted and the cache emptied, `allocated` is still not zero: cuBLAS keeps
# its workspace for the life of the process. A private PyTorch call drops it.

# %% id="01-32"
del a, out
# %gpumem cleanup

# %% id="01-33"
print(f"allocated with no tensor of yours alive: {fmt(torch.cuda.memory_allocated())}")
torch._C._cuda_clearCublasWorkspaces()  # private: drops cuBLAS's cached workspaces
print(f"after dropping cuBLAS's workspaces: {fmt(torch.cuda.memory_allocated())}")
claim(torch.cuda.memory_allocated() == 0, "dropping cuBLAS's workspaces leaves nothing allocated")

# %% [markdown] id="01-34"
# ## The per-cell record
#
# Every cell above was measured: allocated and reserved before and after, the allocator's peak
# during the cell (exact when the cell set a new peak, `≥` otherwise), NVML before, after and at
# its sampled peak, and host RAM. `gpumem_nb.history()` returns the same as a DataFrame; the
# cell after the table checks two of its rows against what the cells printed.

# %% id="01-35"
# %gpumem history

# %% id="01-37"
import gpumem_nb

rows = gpumem_nb.history()
big = rows[rows.source.str.startswith("y = torch.randn(20000, 20000")].iloc[0]
cleanup = rows[rows.source.str.startswith("%gpumem cleanup")].iloc[0]
big_nvml = big.nvml_used_after_bytes - big.nvml_used_before_bytes
cleanup_nvml = cleanup.nvml_used_after_bytes - cleanup.nvml_used_before_bytes
claim(near(big_nvml, big.reserved_after_bytes - big.reserved_before_bytes, within=64 * MiB),
      "the 20000×20000 tensor's row shows NVML rising with reserved",
      nvml_delta=fmt(int(big_nvml), signed=True))
claim(near(-cleanup_nvml, cleanup.reserved_before_bytes - cleanup.reserved_after_bytes,
           within=64 * MiB),
      "the first cleanup's row shows NVML falling with reserved",
      nvml_delta=fmt(int(cleanup_nvml), signed=True))

# %% [markdown] id="01-44"
# What to take away:
#
# - `empty_cache()` returns cached memory to the driver, and NVML falls by as much; with the
#   default allocator only whole free segments go back.
# - It helps only what allocates outside PyTorch's cache: other processes, other libraries and
#   kernel code loaded later in this one. PyTorch's own requests reuse the cache, and the
#   allocator frees it itself before it reports out of memory.
# - With something to free it waits for the GPU's queued work: call it between phases, not in a
#   training loop.
# - The first matrix product allocates cuBLAS's workspace, which outlives every tensor: no
#   cleanup frees it and `%gpumem who` cannot name it.
