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

# %% [markdown] id="05-00"
# # 5. Allocator settings, measured side by side
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** what does each allocator setting change, which backend honours it,
# and when does it take effect?
#
# PyTorch's CUDA allocator is configured with one environment variable, `PYTORCH_ALLOC_CONF`
# (the older name `PYTORCH_CUDA_ALLOC_CONF` still works), holding comma-separated `key:value`
# pairs. This notebook takes the five settings most often tuned, of the fourteen keys torch
# 2.11's parser accepts (the others are listed after them): it says what each changes, which
# backend honours it and when it is read; it then runs one workload under each setting, in
# fresh processes, and compares them in one table. It ends with `torch.cuda.memory_summary()`,
# read line by line.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="05-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import os

import torch
from claims import claim, skipped

from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.zeros(1, device="cuda")
print("torch", torch.__version__)
print("allocator backend in this kernel:", torch.cuda.get_allocator_backend())
for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
    print(f"{var} = {os.environ.get(var)!r}")
claim(torch.cuda.get_allocator_backend() == "native"
      or os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
      "with nothing set, the backend is native")

# %% [markdown] id="05-02"
# With nothing set, the backend is `native`, PyTorch's own caching allocator (one article
# claims a recent torch "defaults to the async pool"; the line above says otherwise).
#
# ## The settings
#
# - **`backend:native`** (the default) or **`backend:cudaMallocAsync`**: who manages memory,
#   PyTorch's own caching allocator or CUDA's stream-ordered pool, which keeps its own cache and
#   reports fewer statistics. *Read when torch is imported.*
# - **`expandable_segments:True`**: segments are ranges of virtual memory that grow and shrink
#   page by page, so free pages inside a partly used segment can be returned (notebook 3).
#   *Native only; read when CUDA starts.*
# - **`max_split_size_mb:N`**: cached blocks larger than N MB are never split for smaller
#   requests ("oversize" blocks), and are the first to be freed when `cudaMalloc` fails.
#   *Native only; read when CUDA starts.*
# - **`roundup_power2_divisions:N`**: request sizes are rounded up to one of N steps between
#   consecutive powers of two, so sizes that vary a little reuse the same cached blocks; the
#   rounding itself costs memory. *Native only; read when CUDA starts.*
# - **`garbage_collection_threshold:F`**: with a cap set by
#   `torch.cuda.set_per_process_memory_fraction`, once reserved memory passes the fraction F of
#   the cap, the allocator frees cached blocks that have not been reused before asking for more,
#   rather than waiting for a failed `cudaMalloc`. *Native only; read when CUDA starts.*
#
# The other keys torch 2.11 accepts (`c10/core/AllocatorConfig.h` and
# `c10/cuda/CUDAAllocatorConfig.h`; this notebook does not measure them):
#
# - **`per_process_memory_fraction`**: the cap of `torch.cuda.set_per_process_memory_fraction`,
#   set from the environment (the cap that `garbage_collection_threshold` above and notebook 9's
#   capped runs work under);
# - **`large_segment_size_mb`**: the size of the segments large requests are packed into (the
#   large segment in notebook 1's table);
# - **`max_non_split_rounding_mb`**: how much larger than a request an oversize cached block may
#   be and still serve it (the "cached block of about its own size" in notebook 8);
# - **`pinned_use_background_threads`**, **`pinned_use_cuda_host_register`**,
#   **`pinned_num_register_threads`** and **`pinned_reserve_segment_size_mb`**: pinned host
#   memory;
# - **`release_lock_on_cudamalloc`**: whether the allocator's lock is released around
#   `cudaMalloc`;
# - **`graph_capture_record_stream_reuse`**: block reuse across streams during CUDA-graph
#   capture.
#
# `cudaMallocAsync` has none of the native allocator's segments and blocks, so these options
# mean nothing to it, and in torch 2.11 it says nothing about `max_split_size_mb`: PyTorch's
# parser warns only about a few other native-only options, such as the `pinned_*` ones. An
# article that tunes `max_split_size_mb` to configure `cudaMallocAsync` tunes nothing. The table
# below shows it (its last two rows), with no warning under it.
#
# ## One workload under each setting
#
# The workload allocates tensors of varying sizes (like batches of varying length), keeping the
# last few alive, under a cap that makes this process's GPU a small one; then it reads the
# allocator's statistics and calls `empty_cache()` with the last tensors still alive. Each
# setting runs in a fresh process, a few at a time (each process reads only its own statistics).

# %% id="05-03"
from fresh_process import run_fresh_many

WORKLOAD = r'''
import json, torch
MiB = 2**20
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(2 * 2**30 / total)
sizes = [13, 200, 37, 410, 90, 256, 18, 333, 64, 150]
live, peak_reserved, oom_at = [], 0, None
for step in range(60):
    nbytes = sizes[step % len(sizes)] * MiB + 4096 * step
    try:
        live.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        oom_at = step
        break
    if len(live) > 4:
        live.pop(0)
    peak_reserved = max(peak_reserved, torch.cuda.memory_reserved())
s = torch.cuda.memory_stats()
out = {"backend": torch.cuda.get_allocator_backend(), "oom_at": oom_at,
       "peak_reserved": peak_reserved, "reserved": torch.cuda.memory_reserved(),
       "allocated": torch.cuda.memory_allocated(),
       "requested": s.get("requested_bytes.all.current", 0),
       "inactive_split": s.get("inactive_split_bytes.all.current", 0),
       "retries": s.get("num_alloc_retries", 0),
       "oversize": s.get("oversize_allocations.peak", 0)}
import os, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)


def mine():  # this process's line in NVML's list, as nvidia-smi shows it
    return next((p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu)
                 if p.pid == os.getpid()), None)


import time
nvml_before, reserved_before = mine(), torch.cuda.memory_reserved()
torch.cuda.empty_cache()
out["after_empty_cache"] = torch.cuda.memory_reserved()
out["reserved_freed"] = reserved_before - out["after_empty_cache"]
for _ in range(20):  # NVML's per-process figure may trail the driver by a moment
    nvml_after = mine()
    if None in (nvml_before, nvml_after) or \
            abs(nvml_before - nvml_after - out["reserved_freed"]) <= 20 * MiB:
        break
    time.sleep(0.05)
out["nvml_freed"] = None if None in (nvml_before, nvml_after) else nvml_before - nvml_after
print(json.dumps(out))
'''
CAP = fmt(2 * 2**30)
CONFIGS = ["", "expandable_segments:True", "max_split_size_mb:128",
           "roundup_power2_divisions:4", "garbage_collection_threshold:0.6",
           "backend:cudaMallocAsync", "backend:cudaMallocAsync,max_split_size_mb:128"]
results = run_fresh_many(WORKLOAD, CONFIGS)


def mib(n):
    return f"{n / MiB:,.0f}"


print(f"cap: {CAP} per process; sizes in MiB")
head = ("setting", "backend", "peak res.", "reserved", "allocated", "requested",
        "inact.split", "retries", "oversize", "after e_c", "e_c freed", "NVML freed", "OOM at")
print(f"{head[0]:<46}{head[1]:>16}" + "".join(f"{h:>12}" for h in head[2:]))
for conf, r in zip(CONFIGS, results):
    cells = [mib(r["peak_reserved"]), mib(r["reserved"]), mib(r["allocated"]),
             mib(r["requested"]), mib(r["inactive_split"]), r["retries"], r["oversize"],
             mib(r["after_empty_cache"]), mib(r["reserved_freed"]),
             "not listed" if r["nvml_freed"] is None else mib(r["nvml_freed"]),
             "—" if r["oom_at"] is None else r["oom_at"]]
    print(f"{conf or '(default)':<46}{r['backend']:>16}" + "".join(f"{c:>12}" for c in cells))
for conf, r in zip(CONFIGS, results):
    for w in r["warnings"]:
        print(f"warning under {conf!r}: {w.strip()}")
by_conf = dict(zip(CONFIGS, results))
compared = ("peak_reserved", "reserved", "allocated", "inactive_split", "oversize",
            "after_empty_cache", "oom_at")
pool, tuned = by_conf["backend:cudaMallocAsync"], by_conf[CONFIGS[-1]]
claim(all(pool[k] == tuned[k] for k in compared),
      "under cudaMallocAsync, max_split_size_mb changes nothing: the two rows are identical")
claim(not tuned["warnings"], "and nothing warns about it", warnings=tuned["warnings"])
claim(by_conf[""]["oversize"] == 0 < by_conf["max_split_size_mb:128"]["oversize"]
      and tuned["oversize"] == 0,
      "oversize blocks appear only under max_split_size_mb, and never under cudaMallocAsync")
claim(by_conf["roundup_power2_divisions:4"]["allocated"] > by_conf[""]["requested"],
      "roundup_power2_divisions hands out blocks bigger than the requests")
listed = [(conf, r) for conf, r in by_conf.items() if r["nvml_freed"] is not None]
if listed:
    # Every row, not some: a row NVML did not list fails the claim instead of dropping out.
    claim(len(listed) == len(CONFIGS)
          and all(r["reserved_freed"] > 0 and abs(r["nvml_freed"] - r["reserved_freed"])
                  <= 20 * MiB for _, r in listed),
          "on every backend and setting, empty_cache() gave memory back and this process's "
          "NVML line fell by the same amount, within one 20 MiB page (the last two columns)",
          rows_with_nvml=f"{len(listed)} of {len(CONFIGS)}")
else:
    skipped("on every backend and setting, empty_cache() gave memory back and this process's "
            "NVML line fell by the same amount", "NVML lists no process line on this host")
claim(by_conf["expandable_segments:True"]["after_empty_cache"]
      < by_conf[""]["after_empty_cache"],
      "with the last tensors alive, empty_cache() returns more under expandable segments")

# %% [markdown] id="05-04"
# How to read it (columns in MiB; *after e_c* is `reserved` after `empty_cache()` with the last
# tensors alive):
#
# - **allocated vs requested** is the rounding: under `roundup_power2_divisions` blocks are
#   bigger than the requests, by design.
# - **oversize** counts blocks above `max_split_size_mb`: zero without the setting, and zero
#   under `cudaMallocAsync` even with it.
# - **inact.split** and **retries** are the native allocator's fragmentation signals; compare
#   the default row with the others. `expandable_segments` reports no inactive split at all,
#   which is bookkeeping (notebook 3), and `cudaMallocAsync` reports neither.
#   `garbage_collection_threshold:0.6` shows the most inactive split of the native rows, and
#   keeps the most after `empty_cache()`: once `reserved` passes that share of the allowed
#   memory, it releases cached blocks before a `cudaMalloc` fails, but only whole (unsplit)
#   ones, so what stays cached is mostly the split pieces it cannot release.
# - **after e_c**: what stays reserved after `empty_cache()`, with the last tensors still alive
#   (what it gave back is the difference from the reserved column). The native
#   allocator without expandable segments can only return segments that hold no live tensor.
# - **e_c freed** and **NVML freed**: what `empty_cache()` gave back, by the allocator and by
#   this process's line in NVML's list. On every backend and setting the two agree (a ✓ line
#   below the table checks each row): one article's "it gives nothing back" is false for each.
# - The two `cudaMallocAsync` rows are the same workload with and without `max_split_size_mb`:
#   they are identical, and no warning was printed under the table.
#
# ## When the options are read
#
# The backend is read when torch is imported (notebook 3 shows what happens if you set it
# later). The other options are read when CUDA starts: set `max_split_size_mb` after the first
# CUDA call and a large block is not counted as oversize; set it before, and it is.

# %% id="05-05"
WHEN = r'''
import json, os, torch
torch.zeros(1, device="cuda")  # CUDA starts here
if "LATE_CONF" in os.environ:
    os.environ["PYTORCH_ALLOC_CONF"] = os.environ["LATE_CONF"]  # after CUDA started
x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
print(json.dumps({"oversize": torch.cuda.memory_stats().get("oversize_allocations.current", 0)}))
'''
before, after = run_fresh_many(WHEN, ["max_split_size_mb:128", ""],
                               extra_envs=[{}, {"LATE_CONF": "max_split_size_mb:128"}])
print(f"max_split_size_mb set before CUDA starts: oversize allocations {before['oversize']}")
print(f"max_split_size_mb set after CUDA started:  oversize allocations {after['oversize']}")
claim(before["oversize"] >= 1 and after["oversize"] == 0,
      "max_split_size_mb counts only when set before CUDA starts")

# %% [markdown] id="05-06"
# ## `memory_summary()`, line by line
#
# `torch.cuda.memory_summary()` prints the native allocator's statistics as a table. First a small
# state to describe: a split 1 GiB segment (as in notebook 3) and some small tensors.

# %% id="05-07"
a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
del a
b = torch.empty(600 * 10**6, dtype=torch.uint8, device="cuda")
print(f"a: {fmt(2**30)}, freed; b: {fmt(b.nbytes)} in a's segment")
small = [torch.empty(1000, device="cuda") for _ in range(10)]
summary = torch.cuda.memory_summary()
print(summary)

# %% [markdown] id="05-08"
# The header counts OOMs and `cudaMalloc` retries (notebook 4). Each metric then has four columns:
# *Cur Usage* (now), *Peak Usage* (since start or the last `reset_peak_memory_stats`),
# *Tot Alloc* and *Tot Freed* (cumulative), and each is split into the large pool and the small
# pool of small requests (notebook 1 measures where one ends). Each column's unit is chosen by
# the metric's first line (both pools together) and the pool lines are rounded down to it: the
# small pool's *Peak Usage* reads as zero MiB because its peak is far below one MiB (the
# total's peak is in MiB), not because it is below its *Cur Usage*, which happens to be shown
# in KiB. What each metric means:

# %% id="05-09"
MEANING = {
    "Allocated memory": "blocks held by live tensors, after rounding (memory_allocated)",
    "Active memory": "allocated, plus freed blocks a stream may still be using",
    "Requested memory": "what the tensors asked for, before rounding",
    "GPU reserved memory": "segments obtained from cudaMalloc (memory_reserved)",
    "Non-releasable memory": "free blocks inside partly used segments: the inactive split",
    "Allocations": "number of live blocks",
    "Active allocs": "number of active blocks",
    "GPU reserved segments": "number of segments",
    "Non-releasable allocs": "number of inactive split blocks",
    "Oversize allocations": "blocks above max_split_size_mb (none without that setting)",
    "Oversize GPU segments": "segments above max_split_size_mb",
}
for line in summary.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[0] and not cells[0].startswith(("from", "Metric")):
        note = MEANING.get(cells[0], "(not described here)")
        print(f"{cells[0]:<24} now {cells[1]:>11}  peak {cells[2]:>11}  {note}")

# %% [markdown] id="05-10"
# Every row is a size or a count of blocks or segments. None is an operation type (an article
# says the summary lists "the operation types that allocated most"; it does not: for that, see
# the allocation traces in notebook 7). Its "Inactive split" is today's *Non-releasable memory*,
# the statistic `inactive_split_bytes`. The same numbers are available as a dict,
# `torch.cuda.memory_stats()`, and `%gpumem summary` puts the important ones in words:

# %% id="05-11"
# %gpumem summary

# %% id="05-12"
del b, small
# %gpumem cleanup

# %% [markdown] id="05-13"
# What to take away:
#
# - With nothing set the backend is `native`, PyTorch's own caching allocator.
# - A setting the backend does not honour is ignored without a word: under `cudaMallocAsync`,
#   `max_split_size_mb` changes nothing and nothing warns.
# - Each setting changes what the statistics show: `roundup_power2_divisions` hands out blocks
#   bigger than the requests, `max_split_size_mb` makes oversize blocks, and expandable
#   segments let `empty_cache()` return more while tensors are alive.
# - The settings count only when set before CUDA starts (the backend before `import torch`).
# - `memory_summary()` counts sizes and blocks, not operations; `%gpumem summary` says the
#   important ones in words, and a trace (notebook 7) says which line allocated what.
