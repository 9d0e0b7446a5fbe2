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
# # 4. Out of memory, explained
#
# `CUDA out of memory` is the error everyone meets. This notebook takes the message apart, shows
# what the allocator tries before it gives up, how to catch the error without leaking, and then
# runs out of memory on purpose, once for each common cause, with gpumem_nb's explanation under
# each error. It ends with the "second request fails" story from a popular article, measured.
#
# Cells that run out of memory on purpose are marked as expected errors; their traceback is
# part of the lesson.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="04-01"
# %load_ext gpumem_nb
import sys

import torch

from gpumem_nb.units import format_bytes as fmt

GiB = 2**30
torch.zeros(1, device="cuda")
free, total = torch.cuda.mem_get_info()
print(f"{torch.cuda.get_device_name(0)}: {fmt(total)} in total, {fmt(free)} free")

# %% [markdown] id="04-02"
# ## The anatomy of the message
#
# Ask for twice the GPU:

# %% id="04-03" tags=["raises-exception"]
x = torch.empty(2 * total, dtype=torch.uint8, device="cuda")

# %% [markdown] id="04-04"
# Below the traceback, gpumem_nb explains the error in the cell that hit it (more on that
# below). First, PyTorch's own message, taken apart:

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

# %% [markdown] id="04-06"
# - **Tried to allocate**: the one request that failed, not the total your code needs.
# - **total capacity / free**: the device, from the driver. *Free* excludes everything every
#   process holds.
# - **this process has … in use**: everything of this process on the GPU, including the CUDA
#   context and other libraries; "Process N has … in use" lines name other processes when the
#   driver lists them.
# - **allocated by PyTorch**: live tensors.
# - **reserved by PyTorch but unallocated**: what the cache still held *after* the allocator
#   had already returned every whole free segment it could (see the retry below). What is left
#   sits inside partly used segments: that is fragmentation, and it is why the message then
#   suggests `expandable_segments` (even when it is already on).
# - **allowed**: appears only under a cap set with `torch.cuda.set_per_process_memory_fraction`.
#
# `%gpumem oom` shows gpumem_nb's last explanation again (`-o` returns it as an object):

# %% id="04-07"
# %gpumem oom

# %% [markdown] id="04-08"
# ## What the allocator tries before it raises
#
# When no cached block fits, the allocator asks the driver (`cudaMalloc`). If that fails, it
# does not give up: it returns every cached block that is a whole free segment to the driver
# (the same as `empty_cache()`), and asks again. It counts that as an *allocation retry*; only
# if the second attempt fails too does it raise, and count an OOM.
#
# The next cell fills the GPU with 1 GiB tensors, deletes them (they stay cached), then asks for
# more than the driver has free but less than free plus cached:

# %% id="04-09"
import time

free, _ = torch.cuda.mem_get_info()
blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(free // GiB - 4)]
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
      f"{fmt(after['reserved_bytes.all.current'])}")
del big


# %% [markdown] id="04-10"
# The request succeeded, and the retry counter moved: the allocator flushed its cache and
# retried, and `reserved` fell to little more than the new tensor. A rising `num_alloc_retries`
# in a training run is an early warning: each retry synchronizes the GPU and frees the cache, and
# the next failure will be a real OOM.
#
# ## Catching `OutOfMemoryError` without leaking
#
# A caught exception keeps its traceback, and the traceback keeps every frame it passed through,
# with their local tensors. Inside the `except` block the failed call's tensors are therefore
# still alive, and if you store the exception, they stay alive after it:

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


# %% [markdown] id="04-12"
# So: keep `str(e)` if you need the message, never `e`; and do the fallback *after* the `except`
# block, not inside it, so that the failed attempt's tensors are gone before you try again:

# %% id="04-13"
def first_batch_that_fits(sizes_gib):
    for size in sizes_gib:
        try:
            result = train_step(size)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{size} GiB: out of memory ({str(e).split('.')[0]})")
            continue  # leaving the except block releases the failed attempt
        return size, result
    raise RuntimeError("nothing fits")


size, result = first_batch_that_fits([2 * total // GiB, total // GiB, 1])
print(f"{size} GiB fits; allocated now {fmt(torch.cuda.memory_allocated() - base)}")
del result

# %% [markdown] id="04-14"
# ## Each cause, explained
#
# An OOM has a handful of usual causes, and the fix differs for each. gpumem_nb explains every
# CUDA OOM in the cell that hit it: what was asked, what the GPU had, the most specific cause it
# can measure, and what to do next with the bytes each action would free. The cells below run
# out of memory on purpose, once per cause; read the explanation under each traceback.
#
# ### Fragmentation
#
# One 40 GiB cached segment is carved into 1 GiB pieces; every other piece is freed, leaving 20
# holes that cannot merge (their neighbours are alive) and cannot be returned (their segment is
# in use). The rest of the GPU is then filled. A 2 GiB request fits in no hole:

# %% id="04-15"
# %gpumem cleanup
big = torch.empty(40 * GiB, dtype=torch.uint8, device="cuda")
del big  # one 40 GiB segment, now cached
pieces = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(40)]
keep = pieces[::2]
del pieces
filler = torch.empty(torch.cuda.mem_get_info()[0] - GiB // 2, dtype=torch.uint8, device="cuda")
s = torch.cuda.memory_stats()
print(f"a {fmt(40 * GiB)} segment in {fmt(GiB)} pieces, {len(keep)} of them kept")
print(f"free on the GPU: {fmt(torch.cuda.mem_get_info()[0])}; reserved but unallocated: "
      f"{fmt(s['reserved_bytes.all.current'] - s['allocated_bytes.all.current'])}")

# %% id="04-16" tags=["raises-exception"]
y = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")

# %% id="04-17"
del keep, filler
# %gpumem cleanup

# %% [markdown] id="04-18"
# ### Another process
#
# A second process (here a child of this kernel; often your other notebook) holds 60 GiB. Ask
# for more than is left:

# %% id="04-19"
import subprocess

HOLD = ("import sys, torch; x = torch.empty(60 * 2**30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()")
child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"child PID {child.pid}; free on the GPU {fmt(torch.cuda.mem_get_info()[0])}; "
      f"asking for {fmt(ask)}")

# %% id="04-20" tags=["raises-exception"]
y = torch.empty(ask, dtype=torch.uint8, device="cuda")

# %% id="04-21"
child.stdin.close()
child.wait()
# %gpumem cleanup

# %% [markdown] id="04-22"
# ### This process, outside PyTorch
#
# Another allocator in the same process (CuPy, a custom CUDA extension, a library's own
# buffers) is invisible to PyTorch's counters: NVML charges it to this process, PyTorch does not
# count it. Here the CUDA runtime that torch loaded allocates 60 GiB directly, through `ctypes`:

# %% id="04-23"
import ctypes

# The CUDA runtime torch loaded (or, if it is linked in, the driver API on torch's context).
cudart = next((ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart" in ln), None)
ptr = ctypes.c_void_p()
if cudart:
    lib = ctypes.CDLL(cudart)
    err = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(60 * GiB))
    release = lib.cudaFree
else:
    lib = ctypes.CDLL("libcuda.so.1")
    err = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(60 * GiB))
    release = lib.cuMemFree_v2
assert err == 0, f"the second allocator failed with error {err}"
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"allocated {fmt(60 * GiB)} outside PyTorch; PyTorch's allocated: "
      f"{fmt(torch.cuda.memory_allocated())}; asking for {fmt(ask)}")

# %% id="04-24" tags=["raises-exception"]
y = torch.empty(ask, dtype=torch.uint8, device="cuda")

# %% id="04-25"
release(ptr)
# %gpumem cleanup

# %% [markdown] id="04-26"
# ### Memory your session holds
#
# The most common case in a notebook: a variable (or `Out[n]`, or a stored traceback) still
# holds a large tensor you no longer need.

# %% id="04-27"
held = torch.empty(60 * GiB, dtype=torch.uint8, device="cuda")
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"asking for {fmt(ask)}")

# %% id="04-28" tags=["raises-exception"]
y = torch.empty(ask, dtype=torch.uint8, device="cuda")

# %% id="04-29"
del held
# %gpumem cleanup

# %% [markdown] id="04-30"
# ## The second request fails: a story, measured
#
# A popular article tells it this way: a service loads a model, serves the first request, and
# runs out of memory on the second; the cause, it says, is that the cache was not emptied after
# the first request, so call `empty_cache()` after each batch.
#
# Rebuild it: a model with 1 GiB of weights, and a service function with a classic bug. It
# keeps each request's output, and the output keeps its autograd graph (no `no_grad`). To make
# the GPU as small as the article's, this process is capped just above what one request needs.

# %% id="04-31"
model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).cuda()


def new_request():
    return torch.randn(16384, 8192, device="cuda")  # one request's batch


def serve(request, results):
    results.append(model(request))  # the bug: keeps the output, and the graph behind it


results = []
torch.cuda.reset_peak_memory_stats()
base = torch.cuda.memory_allocated()
serve(new_request(), results)
need = torch.cuda.max_memory_allocated() - base
kept = torch.cuda.memory_allocated() - base
results.clear()
torch.cuda.empty_cache()
cap = base + need + kept // 2
torch.cuda.set_per_process_memory_fraction(cap / total)
print(f"weights and the rest before a request: {fmt(base)}")
print(f"one request: {fmt(need)} at its peak, {fmt(kept)} still allocated after it")
print(f"cap for this process: {fmt(cap)}")

# %% id="04-32"
serve(new_request(), results)  # request 1
print(f"after request 1: allocated {fmt(torch.cuda.memory_allocated())}, "
      f"reserved {fmt(torch.cuda.memory_reserved())}")

# %% id="04-33" tags=["raises-exception"]
torch.cuda.empty_cache()  # the article's advice
serve(new_request(), results)  # request 2

# %% [markdown] id="04-34"
# `empty_cache()` did not help, and could not: the first request's memory was not *cached*, it
# was *allocated*, held by `results` (read the explanation above). A cached block is reused by
# the same process anyway; emptying the cache only gives memory to other processes, and costs a
# synchronization. The fix is to keep only what the caller needs, and not to build a graph at
# all when serving:

# %% id="04-35"
results.clear()
# %gpumem cleanup


def serve_fixed(request, answers):
    with torch.inference_mode():  # no autograd graph
        answers.append(model(request).argmax(dim=1).cpu())  # keep only the answer


answers, start = [], torch.cuda.memory_allocated()
for i in range(3):
    serve_fixed(new_request(), answers)
    print(f"after request {i + 1}: allocated "
          f"{fmt(torch.cuda.memory_allocated() - start, signed=True)} since before the first, "
          f"reserved {fmt(torch.cuda.memory_reserved())}")
torch.cuda.set_per_process_memory_fraction(1.0)

# %% [markdown] id="04-36"
# Three requests under the same cap, and `allocated` is back where it started after each.
#
# ## The `cudaMallocAsync` backend says it differently
#
# With `PYTORCH_ALLOC_CONF=backend:cudaMallocAsync` the allocation is served by CUDA's own pool,
# and the message has another format. Its statistics also differ: the counters printed here
# stay at zero after a real OOM under that backend, which is why gpumem_nb counts OOMs itself.
# Both backends, in fresh processes:

# %% id="04-37"
from fresh_process import run_fresh_many

OOM = r'''
import json, torch
x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
total = torch.cuda.get_device_properties(0).total_memory
try:
    torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    message = "(no error)"
except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
    message = f"{type(e).__name__}: {e}"
s = torch.cuda.memory_stats()
print(json.dumps({"backend": torch.cuda.get_allocator_backend(), "message": message,
                  "num_ooms": s.get("num_ooms"), "retries": s.get("num_alloc_retries")}))
'''
for r in run_fresh_many(OOM, ["", "backend:cudaMallocAsync"]):
    print(f"--- {r['backend']}: num_ooms {r['num_ooms']}, num_alloc_retries {r['retries']}")
    print(r["message"])

# %% id="04-38"
# %gpumem summary
