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

# %% [markdown] id="04-51"
# # 4, part 2. Out of memory, cause by cause
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** why did *this* cell run out of memory, and what frees enough for it?
#
# This notebook runs out of memory on purpose, once for each common cause, with gpumem_nb's
# explanation under each error: a batch too big for the GPU, a list of losses that keeps their
# graphs, fragmentation, a child process of this kernel, another library in this process
# (CuPy), and memory your session holds. It ends with the "second request fails" story from a
# popular article, measured, and with the message of the `cudaMallocAsync` backend. Part 1,
# [`04_out_of_memory.ipynb`](04_out_of_memory.ipynb), takes PyTorch's message apart and shows
# what the allocator tries before it raises.
#
# After each failing cell, a check reads the explanation (`%gpumem oom -o`) and confirms that
# it names the cause the cell set up.
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

# %% id="04-52"
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

# %% [markdown] id="04-14"
# ## Each cause, explained
#
# An OOM has a handful of usual causes, and the fix differs for each. gpumem_nb explains every
# CUDA OOM in the cell that hit it: what was asked, what the GPU had, the most specific cause it
# can measure, and what to do next with the bytes each action would free. The cells below run
# out of memory on purpose, once per cause; read the explanation under each traceback.
#
# ### A batch too big for the GPU
#
# The most common OOM of all: the step itself needs more than the GPU has. A plain MLP of eight
# 8192 × 8192 layers runs a training step at a small batch, then at a batch whose activations
# alone are many times the GPU. No cleanup and no allocator setting helps; the fix is in the
# workload (a smaller batch, activation checkpointing, autocast), and the explanation says so:
# the cell's own allocations, its *working set*, dwarf everything else it could name.

# %% id="04-40"
from torch import nn

mlp = nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(8)]).cuda()


def mlp_step(batch):
    x = torch.randn(batch, 8192, device="cuda")
    mlp(x).square().mean().backward()


torch.cuda.reset_peak_memory_stats()
mlp_step(1024)
mlp.zero_grad(set_to_none=True)
print(f"batch 1,024: the step peaked at {fmt(torch.cuda.max_memory_allocated())}")
# Each layer saves its float32 input: 8 layers x 8192 x 4 bytes per sample.
big_batch = 4 * total // (8 * 8192 * 4) // 1024 * 1024
print(f"batch {big_batch:,}: its activations alone would take "
      f"{fmt(big_batch * 8 * 8192 * 4)}, four times the GPU")

# %% id="04-41" tags=["raises-exception"]
mlp_step(big_batch)

# %% id="04-42"
claim(verdict() == "working set",
      "the explanation blames the cell's own working set, not fragmentation or the session",
      verdict=verdict())
# %gpumem cleanup

# %% [markdown] id="04-43"
# ### A list of losses that keeps their graphs
#
# A training loop appends each step's `loss` to a list for plotting. Each loss tensor is a few
# bytes, but it keeps its autograd graph, and with it every activation the step saved. The loop
# runs until the GPU is full. `%gpumem who` and the explanation count the graphs' bytes, not only
# the tensors' own:

# %% id="04-44" tags=["raises-exception"]
losses = []
for _ in range(10_000):
    x = torch.randn(8192, 8192, device="cuda")
    losses.append(mlp(x).square().mean())  # the bug: the tensor, with its graph

# %% id="04-45"
found = explanation()
losses_holder = next((h for h in found.holders if h.name.startswith("losses")), None)
claim(verdict() == "held by your session" and losses_holder is not None,
      "the explanation names `losses` as what holds the memory", verdict=verdict())
held = torch.cuda.memory_allocated()
listed = losses_holder.held_bytes  # its tensors and the tensors their graphs saved
losses = [loss.item() for loss in losses]  # the fix: keep numbers, not graphs
freed = held - torch.cuda.memory_allocated()
print(f"listed for `losses`, graphs included: {fmt(listed)}; keeping floats freed {fmt(freed)}")
claim(listed >= 0.9 * freed, "the listed bytes account for what the fix freed",
      listed=fmt(listed), freed=fmt(freed))
del mlp, losses, x  # x: the loop's last batch, which would pin a segment of the cache
# %gpumem cleanup

# %% [markdown] id="04-46"
# The cleanup's `last exception` row frees more than the explanation's dry-run estimate of what
# the traceback held. The estimate was made at the failure, when the traceback was the only
# holder of the failed forward pass's input and its graph; `del mlp, losses, x` just before the
# cleanup made it the last holder of `mlp`'s weights too (the failed frames' `self`) and of the
# loop's last batch `x` (the argument of the failed `mlp(x)` call), so dropping it freed those
# as well: the estimate, `mlp` and `x`, each as the explanation above lists it, add up to the
# row's 4.00 GiB.
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
print(f"a {fmt(40 * GiB)} segment in {fmt(GiB)} pieces, {len(keep)} of them kept, "
      f"{fmt(20 * GiB)} of holes; next, a request for {fmt(2 * GiB)}")
free_pieces = [b["size"] for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
               if b["state"] == "inactive"]
print(f"free on the GPU: {fmt(torch.cuda.mem_get_info()[0])}; reserved but unallocated: "
      f"{fmt(s['reserved_bytes.all.current'] - s['allocated_bytes.all.current'])}, "
      f"the largest free piece {fmt(max(free_pieces))}")
claim(max(free_pieces) < 2 * GiB and torch.cuda.mem_get_info()[0] < 2 * GiB,
      "no free piece of the cache and no free memory on the GPU is as large as 2 GiB",
      largest_piece=fmt(max(free_pieces)), free=fmt(torch.cuda.mem_get_info()[0]),
      segments_with_room=[(fmt(seg["total_size"]), [fmt(b["size"]) for b in seg["blocks"]
                                                    if b["state"] != "inactive"])
                          for seg in torch.cuda.memory_snapshot()
                          if any(b["state"] == "inactive" and b["size"] >= 2 * GiB
                                 for b in seg["blocks"])])

# %% id="04-16" tags=["raises-exception"]
y = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")

# %% id="04-17"
found = explanation()
claim(verdict() == "fragmentation", "the explanation names fragmentation", verdict=verdict())
claim("grow in place" not in str(found),
      "it does not say expandable segments would make segments grow in place")
s = torch.cuda.memory_stats()
holes = s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]
torch.cuda.empty_cache()
s = torch.cuda.memory_stats()
print(f"free inside the cache: {fmt(holes)}; empty_cache() returned "
      f"{fmt(holes - (s['reserved_bytes.all.current'] - s['allocated_bytes.all.current']))}")
claim(s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"] >= 20 * GiB,
      "empty_cache() cannot return the holes: their segment still holds live tensors",
      still_cached=fmt(s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]))
del keep, filler
# %gpumem cleanup

# %% [markdown] id="04-48"
# The holes are real free memory, but only for requests that fit in one of them. No
# `empty_cache()` gives them back (the line above): each is a piece of one segment whose other
# pieces are alive, and a segment goes back to the driver whole or not at all (notebook 1).
# The cures are to free the live pieces (here `keep`), or a process started with
# `expandable_segments:True`, whose free pages can be unmapped and mapped again where a larger
# block needs them (notebook 3).
#
# ### A child process of this kernel
#
# A second process holds 60 GiB. Here it is a child of this kernel, as a DataLoader worker, a
# `torch.multiprocessing` worker or a vLLM engine would be; the explanation names it as this
# kernel's child, by its PID, and says how to release it from this kernel rather than killing
# it. Ask for more than is left:

# %% id="04-19"
import subprocess

HOLD = ("import sys, torch; x = torch.empty(60 * 2**30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()")
child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"child PID {child.pid} holds {fmt(60 * GiB)}; free on the GPU "
      f"{fmt(torch.cuda.mem_get_info()[0])}; asking for {fmt(ask)}")

# %% id="04-20" tags=["raises-exception"]
y = torch.empty(ask, dtype=torch.uint8, device="cuda")

# %% id="04-21"
text = str(explanation())
claim(verdict() == "other processes" and str(child.pid) in text and "child" in text,
      "the explanation names the other process as this kernel's child", verdict=verdict())
child.stdin.close()
child.wait()
# %gpumem cleanup

# %% [markdown] id="04-22"
# ### Another library in this process: CuPy
#
# Another allocator in the same process (CuPy, JAX, a custom CUDA extension, a library's own
# buffers) is invisible to PyTorch's counters: NVML charges it to this process, PyTorch does not
# count it. Here CuPy, with its own memory pool, allocates 60 GiB beside PyTorch:

# %% id="04-23"
import cupy  # CuPy keeps its own memory pool, beside PyTorch's

held_by_cupy = cupy.empty(60 * GiB, dtype=cupy.uint8)
cupy_bytes = cupy.get_default_memory_pool().total_bytes()
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"CuPy's pool holds {fmt(cupy_bytes)}; PyTorch's allocated: "
      f"{fmt(torch.cuda.memory_allocated())}; asking for {fmt(ask)}")

# %% id="04-24" tags=["raises-exception"]
y = torch.empty(ask, dtype=torch.uint8, device="cuda")

# %% id="04-25"
found = explanation()
claim(verdict() == "outside PyTorch", "the explanation names memory outside PyTorch",
      verdict=verdict())
outside = next((c.nbytes or 0 for c in found.causes if c.kind == "outside PyTorch"), 0)
rest = outside - cupy_bytes
print(f"outside PyTorch at the failure: {fmt(outside)} = CuPy's pool {fmt(cupy_bytes)} "
      f"+ {fmt(rest)}")
claim(0 < rest < GiB,
      "besides CuPy's pool, under 1 GiB is outside PyTorch: the CUDA context and its code",
      rest=fmt(rest))
said = next((c.summary for c in found.causes if c.kind == "outside PyTorch"), "")
claim("CUDA context" in said and "workspace" not in said,
      "the explanation names the CUDA context and other libraries, not cuBLAS's workspaces",
      explanation=said)
del held_by_cupy
cupy.get_default_memory_pool().free_all_blocks()  # CuPy's cache, like empty_cache()
# %gpumem cleanup

# %% [markdown] id="04-49"
# What lies outside PyTorch here is CuPy's pool and, under 1 GiB, what every CUDA process
# has: the CUDA context and the GPU code loaded into it (notebook 1 measures both). cuBLAS's
# and cuDNN's workspaces are not part of it: PyTorch takes them from its own caching
# allocator, so they count as `allocated` (notebook 1 measures cuBLAS's), and the
# explanation does not list them there (the last ✓ line). CuPy keeps freed memory in its
# pool, as PyTorch does; `free_all_blocks()` is its `empty_cache()`.

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
found = explanation()
claim(verdict() == "held by your session" and any(h.name == "held" for h in found.holders),
      "the explanation names the variable `held`", verdict=verdict())
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
print(f"weights: {fmt(sum(p.nbytes for p in model.parameters()))}")
print(f"weights and the rest before a request: {fmt(base)}")
print(f"one request: {fmt(need)} at its peak, {fmt(kept)} still allocated after it")
print(f"cap for this process: {fmt(cap)}")

# %% id="04-32"
serve(new_request(), results)  # request 1
print(f"after request 1: allocated {fmt(torch.cuda.memory_allocated())}, "
      f"reserved {fmt(torch.cuda.memory_reserved())}")
after_first = torch.cuda.memory_allocated()

# %% id="04-33" tags=["raises-exception"]
torch.cuda.empty_cache()  # the article's advice
after_empty_cache = torch.cuda.memory_allocated()
serve(new_request(), results)  # request 2

# %% id="04-47"
claim(torch.cuda.memory_allocated() >= after_first,
      "the first request's memory was allocated, not cached: empty_cache() freed none of it",
      after_request_1=fmt(after_first), after_empty_cache=fmt(after_empty_cache),
      now=fmt(torch.cuda.memory_allocated()))
claim(verdict() == "held by your session"
      and any(h.name.startswith("results") for h in explanation().holders),
      "the explanation names `results`", verdict=verdict())

# %% [markdown] id="04-34"
# `empty_cache()` did not help, and could not: the first request's memory was not *cached*, it
# was *allocated*, held by `results` (read the explanation above). A cached block is reused by
# PyTorch's own requests anyway, and its allocator empties the cache itself before it raises;
# emptying the cache helps only what allocates outside that cache (other processes, or another
# library in this one, as the CuPy section above showed), and costs a synchronization. The
# fix is to keep only what the caller needs, and not to build a graph at all when serving:

# %% id="04-35"
results.clear()
# %gpumem cleanup


def serve_fixed(request, answers):
    with torch.inference_mode():  # no autograd graph
        answers.append(model(request).argmax(dim=1).cpu())  # keep only the answer


answers, growth, start = [], [], torch.cuda.memory_allocated()
for i in range(3):
    serve_fixed(new_request(), answers)
    print(f"after request {i + 1}: allocated "
          f"{fmt(torch.cuda.memory_allocated() - start, signed=True)} since before the first, "
          f"reserved {fmt(torch.cuda.memory_reserved())}")
    growth.append(torch.cuda.memory_allocated() - start)
claim(max(growth) <= 2**20, "allocated is back where it started after each request",
      growth=[fmt(g) for g in growth])
torch.cuda.set_per_process_memory_fraction(1.0)

# %% [markdown] id="04-36"
# Three requests under the same cap, and `allocated` is back where it started after each.
#
# ## The `cudaMallocAsync` backend says it differently
#
# With `PYTORCH_ALLOC_CONF=backend:cudaMallocAsync` the allocation is served by CUDA's own pool,
# and the message has another format. PyTorch makes no flush-and-retry of its own there
# (`CUDAMallocAsyncAllocator.cpp` raises on the first failed `cudaMallocAsync`): the pool is
# the driver's. Its statistics also differ: the counters printed here stay at zero after a
# real OOM under that backend, which is why gpumem_nb counts OOMs itself. Its message names a
# "PyTorch limit (set by user-supplied memory fraction)" even where no fraction was set: the
# limit is then the largest 64-bit size, which it prints as an absurd number of GiB. Both
# backends, in fresh processes. The native message also lists other processes on the GPU
# ("Process N has … in use"): here that is this notebook's kernel, which still holds what the
# cells above reserved plus its CUDA context (the summary after the next cell prints both);
# the two fresh processes run side by side, so one can also list the other.

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
native, pool = run_fresh_many(OOM, ["", "backend:cudaMallocAsync"])
for r in (native, pool):
    print(f"--- {r['backend']}: num_ooms {r['num_ooms']}, num_alloc_retries {r['retries']}")
    print(r["message"])
claim(native["num_ooms"] >= 1 and not pool["num_ooms"],
      "under cudaMallocAsync the OOM counter stays at zero after a real OOM")
claim(native["message"].split(".")[0] != pool["message"].split(".")[0]
      or "Tried to allocate" not in pool["message"],
      "the cudaMallocAsync message has another format")

# %% id="04-38"
# %gpumem summary

# %% [markdown] id="04-53"
# What to take away:
#
# - A step too big for the GPU shows as the cell's own working set: the fix is in the workload
#   (a smaller batch, activation checkpointing, autocast), not in a cleanup or a setting.
# - In a notebook the usual cause is memory your session holds: a variable, a list of losses
#   with their graphs, a stored traceback. The explanation names the holder; keep numbers
#   (`.item()`), not tensors.
# - Fragmentation leaves free holes that no request fits and `empty_cache()` cannot return
#   while their segment holds live tensors: free the live pieces, or start the process with
#   `expandable_segments:True`.
# - Another process, or another library in this one, is outside PyTorch's counters: NVML sees
#   it, the explanation names it, and only its owner frees it.
# - `empty_cache()` frees only what is cached: in the "second request" story the memory was
#   allocated, held by `results`, and the allocator empties its cache itself before it raises
#   (part 1). Keep only what the caller needs, and serve under `inference_mode`.
