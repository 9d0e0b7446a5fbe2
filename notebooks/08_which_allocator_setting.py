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

# %% [markdown] id="08-00"
# # 8. Which allocator setting for my workload?
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# PyTorch's out-of-memory message (the native allocator's) ends with the same advice every
# time: "try setting `expandable_segments:True`". It says so even when nothing is reserved but
# unallocated (notebook 4 prints it so) and even when the setting is already on
# (pytorch/pytorch#173049). Whether that helps *your* workload, or whether `max_split_size_mb`
# or `roundup_power2_divisions` would help more, usually means restarting the kernel under each
# setting and running again. This notebook does it in one pass instead:
#
# 1. trace a real training run once, under the default allocator (`%%gpumem --trace`);
# 2. replay that trace through a model of PyTorch's caching allocator under the alternatives
#    (`%gpumem whatif`), without running anything on the GPU again;
# 3. ask the replay two different questions: which setting holds the least at its peak, and
#    which fits in the least memory (`%gpumem whatif --fit`);
# 4. prove both answers: run the same workload for real in a fresh process under each setting,
#    once without a cap and twice under a cap (`set_per_process_memory_fraction`) just above
#    and just below what the replay says it needs.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="08-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import os
import tempfile

import torch
from claims import claim, near
from fresh_process import run_fresh_many

import gpumem_nb
from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.zeros(1, device="cuda");  # tracing needs CUDA started: gpumem_nb never starts it

# %% [markdown] id="08-02"
# ## The workload
#
# A GPT-2-shaped language model (eight layers, 768 wide) built by Hugging Face `transformers`
# from a config (no weights are downloaded), trained with AdamW on batches whose sequence length
# changes from step to step, as with unpadded text. Changing sizes are what make a caching
# allocator's choices matter: a block cached for one length is too small, or too big, for the
# next.
#
# The workload is one piece of code, kept as a string, so that exactly the same steps run in
# this kernel (traced) and later in the fresh processes (for real, under each setting). It
# builds the model on the GPU, then trains; the garbage collector waits until the end, so that
# every run frees the same objects at the same moment.

# %% id="08-03"
WORKLOAD = r'''
import gc, json, torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel

# GPT2Config's default token ids lie outside this vocabulary and it names no loss type:
# transformers warns about both, which changes nothing measured here.
transformers.logging.set_verbosity_error()


def train():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=8, n_embd=768, n_head=12, n_positions=1024, vocab_size=32000)
    model = GPT2LMHeadModel(config).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    for length in (512, 384, 448, 512):  # sequence lengths that change
        ids = torch.randint(0, config.vocab_size, (8, length), generator=g).to("cuda")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, ids


def run_workload():
    gc.collect()
    gc.disable()
    try:
        train()
    finally:
        gc.collect()
        gc.enable()
    torch.cuda.synchronize()
'''
MEASURE = "import torch; torch.zeros(1, device='cuda')\n" + WORKLOAD + r'''
torch.cuda.reset_peak_memory_stats()
run_workload()
print(json.dumps({"backend": torch.cuda.get_allocator_backend(),
                  "peak_reserved": torch.cuda.max_memory_reserved(),
                  "end_reserved": torch.cuda.memory_reserved()}))
'''
exec(WORKLOAD)  # defines train() and run_workload() in this kernel
snapshot_path = os.path.join(tempfile.gettempdir(), "gpumem_08_train.pickle")
torch.cuda.reset_peak_memory_stats()

# %% [markdown] id="08-04"
# ## 1. Trace it once
#
# `%%gpumem --trace` records every allocation and free of the cell; `--save` keeps the recording
# as a snapshot file, the same format as `torch.cuda.memory._dump_snapshot`.

# %% id="08-06"
# %%gpumem --trace --top 3 --save {snapshot_path}
run_workload()

# %% id="08-07"
traced = {"peak_reserved": torch.cuda.max_memory_reserved(),
          "end_reserved": torch.cuda.memory_reserved()}
print(f"this kernel, default allocator: peak reserved {fmt(traced['peak_reserved'])}, "
      f"reserved at the end {fmt(traced['end_reserved'])}")

# %% [markdown] id="08-08"
# The trace's `leak candidates` are what was still allocated when the cell ended, and they are
# no leak: the model and optimizer are local to `train()`, and the cell's `allocated` change is
# their sum. They are cuBLAS's workspaces, which PyTorch keeps per thread and stream for the
# next matrix product (notebook 2 traces them): the forward pass's were allocated under the
# `addmm` line; the backward pass runs on autograd's own thread, and the allocations made there
# carry no Python stack.
#
# ## 2. Replay it under the alternatives
#
# `%gpumem whatif` replays the last traced cell through a model of the native caching
# allocator (it follows `c10/cuda/CUDACachingAllocator.cpp`: the pools, the rounding of
# requests, the split rule, `max_split_size_mb`, `roundup_power2_divisions`, expandable
# segments' pages). One row per setting: the peak and final `reserved`, the saving against the
# setting it ran under, what sits stranded in split blocks at the peak, how many `cudaMalloc`
# and `cudaFree` calls it would make, and whether the cell would run out of memory on this GPU.
# `cudaMallocAsync` lives inside the driver and is not modelled. The replay runs on the CPU;
# nothing touches the GPU.

# %% id="08-09"
SETTINGS = ["", "expandable_segments:True", "max_split_size_mb:64", "max_split_size_mb:256",
            "roundup_power2_divisions:4", "roundup_power2_divisions:[32:4,>:2]"]
ALTERNATIVES = " ".join(f"--conf {conf}" for conf in SETTINGS[1:])  # "" is the default
# %gpumem whatif --trace last {ALTERNATIVES}

# %% [markdown] id="08-16"
# The same replay as data: `gpumem_nb.whatif(snapshot, settings)` takes the saved snapshot and
# a list of `PYTORCH_ALLOC_CONF` strings, and returns one row per setting. Replayed under the
# setting it ran with, the trace must give back this kernel's own peak: that is the first
# check of the model.

# %% id="08-10"
predicted = gpumem_nb.whatif(snapshot_path, SETTINGS)
default = predicted[0]
print(f"replayed under the default: peak reserved {fmt(default.peak_reserved_bytes)}; "
      f"this kernel's real peak {fmt(traced['peak_reserved'])}")
claim(near(default.peak_reserved_bytes, traced["peak_reserved"],
           within=max(20 * MiB, 0.01 * traced["peak_reserved"])),
      "replayed under the setting it ran with, the trace predicts this kernel's own peak "
      "within 1% or one 20 MiB segment",
      predicted=fmt(default.peak_reserved_bytes), real=fmt(traced["peak_reserved"]))

# %% [markdown] id="08-11"
# ## 3. Two questions, two answers
#
# **How much does this process hold at its peak?** That is the peak `reserved` with no memory
# pressure, the column above. It matters beside another process: no other process can use
# this process's cache.
#
# **Does the run fit on a smaller GPU?** The peak `reserved` does not say. When a `cudaMalloc`
# fails, the native allocator frees its cache and retries before it raises (notebook 4
# measures the retry), so a run can fit in less than its peak `reserved`; under
# `max_split_size_mb` the oversize blocks are the first to go. Only a run under a cap answers
# it: the section after this one replays the trace under smaller and smaller caps.
#
# First question: the lowest peak `reserved`, among the settings that do not run out of memory
# on this GPU.

# %% id="08-12"
rows = dict(zip(SETTINGS, predicted))
fits = [(row.peak_reserved_bytes, conf) for conf, row in rows.items() if not row.oom]
best_peak, best = min(fits)
saving = 1 - best_peak / default.peak_reserved_bytes
print(f"best predicted: {best or '(default)'}, peak reserved {fmt(best_peak)}, "
      f"{saving:.1%} below the default's {fmt(default.peak_reserved_bytes)}")
print(f"stranded in split blocks at the peak (the replay's figure): default "
      f"{fmt(default.inactive_split_bytes)}, {best or '(default)'} "
      f"{fmt(rows[best].inactive_split_bytes)}")
claim(best == "expandable_segments:True"
      and rows[best].inactive_split_bytes < default.inactive_split_bytes,
      "expandable segments are predicted to hold the least at the peak, with less stranded",
      best=best or "(default)", stranded=fmt(rows[best].inactive_split_bytes),
      default_stranded=fmt(default.inactive_split_bytes))

# %% [markdown] id="08-13"
# Expandable segments win the replay. With the sequence length changing, the default allocator
# cuts each step's tensors out of segments sized for earlier steps; the free pieces left inside
# segments that still hold live tensors (*stranded*) cannot serve a larger request, so it asks
# the driver for new segments. Expandable segments make no `cudaMalloc` per segment: each
# stream's segment reserves address space once and maps pages into it where they are needed
# (`cuMemCreate`, `cuMemMap`), so less is stranded (the line above). That line is the
# replay's figure: the real runs below check the peaks, not what is stranded, and the replay's
# `cudaMalloc` column is its count of new segments under the native allocator's name.
#
# ## 4. Prove it
#
# A prediction is only as good as its check. PyTorch reads allocator settings once per
# process, so each setting runs the same workload for real in a fresh process (the plumbing is
# in `fresh_process.py` beside this notebook), all at once: each reads only its own
# statistics. Predicted and real, side by side:

# %% id="08-14"
real = run_fresh_many(MEASURE, SETTINGS, workers=len(SETTINGS))
real_by = dict(zip(SETTINGS, real))
print(f"{'setting':<38}{'peak reserved':>36}{'reserved at the end':>28}")
print(f"{'':<38}{'predicted':>14}{'real':>14}{'error':>8}{'predicted':>14}{'real':>14}")
for conf, p, r in zip(SETTINGS, predicted, real):
    error = p.peak_reserved_bytes / r["peak_reserved"] - 1
    print(f"{conf or '(default)':<38}{fmt(p.peak_reserved_bytes):>14}"
          f"{fmt(r['peak_reserved']):>14}{error:>+8.2%}{fmt(p.end_reserved_bytes):>14}"
          f"{fmt(r['end_reserved']):>14}")
claim(all(near(p.peak_reserved_bytes, r["peak_reserved"],
               within=max(20 * MiB, 0.02 * r["peak_reserved"]))
          for p, r in zip(predicted, real)),
      "every predicted peak is within 2% (or one 20 MiB segment) of the real one",
      errors={c or "default": f"{p.peak_reserved_bytes / r['peak_reserved'] - 1:+.2%}"
              for c, p, r in zip(SETTINGS, predicted, real)})
real_saving = 1 - real_by[best]["peak_reserved"] / real_by[""]["peak_reserved"]
print(f"{best}: predicted saving {saving:.1%}, real saving {real_saving:.1%}")
claim(abs(real_saving - saving) <= 0.02,
      "the saving the replay promised is the saving the real run gave, within 2 points",
      predicted=f"{saving:.1%}", real=f"{real_saving:.1%}")
claim(min(real_by, key=lambda c: real_by[c]["peak_reserved"]) == best,
      "the setting the replay picked is the best one for real too")
claim(all(real_by[c]["peak_reserved"] > real_by[""]["peak_reserved"]
          for c in ("max_split_size_mb:64", "max_split_size_mb:256")),
      "for real, max_split_size_mb makes this workload's peak higher, not lower",
      **{c or "default": fmt(real_by[c]["peak_reserved"])
         for c in ("", "max_split_size_mb:64", "max_split_size_mb:256")})

# %% [markdown] id="08-17"
# ## 5. Will it fit in less memory?
#
# `--fit` replays the trace under smaller and smaller caps on what PyTorch may reserve,
# checked as `set_per_process_memory_fraction`'s cap is (with the allocator's free-the-cache-
# and-retry before an OOM), until it runs out: the smallest cap that still fits is the memory
# each setting needs. Its table also says which common GPU sizes that fits on (an N GB GPU
# taken as N GiB less what the driver reserves for itself, read from this GPU (notebook 1),
# and less what the CUDA context holds; the table's first line prints both. Another GPU model's
# reserve and context differ from this one's, so a size within a few hundred MiB of the
# answer is a borderline case that only a run on that GPU settles).

# %% id="08-18"
# %gpumem whatif --trace last --fit {ALTERNATIVES}

# %% id="08-19"
fitted = gpumem_nb.whatif(snapshot_path, SETTINGS, fit=True)
needs = {conf: r.min_bytes for conf, r in zip(SETTINGS, fitted.fit.rows)}
print(f"{'setting':<38}{'needs':>14}{'peak reserved, no cap':>24}")
for conf, row in rows.items():
    need = fmt(needs[conf]) if needs[conf] else "not found"
    print(f"{conf or '(default)':<38}{need:>14}{fmt(row.peak_reserved_bytes):>24}")
claim(len(fitted.fit.rows) == len(SETTINGS) and all(needs.values()),
      "the replay found what every setting needs", settings=len(needs))
cheapest = min(needs, key=needs.get)
print(f"fits in the least memory: {cheapest or '(default)'}, {fmt(needs[cheapest])}; holds "
      f"the least at its peak: {best or '(default)'}: "
      f"{'the same setting' if cheapest == best else 'two different settings'}")
claim(needs[""] < default.peak_reserved_bytes,
      "the default allocator needs less than its peak reserved: under a cap it frees its "
      "cache and retries before it would run out", needs=fmt(needs[""]),
      peak_reserved=fmt(default.peak_reserved_bytes))

# %% [markdown] id="08-20"
# ### Prove it: real runs under a cap
#
# Each setting runs the workload for real again, in fresh processes, capped with
# `torch.cuda.set_per_process_memory_fraction` at what the replay says it needs, plus a margin
# and minus one (`MARGIN`, printed). If the replay is right, every run above its need fits and
# every run below it runs out of memory.

# %% id="08-21"
MARGIN = 0.03
CAPPED = "import torch; torch.zeros(1, device='cuda')\n" + WORKLOAD + r'''
import os
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(float(os.environ["TUTORIAL_CAP"]) / total)
try:
    run_workload()
    oom = False
except torch.OutOfMemoryError:
    oom = True
print(json.dumps({"oom": oom, "peak_reserved": torch.cuda.max_memory_reserved()}))
'''
jobs = [(conf, sign) for conf in SETTINGS for sign in (+1, -1)]
capped = run_fresh_many(
    CAPPED, [conf for conf, _ in jobs], workers=len(SETTINGS),
    extra_envs=[{"TUTORIAL_CAP": str(int(needs[conf] * (1 + sign * MARGIN)))}
                for conf, sign in jobs])
by_job = dict(zip(jobs, capped))
print(f"capped {MARGIN:.0%} above and {MARGIN:.0%} below what the replay says each needs:")
print(f"{'setting':<38}{'needs':>12}{'above: OOM?':>14}{'below: OOM?':>14}")
for conf in SETTINGS:
    above, below = by_job[(conf, +1)], by_job[(conf, -1)]
    print(f"{conf or '(default)':<38}{fmt(needs[conf]):>12}"
          f"{'yes' if above['oom'] else 'no':>14}{'yes' if below['oom'] else 'no':>14}")
claim(not any(by_job[(c, +1)]["oom"] for c in SETTINGS),
      f"capped {MARGIN:.0%} above what the replay says it needs, every setting ran without an "
      "OOM", ran_out=[c or "default" for c in SETTINGS if by_job[(c, +1)]["oom"]])
claim(all(by_job[(c, -1)]["oom"] for c in SETTINGS),
      f"capped {MARGIN:.0%} below it, every setting ran out of memory",
      fitted_anyway=[c or "default" for c in SETTINGS if not by_job[(c, -1)]["oom"]])

# %% [markdown] id="08-15"
# What to take away:
#
# - One traced run and a replay answer "which setting?" without restarting the kernel under
#   each; the fresh processes above are the proof, not a step you need.
# - "Which setting?" is two questions. The lowest peak `reserved` (section 3) is what this
#   process holds beside others; the least memory it fits in (section 5) decides a smaller GPU,
#   and only a run under a cap shows it, because the allocator frees its cache and retries
#   before an OOM. The line under the `--fit` table says whether one setting answers both here.
# - The answers are this workload's. Here the replay's pick for the peak was also the real
#   winner, and `max_split_size_mb`, the setting most often suggested against fragmentation,
#   raised the peak `reserved` for real (the ✓ lines of section 4): blocks above its limit are
#   never split, so each large request needs a cached block of about its own size. What it
#   needs under a cap is in the `--fit` rows, checked by the capped runs. Another workload can
#   rank them differently: trace your own steps and replay them.
# - Set the winner before CUDA starts (notebook 3): first cell, or `PYTORCH_ALLOC_CONF` in the
#   environment of the kernel.
