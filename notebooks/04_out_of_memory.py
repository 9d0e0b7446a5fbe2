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

# %% [markdown] id="04-00"
# # 4. Out of memory: the message, the retry, and catching it
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** `CUDA out of memory` is the error everyone meets. What does its message
# say, what has the allocator already tried when you see it, and how do I catch it without
# leaking?
#
# This notebook takes the message apart, makes the allocator retry, and catches the error twice: the
# usual way, which keeps the failed attempt's memory, and a way that does not. Its second part,
# [`04_out_of_memory_causes.ipynb`](04_out_of_memory_causes.ipynb), runs out of memory on
# purpose once for each common cause, with gpumem_nb's explanation under each error.
#
# The cell that runs out of memory on purpose is marked as an expected error; its traceback is
# part of the lesson.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="04-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import sys

import torch
from claims import claim

from gpumem_nb.units import format_bytes as fmt

GiB = 2**30
# TF32 matrix products: the sections below fill the GPU with activations many times over, and
# memory is what they measure, not arithmetic (TF32 changes no tensor's size).
torch.backends.cuda.matmul.allow_tf32 = True
torch.zeros(1, device="cuda")
# cuBLAS keeps a workspace for each thread that multiplies matrices (this one, and autograd's
# for the backward pass), taken from PyTorch's cache at its first product and kept. Made here,
# on an empty cache, each gets a small segment of its own; made later, it is carved out of a
# large cached segment and pins it for the rest of the notebook (a first run on the H200 had
# 8 GiB held that way, which then served the 2 GiB request of the fragmentation section).
w = torch.ones(64, 64, device="cuda", requires_grad=True)
(w @ w).sum().backward()
del w
free, total = torch.cuda.mem_get_info()
print(f"{torch.cuda.get_device_name(0)}: {fmt(total)} in total, {fmt(free)} free")


def explanation():
    # gpumem_nb's explanation of the last OOM, as an object (what `%gpumem oom` prints).
    return get_ipython().run_line_magic("gpumem", "oom -o")


def verdict():
    # The cause the explanation names first.
    found = explanation()
    return found.causes[0].kind if found is not None and found.causes else None

# %% [markdown] id="04-02"
# ## The anatomy of the message
#
# Ask for twice the GPU:

# %% id="04-03" tags=["raises-exception"]
x = torch.empty(2 * total, dtype=torch.uint8, device="cuda")

# %% [markdown] id="04-04"
# Below the traceback, gpumem_nb explains the error in the cell that hit it (part 2 reads
# one explanation per cause). First, PyTorch's own message, taken apart:

# %% id="04-05"
import re

message = str(sys.last_value)
PARTS = [
    ("asked for", r"Tried to allocate ([\d.]+ \w+)"),
    ("the GPU's total", r"total capacity of ([\d.]+ \w+)"),
    ("free on the GPU", r"of which ([\d.]+ \w+) is free"),
    ("this process, all of it", r"this process has ([\d.]+ \w+) memory in use"),
    ("allocated by PyTorch", r"([\d.]+ \w+) is allocated by PyTorch"),
    ("reserved, unallocated", r"([\d.]+ \w+) is reserved by PyTorch but unallocated"),
    ("cap on this process", r"([\d.]+ \w+) allowed"),
]
for label, pattern in PARTS:
    m = re.search(pattern, message)
    print(f"{label:>24}: {m.group(1) if m else '(not in this message)'}")
stated = re.search(r"total capacity of ([\d.]+) GiB", message)
claim(stated and stated.group(1) == f"{total / GiB:.2f}",
      "the message's total capacity is CUDA's total (cudaMemGetInfo), not NVML's",
      in_message=stated and stated.group(1), cuda_total=fmt(total))
claim(verdict() == "impossible", "gpumem_nb calls a request for twice the GPU impossible",
      verdict=verdict())

# %% [markdown] id="04-06"
# - **Tried to allocate**: the one request that failed, not the total your code needs.
# - **total capacity / free**: the device, from the driver (CUDA's total, which leaves out the
#   memory the driver reserves for itself: notebook 1 reconciles it with NVML's). *Free*
#   excludes everything every process holds.
# - **this process has … in use**: everything of this process on the GPU, including the CUDA
#   context and other libraries; "Process N has … in use" lines name other processes when the
#   driver lists them.
# - **allocated by PyTorch**: every block the caching allocator has handed out: tensors, and
#   library workspaces such as cuBLAS's (above, all of it is workspace). In this message it also
#   counts the free blocks of CUDA-graph private pools (notebook 10).
# - **reserved by PyTorch but unallocated**: what the cache still held *after* the allocator
#   had already returned every whole free segment it could (see the retry below). What is left
#   sits inside partly used segments: when it is large, that is fragmentation. The message's
#   next sentence suggests `expandable_segments` for that case, but it prints the sentence
#   every time: above, with nothing reserved but unallocated, and even when the setting is
#   already on (notebook 8).
# - **allowed**: appears only under a cap, set with `torch.cuda.set_per_process_memory_fraction`
#   or, in torch 2.11, with the `per_process_memory_fraction` key of `PYTORCH_ALLOC_CONF`.
#
# `%gpumem oom` shows gpumem_nb's last explanation again (`-o` returns it as an object):

# %% id="04-07"
# %gpumem oom

# %% [markdown] id="04-08"
# ## What the allocator tries before it raises
#
# When no cached block fits, the native allocator (this notebook's, until its last section)
# asks the driver (`cudaMalloc`). If that fails, it does not give up: it returns every cached
# block that is a whole free segment to the driver (the same as `empty_cache()`), and asks
# again. It counts that as an *allocation retry*; only
# if the second attempt fails too does it raise, and count an OOM.
#
# The next cell fills the GPU with 1 GiB tensors, deletes them (they stay cached), then asks for
# more than the driver has free but less than free plus cached:

# %% id="04-09"
import time

start_reserved = torch.cuda.memory_reserved()  # the segments that hold live tensors
free, _ = torch.cuda.mem_get_info()
blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(free // GiB - 4)]
print(f"filled the GPU with {len(blocks)} tensors of {fmt(GiB)}")
del blocks  # all cached: free for PyTorch, not for cudaMalloc
free_now = torch.cuda.mem_get_info()[0]
before = torch.cuda.memory_stats()
ask = free_now + 2 * GiB  # more than the driver has, and larger than any cached block
t0 = time.perf_counter()
big = torch.empty(ask, dtype=torch.uint8, device="cuda")
took_ms = (time.perf_counter() - t0) * 1e3
after = torch.cuda.memory_stats()
cached = before["reserved_bytes.all.current"] - before["allocated_bytes.all.current"]
print(f"before: {fmt(cached)} cached, {fmt(free_now)} free on the GPU")
print(f"asked for {fmt(ask)}: granted after {took_ms:.0f} ms")
print(f"num_alloc_retries {before['num_alloc_retries']} -> {after['num_alloc_retries']}, "
      f"num_ooms {before['num_ooms']} -> {after['num_ooms']}")
print(f"reserved {fmt(before['reserved_bytes.all.current'])} -> "
      f"{fmt(after['reserved_bytes.all.current'])} ({fmt(start_reserved)} before the filling)")
claim(after["num_alloc_retries"] > before["num_alloc_retries"]
      and after["num_ooms"] == before["num_ooms"],
      "the request succeeded after a retry, and no OOM was counted")
claim(after["reserved_bytes.all.current"] <= ask + start_reserved + 2 * 2**20,
      "reserved fell to little more than the new tensor: it, rounded up to 2 MiB, and what was "
      "reserved before the filling",
      reserved=fmt(after["reserved_bytes.all.current"]), asked=fmt(ask),
      before_filling=fmt(start_reserved))
del big

# %% [markdown] id="04-10"
# The request succeeded, and the retry counter moved: the allocator flushed its cache and
# retried, and `reserved` fell to little more than the new tensor. A retry that succeeds says
# only that the cache was flushed once and the request then fit; it predicts no OOM, and a
# workload whose cache fragments can retry on every step without ever failing (this cell
# counted a retry and no OOM). A rising `num_alloc_retries` in a training run is an early
# warning of a cost: each retry synchronizes the GPU, frees the cache, and the allocator then
# pays `cudaMalloc` again for what it had cached.
#
# ## Catching `OutOfMemoryError`: the leak
#
# A caught exception keeps its traceback, and the traceback keeps every frame it passed through,
# with their local tensors. Inside the `except` block the failed call's tensors are therefore
# still alive, and if you store the exception, they stay alive after it, until you delete it:

# %% id="04-11"
def train_step(batch_gib):
    activations = torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
    logits = torch.empty(batch_gib * GiB, dtype=torch.uint8, device="cuda")
    return activations, logits


base = torch.cuda.memory_allocated()
try:
    train_step(batch_gib=2 * total // GiB)
except torch.cuda.OutOfMemoryError as e:
    inside = torch.cuda.memory_allocated() - base
    error = e  # the mistake: keeps the traceback, its frames, and their tensors
kept = torch.cuda.memory_allocated() - base
del error
gone = torch.cuda.memory_allocated() - base
print(f"inside the except block:           {fmt(inside)} still allocated")
print(f"after it, with the exception kept: {fmt(kept)}")
print(f"after del error:                   {fmt(gone)}")
claim(inside >= 8 * GiB and kept >= 8 * GiB,
      "inside the except block, and with the exception kept, the attempt's 8 GiB stay allocated",
      inside=fmt(inside), kept=fmt(kept))
claim(gone == 0, "deleting the stored exception frees the attempt's tensors", after_del=fmt(gone))

# %% [markdown] id="04-12"
# ## The caught OOM done right
#
# Keep `str(e)` if you need the message, never `e`; and do the fallback *after* the `except`
# block, not inside it, so that the failed attempt's tensors are gone before you try again. The
# next cell tries smaller and smaller batches and prints what is still allocated at the start of
# each attempt:

# %% id="04-13"
def first_batch_that_fits(sizes_gib):
    for size in sizes_gib:
        print(f"trying {size} GiB; allocated before it: "
              f"{fmt(torch.cuda.memory_allocated() - base)}")
        left_over.append(torch.cuda.memory_allocated() - base)
        try:
            result = train_step(size)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{size} GiB: out of memory ({str(e).split('.')[0]})")
            continue  # leaving the except block releases the failed attempt
        return size, result
    raise RuntimeError("nothing fits")


left_over = []
size, result = first_batch_that_fits([2 * total // GiB, total // GiB, 1])
print(f"{size} GiB fits; allocated now {fmt(torch.cuda.memory_allocated() - base)}")
claim(max(left_over) == 0, "no failed attempt left anything allocated for the next one",
      left_over=[fmt(n) for n in left_over])
del result
claim(torch.cuda.memory_allocated() == base, "after del result nothing of the attempts is left",
      allocated=fmt(torch.cuda.memory_allocated() - base))

# %% [markdown] id="04-50"
# What to take away:
#
# - The message's "Tried to allocate" is the one request that failed, not what your code
#   needs; its total capacity is CUDA's, which leaves out the driver's reserve.
# - Before it raises, the native allocator returns every whole free cached segment and asks
#   again: a counted retry is no OOM, but a rising `num_alloc_retries` warns of a cache that
#   keeps being flushed.
# - A caught `OutOfMemoryError` keeps the failed attempt's tensors alive through its traceback:
#   keep `str(e)`, never `e`, and try again after the `except` block, not inside it.
# - `%gpumem oom` shows gpumem_nb's explanation of the last OOM again; `-o` returns it as an
#   object.
