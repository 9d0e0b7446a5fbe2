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

# %% [markdown] id="00-00"
# # 0. Quickstart: gpumem_nb in five minutes
#
# **The question:** what is using the GPU's memory while I work in a notebook, and how do I
# get it back without restarting the kernel?
#
# gpumem_nb watches memory while you work in a notebook: NVML's view of the GPU (what
# `nvidia-smi` shows), PyTorch's allocator (`allocated`, `reserved`), and host RAM. It measures
# every cell, notices when re-running a cell keeps eating memory, says who holds it, and frees
# it safely.
#
# **This notebook runs anywhere, with or without a GPU.** Without an NVIDIA GPU (a laptop,
# Binder, CI), the chart plays back a session recorded on an H200 (the *replay* mode), so you
# can learn to read it. Your own cells are still measured live: on such a machine that means
# host RAM only, and the GPU columns show `—`. Without torch, the examples use NumPy arrays.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="00-01"
# %load_ext gpumem_nb

# %% [markdown] id="00-02"
# The line above says what gpumem_nb found: which GPU, or why there is none. Loading it never
# imports torch and never touches the GPU.
#
# The next cell finds out what this machine has. `torch.cuda.is_available()` does not start
# CUDA; on a GPU machine, `get_device_name` then prints which GPU the cells below use.

# %% id="00-03"
import numpy as np

try:
    import torch
except ImportError:  # gpumem_nb itself never needs torch
    torch = None
GPU = torch is not None and torch.cuda.is_available()
MiB = 2**20


def big_array(mib):
    # `mib` MiB of float32: on the GPU when there is one, else in host RAM.
    n = mib * MiB // 4
    return torch.ones(n, device="cuda") if GPU else np.ones(n, dtype=np.float32)


print("torch:", torch.__version__ if torch is not None else "not installed")
print("GPU:", torch.cuda.get_device_name(0) if GPU else
      "none; the chart replays an H200 recording, your cells are measured in host RAM")

# %% [markdown] id="00-04"
# ## 1. The chart
#
# `%gpumem watch` draws the chart. Here it replays the bundled H200 recording on every machine,
# so that everyone sees the same story; the caption under it says what was recorded. Reading it:
#
# - **NVML used (whole GPU)** (grey, dashed): what `nvidia-smi` reports for the whole GPU,
#   every process included;
# - **this process (NVML)**: NVML's line for this process alone (only one process used the GPU
#   in this recording, so the two NVML lines nearly coincide);
# - **reserved (PyTorch cache)**: what PyTorch's caching allocator holds from the driver, live
#   tensors plus its cache;
# - **allocated (live tensors)**: what PyTorch's allocator has handed out: live tensors, and
#   library workspaces such as cuBLAS's;
# - **host RAM (RSS)**: this process's resident memory, in the live chart's legend (drawn by
#   default where there is no GPU);
# - the gap between *this process* and *reserved* is memory outside PyTorch's allocator: mostly
#   the CUDA context; the gap between *reserved* and *allocated* is the cache.
#
# In the recording you can see CUDA start (NVML jumps by the CUDA context while PyTorch has
# reserved almost nothing), weights load
# (all three rise), training steps (allocated spikes, reserved keeps the high-water mark), a
# `del` (allocated falls, reserved and NVML do not), `empty_cache` (reserved and NVML fall),
# and re-runs that keep results alive until a cleanup. The [checks](#Checks) at the end of this
# notebook test each of these against the recorded samples.
#
# In a notebook with a frontend the chart is live. When it ends (`%gpumem watch --stop`, a
# kernel shutdown, or the end of this notebook's run), its output becomes a static picture of
# the whole recording, with the numbers under it as they were when the chart ended (for a
# replay, at the point it had reached), which GitHub, nbviewer and a JupyterLab without a
# kernel show. So for a replay the picture and the table under it can show different moments:
# the picture draws the whole recording, the table where the replay stood when the chart
# ended. The first check at the end prints the recording's own last sample.
# On a GPU machine `%gpumem watch --live` switches it to this machine's own memory.

# %% id="00-05"
# %gpumem watch --replay bundled

# %% [markdown] id="00-06"
# ## 2. Measure one cell: `%%gpumem`
#
# Put `%%gpumem` on the first line of a cell to get its time, the allocator's exact peak during
# the cell (GPU), the changes in `allocated` and `reserved`, the highest NVML reading (NVML
# read just before and just after the cell, and sampled while it runs), and the host RAM
# change.

# %% id="00-07"
# %%gpumem
data = big_array(256)
scratch = big_array(512)  # a temporary: part of the peak, gone by the end
del scratch

# %% [markdown] id="00-08"
# On a GPU the peak includes the temporary, although neither the start nor the end of the cell
# shows it (checked at the end of this notebook). Every cell is measured even without
# `%%gpumem`; `%gpumem history` lists them.
#
# ## 3. Re-running a cell
#
# The next cell was run **three times**, as you would while experimenting. It rebinds the same
# name, so memory should stay flat, but its last line displays a result and IPython keeps every
# displayed result in `Out[n]`. On a GPU, gpumem_nb flags the third run and says who holds the
# memory.

# %% id="00-09" tutorial={"runs": 3}
result = big_array(64)
result * 2

# %% [markdown] id="00-10"
# ## 4. Who holds memory: `%gpumem who`
#
# `who` lists what keeps tensors and arrays alive: your variables (and the tensors inside
# modules, optimizers, lists and dicts), the output cache `Out[n]`, and a stored traceback.

# %% id="00-11"
# %gpumem who

# %% [markdown] id="00-12"
# ## 5. The per-cell history
#
# One row per cell: time, `allocated`/`reserved` change, the allocator's peak (`≥` marks a
# lower bound), NVML's change and peak, and the host RAM change. `gpumem_nb.history()` returns
# the same as a DataFrame, and `%gpumem history --csv FILE` saves it.

# %% id="00-13"
# %gpumem history

# %% [markdown] id="00-14"
# ## 6. Clean up safely
#
# `%gpumem cleanup` runs `gc.collect()`, drops a stored traceback and returns PyTorch's unused
# cache to the driver (`torch.cuda.empty_cache()`): with the default allocator, every cached
# *segment* that holds no live tensor. `--out` also clears the
# output cache. It never deletes a variable you did not name (`--vars a,b` deletes those), and
# it reports what each step freed, each step measured on its own.

# %% id="00-15"
# %gpumem cleanup --out

# %% [markdown] id="00-16"
# The `output cache` row shows what the three kept results cost; `result` itself is untouched.
#
# On a GPU the `empty_cache` row frees less than the output cache did. The allocator gets
# memory from the driver in *segments* and cuts tensors out of them; `empty_cache()` can give
# back only a segment with no live tensor in it. The three `Out` results were cut from the same
# segment as `result`, which is alive, so their blocks stay cached: the allocator reuses them
# for your next tensors, but the driver cannot have them. Notebook 1 shows segments and blocks
# in detail. (That is the default allocator's rule: with `expandable_segments:True`,
# `empty_cache()` can also give back the free pages of a segment a live tensor still uses, as
# notebook 3 shows.)

# %% [markdown] id="00-22"
# ## Checks
#
# The lesson ends here; the checks are for the curious, and what to take away and which
# tutorial to read next follow them. Each sentence above about what the chart or a cell showed
# is checked by one of the cells below, in the order of the sections, and a run that
# contradicts the text stops there instead of saving it: the ✓ lines are those checks. They
# only read what the cells above recorded (the replay's samples, the history, the allocator's
# state after the cleanup), so running them here changes nothing they check.

# %% id="00-17"
# The chart's story (section 1), checked against the recorded samples (the replay's data).
from claims import claim, skipped

from gpumem_nb.sources.replay import load_trace
from gpumem_nb.units import format_bytes as fmt

samples, note = load_trace()  # the bundled H200 recording
gpu0 = [(s.t_s, s.devices[0]) for s in samples if s.devices]
nvml = [(d.nvml.used_bytes or 0) if d.nvml else 0 for _, d in gpu0]
reserved = [d.allocator.reserved_bytes if d.allocator else 0 for _, d in gpu0]
allocated = [d.allocator.allocated_bytes if d.allocator else 0 for _, d in gpu0]
GiB, n = 2**30, len(gpu0)
print(f"{n} samples over {gpu0[-1][0] - gpu0[0][0]:.0f} s: {note}")
first_tensor = next(i for i, r in enumerate(reserved) if r > 0)
context = nvml[first_tensor] - reserved[first_tensor]
claim(context > 256 * MiB and reserved[first_tensor] <= 2 * MiB,
      "CUDA start: NVML jumps by the context while PyTorch holds almost nothing",
      nvml_jump=fmt(context), reserved=fmt(reserved[first_tensor]))
claim(any(min(allocated[i] - allocated[i - 1], reserved[i] - reserved[i - 1],
              nvml[i] - nvml[i - 1]) >= GiB for i in range(1, n)),
      "weights load: allocated, reserved and NVML rise together")
falls = [i for i in range(1, n)
         if allocated[i] < allocated[i - 1] - GiB and reserved[i] == reserved[i - 1]]
steps = [i for i in falls if allocated[i] > GiB]


def fell(i):
    # One sample's fall, as "allocated before -> after, reserved before -> after".
    return (f"allocated {fmt(allocated[i - 1])} -> {fmt(allocated[i])}, reserved "
            f"{fmt(reserved[i - 1])} -> {fmt(reserved[i])}")


claim(len(steps) >= 3,
      "training steps: allocated spikes and falls back, reserved keeps the high-water mark",
      falls=len(steps), first=fell(steps[0]) if steps else None)
deleted = next((i for i in falls if allocated[i] <= 2 * MiB), None)
claim(deleted is not None, "a del: allocated falls to nothing while reserved does not",
      at_the_del=fell(deleted) if deleted is not None else None)
top = max(range(n), key=reserved.__getitem__)
emptied_at = next((i for i in range(top, n) if reserved[i] < reserved[top] // 2
                   and nvml[i] < nvml[top] - reserved[top] // 2), None)
claim(emptied_at is not None, "empty_cache: reserved and NVML fall after the high-water mark",
      reserved=(f"{fmt(reserved[top])} -> {fmt(reserved[emptied_at])}"
                if emptied_at is not None else None),
      nvml=(f"{fmt(nvml[top])} -> {fmt(nvml[emptied_at])}" if emptied_at is not None
            else None))
emptied = next(i for i in range(top, n) if reserved[i] < reserved[top] // 2)
highest = max(range(emptied, n), key=allocated.__getitem__)
climbs = sum(allocated[i] >= allocated[i - 1] + GiB for i in range(emptied + 1, highest + 1))
claim(climbs >= 3 and allocated[-1] <= 2 * MiB,
      "re-runs: allocated climbs run after run until a cleanup frees it", climbs=climbs)
print(f"the recording's last sample, at {gpu0[-1][0] - gpu0[0][0]:.0f} s: NVML used "
      f"{fmt(nvml[-1])}, reserved {fmt(reserved[-1])}, allocated {fmt(allocated[-1])}")

# %% id="00-18"
# Section 2's %%gpumem cell.
import gpumem_nb

if GPU:  # without a GPU the peak is not measured: its line shows `—`
    rows = gpumem_nb.history()
    cell = rows[rows.source.str.startswith("%%gpumem")].iloc[0]  # a row's source: its first line
    claim(cell.peak_exact and cell.peak_allocated_bytes >= (256 + 512) * MiB,
          "the exact peak includes the temporary",
          peak=fmt(int(cell.peak_allocated_bytes)), exact=cell.peak_exact)
    claim(cell.allocated_after_bytes - cell.allocated_before_bytes == 256 * MiB,
          "the end of the cell shows only `data`",
          allocated_delta=fmt(int(cell.allocated_after_bytes - cell.allocated_before_bytes)))
else:
    skipped("the exact peak includes the temporary", "no GPU here: the peak is not measured")
    skipped("the end of the cell shows only `data`", "no GPU here: host RAM is measured instead")

# %% id="00-21"
# Section 3's re-runs.
from gpumem_nb.magics import current_monitor

gpumem_nb.history()  # records, and judges, every cell that has finished
if GPU:
    flags = list(current_monitor().verdicts)
    flag = flags[-1] if flags else None
    claim(flag is not None and flag.runs == 3 and flag.cause == "live tensors"
          and any(h.name.startswith("Out[") for h in flag.holders),
          "the third run was flagged: live tensors, held by the output cache `Out`",
          flag=flag.message if flag else None)
else:
    skipped("the third run was flagged: live tensors, held by the output cache `Out`",
            "no GPU here: gpumem_nb judges re-runs by the GPU's allocator")

# %% id="00-19"
# Section 5's history.
rows = gpumem_nb.history()
if GPU:
    # Nothing else runs on this GPU, so NVML stands still between two cells: each cell's
    # "after" reading must be where the next cell's "before" starts. A stale "after" (read
    # before the cell's memory arrived) would move the change into the next row.
    pairs = zip(rows.nvml_used_after_bytes[:-1], rows.nvml_used_before_bytes[1:])
    gaps = [abs(b - a) for a, b in pairs if a == a and b == b]  # NaN: not read
    claim(gaps and max(gaps) <= 64 * MiB,
          "each row's NVML Δ is that cell's own change, read after it finished",
          largest_gap_between_cells=fmt(int(max(gaps, default=0))))
else:
    skipped("each row's NVML Δ is that cell's own change, read after it finished",
            "no GPU here: there is no NVML reading")

# %% id="00-20"
# Section 6's cleanup: no cell since has allocated on the GPU.
if GPU:
    segments = torch.cuda.memory_snapshot()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    beside_live = sum(s["total_size"] - s["allocated_size"] for s in segments
                      if s["allocated_size"] > 0)
    print(f"still cached: {fmt(cached)}")
    claim(all(s["allocated_size"] > 0 for s in segments),
          "no cached segment is wholly free: empty_cache returned each of those")
    claim(cached > 0 and cached == beside_live,
          "what stays cached shares a segment with a live tensor",
          cached=fmt(cached), beside_live_tensors=fmt(beside_live))
else:
    skipped("what stays cached shares a segment with a live tensor",
            "no GPU here: there is no allocator cache")
total = float(result.sum())  # every element of big_array(64) is 1
claim(total == 64 * MiB // 4, "`result` itself is untouched: still bound, every value as it was",
      elements_summed=int(total))

# %% [markdown] id="00-23"
# What to take away:
#
# - `%load_ext gpumem_nb` measures every cell; `%%gpumem` adds a cell's exact peak, which a
#   temporary can set although neither the start nor the end of the cell shows it.
# - In the chart, the gap between *this process* and *reserved* is memory outside PyTorch
#   (mostly the CUDA context), and the gap between *reserved* and *allocated* is the cache.
# - A cell whose last line displays a result keeps it in `Out[n]` on every run: gpumem_nb flags
#   the third run, and `%gpumem who` names the holder.
# - `%gpumem cleanup` frees safely and says what each step freed; what stays cached shares a
#   segment with a live tensor.
#
# ## Next
#
# - [`01_allocated_reserved_nvidia_smi.ipynb`](01_allocated_reserved_nvidia_smi.ipynb): the CUDA
#   context, allocated vs reserved vs NVML, `del`;
# - [`01_empty_cache_and_workspaces.ipynb`](01_empty_cache_and_workspaces.ipynb): what
#   `empty_cache` gives back and costs, and the workspace no cleanup frees;
# - [`02_rerun_accumulation.ipynb`](02_rerun_accumulation.ipynb): `Out[n]`, a failed cell's
#   traceback, a stored loss and its graph;
# - [`03_peaks_fragmentation_live.ipynb`](03_peaks_fragmentation_live.ipynb): exact peaks,
#   fragmentation, `expandable_segments`, the live chart;
# - [`04_out_of_memory.ipynb`](04_out_of_memory.ipynb): the OOM message, the allocator's retry,
#   catching the error without leaking;
# - [`04_out_of_memory_causes.ipynb`](04_out_of_memory_causes.ipynb): one OOM per common cause,
#   each with gpumem_nb's explanation;
# - [`05_allocator_settings.ipynb`](05_allocator_settings.ipynb): the five allocator settings
#   most often tuned, measured side by side, and the others named;
# - [`06_training_memory_budget.ipynb`](06_training_memory_budget.ipynb): parameters, gradients,
#   AdamW, activations;
# - [`07_traces_and_snapshots.ipynb`](07_traces_and_snapshots.ipynb): which line allocated what,
#   and memory_viz;
# - [`08_which_allocator_setting.ipynb`](08_which_allocator_setting.ipynb): choosing an
#   allocator setting for a workload;
# - [`09_will_it_fit.ipynb`](09_will_it_fit.ipynb): whether a run fits a smaller GPU, from one
#   recording;
# - [`10_graphs_and_compile.ipynb`](10_graphs_and_compile.ipynb): CUDA graphs' and
#   `torch.compile`'s private pools;
# - [`11_generation_kv_cache.ipynb`](11_generation_kv_cache.ipynb): a KV cache growing during
#   generation, and its OOM;
# - [`12_more_than_one_process.ipynb`](12_more_than_one_process.ipynb): memory held by other
#   processes on the same GPU;
# - [`13_loading_a_checkpoint.ipynb`](13_loading_a_checkpoint.ipynb): loading a checkpoint
#   without holding the weights twice (`map_location`, `mmap`, the meta device);
# - [`14_fine_tuning_budgets.ipynb`](14_fine_tuning_budgets.ipynb): bf16 weights, each
#   optimizer's state, and LoRA adapters;
# - [`15_compile_and_shapes.ipynb`](15_compile_and_shapes.ipynb): `torch.compile`'s recompiles
#   and CUDA graph pools per input shape;
# - [`16_kv_cache_fragmentation.ipynb`](16_kv_cache_fragmentation.ipynb): a KV cache grown by
#   `torch.cat` against a preallocated one, and its size under grouped-query attention.
#
# `%gpumem?` lists every command.
