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

# %% [markdown] id="15-00"
# # 15. `torch.compile` and input shapes: recompiles, and pools that grow per shape
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** why does my compiled model get slower, and its memory grow, each time the
# prompt length changes?
#
# `torch.compile` specialises what it compiles to the shapes it sees. A new input shape can
# mean a new compilation; with `mode="reduce-overhead"` it also means a new CUDA graph
# recording, and each recording's memory lives in the graph trees' private pool (notebook 10),
# which `empty_cache()` cannot give back. This notebook counts the compilations for each way of
# telling the compiler about shapes (the default, `dynamic=False`, `dynamic=True`,
# `torch._dynamo.mark_dynamic`), then measures the pool cell by cell with `%%gpumem` as new
# lengths arrive, and shows what keeps it from growing: one padded length.
#
# Sizes are set from this GPU's memory. It needs an NVIDIA GPU and torch with CUDA.
#
# > The outputs were produced by running this notebook on the GPU its metadata
# > (`gpumem_nb` key) names, with the driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="15-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import gc

import torch
import torch._dynamo
import torch._inductor.cudagraph_trees as trees
from claims import claim
from torch._dynamo.utils import counters

from gpumem_nb.units import format_bytes as fmt

torch.zeros(1, device="cuda")
BATCH, D = 8, 1024
total = torch.cuda.get_device_properties(0).total_memory
# The longest length's hidden layer (BATCH × length × 4·D float32) is a 64th of the GPU.
LONGEST = max(256, total // 64 // (BATCH * 4 * D * 4) // 256 * 256)
LENGTHS = [LONGEST // 4, LONGEST // 2, LONGEST]
w1 = torch.randn(D, 4 * D, device="cuda") / D**0.5
w2 = torch.randn(4 * D, D, device="cuda") / (4 * D) ** 0.5
inputs = {n: torch.randn(BATCH, n, D, device="cuda") for n in LENGTHS}


def mlp(x):
    return (x @ w1).relu() @ w2


def pools():
    # Reserved bytes per private pool (notebook 10): the default pool's id is (0, 0).
    found = {}
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            found[pool] = found.get(pool, 0) + seg["total_size"]
    return found


def fresh_compiler():
    # Forget every compiled graph and the CUDA graph trees, and release their pool.
    torch.compiler.reset()
    trees.reset_cudagraph_trees()
    counters.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


print(f"lengths {LENGTHS}, batch {BATCH}, width {D}; the longest hidden layer: "
      f"{fmt(BATCH * LONGEST * 4 * D * 4)}")

# %% [markdown] id="15-02"
# ## How many compilations: four ways to tell the compiler about shapes
#
# The same function, compiled afresh four ways, is called with the three lengths and then the
# middle one again. Dynamo's own counter (`counters["stats"]["unique_graphs"]`) says how many
# graphs it compiled:
#
# - **the default** compiles for the first shape exactly; at the second, it marks the length
#   as dynamic and compiles once more, a graph for any length;
# - **`dynamic=False`** compiles one graph per shape (up to `recompile_limit`, then it falls
#   back to eager);
# - **`dynamic=True`**, or **`mark_dynamic(x, 1)`** on the input before the first call,
#   compiles one graph for any length from the start.

# %% id="15-03"
def compiled_graphs(mark=False, **options):
    fresh_compiler()
    fast = torch.compile(mlp, **options)
    with torch.no_grad():
        for n in [*LENGTHS, LENGTHS[1]]:
            x = inputs[n]
            if mark:
                torch._dynamo.mark_dynamic(x, 1)
            fast(x)
    return counters["stats"]["unique_graphs"]


graphs = {"default": compiled_graphs(), "dynamic=False": compiled_graphs(dynamic=False),
          "dynamic=True": compiled_graphs(dynamic=True),
          "mark_dynamic(x, 1)": compiled_graphs(mark=True)}
for way, n in graphs.items():
    print(f"{way:<22}{n} graphs compiled for {len(LENGTHS)} lengths")
claim(graphs["default"] == 2,
      "the default compiles twice: for the first shape, then once for any length",
      graphs=graphs["default"])
claim(graphs["dynamic=False"] == len(LENGTHS), "dynamic=False compiles once per length",
      graphs=graphs["dynamic=False"], lengths=len(LENGTHS))
claim(graphs["dynamic=True"] == graphs["mark_dynamic(x, 1)"] == 1,
      "dynamic=True and mark_dynamic compile once",
      dynamic=graphs["dynamic=True"], mark_dynamic=graphs["mark_dynamic(x, 1)"])

# %% [markdown] id="15-04"
# ## `reduce-overhead`: a recording per length, measured cell by cell
#
# Now `mode="reduce-overhead"`, with the length marked dynamic, so one graph is compiled. Each
# cell below brings one length and calls the compiled function three times (the graph trees
# run a new shape once to warm up, then record it, then replay it). `%%gpumem` measures each
# cell; after each, the cell notes the size of the graph trees' pool. The last cell brings the
# middle length back.

# %% id="15-05"
fresh_compiler()
fast = torch.compile(mlp, mode="reduce-overhead")
for x in inputs.values():
    torch._dynamo.mark_dynamic(x, 1)
pool_after = {}


def three_calls(n):
    with torch.no_grad():
        for _ in range(3):
            checksum = float(fast(inputs[n]).sum())
    torch.cuda.synchronize()
    pool_after[len(pool_after)] = sum(pools().values())
    return checksum


print("compiled lazily: the first call below compiles")

# %% id="15-06"
# %%gpumem -q
checksum = three_calls(LENGTHS[0])

# %% id="15-07"
# %%gpumem -q
checksum = three_calls(LENGTHS[1])

# %% id="15-08"
# %%gpumem -q
checksum = three_calls(LENGTHS[2])

# %% id="15-09"
# %%gpumem -q
checksum = three_calls(LENGTHS[1])

# %% id="15-10"
import gpumem_nb

rows = gpumem_nb.history().iloc[-4:]  # the four %%gpumem cells above
print(f"{'cell: length':<18}{'reserved Δ':>14}{'pool after':>14}{'host RAM Δ':>14}")
for i, (n, row) in enumerate(zip([*LENGTHS, LENGTHS[1]], rows.itertuples(), strict=True)):
    rss = row.rss_after_bytes - row.rss_before_bytes
    print(f"{row.execution_count:>4}: {n:<12}{fmt(int(row.reserved_delta_bytes), signed=True):>14}"
          f"{fmt(pool_after[i]):>14}{fmt(int(rss), signed=True):>14}")
print(f"graphs compiled: {counters['stats']['unique_graphs']}")
claim(counters["stats"]["unique_graphs"] == 1, "one graph was compiled for every length",
      graphs=counters["stats"]["unique_graphs"])
claim(pool_after[0] < pool_after[1] < pool_after[2],
      "yet the pool grew with each new, longer length: each one was recorded",
      **{f"after_length_{n}": fmt(pool_after[i]) for i, n in enumerate(LENGTHS)})
claim(pool_after[3] == pool_after[2] and rows.iloc[-1].reserved_delta_bytes == 0,
      "a length seen before replays its recording: nothing new is reserved",
      pool=fmt(pool_after[3]), reserved_delta=fmt(int(rows.iloc[-1].reserved_delta_bytes)))

# %% [markdown] id="15-11"
# `mark_dynamic` stopped the recompiles (one graph compiled) but not the recordings: a CUDA
# graph replays fixed addresses and fixed sizes, so the graph trees record the compiled graph
# again for each length, in the same private pool, and keep what each recording needs. The
# pool grows with each new, longer length (the `pool after` column), `empty_cache()` cannot
# release it (notebook 10), and a server that sees every prompt length keeps recording
# (pytorch/pytorch#117106). The host RAM column is the compiler's side of the cost.
#
# ## One length for all: pad to a bucket
#
# The cure is to show the graph trees few shapes: pad each input to one length (or to a few
# bucket lengths) and cut the output back. The cell below runs the same three lengths padded
# to the longest, from a fresh compiler.

# %% id="15-12"
fresh_compiler()
fast = torch.compile(mlp, mode="reduce-overhead")
padded = torch.zeros(BATCH, LONGEST, D, device="cuda")
padded_pools = []
with torch.no_grad():
    for n in LENGTHS:
        padded.zero_()
        padded[:, :n] = inputs[n]
        for _ in range(3):
            out = fast(padded)[:, :n].clone()
        torch.cuda.synchronize()
        padded_pools.append(sum(pools().values()))
del out
for n, size in zip(LENGTHS, padded_pools, strict=True):
    print(f"length {n:>6} padded to {LONGEST}: pool {fmt(size)}")
print(f"unpadded, after the three lengths: {fmt(pool_after[2])}")
claim(padded_pools[0] == padded_pools[-1] > 0,
      "padded to one length, the pool is made once and does not grow",
      first=fmt(padded_pools[0]), last=fmt(padded_pools[-1]))
claim(padded_pools[-1] < pool_after[2],
      "and it ends smaller than the pool of one recording per length",
      padded=fmt(padded_pools[-1]), per_length=fmt(pool_after[2]))

# %% id="15-13"
del fast, padded
fresh_compiler()
left = pools()
print(f"after torch.compiler.reset() and reset_cudagraph_trees(): private pools "
      f"{', '.join(fmt(v) for v in left.values()) or 'none'}")
claim(left == {}, "resetting the compiler and the graph trees released the pool",
      pools_left=len(left))

# %% [markdown] id="15-14"
# What to take away:
#
# - Each new input shape can cost a compilation: the default compiles twice and then handles
#   any length; `dynamic=True` or `torch._dynamo.mark_dynamic` compiles once; `dynamic=False`
#   compiles once per shape.
# - With `mode="reduce-overhead"`, each new shape is also a new CUDA graph recording in the
#   graph trees' private pool, dynamic or not: the pool grows per shape and `empty_cache()`
#   does not shrink it.
# - Pad inputs to one length, or a few buckets, to bound the recordings; a length seen before
#   replays without reserving anything.
# - `torch.compiler.reset()` with the graph trees' reset releases the pool.
