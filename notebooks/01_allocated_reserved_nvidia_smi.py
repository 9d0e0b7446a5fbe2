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

# %% [markdown] id="01-00"
# # 1. Allocated, reserved, and what nvidia-smi sees
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** "I deleted everything and nvidia-smi still says the GPU is full." Where does
# a process's GPU memory go, and why does deleting a tensor not give it back?
#
# This notebook shows it one step at a time, with PyTorch's caching allocator and NVML (the
# library `nvidia-smi` reads) side by side: the CUDA context, how `allocated` and `reserved`
# round a request, NVML's two totals, and what `del` does. It also settles a few claims that
# circulate in blog posts, each with a measured cell. Its second part,
# [`01_empty_cache_and_workspaces.ipynb`](01_empty_cache_and_workspaces.ipynb), gives the
# memory back with `empty_cache()` and measures what that costs and what stays.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="01-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb

# %% [markdown] id="01-02"
# ## Importing is not initializing
#
# Three steps that are easy to blur: importing torch, initializing CUDA, and creating the CUDA
# *context* (the driver's per-process state on the GPU, which is what costs memory). To tell
# them apart we read NVML directly, the way `nvidia-smi` does: the device's used memory, and
# this process's line in NVML's process list.

# %% id="01-03"
import os

import pynvml  # from the nvidia-ml-py package: what nvidia-smi reads
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


used_at_start = nvml_used()
print(f"NVML used before this process touched the GPU: {fmt(used_at_start)}")
print(f"this process listed by NVML: {this_process() is not None}")
claim(this_process() is None, "this process has no CUDA context yet")

# %% id="01-04"
import torch

after_import = nvml_used()
print("torch", torch.__version__)
print(f"import torch: NVML used {fmt(after_import - used_at_start, signed=True)}; "
      f"CUDA initialized: {torch.cuda.is_initialized()}")
claim(not torch.cuda.is_initialized() and this_process() is None,
      "importing torch initializes nothing on the GPU")

# %% id="01-05"
name = torch.cuda.get_device_name(0)
after_init = nvml_used()
print(name)
print(f"get_device_name: NVML used {fmt(after_init - after_import, signed=True)}; "
      f"CUDA initialized: {torch.cuda.is_initialized()}; "
      f"this process listed by NVML: {this_process() is not None}")
claim(torch.cuda.is_initialized() and this_process() is None,
      "get_device_name initializes PyTorch's CUDA state, but creates no context yet")

# %% [markdown] id="01-06"
# Importing torch puts nothing on the GPU, and neither does loading gpumem_nb.
# `get_device_name` does initialize PyTorch's CUDA state (`is_initialized()` is now `True`),
# but NVML still lists no context for this process: the driver creates it lazily, when the
# first real GPU work needs it.
#
# `%gpumem` shows each GPU: NVML's used/total, this process's share, PyTorch's `allocated`
# (live tensors) and `reserved` (live tensors plus the cache), and memory outside PyTorch.

# %% id="01-07"
# %gpumem

# %% [markdown] id="01-08"
# ## The CUDA context
#
# The first allocation creates the context: most of it is the driver's per-process state. It
# is this process's memory, but PyTorch's allocator does not manage it, so it appears as
# **outside PyTorch** and never as `reserved`. The first allocation below is `torch.zeros`,
# which also launches a kernel (the fill with zeros), and a process's first kernel launch adds
# a one-off amount outside PyTorch: the cell after the next one shows it in two fresh
# processes, one whose first allocation is `torch.empty` (which launches nothing) and then
# launches a kernel, and one whose first allocation is `torch.zeros`. That amount is not the
# fill kernel's code: the six kernels launched for the first time further down add nothing
# NVML shows. What it holds, this run does not show.
#
# Most GPU code is not loaded with it. CUDA loads a kernel's code the first time that kernel is
# launched (*lazy loading*), so a kernel launched for the first time, PyTorch's own as much as
# a library's, can grow the context: six small kernels below grow it by nothing NVML shows, the
# first matrix product (part 2 of this lesson) by tens of MiB. Who asks for lazy loading
# depends on the versions. PyTorch used to set `CUDA_MODULE_LOADING=LAZY` when you had not set
# it (from 1.13, pytorch#86509); since pytorch#152695 it does so only for drivers older than
# CUDA 12.2, whose default is eager. CUDA 12.2 and later load lazily on Linux without being
# asked (CUDA's programming guide, "Lazy Loading"). The run below prints what its PyTorch left
# in the variable: with a driver of CUDA 12.2 or later, unset, and the driver's default, lazy,
# applies. The two cells after the next one measure what lazy loading saves.

# %% id="01-09"
t = torch.zeros(1, device="cuda")
after_alloc = nvml_used()
print(f"first allocation: NVML used {fmt(after_alloc - after_init, signed=True)}")
print(f"a {t.element_size()}-byte tensor: allocated {fmt(torch.cuda.memory_allocated())}, "
      f"reserved {fmt(torch.cuda.memory_reserved())}")
claim(after_alloc - after_init > 256 * MiB and this_process() is not None,
      "the first allocation creates the context, hundreds of MiB outside PyTorch",
      nvml_change=fmt(after_alloc - after_init))

# %% id="01-47"
from fresh_process import run_fresh_many

FIRST_LAUNCH = r'''
import json, os, pynvml, torch
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)


def outside():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu):
        if p.pid == os.getpid() and p.usedGpuMemory is not None:
            return p.usedGpuMemory - torch.cuda.memory_reserved()
    return None


first = getattr(torch, os.environ["TUTORIAL_FIRST"])(1, device="cuda")
torch.cuda.synchronize()
at_first = outside()
first.add_(1)  # a kernel launch: the process's first where it allocated with torch.empty
torch.cuda.synchronize()
print(json.dumps({"at_first": at_first, "after_a_launch": outside()}))
'''
empty_first, zeros_first = run_fresh_many(
    FIRST_LAUNCH, ["", ""], extra_envs=[{"TUTORIAL_FIRST": "empty"},
                                        {"TUTORIAL_FIRST": "zeros"}])
one_off = empty_first["after_a_launch"] - empty_first["at_first"]
print(f"first allocation by torch.empty (no launch): outside PyTorch "
      f"{fmt(empty_first['at_first'])}; after its first launch "
      f"{fmt(empty_first['after_a_launch'])}")
print(f"first allocation by torch.zeros (a launch): outside PyTorch "
      f"{fmt(zeros_first['at_first'])}")
print(f"the first launch added {fmt(one_off, signed=True)}")
claim(one_off > 0 and abs(empty_first["after_a_launch"] - zeros_first["at_first"]) <= 2 * MiB,
      "a process's first kernel launch adds a one-off amount outside PyTorch, whichever "
      "kernel it is", one_off=fmt(one_off))

# %% id="01-10"
# %gpumem

# %% [markdown] id="01-38"
# ### What lazy loading saves
#
# Two fresh processes make the same first allocation, then launch a handful of kernels they
# have not launched before (`sin`, `exp`, `sort`, `cumsum`, `softmax`, `topk`): one with
# PyTorch's default (lazy), one with `CUDA_MODULE_LOADING=EAGER`, which loads the code of every
# kernel in the CUDA libraries loaded so far (PyTorch's own, cuBLAS's and the others it links)
# when the context is created. "Outside PyTorch" is the process's NVML
# line less what PyTorch reserved.

# %% id="01-39"
from fresh_process import run_fresh_many

CONTEXT_COST = r'''
import ctypes, json, os, sys
mode = os.environ.pop("TUTORIAL_MODULE_LOADING")
os.environ.pop("CUDA_MODULE_LOADING", None)
if mode == "EAGER":
    os.environ["CUDA_MODULE_LOADING"] = "EAGER"
import pynvml, torch
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)


def outside():
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu):
        if p.pid == os.getpid() and p.usedGpuMemory is not None:
            return p.usedGpuMemory - torch.cuda.memory_reserved()
    return None


t = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
first = outside()
x = torch.randn(1024, 1024, device="cuda")
for kernel in (torch.sin, torch.exp, torch.sort, lambda v: v.cumsum(0),
               lambda v: v.softmax(-1), lambda v: v.topk(5)):
    kernel(x)
torch.cuda.synchronize()
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
setting = libc.getenv(b"CUDA_MODULE_LOADING")  # what the process runs with, as CUDA reads it
version = ctypes.c_int()
ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
print(json.dumps({"mode": mode, "setting": setting.decode() if setting else None,
                  "first": first, "after_kernels": outside(), "driver": version.value}))
'''
lazy, eager = run_fresh_many(CONTEXT_COST, ["", ""],
                             extra_envs=[{"TUTORIAL_MODULE_LOADING": "default"},
                                         {"TUTORIAL_MODULE_LOADING": "EAGER"}])
print(f"{'':<34}{'at the first allocation':>26}{'after six new kernels':>24}")
for label, r in (("default (variable " + (lazy["setting"] or "unset") + ")", lazy),
                 ("CUDA_MODULE_LOADING=EAGER", eager)):
    print(f"{label:<34}{fmt(r['first']):>26}{fmt(r['after_kernels']):>24}")
grew = lazy["after_kernels"] - lazy["first"]
saved = eager["first"] - lazy["first"]
print(f"lazy: the six first launches grew the context by {fmt(grew, signed=True)}; "
      f"loading everything up front costs {fmt(saved, signed=True)} more at the first "
      "allocation")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) left CUDA_MODULE_LOADING "
      f"{'= ' + lazy['setting'] if lazy['setting'] else 'unset'}")
driver = lazy["driver"]
print(f"driver CUDA {driver // 1000}.{driver % 1000 // 10}")
claim(lazy["setting"] is None if driver >= 12020 else lazy["setting"] == "LAZY",
      "torch sets CUDA_MODULE_LOADING=LAZY only for drivers older than CUDA 12.2; with this "
      "one it left the variable unset" if driver >= 12020 else
      "torch sets CUDA_MODULE_LOADING=LAZY for drivers older than CUDA 12.2, as this one is",
      setting=lazy["setting"], driver=driver)
claim(saved > 0, "eager loading makes the first allocation's context larger: the kernels' "
      "code, which lazy loading leaves out of it", lazy=fmt(lazy["first"]),
      eager=fmt(eager["first"]))

# %% [markdown] id="01-11"
# ## Why a 4-byte tensor shows 512 B allocated and 2 MiB reserved
#
# The caching allocator rounds every request up to a multiple of 512 B and hands out *blocks*
# (what `allocated` counts), cut from *segments* that it gets from the driver with `cudaMalloc`
# (what `reserved` counts). PyTorch's source (`c10/cuda/CUDACachingAllocator.cpp`) sets the
# sizes:
#
# - requests up to 1 MiB come from a small pool of 2 MiB segments;
# - larger requests below 10 MiB share segments of 20 MiB;
# - from 10 MiB on, a request that fits no cached block gets a segment of its own, rounded up
#   to a multiple of 2 MiB.
#
# A block bigger than the request is split, and the rest stays cached for later requests, but
# only if the rest is worth keeping: in the large pool the remainder must be **more than
# 1 MiB** (`should_split`: `remaining > kSmallSize`). An 11 MiB request gets a 12 MiB
# segment; the 1 MiB left over is not more than 1 MiB, so the whole 12 MiB block is handed out,
# and `allocated` counts all of it. 100 MiB + 1 B gets a 102 MiB segment and leaves almost
# 2 MiB, so that block is split.
#
# The cell below measures one request of each kind, starting each time from an empty cache so
# that nothing is reused, and checks each row against these rules.

# %% id="01-12"
del t


def footprint(nbytes):
    # What one tensor of `nbytes` costs: its block (allocated) and the new segment (reserved).
    torch.cuda.empty_cache()  # nothing cached to reuse
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    block = torch.cuda.memory_allocated() - a0
    segment = torch.cuda.memory_reserved() - r0
    del x
    return block, segment


print(f"{'request':>28}   {'block (allocated)':>26}   {'new segment (reserved)':>22}")
for label, n in [("4 B", 4), ("1 MiB", MiB), ("1 MiB + 1 B", MiB + 1),
                 ("9 MiB", 9 * MiB), ("10 MiB", 10 * MiB), ("11 MiB", 11 * MiB),
                 ("100 MiB + 1 B", 100 * MiB + 1)]:
    block, segment = footprint(n)
    print(f"{label:>14} = {n:>11,} B   {block:>11,} B = {fmt(block):>10}   "
          f"{fmt(segment):>22}")
    rounded = -(-n // 512) * 512
    if rounded <= MiB:  # small pool
        expected_segment = 2 * MiB
    elif rounded < 10 * MiB:
        expected_segment = 20 * MiB
    else:
        expected_segment = -(-rounded // (2 * MiB)) * 2 * MiB
    # the large pool splits only a remainder of more than 1 MiB (the small pool: >= 512 B)
    split = (expected_segment - rounded >= 512 if rounded <= MiB
             else expected_segment - rounded > MiB)
    expected_block = rounded if split or expected_segment == rounded else expected_segment
    claim(block == expected_block and segment == expected_segment,
          f"{label}: a {fmt(expected_block)} block from a {fmt(expected_segment)} segment",
          block=fmt(block), segment=fmt(segment))

# %% [markdown] id="01-13"
# So `allocated` is already a little more than your tensors' sizes, and `reserved` more again,
# before any caching happens. (Notebook 5 shows settings that change this rounding.)
#
# ## NVML "used" versus "this process", and the two totals
#
# NVML charges each process its own memory. The device's *used* figure comes from NVML's v2
# memory call, the one `nvidia-smi` uses: it leaves out the memory the driver reserves for
# itself, which is why it was 0 B before this process touched the GPU (the first output above).
# That reserved memory is also why a learner meets two "totals": NVML's total counts it, and
# CUDA's (`torch.cuda.mem_get_info()`, `cudaMemGetInfo`, the figure in PyTorch's OOM message)
# does not. The cell below reads both.

# %% id="01-14"
used, mine = nvml_used(), this_process()
print(f"NVML used on the device:      {fmt(used)}")
if mine is None:
    print("this process is not in NVML's list (in a container NVML may report host PIDs)")
    skipped("nearly all of the device's used memory is this process's own",
            "NVML does not list this process")
else:
    print(f"NVML's line for this process: {fmt(mine)}")
    print(f"used − this process:          {fmt(used - mine)} "
          f"(before this process started CUDA: {fmt(used_at_start)})")
    claim(0 <= used - mine <= 64 * MiB,
          "nearly all of the device's used memory is this process's own",
          used_minus_this_process=fmt(used - mine))

v2 = pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2)
cuda_free, cuda_total = torch.cuda.mem_get_info()
print(f"NVML total:                    {fmt(v2.total)}")
print(f"  of which the driver reserves: {fmt(v2.reserved)}")
print(f"CUDA total (cudaMemGetInfo):   {fmt(cuda_total)}")
print(f"NVML total − CUDA total:       {fmt(v2.total - cuda_total)}")
claim(near(v2.total - cuda_total, v2.reserved, within=16 * MiB),
      "CUDA's total is NVML's total less what the driver reserves",
      difference=fmt(v2.total - cuda_total), driver_reserved=fmt(v2.reserved))

# %% [markdown] id="01-15"
# ### Per-process memory without parsing `nvidia-smi`
#
# A popular snippet finds a process's memory by searching `nvidia-smi`'s table for lines with
# the PID and "python", then matching `(\d+)MiB / (\d+)MiB`. That pattern is the *device*
# column (`used / total`); a process line has a single figure, so the search finds nothing, and
# inside containers the PID shown is often the host's. NVML's process list is the reliable way
# (it is what `this_process()` above reads). The cell runs the snippet as published:

# %% id="01-16"
import re
import shutil
import subprocess


def get_gpu_memory_by_pid(pid):  # the snippet, as published
    result = subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in result.stdout.split("\n"):
        if str(pid) in line and "python" in line:
            match = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", line)
            if match:
                return int(match.group(1)), int(match.group(2))
    return None, None


if shutil.which("nvidia-smi"):
    print("the snippet for this process:", get_gpu_memory_by_pid(os.getpid()))
else:
    print("nvidia-smi is not installed here; the snippet cannot run at all")
mine = this_process()
print("NVML for this process:", fmt(mine) if mine is not None else "not listed")

# %% [markdown] id="01-17"
# ## A tensor, then `del`
#
# A 20000×20000 float32 tensor is 20000·20000·4 bytes. The article this project started from
# put it at about 3 GB, and 10000×10000 at 0.76 GB; the first lines print the real sizes (a
# `meta` tensor has a size but no storage, so measuring the second costs nothing; the first is
# measured on the GPU, where `allocated` is a little more: the tensor's size rounded as the
# table above says, printed after the two sizes).

# %% id="01-18"
x = torch.randn(20000, 20000, device="cuda")
print(f"a float32 takes {x.element_size()} bytes")
for shape in [(20000, 20000), (10000, 10000)]:
    nbytes = torch.empty(shape, device="meta").nbytes
    article = {20000: "about 3 GB", 10000: "0.76 GB"}[shape[0]]
    print(f"{shape[0]}×{shape[1]} float32: {nbytes / 2**30:.2f} GiB = {nbytes / 1e9:.2f} GB "
          f"(the article: {article})")
segment = -(-x.nbytes // (2 * MiB)) * 2 * MiB  # the rules of the table above
print(f"allocated: {torch.cuda.memory_allocated():,} B for a tensor of {x.nbytes:,} B, "
      f"{fmt(torch.cuda.memory_allocated() - x.nbytes)} of rounding")
claim(x.nbytes == 20000 * 20000 * 4 and torch.cuda.memory_allocated() == segment
      and segment - x.nbytes < MiB,
      "the tensor is 20000·20000·4 bytes, about half of the article's 3 GB; `allocated` is "
      "its whole 2 MiB-rounded segment, the remainder under 1 MiB being too small to split off",
      allocated=torch.cuda.memory_allocated(), nbytes=x.nbytes, segment=segment)
# %gpumem

# %% [markdown] id="01-19"
# After `del`, `allocated` falls back at once, with no `torch.cuda.synchronize()` (another
# article adds one "to make the deletion take effect"; the allocator's bookkeeping is on the
# host and needs none). `reserved` does not fall: the allocator keeps the block for the next
# tensor, and the driver still counts it as used. That is the "false leak".

# %% id="01-20"
del x
print(f"allocated right after del, no synchronize(): {fmt(torch.cuda.memory_allocated())}")
claim(torch.cuda.memory_allocated() == 0 and torch.cuda.memory_reserved() > 0,
      "allocated falls at once without synchronize(); reserved does not fall")
# %gpumem

# %% [markdown] id="01-21"
# ## Reuse
#
# A new tensor of the same size takes the cached block: `allocated` rises, `reserved` and NVML
# do not move. The cache is working for you.

# %% id="01-22"
reserved_before, nvml_before = torch.cuda.memory_reserved(), nvml_used()
y = torch.randn(20000, 20000, device="cuda")
reserved_after, nvml_after = torch.cuda.memory_reserved(), nvml_used()
claim(reserved_after == reserved_before and near(nvml_after, nvml_before, within=4 * MiB),
      "the new tensor reuses the cached block: reserved and NVML do not move",
      reserved=f"{fmt(reserved_before)} -> {fmt(reserved_after)}",
      nvml=f"{fmt(nvml_before)} -> {fmt(nvml_after)}")
# %gpumem

# %% [markdown] id="01-40"
# What to take away:
#
# - Importing torch, and even `get_device_name`, puts nothing on the GPU; the first allocation
#   creates the CUDA context, which NVML charges to this process and PyTorch's allocator never
#   counts.
# - Under lazy loading a kernel's code joins the context at its first launch; eager loading
#   makes the context larger from the start.
# - `allocated` counts blocks (requests rounded up, sometimes to a whole segment) and
#   `reserved` counts segments: both exceed your tensors' sizes before anything is cached.
# - NVML's total counts the driver's reserve and CUDA's (the one in PyTorch's OOM message) does
#   not; read a process's memory from NVML's process list, not from `nvidia-smi`'s table.
# - After `del`, `allocated` falls at once and `reserved` and NVML do not: the block stays
#   cached, and the next tensor of that size reuses it.
