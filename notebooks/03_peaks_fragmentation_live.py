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

# %% [markdown] id="03-00"
# # 3. Peaks, fragmentation, and the live chart
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** why did a cell run out of memory when, before it and after it,
# there seemed to be plenty free?
#
# An OOM "out of nowhere" is usually a short peak, or memory the allocator holds but cannot hand
# out. This notebook measures both, compares the allocator with `expandable_segments` honestly,
# and shows the live chart during a long cell.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="03-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import torch
from claims import claim

import gpumem_nb
from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.zeros(1, device="cuda");

# %% [markdown] id="03-02"
# ## Exact peaks
#
# A transient allocation inside a cell (here 8 GiB that lives for a few milliseconds) is
# invisible before and after the cell. `%%gpumem` reports the allocator's exact peak during the
# cell. gpumem_nb never resets PyTorch's peak counters unless you ask (`--reset-peak`, or
# `%gpumem config --peak reset`), so `torch.cuda.max_memory_allocated()` still means what you
# think.

# %% id="03-03"
# %%gpumem
tmp = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda._sleep(10_000_000)  # ten million GPU clock cycles
del tmp
torch.cuda.synchronize()

# %% id="03-04"
cell = gpumem_nb.history().iloc[-1]  # the %%gpumem cell above
print(f"max_memory_allocated: {fmt(torch.cuda.max_memory_allocated())}")
claim(cell.peak_exact and cell.peak_allocated_bytes >= 8 * 2**30,
      "%%gpumem caught the transient 8 GiB exactly",
      peak=fmt(int(cell.peak_allocated_bytes)), exact=cell.peak_exact)
claim(torch.cuda.max_memory_allocated() >= 8 * 2**30,
      "gpumem_nb did not reset PyTorch's own peak counter")
before_spike = torch.cuda.memory_stats()  # for the next cell's bound (reads, allocates nothing)

# %% [markdown] id="03-05"
# A smaller spike later does not raise the process-wide peak, so without a reset its exact size
# is unknown. gpumem_nb then reports a lower bound instead of a guess (`%%gpumem` says "lower
# bound", the history marks it `≥`): the largest of the readings at the cell's start, at its
# end and by the sampler in between. That bound is honest but loose, and for this cell it
# misses the whole spike. The cell after the next
# computes a tighter one from PyTorch's cumulative counters; ask for a reset and the figure is
# exact again.

# %% id="03-06"
# %%gpumem
tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); del tmp
after_spike = torch.cuda.memory_stats()

# %% id="03-07"
# %%gpumem --reset-peak
tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); del tmp

# %% id="03-22"
smaller, reset = gpumem_nb.history().iloc[-2:].itertuples()
claim(not smaller.peak_exact, "without a reset the smaller spike's peak is a lower bound",
      reported=fmt(int(smaller.peak_allocated_bytes)))
# The cell's largest allocation is at least the mean of its allocations, and the peak is at
# least its largest allocation: max(start, end, Δ allocated bytes ÷ Δ allocations).
added = (after_spike["allocated_bytes.all.allocated"]
         - before_spike["allocated_bytes.all.allocated"])
count = after_spike["allocation.all.allocated"] - before_spike["allocation.all.allocated"]
tighter = max(int(smaller.allocated_before_bytes), int(smaller.allocated_after_bytes),
              added // max(count, 1))
print(f"the smaller spike: gpumem_nb's bound {fmt(int(smaller.peak_allocated_bytes))}; "
      f"from the counters, {fmt(added)} in {count} allocation(s): at least {fmt(tighter)}")
claim(tighter >= 2 * 2**30 > smaller.peak_allocated_bytes,
      "PyTorch's cumulative counters bound the spike by its real size, where the start-and-"
      "end bound does not", counters_bound=fmt(tighter),
      gpumem_bound=fmt(int(smaller.peak_allocated_bytes)))
claim(reset.peak_exact and reset.peak_allocated_bytes >= 2 * 2**30,
      "with --reset-peak the peak is exact again",
      peak=fmt(int(reset.peak_allocated_bytes)), exact=reset.peak_exact)

# %% [markdown] id="03-08"
# ## Fragmentation
#
# Free a 1 GiB tensor and allocate 600 MB: the allocator splits its cached 1 GiB segment. The
# unused part is *inactive split*: reserved, free, and not returnable to the driver while the
# 600 MB tensor lives in the same segment. `%gpumem summary` explains the state.

# %% id="03-09"
# %gpumem cleanup
a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
print(f"a: {fmt(a.nbytes)}")
del a
b = torch.empty(600 * 10**6, dtype=torch.uint8, device="cuda")
print(f"b: {fmt(b.nbytes)} = {b.nbytes / 1e6:.0f} MB")
split = torch.cuda.memory_stats()["inactive_split_bytes.large_pool.current"]
claim(split == 2**30 - -(-b.nbytes // 512) * 512,
      "the rest of the 1 GiB segment is an inactive split block beside b",
      inactive_split=fmt(split))

# %% id="03-10"
# %gpumem summary

# %% [markdown] id="03-11"
# ## `expandable_segments`: what it really changes
#
# With `PYTORCH_ALLOC_CONF=expandable_segments:True` the allocator reserves one large range of
# virtual addresses per stream and maps physical memory into it in pages, as it needs them. Its
# settings are read once per process, so the comparison runs the same pattern in two fresh
# processes (the plumbing is in `fresh_process.py` next to this notebook). Besides the statistics,
# each process prints the blocks inside `b`'s segment, what `empty_cache()` leaves reserved while
# `b` is still alive, and what a 21 MiB tensor reserves afterwards.

# %% id="03-12"
import math

from fresh_process import run_fresh_many

SPLIT = r'''
import json, torch
MiB = 2**20
a = torch.empty(2**30, dtype=torch.uint8, device="cuda"); del a
b = torch.empty(600 * 10**6, dtype=torch.uint8, device="cuda")
s = torch.cuda.memory_stats()
seg = next(g for g in torch.cuda.memory._snapshot()["segments"]
           if any(k["state"] == "active_allocated" and k["size"] >= b.nbytes
                  for k in g["blocks"]))
out = {"allocated": s["allocated_bytes.all.current"],
       "reserved": s["reserved_bytes.all.current"],
       "inactive_split": s["inactive_split_bytes.all.current"],
       "expandable": seg.get("is_expandable", False),
       "blocks": [[k["state"], k["size"]] for k in seg["blocks"]]}
torch.cuda.empty_cache()
out["reserved_b_alive_after_empty_cache"] = torch.cuda.memory_reserved()
del b
torch.cuda.empty_cache()
r0, keep, out["reserved_21_MiB"] = torch.cuda.memory_reserved(), [], []
for _ in range(3):
    keep.append(torch.empty(21 * MiB, dtype=torch.uint8, device="cuda"))
    out["reserved_21_MiB"].append(torch.cuda.memory_reserved() - r0)
print(json.dumps(out))
'''


def mib(n):
    return f"{n / MiB:,.0f} MiB"


CONFS = ["", "expandable_segments:True"]
results = run_fresh_many(SPLIT, CONFS)
for conf, r in zip(CONFS, results):
    steps = r["reserved_21_MiB"]
    print(f"{conf or 'default'} (segment expandable: {r['expandable']})")
    print(f"  allocated {mib(r['allocated'])}, reserved {mib(r['reserved'])}, "
          f"inactive_split {mib(r['inactive_split'])}")
    print("  blocks in b's segment: "
          + ", ".join(f"{state} {mib(size)}" for state, size in r["blocks"]))
    print(f"  empty_cache() with b alive: "
          f"reserved {mib(r['reserved_b_alive_after_empty_cache'])}")
    print(f"  then 1, 2, 3 tensors of 21 MiB: reserved {', '.join(mib(n) for n in steps)}; "
          f"reserved moves in multiples of {mib(math.gcd(*steps))}")
default, expandable = results
claim(expandable["expandable"] and expandable["inactive_split"] == 0
      and len(expandable["blocks"]) >= 2 and len(default["blocks"]) >= 2,
      "expandable segments report no inactive split, yet b's segment is still split",
      blocks=expandable["blocks"])
claim(default["reserved_b_alive_after_empty_cache"] == default["reserved"],
      "default: empty_cache() with b alive returns nothing (b keeps its segment)")
claim(expandable["reserved_b_alive_after_empty_cache"]
      < default["reserved_b_alive_after_empty_cache"],
      "expandable: empty_cache() with b alive unmaps the free pages")
claim(math.gcd(*default["reserved_21_MiB"]) == 22 * MiB
      and math.gcd(*expandable["reserved_21_MiB"]) == 20 * MiB,
      "21 MiB tensors: 22 MiB segments each by default, 20 MiB pages when expandable")

# %% [markdown] id="03-13"
# Read the two runs line by line:
#
# - **`inactive_split` reads zero with expandable segments, but that is bookkeeping.** The
#   allocator does not track that statistic for expandable segments. The block list shows the
#   same split in both runs: `b`'s block, and a free (`inactive`) block beside it. Blocks are
#   still split.
# - **`reserved` is a little higher.** Physical memory for large requests is mapped in pages of
#   20 MiB (the last line; the small pool, for small requests, maps smaller pages), so
#   reserved grows a page at a time; the default allocator instead gives each 21 MiB tensor a
#   segment of its own, rounded up to 22 MiB.
# - **The real benefit is the third line.** With `b` alive, `empty_cache()` can unmap the free
#   pages of an expandable segment, so reserved falls to about `b`'s own size, rounded up to
#   whole pages. The default allocator can only return whole free segments, and `b` keeps its
#   segment.
#
# So expandable segments do not stop splitting; they let free memory inside a partly used
# segment go back to the driver (or be mapped again for a larger request), which is what
# fragmentation needs.

# %% id="03-14"
del b
# %gpumem cleanup

# %% [markdown] id="03-15"
# ## When the settings are read
#
# Most allocator options are read when CUDA starts, so setting `PYTORCH_ALLOC_CONF` in the
# notebook after `import torch` still works, as long as no cell has used the GPU yet. (After
# that the variable is not read again; a private call, `torch.cuda.memory._set_allocator_settings`,
# can still change some options at run time: PyTorch's source says expandable segments "can be
# enabled/disabled throughout the run of a program".) The
# `backend` option is different: it is read when torch is **imported**. Set after the import,
# it makes CUDA's start fail with a mismatch error. Each case runs in a fresh process, which sets
# the variable at the moment named:

# %% id="03-16"
LATE = r'''
import json, os
if os.environ.get("WHEN") == "after import":
    import torch
    os.environ["PYTORCH_ALLOC_CONF"] = os.environ["CONF"]
else:
    os.environ["PYTORCH_ALLOC_CONF"] = os.environ["CONF"]
    import torch
try:
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    backend = torch.cuda.get_allocator_backend()
    segments = torch.cuda.memory._snapshot()["segments"] if backend == "native" else []
    result = {"backend": backend,
              "expandable": any(s.get("is_expandable", False) for s in segments)}
except Exception as e:
    result = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
print(json.dumps(result))
'''

cases = [(conf, when) for conf in ("backend:cudaMallocAsync", "expandable_segments:True")
         for when in ("before import", "after import")]
results = run_fresh_many(LATE, ["" for _ in cases], check=False,
                         extra_envs=[{"CONF": conf, "WHEN": when} for conf, when in cases])
for (conf, when), r in zip(cases, results):
    seen = r.get("error") or f"backend {r['backend']}, expandable {r['expandable']}"
    print(f"{conf:26} set {when:13} -> {seen}")
outcome = {case: r for case, r in zip(cases, results)}
claim("error" in outcome[("backend:cudaMallocAsync", "after import")]
      and outcome[("backend:cudaMallocAsync", "before import")].get("backend")
      == "cudaMallocAsync",
      "the backend is read at import: set after it, CUDA's start fails")
claim(all(outcome[("expandable_segments:True", w)].get("expandable")
          for w in ("before import", "after import")),
      "expandable_segments set after the import, before CUDA starts, still applies")

# %% [markdown] id="03-17"
# In a notebook, set the variable in the first cell, before `import torch`, or restart the
# kernel after changing it: once torch is imported the backend cannot change, and once CUDA has
# started the variable is not read again.
#
# ## The live chart
#
# `%gpumem watch` shows NVML's usage beside PyTorch's `allocated` and `reserved`, with a mark at
# every cell. A background thread updates it while a cell runs, so a long training cell is
# visible as it happens. The cleanup button runs the same safe cleanup as `%gpumem cleanup`.
# During a long cell the page's messages to the kernel wait for the cell to end, so the
# controls answer in the page first: Pause freezes the lines at once, and Clean up and the
# device selector say they are queued until the cell ends, when they run.
#
# When the chart ends (`%gpumem watch --stop`, a kernel shutdown, or, for this notebook, the end
# of its run), its output becomes a static picture with the numbers under it: what GitHub,
# nbviewer and a JupyterLab without a kernel show. Both are taken when the chart ends, so the
# saved picture shows everything since the chart started, the training cell included, and the
# numbers are those at the end, not those of the moment the chart was first shown. Before
# saving a notebook of your own to share, run `%gpumem watch --stop`.

# %% id="03-18"
# %gpumem watch

# %% id="03-19"
# A few seconds of training: watch the chart move while this cell runs.
import time

model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())
t_end = time.monotonic() + 4
steps = 0
while time.monotonic() < t_end:
    x = torch.randn(4096, 8192, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    steps += 1
torch.cuda.synchronize()
print(steps, "steps")

# %% [markdown] id="03-20"
# ## Which cells cost the most?
#
# The history is data. `gpumem_nb.history()` returns it as a pandas DataFrame, one row per cell
# and GPU, so you can sort, filter, plot or save it. Here: the three cells with the highest
# allocator peak in this notebook, with how long each took. A peak marked `≥` is a lower bound
# (the cell did not set a new process-wide peak and nothing reset it).

# %% id="03-21"
df = gpumem_nb.history().dropna(subset=["peak_allocated_bytes"])
for _, row in df.sort_values("peak_allocated_bytes", ascending=False).head(3).iterrows():
    bound = "" if row.peak_exact else "≥"
    print(f"[{row.execution_count:.0f}] peak {bound}{fmt(int(row.peak_allocated_bytes))} "
          f"in {row.duration_s:.2f} s: {row.source[:60]!r}")
resets = df[df.source.str.contains("--reset-peak")]
claim(len(resets) and resets.peak_exact.all(), "no --reset-peak row is marked ≥")

# %% [markdown] id="03-23"
# What to take away:
#
# - A short spike inside a cell is invisible before and after it: `%%gpumem` gives the exact
#   peak when the cell sets a new process-wide one, a lower bound (`≥`) otherwise, and the
#   exact figure again with `--reset-peak`.
# - A smaller tensor cut from a larger cached block leaves the rest as *inactive split*:
#   reserved, free, and not returnable while the tensor beside it lives.
# - `expandable_segments:True` does not stop splitting; it lets `empty_cache()` unmap the free
#   pages of a segment that a live tensor still uses.
# - Set `PYTORCH_ALLOC_CONF` in the first cell: the backend is read when torch is imported, the
#   other options when CUDA starts, and neither is read again.
