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

# %% [markdown] id="13-00"
# # 13. Loading a checkpoint without holding the model twice
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** my model fits on the GPU, so why does loading its checkpoint run out of
# memory?
#
# The usual load builds the model (its weights, randomly initialised), then reads the
# checkpoint (a second set of weights), then copies one into the other. For a moment the
# weights exist twice: on the GPU when the checkpoint was saved from GPU tensors and is loaded
# as saved, in host RAM when both live on the CPU. This notebook measures that moment, then
# each of PyTorch's ways around it: `torch.load(map_location=...)`, `torch.load(mmap=True)`,
# a model built on the `meta` device (no memory at all) with `to_empty()` or
# `load_state_dict(assign=True)`.
#
# The checkpoint is sized from this GPU's memory (a sixteenth of it), so the doubling shows
# the same way on any card. It needs an NVIDIA GPU and torch with CUDA.
#
# > The outputs were produced by running this notebook on the GPU its metadata
# > (`gpumem_nb` key) names, with the driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="13-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import os
import shutil
import tempfile

import torch
from claims import claim, near

from gpumem_nb.units import format_bytes as fmt

GiB, MiB = 2**30, 2**20
torch.zeros(1, device="cuda")

# The model: a stack of square linear layers, every weight the same size, so the checkpoint
# is exactly the weights. The same text builds it here and in the fresh processes below.
MODEL = r'''
from torch import nn


def build(layers, width, device=None):
    return nn.Sequential(*(nn.Linear(width, width, bias=False, device=device)
                           for _ in range(layers)))
'''
exec(MODEL)

WIDTH = 8192
layer_bytes = WIDTH * WIDTH * 4  # one float32 weight
total = torch.cuda.get_device_properties(0).total_memory
with open("/proc/meminfo") as f:
    host_available = next(int(line.split()[1]) * 1024 for line in f
                          if line.startswith("MemAvailable:"))
folder = tempfile.mkdtemp(prefix="gpumem_ckpt_")
disk_free = shutil.disk_usage(folder).free
# A sixteenth of the GPU; less where host RAM (the CPU ways hold the weights twice, two
# processes at a time) or the disk could not take it.
size_goal = min(total // 16, host_available // 6, disk_free // 3)
LAYERS = max(2, size_goal // layer_bytes)
WEIGHTS = LAYERS * layer_bytes
print(f"GPU memory {fmt(total)}; host RAM available {fmt(host_available)}; "
      f"free disk {fmt(disk_free)}")
print(f"the model: {LAYERS} layers of {WIDTH} × {WIDTH} float32, {fmt(WEIGHTS)} of weights")

# %% [markdown] id="13-02"
# ## The checkpoint, saved from the GPU
#
# A training run saves its `state_dict()` while the weights are on the GPU. `torch.save`
# records, with each tensor, the device it was on: that is where `torch.load` puts it back
# unless told otherwise.

# %% id="13-03"
torch.manual_seed(0)
model = build(LAYERS, WIDTH, device="cuda")
PATH = os.path.join(folder, "model.pt")
torch.save(model.state_dict(), PATH)
# Two entries of the weights, read back after every load below to show it loaded these.
CHECK = [float(model[0].weight.detach()[0, :8].sum()),
         float(model[-1].weight.detach()[-1, -8:].sum())]
del model
torch.cuda.empty_cache()
file_bytes = os.path.getsize(PATH)
print(f"{PATH}: {fmt(file_bytes)}; the weights: {fmt(WEIGHTS)}")
claim(near(file_bytes, WEIGHTS, rel=0.01),
      "the checkpoint file is the weights, and little else",
      file=fmt(file_bytes), weights=fmt(WEIGHTS))

# %% [markdown] id="13-04"
# ## The usual load, in this kernel
#
# Build the model on the GPU, `torch.load` the file, `load_state_dict`: the cell below does
# exactly that, and `%%gpumem --reset-peak` measures its exact peak. Then the same weights
# loaded the other way round: the model built on the `meta` device (shapes only, no memory),
# the file read straight to the GPU, and `load_state_dict(assign=True)`, which makes the loaded
# tensors the model's parameters instead of copying them into parameters that already exist.

# %% id="13-05"
# %%gpumem --reset-peak -q
model = build(LAYERS, WIDTH, device="cuda")
state = torch.load(PATH)
loaded_to = next(iter(state.values())).device
model.load_state_dict(state)
del state

# %% id="13-06"
import gpumem_nb

usual = gpumem_nb.history().iloc[-1]  # the %%gpumem cell above
del model
torch.cuda.empty_cache()

# %% id="13-07"
# %%gpumem --reset-peak -q
with torch.device("meta"):
    model = build(LAYERS, WIDTH)
state = torch.load(PATH, map_location="cuda", mmap=True)
model.load_state_dict(state, assign=True)
shares = model[0].weight.data_ptr() == state["0.weight"].data_ptr()
del state

# %% id="13-08"
meta = gpumem_nb.history().iloc[-1]  # the %%gpumem cell above
print(f"torch.load put the saved tensors on: {loaded_to}")
for name, row in (("build on the GPU, torch.load, load_state_dict", usual),
                  ("meta device, torch.load to the GPU, assign=True", meta)):
    print(f"{name:<50} peak above the cell's start "
          f"{fmt(int(row.peak_allocated_bytes - row.allocated_before_bytes)):>12}; "
          f"allocated after {fmt(int(row.allocated_delta_bytes), signed=True):>12}")
print(f"the weights: {fmt(WEIGHTS)}")
claim(loaded_to.type == "cuda", "torch.load put the tensors back on the GPU they were saved from",
      device=str(loaded_to))
claim(usual.peak_exact and near(usual.peak_allocated_bytes - usual.allocated_before_bytes,
                                2 * WEIGHTS, rel=0.02),
      "the usual load peaks at twice the weights: the model's and the checkpoint's",
      peak=fmt(int(usual.peak_allocated_bytes - usual.allocated_before_bytes)),
      twice_the_weights=fmt(2 * WEIGHTS))
claim(meta.peak_exact and near(meta.peak_allocated_bytes - meta.allocated_before_bytes,
                               WEIGHTS, rel=0.02),
      "built on the meta device and loaded with assign=True, the peak is the weights once",
      peak=fmt(int(meta.peak_allocated_bytes - meta.allocated_before_bytes)),
      weights=fmt(WEIGHTS))
claim(shares, "with assign=True the parameters are the loaded tensors themselves, not copies")
claim(near(usual.allocated_delta_bytes, meta.allocated_delta_bytes, within=MiB),
      "both cells end holding the same: the model's weights once",
      usual=fmt(int(usual.allocated_delta_bytes)), meta=fmt(int(meta.allocated_delta_bytes)))
del model
torch.cuda.empty_cache()

# %% [markdown] id="13-09"
# The usual load's peak is the model's weights plus the checkpoint's, both on the GPU, until
# `load_state_dict` has copied one into the other and the state dict is dropped. After the
# cell both ways hold the same; only the peak differs, and the peak is what runs out of memory.
#
# ## Every way, side by side: GPU and host RAM
#
# A process's peak host RAM cannot be reset, so each way below runs in a fresh process (the
# plumbing is in `fresh_process.py` beside this notebook), two at a time. Each reports:
#
# - **GPU peak**: the allocator's exact peak during the load, above what the process held
#   before it;
# - **built**: what building the model allocated on the GPU, before any loading;
# - **host, anonymous**: the process's peak anonymous memory (`RssAnon`: its own heap, where
#   `torch.load` puts tensors it reads to the CPU) above its start. It is read every
#   millisecond by a thread, and at each step of the load: a shorter spike could be missed;
# - **host, file pages**: the peak of the checkpoint's pages mapped into the process
#   (`RssFile`). These are the kernel's page cache: counted as the process's resident memory,
#   but the kernel can drop them under pressure and read them again from the file.
#
# The ways: the model built on the CPU, loaded there, then moved with `.cuda()`; built on the
# GPU and the file loaded as saved (the usual load above); `map_location="cpu"`; the same with
# `mmap=True`; a `meta` model given GPU memory with `to_empty()`, then the mmapped state dict
# copied in; a `meta` model and `load_state_dict(assign=True)`.

# %% id="13-10"
from fresh_process import run_fresh_many

LOAD = MODEL + r'''
import json, os, threading, time
import torch

LAYERS, WIDTH, PATH, WAY = (int(os.environ["LAYERS"]), int(os.environ["WIDTH"]),
                            os.environ["CKPT"], os.environ["WAY"])
KEYS = ("RssAnon", "RssFile")


def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, _, v in
                (line.partition(":") for line in f) if k in KEYS}


peak = dict.fromkeys(KEYS, 0)


def sample():
    for k, v in status().items():
        peak[k] = max(peak[k], v)


torch.zeros(1, device="cuda")
torch.cuda.synchronize()
start, gpu_start = status(), torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
peak.update(start)
done = threading.Event()


def sampler():
    while not done.is_set():
        sample()
        time.sleep(0.001)


thread = threading.Thread(target=sampler, daemon=True)
thread.start()
if WAY in ("cpu then .cuda()", "GPU, as saved", "map_location='cpu'",
           "map_location='cpu', mmap=True"):
    model = build(LAYERS, WIDTH, device=None if WAY == "cpu then .cuda()" else "cuda")
elif WAY in ("meta, to_empty()", "meta, assign=True"):
    with torch.device("meta"):
        model = build(LAYERS, WIDTH)
    if WAY == "meta, to_empty()":
        model = model.to_empty(device="cuda")
torch.cuda.synchronize()
built = torch.cuda.memory_allocated() - gpu_start
sample()
if WAY == "GPU, as saved":
    state = torch.load(PATH)
elif WAY in ("cpu then .cuda()", "map_location='cpu'"):
    state = torch.load(PATH, map_location="cpu")
elif WAY == "meta, assign=True":
    state = torch.load(PATH, map_location="cuda", mmap=True)
else:
    state = torch.load(PATH, map_location="cpu", mmap=True)
sample()
model.load_state_dict(state, assign=WAY == "meta, assign=True")
sample()
del state
if WAY == "cpu then .cuda()":
    model = model.cuda()
torch.cuda.synchronize()
sample()
done.set()
thread.join()
print(json.dumps({
    "way": WAY, "built": built,
    "gpu_peak": torch.cuda.max_memory_allocated() - gpu_start,
    "gpu_after": torch.cuda.memory_allocated() - gpu_start,
    "anon_peak": peak["RssAnon"] - start["RssAnon"],
    "file_peak": peak["RssFile"] - start["RssFile"],
    "device": str(model[0].weight.device),
    "check": [float(model[0].weight.detach()[0, :8].sum()),
         float(model[-1].weight.detach()[-1, -8:].sum())]}))
'''
WAYS = ["cpu then .cuda()", "GPU, as saved", "map_location='cpu'",
        "map_location='cpu', mmap=True", "meta, to_empty()", "meta, assign=True"]
env = {"LAYERS": str(LAYERS), "WIDTH": str(WIDTH), "CKPT": PATH}
results = run_fresh_many(LOAD, [""] * len(WAYS), workers=2,
                         extra_envs=[dict(env, WAY=way) for way in WAYS])
way = {r["way"]: r for r in results}
print(f"the weights: {fmt(WEIGHTS)}")
print(f"{'way':<32}{'built':>12}{'GPU peak':>12}{'host, anonymous':>18}"
      f"{'host, file pages':>18}")
for r in results:
    print(f"{r['way']:<32}{fmt(r['built']):>12}{fmt(r['gpu_peak']):>12}"
          f"{fmt(r['anon_peak']):>18}{fmt(r['file_peak']):>18}")

# %% [markdown] id="13-11"
# What the table shows, each line checked below:
#
# - **Built on the CPU** (the first row), the model's weights and the loaded state dict are
#   both in host RAM: the anonymous peak is about twice the weights, and the GPU gets them
#   once, at `.cuda()`.
# - **Built on the GPU, loaded as saved**: the doubling moves to the GPU.
# - **`map_location="cpu"`** keeps the checkpoint's copy in host RAM: the GPU holds the weights
#   once, the host holds them once, until the state dict is dropped.
# - **`mmap=True`** reads nothing up front: `load_state_dict` pulls each tensor's pages from the
#   file as it copies it. The anonymous memory hardly moves; the file pages grow instead, and
#   those the kernel can drop.
# - **The `meta` device** builds the model without memory (the `built` column) and without
#   running the random initialisation that the load overwrites anyway. `to_empty()` then gives
#   it uninitialised GPU memory to copy into; `assign=True` skips even that and keeps the
#   loaded tensors.

# %% id="13-12"
claim(all(r["check"] == CHECK and r["device"].startswith("cuda") for r in results),
      "every way ends with the checkpoint's weights, on the GPU",
      ways_checked=len(results))
claim(all(near(r["gpu_after"], WEIGHTS, rel=0.01) for r in results),
      "every way ends holding the weights once on the GPU")
cpu, gpu = way["cpu then .cuda()"], way["GPU, as saved"]
claim(near(cpu["anon_peak"], 2 * WEIGHTS, rel=0.10) and near(cpu["gpu_peak"], WEIGHTS, rel=0.02),
      "built on the CPU, the host holds the weights twice and the GPU once",
      host=fmt(cpu["anon_peak"]), gpu=fmt(cpu["gpu_peak"]), weights=fmt(WEIGHTS))
claim(near(gpu["gpu_peak"], 2 * WEIGHTS, rel=0.02),
      "built on the GPU and loaded as saved, the GPU holds the weights twice",
      gpu=fmt(gpu["gpu_peak"]), twice_the_weights=fmt(2 * WEIGHTS))
mapped = way["map_location='cpu'"]
claim(near(mapped["gpu_peak"], WEIGHTS, rel=0.02) and near(mapped["anon_peak"], WEIGHTS, rel=0.10),
      "map_location='cpu': the weights once on the GPU, once in host RAM",
      gpu=fmt(mapped["gpu_peak"]), host=fmt(mapped["anon_peak"]))
mm = way["map_location='cpu', mmap=True"]
claim(near(mm["gpu_peak"], WEIGHTS, rel=0.02) and mm["anon_peak"] < WEIGHTS / 10
      and near(mm["file_peak"], WEIGHTS, rel=0.15),
      "mmap=True: the host's anonymous memory hardly moves; the file's pages take its place",
      gpu=fmt(mm["gpu_peak"]), anonymous=fmt(mm["anon_peak"]), file_pages=fmt(mm["file_peak"]))
empty, assign = way["meta, to_empty()"], way["meta, assign=True"]
claim(assign["built"] == 0 and empty["built"] == way["map_location='cpu'"]["built"],
      "a meta model allocates nothing until to_empty() gives it the GPU memory a GPU build has",
      meta=fmt(assign["built"]), to_empty=fmt(empty["built"]),
      gpu_build=fmt(way["map_location='cpu'"]["built"]))
claim(all(near(r["gpu_peak"], WEIGHTS, rel=0.02) and r["anon_peak"] < WEIGHTS / 10
          for r in (empty, assign)),
      "to_empty() and assign=True, with an mmapped file, hold the weights once, on the GPU only",
      to_empty=fmt(empty["gpu_peak"]), assign=fmt(assign["gpu_peak"]))

# %% id="13-13"
shutil.rmtree(folder)
print(f"removed {folder}")

# %% [markdown] id="13-14"
# What to take away:
#
# - Build the model, then load, and the weights exist twice for a moment: on the GPU when the
#   checkpoint is loaded as saved from GPU tensors, in host RAM when both are on the CPU.
# - `torch.load(..., map_location="cpu")` moves the second copy to host RAM; adding
#   `mmap=True` makes it the file's pages, which the kernel can drop, instead of the process's
#   own memory.
# - Build on `torch.device("meta")` to allocate nothing and skip the initialisation the load
#   overwrites; then `to_empty(device="cuda")` and `load_state_dict`, or
#   `load_state_dict(state, assign=True)` to keep the loaded tensors as the parameters.
# - The moment that runs out of memory is the load's peak, not what the cell leaves behind:
#   measure it with `%%gpumem --reset-peak`.
