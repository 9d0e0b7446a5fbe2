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

# %% [markdown] id="09-00"
# # 9. Will it fit on a smaller GPU?
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# "It trains on the big GPU; will it fit on the smaller one?" The peak `reserved` of a run with
# room to spare does not answer that: when a `cudaMalloc` fails, the native allocator frees its
# cache and retries before it raises (notebook 4 measures the retry), so a run can fit in less
# than it reserved. This notebook answers the question three ways, for one training run, and
# checks that they agree:
#
# 1. **a real run under a cap**: `torch.cuda.set_per_process_memory_fraction` makes this GPU as
#    small as the smaller one, in a fresh process;
# 2. **one traced cell and `%gpumem whatif --fit`**: the cell's allocations replayed on the CPU
#    under smaller and smaller caps, for several allocator settings at once;
# 3. **the session's recording**, `%gpumem record on` and then `%gpumem whatif --session
#    --fit`: every cell since the recording began, replayed from an empty GPU, as if you
#    restarted the kernel under each setting and ran the same cells again.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="09-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import gc

import torch
from claims import claim, near
from fresh_process import run_fresh_many

import gpumem_nb
from gpumem_nb.units import format_bytes as fmt

GiB, MiB = 2**30, 2**20
SMALLER_GB = 16  # the smaller GPU
SETTINGS = ["", "expandable_segments:True", "max_split_size_mb:256"]
CONFS = " ".join(f"--conf {conf}" for conf in SETTINGS[1:])  # "" is the default

# %% [markdown] id="09-02"
# ## Record the session from the start
#
# The third way needs the allocator's history from an empty GPU, so it starts first.
# `%gpumem record on --start-cuda` starts CUDA (gpumem_nb never does unless asked) and keeps
# PyTorch's allocation history for every cell from here on; `--max-entries` makes room for
# every event of this notebook (a full ring buffer would drop the oldest, and the replay would
# no longer start from the empty GPU).

# %% id="09-03"
# %gpumem record on --start-cuda --max-entries 500000

# %% [markdown] id="09-04"
# ## The run
#
# Twelve transformer layers trained with AdamW on batches whose sequence length changes from
# step to step. The code is kept as a string, so that exactly the same steps run here and in
# the fresh processes below. Here it runs as a notebook would: the model in one cell, the
# training steps in the next.

# %% id="09-05"
WORK = r'''
import json, torch
from torch import nn


def build():
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
              for _ in range(12)]
    model = nn.Sequential(*layers).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train(model, opt):
    g = torch.Generator().manual_seed(1)
    for length in (1024, 768, 896, 1024):  # sequence lengths that change
        x = torch.randn(16, length, 1024, generator=g).cuda()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x
    torch.cuda.synchronize()
'''
exec(WORK)  # defines build() and train() in this kernel
model, opt = build()
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")

# %% id="09-06"
train(model, opt)
print(f"on this GPU: peak allocated {fmt(torch.cuda.max_memory_allocated())}, "
      f"peak reserved {fmt(torch.cuda.max_memory_reserved())}")

# %% [markdown] id="09-07"
# ## 1. A real run under a cap
#
# The most direct answer: run the same cells again in a fresh process whose PyTorch may reserve
# no more than the smaller GPU would leave it, and see whether it runs out of memory. It takes
# a whole run per question, and another run for each setting you want to compare.

# %% id="09-08"
CAPPED = "import os, torch\n" + WORK + r'''
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(int(os.environ["TUTORIAL_CAP"]) / total)
try:
    model, opt = build()
    train(model, opt)
    oom = False
except torch.OutOfMemoryError:
    oom = True
print(json.dumps({"oom": oom, "peak_reserved": torch.cuda.max_memory_reserved()}))
'''
# What an N GB GPU leaves PyTorch, as `--fit` below takes it: N GiB less two things PyTorch
# can never have. One is what the driver reserves for itself (NVML's total less CUDA's:
# notebook 1), read from this GPU and taken as the smaller one's. The other is this process's
# memory outside PyTorch (its CUDA context and libraries), read now.
device = gpumem_nb.snapshot().sample.devices[0]
RESERVE = device.nvml.driver_reserved_bytes if device.nvml else None
RESERVE = 615 * MiB if RESERVE is None else RESERVE  # an NVML without the v2 call: the H200's
CONTEXT = device.outside_pytorch_bytes or 512 * MiB
ROOM = SMALLER_GB * GiB - RESERVE - CONTEXT
(real,) = run_fresh_many(CAPPED, [""], extra_envs=[{"TUTORIAL_CAP": str(ROOM)}])
fits_for_real = not real["oom"]
print(f"a {SMALLER_GB} GB GPU leaves PyTorch about {fmt(ROOM)} (the driver's reserve "
      f"{fmt(RESERVE)}, this GPU's; the context {fmt(CONTEXT)}); "
      f"capped there, the run {'fitted' if fits_for_real else 'ran out of memory'} "
      f"(peak reserved {fmt(real['peak_reserved'])})")

# %% [markdown] id="09-09"
# ## 2. One traced cell, replayed under caps
#
# `%%gpumem --trace` records the cell's allocations; `%gpumem whatif --fit N` replays them on
# the CPU under smaller and smaller caps, checked as `set_per_process_memory_fraction`'s cap is
# (with the free-the-cache-and-retry the allocator makes before an OOM), and reports the least
# memory each setting needs and whether that fits an N GB GPU. The traced cell runs the same
# work again. Before it, the next cell frees the first run's model and optimizer and empties
# the cache. `del` alone may not free them: objects in a reference cycle wait for Python's
# garbage collector, which runs when it decides to. So the cell prints what is still allocated
# after `del`, and again after `gc.collect()`; the traced cell starts from the second figure,
# and collects its own model and optimizer at its end the same way.

# %% id="09-10"
del model, opt
torch.cuda.empty_cache()
print(f"allocated after del and empty_cache(): {fmt(torch.cuda.memory_allocated())}")
gc.collect()
torch.cuda.empty_cache()
print(f"after gc.collect() and empty_cache() too: {fmt(torch.cuda.memory_allocated())}")

# %% id="09-11"
# %%gpumem --trace --top 3
model, opt = build()
train(model, opt)
del model, opt
collected = gc.collect()  # a count of objects, not the lesson

# %% id="09-12"
# %gpumem whatif --trace last --fit {SMALLER_GB} {CONFS}

# %% id="09-13"
traced = get_ipython().run_line_magic("gpumem", f"whatif --trace last --fit {SMALLER_GB} "
                                                f"{CONFS} -o")
need = {conf: row.min_bytes for conf, row in zip(SETTINGS, traced.fit.rows)}
default_row = traced.fit.rows[0]
default_fits = traced.fit.fits(default_row, SMALLER_GB)
print(f"the replay: the default needs {fmt(need[''])}; on a {SMALLER_GB} GB GPU "
      f"({fmt(traced.fit.usable_bytes(SMALLER_GB))} for PyTorch, as --fit takes it) it "
      f"{'fits' if default_fits else 'does not fit'}")
claim(traced.rows[0].current and len(traced.fit.rows) == len(SETTINGS) and all(need.values()),
      "the replay found what each setting needs, the recorded (default) setting first",
      settings=len(need))
claim(default_fits == fits_for_real,
      "the replay's answer for the smaller GPU is the real capped run's",
      replay="fits" if default_fits else "does not fit",
      real="fitted" if fits_for_real else "ran out of memory")
split = next(r for r in traced.rows if r.setting == "max_split_size_mb:256")
split_fit = next(r for r in traced.fit.rows if r.setting == "max_split_size_mb:256")
claim(split.peak_reserved_bytes is not None and split.peak_reserved_bytes > ROOM
      and bool(traced.fit.fits(split_fit, SMALLER_GB)),
      f"under max_split_size_mb:256 the run reserves more at its peak than a {SMALLER_GB} GB "
      "GPU leaves PyTorch, yet fits there",
      peak_reserved=fmt(split.peak_reserved_bytes or 0), room=fmt(ROOM),
      needs=fmt(split_fit.min_bytes or 0))

# %% [markdown] id="09-14"
# One capped run answers one question for one setting; the replay answers every setting at
# once, and gives the least memory each needs, not only yes or no. That figure is checked the
# same way as the single answer: a real run for each setting, capped a margin above its need
# and a margin below it (`MARGIN`, printed). Where two settings' needs differ by less than that
# margin, as the three do here, the replay's "needs the least" picks one of near-equals: the
# capped runs check each need to the margin, not which setting is lower.
#
# The smaller GPU also shows that peak `reserved` is not what a run needs:
# `max_split_size_mb:256` reserves more at its peak (the first table) than the smaller GPU
# leaves PyTorch, yet needs less than that (the second), and the last ✓ line above checks both.

# %% id="09-15"
MARGIN = 0.03
torch.cuda.empty_cache()  # room on this GPU for the runs beside this kernel
jobs = [(conf, sign) for conf in SETTINGS for sign in (+1, -1)]
capped = run_fresh_many(CAPPED, [conf for conf, _ in jobs], workers=3,
                        extra_envs=[{"TUTORIAL_CAP": str(int(need[conf] * (1 + s * MARGIN)))}
                                    for conf, s in jobs])
by_job = dict(zip(jobs, capped))
print(f"{'setting':<30}{'needs':>12}{f'+{MARGIN:.0%}: OOM?':>14}{f'-{MARGIN:.0%}: OOM?':>14}")
for conf in SETTINGS:
    print(f"{conf or '(default)':<30}{fmt(need[conf]):>12}"
          f"{'yes' if by_job[(conf, +1)]['oom'] else 'no':>14}"
          f"{'yes' if by_job[(conf, -1)]['oom'] else 'no':>14}")
claim(not any(by_job[(c, +1)]["oom"] for c in SETTINGS),
      f"capped {MARGIN:.0%} above its need, every setting fitted",
      ran_out=[c or "default" for c in SETTINGS if by_job[(c, +1)]["oom"]])
claim(all(by_job[(c, -1)]["oom"] for c in SETTINGS),
      f"capped {MARGIN:.0%} below its need, every setting ran out of memory",
      fitted_anyway=[c or "default" for c in SETTINGS if not by_job[(c, -1)]["oom"]])

# %% [markdown] id="09-16"
# ## 3. The whole session, as if restarted under each setting
#
# A traced cell needs you to know which cell matters. The session recording needs nothing:
# `%gpumem whatif --session` replays every allocation since `%gpumem record on`, from the empty
# GPU it started on, which is what restarting the kernel under each setting and running the
# same cells would do. This session ran the work twice (the two cells of "The run", then the
# traced cell), one after the other, with the first run's model and optimizer freed and the
# cache emptied in between (the two lines printed before the traced cell say what stayed
# allocated), so it should need what one run needs: the check below compares the two.

# %% id="09-17"
# %gpumem whatif --session --fit {SMALLER_GB} {CONFS}

# %% id="09-18"
session = get_ipython().run_line_magic("gpumem", f"whatif --session --fit {SMALLER_GB} "
                                                 f"{CONFS} -o")
session_need = session.fit.rows[0].min_bytes
print(f"the session replayed from its start: the default needs {fmt(session_need)}; the "
      f"traced cell alone: {fmt(need[''])}")
claim(session_need is not None and near(session_need, need[""], rel=0.05, within=64 * MiB),
      "the session and the traced cell need the same memory, within 5%",
      session=fmt(session_need or 0), traced=fmt(need[""]))
claim(session.fit.fits(session.fit.rows[0], SMALLER_GB) == fits_for_real,
      "restarted under the default, the session's answer for the smaller GPU is the real "
      "capped run's", real="fitted" if fits_for_real else "ran out of memory")

# %% id="09-19"
# %gpumem record off

# %% [markdown] id="09-20"
# What to take away:
#
# - Peak `reserved` on a large GPU is an upper bound on what a run needs, not the answer: the
#   allocator flushes its cache and retries before it raises.
# - A run under `set_per_process_memory_fraction` answers for this GPU with that much memory,
#   one setting and one size at a time, in a fresh process (the fraction caps this process only;
#   the settings are read when CUDA starts). Another GPU model has its own context, driver
#   reserve, workspace sizes and kernels: keep a margin there, or make one real run on it.
# - `%gpumem whatif --fit` turns one traced cell into the least memory each setting needs;
#   `%gpumem whatif --session --fit` does it for everything since `%gpumem record on`, as if
#   restarted. The capped runs above are the proof, not a step you need.
# - The replay models the native allocator (with or without expandable segments);
#   `cudaMallocAsync` is the driver's, and only a capped run answers for it.
