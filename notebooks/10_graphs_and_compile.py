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

# %% [markdown] id="10-00"
# # 10. CUDA graphs and `torch.compile`: memory that `empty_cache` cannot give back
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# A CUDA graph replays a captured sequence of kernels at fixed addresses, so the memory its
# capture allocated must stay where it is: PyTorch gives each graph a *private memory pool*,
# kept apart from the cache every other tensor shares. `torch.compile(mode="reduce-overhead")`
# captures CUDA graphs for you, into a pool of its own. This notebook shows what such a pool
# holds, that `torch.cuda.empty_cache()` leaves it alone while its owner lives, what the OOM
# message and gpumem_nb's explanation say about it, and what frees it.
#
# Everything here is the native allocator's (with or without expandable segments): under
# `cudaMallocAsync` a capture's allocations are the driver's graph memory, not a PyTorch pool.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="10-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import gc

import torch
from claims import claim, near

from gpumem_nb.units import format_bytes as fmt

GiB, MiB = 2**30, 2**20
torch.zeros(1, device="cuda")
print("allocator backend:", torch.cuda.get_allocator_backend())


def pools():
    # Reserved bytes per private pool, from the allocator's segments: the default pool's id
    # is (0, 0); a graph's or torch.compile's pool has another.
    found = {}
    for seg in torch.cuda.memory_snapshot():
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            found[pool] = found.get(pool, 0) + seg["total_size"]
    return found


def explanation():
    # gpumem_nb's explanation of the last OOM, as an object (what `%gpumem oom` prints).
    return get_ipython().run_line_magic("gpumem", "oom -o")

# %% [markdown] id="10-02"
# ## A graph's private pool
#
# The capture below computes `sin(2x) + 1` for a large `x` and keeps the result as the graph's
# static output. As PyTorch's documentation asks, it warms up on a side stream first. The pool
# then holds the intermediate results and the output, at the addresses every replay writes to.
# Entering `torch.cuda.graph` calls `torch.cuda.empty_cache()` to free memory for the capture,
# which gives back the warm-up's cached blocks; the cell empties the cache itself before it
# reads `reserved` (the first line), so that the second shows only what the pool adds.
# (Elementwise kernels only: a matrix product inside a capture would also put a cuBLAS
# workspace for the capture's stream into the pool.)

# %% id="10-03"
x = torch.randn(4096, 4096, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(2):
        torch.sin(x * 2) + 1
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
reserved_warm = torch.cuda.memory_reserved()
torch.cuda.empty_cache()  # what entering torch.cuda.graph does first
reserved_before = torch.cuda.memory_reserved()
print(f"reserved after the warm-up {fmt(reserved_warm)}, after empty_cache() "
      f"{fmt(reserved_before)}")

g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out = torch.sin(x * 2) + 1
torch.cuda.synchronize()
in_pools = pools()
reserved_after = torch.cuda.memory_reserved()
print(f"reserved {fmt(reserved_before)} -> {fmt(reserved_after)}; "
      f"private pools: " + ", ".join(f"{p}: {fmt(n)}" for p, n in in_pools.items()))
allocated = torch.cuda.memory_allocated()
for _ in range(3):
    g.replay()
torch.cuda.synchronize()
print(f"three replays: allocated {fmt(torch.cuda.memory_allocated() - allocated, signed=True)}")
claim(len(in_pools) == 1 and sum(in_pools.values()) >= 2 * x.nbytes
      and near(reserved_after - reserved_before, sum(in_pools.values()), within=2 * MiB),
      "the capture reserved a private pool that holds an intermediate result and the output, "
      "and reserved grew by the pool", pool=fmt(sum(in_pools.values())),
      two_tensors=fmt(2 * x.nbytes),
      reserved_grew=fmt(reserved_after - reserved_before, signed=True))
claim(torch.cuda.memory_allocated() == allocated,
      "replaying the graph allocates nothing: it writes where the capture allocated")

# %% [markdown] id="10-04"
# ## `empty_cache()` leaves it alone
#
# The intermediate results are free once the capture ends, but only inside the pool: their
# blocks are kept for the graph's next replay, at the same addresses.
# `torch.cuda.empty_cache()` returns the default pool's free segments to the driver; a live
# graph's pool is not among them.

# %% id="10-05"
torch.cuda.empty_cache()
after = pools()
print("after empty_cache(): private pools "
      + ", ".join(f"{p}: {fmt(n)}" for p, n in after.items()))
claim(after == in_pools, "empty_cache() gave back none of the live graph's pool",
      before=fmt(sum(in_pools.values())), after=fmt(sum(after.values())))

# %% [markdown] id="10-06"
# ## What the OOM says about a pool
#
# A pool also keeps whatever the capture allocated and freed: a large temporary inside a
# capture stays reserved for that graph alone. The next cells capture a graph whose step uses
# a temporary of most of the GPU's free memory, then ask for about as much again.

# %% id="10-07"
free, _ = torch.cuda.mem_get_info()
big_graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(big_graph):
    tmp = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")
    tmp.zero_()
    big_out = static_out + tmp[:1].float()
    del tmp
torch.cuda.synchronize()
print(f"captured; private pools: {', '.join(f'{p}: {fmt(n)}' for p, n in pools().items())}")

# %% id="10-08" tags=["raises-exception"]
y = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")

# %% id="10-09"
found = explanation()
text = str(found)
print(next((ln for ln in text.splitlines() if ln.startswith("Cause:")), "(no cause line)"))
claim(found is not None and found.causes[0].kind == "memory pool",
      "gpumem_nb names a private memory pool as the cause",
      cause=found.causes[0].kind if found is not None and found.causes else None)
claim("CUDA graph big_graph" in text and "empty_cache() cannot release it" in text,
      "it names the graph that owns the pool, and says empty_cache() cannot release it")

# %% [markdown] id="10-10"
# PyTorch's own message counts the pool in a clause of its own ("allocated in private pools
# (e.g., CUDA Graphs)"): memory that is neither your tensors nor the shared cache.
#
# ## What frees a graph's pool
#
# Deleting the graph and every tensor its capture made (here the static outputs): the pool is
# then released as a whole, at the next `empty_cache()`.

# %% id="10-11"
del big_graph, big_out, g, static_out
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
left = pools()
print(f"after del and empty_cache(): private pools {left or 'none'}; reserved "
      f"{fmt(torch.cuda.memory_reserved())}")
claim(left == {}, "with the graphs and their outputs gone, empty_cache() released both pools",
      pools_left=len(left))

# %% [markdown] id="10-12"
# ## `torch.compile(mode="reduce-overhead")`
#
# The same mechanism, automated: after a warm-up call, `reduce-overhead` records the compiled
# function into CUDA graphs ("CUDA graph trees") and replays them, all sharing one private pool
# that the graph trees keep. Its outputs live in that pool and are overwritten by the
# next call, so keep a copy (`.clone()`) of what you want to hold on to.
#
# The first call compiles (seconds); the next ones record and replay.

# %% id="10-13"
def spread(a):
    return (a.sin() * 2).exp()  # one fused kernel, an output as large as its input


fast = torch.compile(spread, mode="reduce-overhead")
a = torch.randn(16384, 4096, device="cuda")
for _ in range(3):
    kept = fast(a).clone()
torch.cuda.synchronize()
compiled_pools = pools()
print(f"after three calls: private pools "
      f"{', '.join(f'{p}: {fmt(n)}' for p, n in compiled_pools.items()) or 'none'}")
in_use = sum(seg["allocated_size"] for seg in torch.cuda.memory_snapshot()
             if tuple(seg.get("segment_pool_id") or (0, 0)) in compiled_pools)
print(f"  of it allocated (tensors the graph trees keep): {fmt(in_use)}; free blocks kept for "
      f"the pool's own allocations: {fmt(sum(compiled_pools.values()) - in_use)}; "
      f"one output: {fmt(a.nbytes)}")
torch.cuda.empty_cache()
still = pools()
print(f"after empty_cache(): {', '.join(f'{p}: {fmt(n)}' for p, n in still.items()) or 'none'}")
claim(compiled_pools and sum(compiled_pools.values()) >= a.nbytes,
      "reduce-overhead keeps a private pool of at least one output's size, whatever of it is "
      "still allocated", pool=fmt(sum(compiled_pools.values())), output=fmt(a.nbytes),
      allocated_in_it=fmt(in_use))
claim(still == compiled_pools, "empty_cache() gave back none of it",
      before=fmt(sum(compiled_pools.values())), after=fmt(sum(still.values())))

# %% [markdown] id="10-14"
# ## What frees `torch.compile`'s pool
#
# The pool belongs to the CUDA graph trees that `torch.compile` keeps for the device, not to a
# variable of yours: `del fast` leaves it (the first line below). Its size is not what its
# tensors hold: the second line above splits it into what is still allocated in it (each
# call's output was dropped once `kept` had its copy, which lives outside the pool) and the
# free blocks it keeps for the next replays. Resetting the compiler and
# the graph trees lets it go, and the next `empty_cache()` returns it. The cell resets both at
# once, so it does not show which of the two alone would free it.

# %% id="10-15"
import torch._inductor.cudagraph_trees as trees

del fast
gc.collect()
torch.cuda.empty_cache()
after_del = pools()
print(f"after del fast: {', '.join(f'{p}: {fmt(n)}' for p, n in after_del.items()) or 'none'}")
torch.compiler.reset()
trees.reset_cudagraph_trees()
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
after_reset = pools()
print(f"after torch.compiler.reset() and reset_cudagraph_trees(): "
      f"{', '.join(f'{p}: {fmt(n)}' for p, n in after_reset.items()) or 'none'}")
claim(after_reset == {}, "resetting the compiler and the graph trees released it",
      pools_left=len(after_reset))

# %% [markdown] id="10-16"
# What to take away:
#
# - A CUDA graph, and `torch.compile(mode="reduce-overhead")`, keep a private pool:
#   `reserved` counts it, `empty_cache()` leaves it alone while its owner lives, and PyTorch's
#   OOM message lists it in a clause of its own.
# - A graph's pool goes with the graph and the tensors its capture made; `torch.compile`'s
#   with `torch.compiler.reset()` and the graph trees' reset.
# - A large temporary inside a capture stays reserved for that graph alone: capture smaller
#   steps, or let graphs share one pool (`torch.cuda.graph(g, pool=other.pool())`).
