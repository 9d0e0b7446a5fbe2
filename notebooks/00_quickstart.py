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
# > The outputs in this notebook were produced by running it on an NVIDIA H200; the notebook's metadata (`gpumem_nb` key) records the GPU, driver, torch and gpumem_nb versions, commit and date. The text quotes no measured figure of its own: it points at the printed lines, so what you read is what the cells measured.

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
# - **NVML used** (dashed, on top): what `nvidia-smi` reports for the whole GPU, every process
#   included;
# - **reserved**: what PyTorch's caching allocator holds from the driver, live tensors plus its
#   cache;
# - **allocated**: live tensors only;
# - **host RAM**: this process's resident memory;
# - the gap between *NVML used* and *reserved* is memory outside PyTorch's allocator, mostly the
#   CUDA context; the gap between *reserved* and *allocated* is the cache.
#
# In the recording you can see CUDA start (NVML jumps before any tensor exists), weights load
# (all three rise), training steps (allocated spikes, reserved keeps the high-water mark), a
# `del` (allocated falls, reserved and NVML do not), `empty_cache` (reserved and NVML fall),
# and re-runs that keep results alive until a cleanup.
#
# In a notebook with a frontend the chart is live; saved notebooks keep a static picture of it.
# On a GPU machine `%gpumem watch --live` switches it to this machine's own memory.

# %% id="00-05"
# %gpumem watch --replay bundled

# %% [markdown] id="00-06"
# ## 2. Measure one cell: `%%gpumem`
#
# Put `%%gpumem` on the first line of a cell to get its time, the allocator's exact peak during
# the cell (GPU), the changes in `allocated`, `reserved` and NVML, and the host RAM change.

# %% id="00-07"
# %%gpumem
data = big_array(256)
scratch = big_array(512)  # a temporary: part of the peak, gone by the end
del scratch

# %% [markdown] id="00-08"
# On a GPU the peak includes the temporary, although neither the start nor the end of the cell
# shows it. Every cell is measured even without `%%gpumem`; `%gpumem history` lists them.
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
# `%gpumem cleanup` drops a stored traceback, runs `gc.collect()` and returns PyTorch's unused
# cache to the driver. `--out` also clears the output cache. It never deletes a variable you did
# not name (`--vars a,b` deletes those), and it reports what each step freed.

# %% id="00-15"
# %gpumem cleanup --out

# %% [markdown] id="00-16"
# The `output cache` row shows what the three kept results cost; `result` itself is untouched.
#
# ## Next
#
# - `01_allocated_reserved_nvidia_smi.ipynb`: the CUDA context, allocated vs reserved vs NVML,
#   `empty_cache`;
# - `02_rerun_accumulation.ipynb`: `Out[n]`, a failed cell's traceback, a stored loss and its
#   graph;
# - `03_peaks_fragmentation_live.ipynb`: exact peaks, fragmentation, `expandable_segments`, the
#   live chart;
# - `04_out_of_memory.ipynb`: the OOM message, the allocator's retry, the explainer;
# - `05_allocator_settings.ipynb`: every allocator setting, measured side by side;
# - `06_training_memory_budget.ipynb`: parameters, gradients, AdamW, activations;
# - `07_traces_and_snapshots.ipynb`: which line allocated what, and memory_viz.
#
# `%gpumem?` lists every command.
