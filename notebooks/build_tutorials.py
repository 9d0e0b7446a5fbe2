"""Write the tutorial notebooks (sources only). Their outputs come from executing them on a
real GPU with ``run_tutorials.py``. No measured number is typed into the prose: cells print
every figure with a label, and the prose points at the printed line. Constants the prose
states (the allocator's 512 B blocks, its 2 MiB and 20 MiB segments) are printed too, by a
cell that measures them. ``tests/test_tutorials_numbers.py`` checks that every number with a
unit in a markdown cell appears in an output of the same notebook.

    python notebooks/build_tutorials.py
"""

from __future__ import annotations

import platform
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

PREAMBLE = (
    "> The outputs in this notebook were produced by running it on an NVIDIA H200; the "
    "notebook's metadata (`gpumem_nb` key) records the GPU, driver, torch and gpumem_nb "
    "versions, commit and date. The text quotes no measured figure of its own: it points at "
    "the printed lines, so what you read is what the cells measured."
)


def md(text: str) -> dict:
    return {"kind": "markdown", "source": text.strip()}


def code(text: str, runs: int = 1, raises: bool = False) -> dict:
    return {"kind": "code", "source": text.strip(), "runs": runs, "raises": raises}


# ------------------------------------------------------------------------------------------
# 00: the quickstart. It must run to the end anywhere: no GPU, even no torch (CI, Binder).
# ------------------------------------------------------------------------------------------
NB00 = [
    md(r"""
# 0. Quickstart: gpumem_nb in five minutes

gpumem_nb watches memory while you work in a notebook: NVML's view of the GPU (what
`nvidia-smi` shows), PyTorch's allocator (`allocated`, `reserved`), and host RAM. It measures
every cell, notices when re-running a cell keeps eating memory, says who holds it, and frees
it safely.

**This notebook runs anywhere, with or without a GPU.** Without an NVIDIA GPU (a laptop,
Binder, CI), the chart plays back a session recorded on an H200 (the *replay* mode), so you
can learn to read it. Your own cells are still measured live: on such a machine that means
host RAM only, and the GPU columns show `—`. Without torch, the examples use NumPy arrays.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
"""),
    md(r"""
The line above says what gpumem_nb found: which GPU, or why there is none. Loading it never
imports torch and never touches the GPU.

The next cell finds out what this machine has. `torch.cuda.is_available()` does not start
CUDA; on a GPU machine, `get_device_name` then prints which GPU the cells below use.
"""),
    code(r"""
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
"""),
    md(r"""
## 1. The chart

`%gpumem watch` draws the chart. Here it replays the bundled H200 recording on every machine,
so that everyone sees the same story; the caption under it says what was recorded. Reading it:

- **NVML used** (dashed, on top): what `nvidia-smi` reports for the whole GPU, every process
  included;
- **reserved**: what PyTorch's caching allocator holds from the driver, live tensors plus its
  cache;
- **allocated**: live tensors only;
- **host RAM**: this process's resident memory;
- the gap between *NVML used* and *reserved* is memory outside PyTorch's allocator, mostly the
  CUDA context; the gap between *reserved* and *allocated* is the cache.

In the recording you can see CUDA start (NVML jumps before any tensor exists), weights load
(all three rise), training steps (allocated spikes, reserved keeps the high-water mark), a
`del` (allocated falls, reserved and NVML do not), `empty_cache` (reserved and NVML fall),
and re-runs that keep results alive until a cleanup.

In a notebook with a frontend the chart is live; saved notebooks keep a static picture of it.
On a GPU machine `%gpumem watch --live` switches it to this machine's own memory.
"""),
    code(r"""
%gpumem watch --replay bundled
"""),
    md(r"""
## 2. Measure one cell: `%%gpumem`

Put `%%gpumem` on the first line of a cell to get its time, the allocator's exact peak during
the cell (GPU), the changes in `allocated`, `reserved` and NVML, and the host RAM change.
"""),
    code(r"""
%%gpumem
data = big_array(256)
scratch = big_array(512)  # a temporary: part of the peak, gone by the end
del scratch
"""),
    md(r"""
On a GPU the peak includes the temporary, although neither the start nor the end of the cell
shows it. Every cell is measured even without `%%gpumem`; `%gpumem history` lists them.

## 3. Re-running a cell

The next cell was run **three times**, as you would while experimenting. It rebinds the same
name, so memory should stay flat, but its last line displays a result and IPython keeps every
displayed result in `Out[n]`. On a GPU, gpumem_nb flags the third run and says who holds the
memory.
"""),
    code(r"""
result = big_array(64)
result * 2
""", runs=3),
    md(r"""
## 4. Who holds memory: `%gpumem who`

`who` lists what keeps tensors and arrays alive: your variables (and the tensors inside
modules, optimizers, lists and dicts), the output cache `Out[n]`, and a stored traceback.
"""),
    code(r"""
%gpumem who
"""),
    md(r"""
## 5. The per-cell history

One row per cell: time, `allocated`/`reserved` change, the allocator's peak (`≥` marks a
lower bound), NVML's change and peak, and the host RAM change. `gpumem_nb.history()` returns
the same as a DataFrame, and `%gpumem history --csv FILE` saves it.
"""),
    code(r"""
%gpumem history
"""),
    md(r"""
## 6. Clean up safely

`%gpumem cleanup` drops a stored traceback, runs `gc.collect()` and returns PyTorch's unused
cache to the driver. `--out` also clears the output cache. It never deletes a variable you did
not name (`--vars a,b` deletes those), and it reports what each step freed.
"""),
    code(r"""
%gpumem cleanup --out
"""),
    md(r"""
The `output cache` row shows what the three kept results cost; `result` itself is untouched.

## Next

- `01_allocated_reserved_nvidia_smi.ipynb`: the CUDA context, allocated vs reserved vs NVML,
  `empty_cache`;
- `02_rerun_accumulation.ipynb`: `Out[n]`, a failed cell's traceback, a stored loss and its
  graph;
- `03_peaks_fragmentation_live.ipynb`: exact peaks, fragmentation, `expandable_segments`, the
  live chart;
- `04_out_of_memory.ipynb`: the OOM message, the allocator's retry, the explainer;
- `05_allocator_settings.ipynb`: every allocator setting, measured side by side;
- `06_training_memory_budget.ipynb`: parameters, gradients, AdamW, activations;
- `07_traces_and_snapshots.ipynb`: which line allocated what, and memory_viz.

`%gpumem?` lists every command.
"""),
]


# ------------------------------------------------------------------------------------------
# 01: allocated, reserved, NVML; the context; the allocator's granularity; empty_cache.
# ------------------------------------------------------------------------------------------
NB01 = [
    md(r"""
# 1. Allocated, reserved, and what nvidia-smi sees

"I deleted everything and nvidia-smi still says the GPU is full." This notebook shows why, one
step at a time, with PyTorch's caching allocator and NVML (the library `nvidia-smi` reads)
side by side. It also settles a few claims that circulate in blog posts, each with a measured
cell.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
"""),
    md(r"""
## Importing is not initializing

Three steps that are easy to blur: importing torch, initializing CUDA, and creating the CUDA
*context* (the driver's per-process state on the GPU, which is what costs memory). To tell
them apart we read NVML directly, the way `nvidia-smi` does: the device's used memory, and
this process's line in NVML's process list.
"""),
    code(r"""
import os

import pynvml  # from the nvidia-ml-py package: what nvidia-smi reads

from gpumem_nb.units import format_bytes as fmt

pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
MiB = 2**20


def nvml_used():
    # Used memory of GPU 0 as nvidia-smi shows it (v2 leaves driver-reserved memory out).
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(gpu, version=pynvml.nvmlMemory_v2).used
    except (AttributeError, TypeError, pynvml.NVMLError):
        return pynvml.nvmlDeviceGetMemoryInfo(gpu).used


def this_process():
    # This process's bytes in NVML's process list; None when it is not listed.
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(gpu):
        if p.pid == os.getpid():
            return p.usedGpuMemory
    return None


used_at_start = nvml_used()
print(f"NVML used before this process touched the GPU: {fmt(used_at_start)}")
print(f"this process listed by NVML: {this_process() is not None}")
"""),
    code(r"""
import torch

after_import = nvml_used()
print("torch", torch.__version__)
print(f"import torch: NVML used {fmt(after_import - used_at_start, signed=True)}; "
      f"CUDA initialized: {torch.cuda.is_initialized()}")
"""),
    code(r"""
name = torch.cuda.get_device_name(0)
after_init = nvml_used()
print(name)
print(f"get_device_name: NVML used {fmt(after_init - after_import, signed=True)}; "
      f"CUDA initialized: {torch.cuda.is_initialized()}; "
      f"this process listed by NVML: {this_process() is not None}")
"""),
    md(r"""
Importing torch puts nothing on the GPU (first delta), and neither does loading gpumem_nb.
`get_device_name` does initialize PyTorch's CUDA state (`is_initialized()` is now `True`),
but compare its NVML delta with the next one: the driver creates the context lazily, when the
first real GPU work needs it.

`%gpumem` shows each GPU: NVML's used/total, this process's share, PyTorch's `allocated`
(live tensors) and `reserved` (live tensors plus the cache), and memory outside PyTorch.
"""),
    code(r"""
%gpumem
"""),
    md(r"""
## The CUDA context

The first allocation creates the context: driver state, loaded kernels, library handles. It
is this process's memory, but PyTorch's allocator does not manage it, so it appears as
**outside PyTorch** and never as `reserved`.
"""),
    code(r"""
t = torch.zeros(1, device="cuda")
after_alloc = nvml_used()
print(f"first allocation: NVML used {fmt(after_alloc - after_init, signed=True)}")
print(f"a {t.element_size()}-byte tensor: allocated {fmt(torch.cuda.memory_allocated())}, "
      f"reserved {fmt(torch.cuda.memory_reserved())}")
"""),
    code(r"""
%gpumem
"""),
    md(r"""
## Why a 4-byte tensor shows 512 B allocated and 2 MiB reserved

The caching allocator never hands out less than 512 B: every request is rounded up to a
multiple of it (that rounded *block* is what `allocated` counts). Blocks are cut from
*segments* that it gets from the driver with `cudaMalloc` (that is what `reserved` counts):

- requests up to 1 MiB come from a small pool of 2 MiB segments;
- larger requests below 10 MiB share segments of 20 MiB;
- from 10 MiB on, a request that fits no cached block gets a segment of its own, rounded up
  to a multiple of 2 MiB.

The cell below measures one request of each kind, starting each time from an empty cache so
that nothing is reused.
"""),
    code(r"""
del t


def footprint(nbytes):
    # What one tensor of `nbytes` costs: its block (allocated) and the new segment (reserved).
    torch.cuda.empty_cache()  # nothing cached to reuse
    a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    block = torch.cuda.memory_allocated() - a0
    segment = torch.cuda.memory_reserved() - r0
    del x
    return block, segment


print(f"{'request':>28}   {'block (allocated)':>26}   {'new segment (reserved)':>22}")
for label, n in [("4 B", 4), ("1 MiB", MiB), ("1 MiB + 1 B", MiB + 1),
                 ("9 MiB", 9 * MiB), ("10 MiB", 10 * MiB), ("11 MiB", 11 * MiB),
                 ("100 MiB + 1 B", 100 * MiB + 1)]:
    block, segment = footprint(n)
    print(f"{label:>14} = {n:>11,} B   {block:>11,} B = {fmt(block):>10}   "
          f"{fmt(segment):>22}")
"""),
    md(r"""
So `allocated` is already a little more than your tensors' sizes, and `reserved` more again,
before any caching happens. (Notebook 5 shows settings that change this rounding.)

## NVML "used" versus "this process"

NVML charges each process its own memory. The device's *used* figure also counts memory the
driver keeps for itself and charges to no process: it was not zero before this process
touched the GPU (the first output above), and it grows a little with each context.
"""),
    code(r"""
used, mine = nvml_used(), this_process()
print(f"NVML used on the device:      {fmt(used)}")
if mine is None:
    print("this process is not in NVML's list (in a container NVML may report host PIDs)")
else:
    print(f"NVML's line for this process: {fmt(mine)}")
    print(f"used − this process:          {fmt(used - mine)} "
          f"(before this process started CUDA: {fmt(used_at_start)})")
"""),
    md(r"""
### Per-process memory without parsing `nvidia-smi`

A popular snippet finds a process's memory by searching `nvidia-smi`'s table for lines with
the PID and "python", then matching `(\d+)MiB / (\d+)MiB`. That pattern is the *device*
column (`used / total`); a process line has a single figure, so the search finds nothing, and
inside containers the PID shown is often the host's. NVML's process list is the reliable way
(it is what `this_process()` above reads). The cell runs the snippet as published:
"""),
    code(r"""
import re
import shutil
import subprocess


def get_gpu_memory_by_pid(pid):  # the snippet, as published
    result = subprocess.run(["nvidia-smi"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in result.stdout.split("\n"):
        if str(pid) in line and "python" in line:
            match = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", line)
            if match:
                return int(match.group(1)), int(match.group(2))
    return None, None


if shutil.which("nvidia-smi"):
    print("the snippet for this process:", get_gpu_memory_by_pid(os.getpid()))
else:
    print("nvidia-smi is not installed here; the snippet cannot run at all")
mine = this_process()
print("NVML for this process:", fmt(mine) if mine is not None else "not listed")
"""),
    md(r"""
## A tensor, then `del`

A 20000×20000 float32 tensor is 20000·20000·4 bytes. The article this project started from
put it at about 3 GB, and 10000×10000 at 0.76 GB; the first lines print the real sizes (a
`meta` tensor has a size but no storage, so measuring the second costs nothing).
"""),
    code(r"""
x = torch.randn(20000, 20000, device="cuda")
for shape in [(20000, 20000), (10000, 10000)]:
    nbytes = torch.empty(shape, device="meta").nbytes
    claim = {20000: "about 3 GB", 10000: "0.76 GB"}[shape[0]]
    print(f"{shape[0]}×{shape[1]} float32: {nbytes / 2**30:.2f} GiB = {nbytes / 1e9:.2f} GB "
          f"(the article: {claim})")
%gpumem
"""),
    md(r"""
After `del`, `allocated` falls back at once, with no `torch.cuda.synchronize()` (another
article adds one "to make the deletion take effect"; the allocator's bookkeeping is on the
host and needs none). `reserved` does not fall: the allocator keeps the block for the next
tensor, and the driver still counts it as used. That is the "false leak".
"""),
    code(r"""
del x
print(f"allocated right after del, no synchronize(): {fmt(torch.cuda.memory_allocated())}")
%gpumem
"""),
    md(r"""
## Reuse

A new tensor of the same size takes the cached block: `allocated` rises, `reserved` and NVML
do not move. The cache is working for you.
"""),
    code(r"""
y = torch.randn(20000, 20000, device="cuda")
%gpumem
"""),
    code(r"""
del y
"""),
    md(r"""
## `empty_cache()`

`torch.cuda.empty_cache()` hands unused cached blocks back to the driver, and NVML drops by
the same amount (one article claims it gives nothing back: the `NVML freed` column below says
otherwise). Other processes can then use that memory; yours gains nothing, because it would
have reused the cache anyway. `%gpumem cleanup` calls it for you and reports what each step
freed.
"""),
    code(r"""
%gpumem cleanup
"""),
    code(r"""
%gpumem
"""),
    md(r"""
## The context keeps growing

The context is not fixed at creation. Libraries load lazily: the first matrix product loads
cuBLAS's kernels, which count outside PyTorch, and gives cuBLAS a *workspace*, which PyTorch
allocates from its own cache. The next cell measures both around the first product of this
process.
"""),
    code(r"""
def outside_pytorch():
    # This process's NVML line minus what PyTorch reserved; None when NVML lists no line.
    mine = this_process()
    return None if mine is None else mine - torch.cuda.memory_reserved()


a = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
alloc0, outside0 = torch.cuda.memory_allocated(), outside_pytorch()
out = a @ a  # the first matrix product of this process
torch.cuda.synchronize()
grown = torch.cuda.memory_allocated() - alloc0
print(f"first matmul: allocated {fmt(grown, signed=True)}: the product {fmt(out.nbytes)} "
      f"and {fmt(grown - out.nbytes)} that is no tensor of yours")
if outside0 is not None:
    print(f"outside PyTorch: {fmt(outside_pytorch() - outside0, signed=True)}")
"""),
    md(r"""
The part of `allocated` that is no tensor of yours is cuBLAS's workspace; the end of this
notebook shows it outliving every tensor. It is also why `%gpumem who` (notebook 2) cannot
account for every allocated byte: no Python object holds it.

### `empty_cache()` is not free

It must not release a block the GPU may still be using, so when it has cached blocks to free
it first waits for the GPU to finish all queued work. The next cell queues 40 large matrix
products (which return at once: CUDA calls are asynchronous) and times three things: how long
the queued work takes, `empty_cache()` with nothing cached, and `empty_cache()` with a cached
block to free.
"""),
    code(r"""
import time


def queue_matmuls(n=40):
    for _ in range(n):
        torch.matmul(a, a, out=out)  # writes into `out`: allocates and caches nothing


def ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


torch.cuda.empty_cache()
queue_matmuls()
queued_ms = ms(torch.cuda.synchronize)
queue_matmuls()
nothing_ms = ms(torch.cuda.empty_cache)
torch.cuda.synchronize()
junk = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
del junk  # now a 2 GiB block sits in the cache
queue_matmuls()
cached_ms = ms(torch.cuda.empty_cache)
torch.cuda.synchronize()
print(f"40 queued matmuls: synchronize() waited {queued_ms:.0f} ms")
print(f"empty_cache() with nothing cached returned after {nothing_ms:.2f} ms")
print(f"empty_cache() with {fmt(2 * 2**30)} cached blocked for {cached_ms:.0f} ms")
"""),
    md(r"""
With a block to free, `empty_cache()` blocked for about as long as the queued work (compare
the first and third lines); with nothing to free it returned at once. So it is not harmless:
inside a training loop it stalls the pipeline every time it has something to free. Call it
between phases, and never from a background thread.

Its docstring gives it one more purpose: it "may help reduce fragmentation". Returning whole
free segments lets a later, larger request be served by a fresh `cudaMalloc` instead of
failing to fit in the cached pieces. The allocator already does this itself, once, when a
`cudaMalloc` fails (notebook 4 measures that retry), so for your own process calling it is
rarely needed; it matters when *another* process needs the memory.

## What a cleanup cannot free

With every tensor deleted and the cache emptied, `allocated` is still not zero: cuBLAS keeps
its workspace for the life of the process. A private PyTorch call drops it.
"""),
    code(r"""
del a, out
%gpumem cleanup
"""),
    code(r"""
print(f"allocated with no tensor of yours alive: {fmt(torch.cuda.memory_allocated())}")
torch._C._cuda_clearCublasWorkspaces()  # private: drops cuBLAS's cached workspaces
print(f"after dropping cuBLAS's workspaces: {fmt(torch.cuda.memory_allocated())}")
"""),
    md(r"""
## The per-cell record

Every cell above was measured: allocated and reserved before and after, the allocator's peak
during the cell (exact when the cell set a new peak, `≥` otherwise), NVML before, after and at
its sampled peak, and host RAM. `gpumem_nb.history()` returns the same as a DataFrame.
"""),
    code(r"""
%gpumem history
"""),
]


# ------------------------------------------------------------------------------------------
# 02: re-runs: Out[n], a stored traceback, a loss and its graph, optimizer state, who's gaps.
# ------------------------------------------------------------------------------------------
NB02 = [
    md(r"""
# 2. Re-running a cell quietly eats memory

Re-running a cell should cost nothing extra: it rebinds the same names. Three things break that,
and gpumem_nb names each one: results kept alive by IPython's output cache (`Out[n]`, `_`), a
stored traceback that keeps a failed cell's frames, and tensors that carry their autograd
graph.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import torch

from gpumem_nb.units import format_bytes as fmt

torch.zeros(1, device="cuda");
"""),
    md(r"""
## The output cache

The next cell was run **three times**, as you would re-run it while experimenting (the output
shows the last run). It rebinds `y`, so memory should stay flat, but its last line displays a
result, and IPython keeps every displayed result in `Out`. On the third run gpumem_nb flags it,
says the cause is live tensors, and names who holds them."""),
    code(r"""
y = torch.randn(4096, 4096, device="cuda")
y @ y
""", runs=3),
    code(r"""
%gpumem who
"""),
    md(r"""
`%gpumem cleanup --out` clears the output cache. Your variables, `y` included, are untouched;
only results IPython kept for you go. The `output cache` row says what that freed."""),
    code(r"""
%gpumem cleanup --out
"""),
    md(r"""
To avoid it, end such cells with `;` or assign the result: nothing is displayed, nothing is
cached.

## A cell that raised

When a cell fails, Python keeps the exception, its traceback and every frame in it, with all
their local tensors, so that `%debug` can inspect them. A failed training step can pin its
activations until the next error. gpumem_nb flags this on the first run."""),
    code(r"""
def step():
    activations = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    raise RuntimeError("shape mismatch in layer 3")


step()
""", raises=True),
    code(r"""
%gpumem cleanup
"""),
    md(r"""
The `last exception` row dropped the stored exception, and the `empty_cache` row then returned
the freed block to the driver. IPython keeps a failed cell's traceback in three places:
`sys.last_value` and friends (`sys.last_exc` from Python 3.12), its record of the last result,
and its traceback formatter, which `%debug` reads. Dropping only one of them frees nothing; the
cleanup cuts the traceback's frames, so whoever still holds a reference holds no locals. Any
later cleanup's `last exception` row says whether a stored exception was left to drop.

## A stored loss keeps its graph

Appending the loss tensor to a list keeps the whole autograd graph of that step alive, with the
activations it saved. The next cell was run three times."""),
    code(r"""
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
).cuda()
opt = torch.optim.Adam(model.parameters())
batch = torch.randn(8192, 4096, device="cuda")
losses = []
"""),
    code(r"""
loss = model(batch).pow(2).mean()
losses.append(loss)
""", runs=3),
    md(r"""
The flag names `losses` first: its own storage is a few bytes, but its tensors carry a
`grad_fn`. The usual advice is to store `loss.item()`, a Python float, instead. Try it, again
three times:"""),
    code(r"""
losses = [l.item() for l in losses]
del loss
%gpumem cleanup
"""),
    code(r"""
loss = model(batch).pow(2).mean()
losses.append(loss.item())
""", runs=3),
    code(r"""
%gpumem history -n 3
"""),
    md(r"""
Only partly fixed. `allocated` no longer grows after the first run, but look at `reserved Δ`
on the second run: it grew again. The cause is `loss` itself. The variable still holds the
last step's loss *tensor*, and with it that step's whole graph. On the second run the forward
pass executes while the first run's `loss` (and graph) is still bound: two graphs are alive at
once until the assignment replaces the old one. The cache has to grow to hold both; from the
third run on, it is big enough.

`%gpumem who` shows the holder: a tensor of a few bytes that holds its autograd graph. Its
bytes column counts only the tensor's own storage, because sizing a graph means unpacking what
it saved."""),
    code(r"""
%gpumem who
"""),
    md(r"""
## What `who` cannot see

`who` lists Python objects that hold tensors. Two things hold GPU memory without being such
an object: the tensors an autograd graph saved, and cuBLAS's workspaces (PyTorch keeps one per
cuBLAS handle and stream; every thread that multiplies matrices has its own handle, and
backward runs on autograd's own thread). The next cell accounts for `allocated` in full:
what `who` lists, then what deleting `loss` frees (its graph), then what dropping cuBLAS's
workspaces frees.
"""),
    code(r"""
def listed_bytes():
    report = get_ipython().run_line_magic("gpumem", "who -o -n 1000")
    return sum(h.nbytes for h in report.holders if h.device.startswith("cuda"))


allocated = torch.cuda.memory_allocated()
listed = listed_bytes()
print(f"allocated:                 {fmt(allocated)}")
print(f"listed by who:             {fmt(listed)}")
print(f"not listed:                {fmt(allocated - listed)}")
before = torch.cuda.memory_allocated()
del loss
print(f"del loss freed:            {fmt(before - torch.cuda.memory_allocated())} (its graph)")
before = torch.cuda.memory_allocated()
torch._C._cuda_clearCublasWorkspaces()  # private: drops cuBLAS's cached workspaces
print(f"cuBLAS workspaces freed:   {fmt(before - torch.cuda.memory_allocated())}")
print(f"still not listed:          {fmt(torch.cuda.memory_allocated() - listed_bytes())}")
"""),
    md(r"""
The fix is not to keep the tensor at all. Start from an empty cache and re-run three times:
"""),
    code(r"""
%gpumem cleanup
"""),
    code(r"""
losses.append(model(batch).pow(2).mean().item())
""", runs=3),
    code(r"""
%gpumem history -n 3
"""),
    md(r"""
The first run fills the cache with the forward pass's blocks; the second and third reuse them:
`allocated` and `reserved` stay flat.

## Optimizer state

Adam keeps two tensors per parameter (`exp_avg`, `exp_avg_sq`), created at the first `step()`.
`%gpumem who` lists the optimizer's state next to the model's parameters."""),
    code(r"""
model(batch).pow(2).mean().backward()
opt.step()
opt.zero_grad()
%gpumem who
"""),
    code(r"""
%gpumem history -n 12
"""),
]


# ------------------------------------------------------------------------------------------
# 03: exact peaks, fragmentation, expandable segments told truthfully, when settings are read.
# ------------------------------------------------------------------------------------------
NB03 = [
    md(r"""
# 3. Peaks, fragmentation, and the live chart

An OOM "out of nowhere" is usually a short peak, or memory the allocator holds but cannot hand
out. This notebook measures both, compares the allocator with `expandable_segments` honestly,
and shows the live chart during a long cell.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import torch

from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.zeros(1, device="cuda");
"""),
    md(r"""
## Exact peaks

A transient allocation inside a cell (here 8 GiB that lives for a few milliseconds) is
invisible before and after the cell. `%%gpumem` reports the allocator's exact peak during the
cell. gpumem_nb never resets PyTorch's peak counters unless you ask (`--reset-peak`, or
`%gpumem config --peak reset`), so `torch.cuda.max_memory_allocated()` still means what you
think."""),
    code(r"""
%%gpumem
tmp = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda._sleep(10_000_000)  # ten million GPU clock cycles
del tmp
torch.cuda.synchronize()
"""),
    code(r"""
print(f"max_memory_allocated: {fmt(torch.cuda.max_memory_allocated())}")
"""),
    md(r"""
A smaller spike later does not raise the process-wide peak, so without a reset its exact size
is unknown; gpumem_nb reports the best honest lower bound instead of a guess (`%%gpumem` says
"lower bound", the history marks it `≥`). Ask for a reset and the figure is exact again."""),
    code(r"""
%%gpumem
tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); del tmp
"""),
    code(r"""
%%gpumem --reset-peak
tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); del tmp
"""),
    md(r"""
## Fragmentation

Free a 1 GiB tensor and allocate 600 MB: the allocator splits its cached 1 GiB segment. The
unused part is *inactive split*: reserved, free, and not returnable to the driver while the
600 MB tensor lives in the same segment. `%gpumem summary` explains the state."""),
    code(r"""
%gpumem cleanup
a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
del a
b = torch.empty(600 * 10**6, dtype=torch.uint8, device="cuda")
print(f"b: {fmt(b.nbytes)} = {b.nbytes / 1e6:.0f} MB")
"""),
    code(r"""
%gpumem summary
"""),
    md(r"""
## `expandable_segments`: what it really changes

With `PYTORCH_ALLOC_CONF=expandable_segments:True` the allocator reserves one large range of
virtual addresses per stream and maps physical memory into it in pages, as it needs them. Its
settings are read once per process, so the comparison runs the same pattern in two fresh
processes (the plumbing is in `fresh_process.py` next to this notebook). Besides the statistics,
each process prints the blocks inside `b`'s segment, what `empty_cache()` leaves reserved while
`b` is still alive, and what a 21 MiB tensor reserves afterwards.
"""),
    code(r"""
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
for conf, r in zip(CONFS, run_fresh_many(SPLIT, CONFS)):
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
"""),
    md(r"""
Read the two runs line by line:

- **`inactive_split` reads zero with expandable segments, but that is bookkeeping.** The
  allocator does not track that statistic for expandable segments. The block list shows the
  same split in both runs: `b`'s block, and a free (`inactive`) block beside it. Blocks are
  still split.
- **`reserved` is a little higher.** Physical memory is mapped in pages of 20 MiB (the last
  line), so reserved is always a whole number of pages; the default allocator instead gives
  each 21 MiB tensor a segment of its own, rounded up to 22 MiB.
- **The real benefit is the third line.** With `b` alive, `empty_cache()` can unmap the free
  pages of an expandable segment, so reserved falls to about `b`'s own size, rounded up to
  whole pages. The default allocator can only return whole free segments, and `b` keeps its
  segment.

So expandable segments do not stop splitting; they let free memory inside a partly used
segment go back to the driver (or be mapped again for a larger request), which is what
fragmentation needs.
"""),
    code(r"""
del b
%gpumem cleanup
"""),
    md(r"""
## When the settings are read

Most allocator options are read when CUDA starts, so setting `PYTORCH_ALLOC_CONF` in the
notebook after `import torch` still works, as long as no cell has used the GPU yet. The
`backend` option is different: it is read when torch is **imported**. Set after the import,
it makes CUDA's start fail with a mismatch error. Each case runs in a fresh process, which sets
the variable at the moment named:
"""),
    code(r"""
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
"""),
    md(r"""
In a notebook, set the variable in the first cell, before `import torch`, or restart the
kernel after changing it: once torch is imported the backend cannot change, and once CUDA has
started the variable is not read again.

## The live chart

`%gpumem watch` shows NVML's usage beside PyTorch's `allocated` and `reserved`, with a mark at
every cell. A background thread updates it while a cell runs, so a long training cell is
visible as it happens. The cleanup button runs the same safe cleanup as `%gpumem cleanup`.
(On GitHub or nbviewer the widget cannot run; the picture and numbers below it are its static
fallback.)"""),
    code(r"""
%gpumem watch
"""),
    code(r"""
# Ten seconds of training: watch the chart move while this cell runs.
import time

model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters())
t_end = time.monotonic() + 10
steps = 0
while time.monotonic() < t_end:
    x = torch.randn(4096, 8192, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    steps += 1
torch.cuda.synchronize()
print(steps, "steps")
"""),
    md(r"""
## Which cells cost the most?

The history is data. `gpumem_nb.history()` returns it as a pandas DataFrame, one row per cell
and GPU, so you can sort, filter, plot or save it. Here: the three cells with the highest
allocator peak in this notebook, with how long each took. A peak marked `≥` is a lower bound
(the cell did not set a new process-wide peak and nothing reset it).
"""),
    code(r"""
import gpumem_nb

df = gpumem_nb.history().dropna(subset=["peak_allocated_bytes"])
for _, row in df.sort_values("peak_allocated_bytes", ascending=False).head(3).iterrows():
    bound = "" if row.peak_exact else "≥"
    print(f"[{row.execution_count:.0f}] peak {bound}{fmt(int(row.peak_allocated_bytes))} "
          f"in {row.duration_s:.2f} s: {row.source[:60]!r}")
"""),
]


# ------------------------------------------------------------------------------------------
# 04: out of memory: the message, the retry, catching it, each cause explained, the seed story.
# ------------------------------------------------------------------------------------------
NB04 = [
    md(r"""
# 4. Out of memory, explained

`CUDA out of memory` is the error everyone meets. This notebook takes the message apart, shows
what the allocator tries before it gives up, how to catch the error without leaking, and then
runs out of memory on purpose, once for each common cause, with gpumem_nb's explanation under
each error. It ends with the "second request fails" story from a popular article, measured.

Cells that run out of memory on purpose are marked as expected errors; their traceback is
part of the lesson.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import sys

import torch

from gpumem_nb.units import format_bytes as fmt

GiB = 2**30
torch.zeros(1, device="cuda")
free, total = torch.cuda.mem_get_info()
print(f"{torch.cuda.get_device_name(0)}: {fmt(total)} in total, {fmt(free)} free")
"""),
    md(r"""
## The anatomy of the message

Ask for twice the GPU:"""),
    code(r"""
x = torch.empty(2 * total, dtype=torch.uint8, device="cuda")
""", raises=True),
    md(r"""
Below the traceback, gpumem_nb explains the error in the cell that hit it (more on that
below). First, PyTorch's own message, taken apart:"""),
    code(r"""
import re

message = str(sys.last_value)
PARTS = [
    ("asked for", r"Tried to allocate ([\d.]+ \w+)"),
    ("the GPU's total", r"total capacity of ([\d.]+ \w+)"),
    ("free on the GPU", r"of which ([\d.]+ \w+) is free"),
    ("this process, all of it", r"this process has ([\d.]+ \w+) memory in use"),
    ("allocated by PyTorch", r"([\d.]+ \w+) is allocated by PyTorch"),
    ("reserved, unallocated", r"([\d.]+ \w+) is reserved by PyTorch but unallocated"),
    ("cap on this process", r"([\d.]+ \w+) allowed"),
]
for label, pattern in PARTS:
    m = re.search(pattern, message)
    print(f"{label:>24}: {m.group(1) if m else '(not in this message)'}")
"""),
    md(r"""
- **Tried to allocate**: the one request that failed, not the total your code needs.
- **total capacity / free**: the device, from the driver. *Free* excludes everything every
  process holds.
- **this process has … in use**: everything of this process on the GPU, including the CUDA
  context and other libraries; "Process N has … in use" lines name other processes when the
  driver lists them.
- **allocated by PyTorch**: live tensors.
- **reserved by PyTorch but unallocated**: what the cache still held *after* the allocator
  had already returned every whole free segment it could (see the retry below). What is left
  sits inside partly used segments: that is fragmentation, and it is why the message then
  suggests `expandable_segments` (even when it is already on).
- **allowed**: appears only under a cap set with `torch.cuda.set_per_process_memory_fraction`.

`%gpumem oom` shows gpumem_nb's last explanation again (`-o` returns it as an object):"""),
    code(r"""
%gpumem oom
"""),
    md(r"""
## What the allocator tries before it raises

When no cached block fits, the allocator asks the driver (`cudaMalloc`). If that fails, it
does not give up: it returns every cached block that is a whole free segment to the driver
(the same as `empty_cache()`), and asks again. It counts that as an *allocation retry*; only
if the second attempt fails too does it raise, and count an OOM.

The next cell fills the GPU with 1 GiB tensors, deletes them (they stay cached), then asks for
more than the driver has free but less than free plus cached:"""),
    code(r"""
import time

free, _ = torch.cuda.mem_get_info()
blocks = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(free // GiB - 4)]
del blocks  # all cached: free for PyTorch, not for cudaMalloc
free_now = torch.cuda.mem_get_info()[0]
before = torch.cuda.memory_stats()
ask = free_now + 2 * GiB  # more than the driver has, and larger than any cached block
t0 = time.perf_counter()
big = torch.empty(ask, dtype=torch.uint8, device="cuda")
took_ms = (time.perf_counter() - t0) * 1e3
after = torch.cuda.memory_stats()
cached = before["reserved_bytes.all.current"] - before["allocated_bytes.all.current"]
print(f"before: {fmt(cached)} cached, {fmt(free_now)} free on the GPU")
print(f"asked for {fmt(ask)}: granted after {took_ms:.0f} ms")
print(f"num_alloc_retries {before['num_alloc_retries']} -> {after['num_alloc_retries']}, "
      f"num_ooms {before['num_ooms']} -> {after['num_ooms']}")
print(f"reserved {fmt(before['reserved_bytes.all.current'])} -> "
      f"{fmt(after['reserved_bytes.all.current'])}")
del big
"""),
    md(r"""
The request succeeded, and the retry counter moved: the allocator flushed its cache and
retried, and `reserved` fell to little more than the new tensor. A rising `num_alloc_retries`
in a training run is an early warning: each retry synchronizes the GPU and frees the cache, and
the next failure will be a real OOM.

## Catching `OutOfMemoryError` without leaking

A caught exception keeps its traceback, and the traceback keeps every frame it passed through,
with their local tensors. Inside the `except` block the failed call's tensors are therefore
still alive, and if you store the exception, they stay alive after it:"""),
    code(r"""
def train_step(batch_gib):
    activations = torch.empty(8 * GiB, dtype=torch.uint8, device="cuda")
    logits = torch.empty(batch_gib * GiB, dtype=torch.uint8, device="cuda")
    return activations, logits


base = torch.cuda.memory_allocated()
try:
    train_step(batch_gib=2 * total // GiB)
except torch.cuda.OutOfMemoryError as e:
    inside = torch.cuda.memory_allocated() - base
    error = e  # the mistake: keeps the traceback, its frames, and their tensors
kept = torch.cuda.memory_allocated() - base
del error
gone = torch.cuda.memory_allocated() - base
print(f"inside the except block:           {fmt(inside)} still allocated")
print(f"after it, with the exception kept: {fmt(kept)}")
print(f"after del error:                   {fmt(gone)}")
"""),
    md(r"""
So: keep `str(e)` if you need the message, never `e`; and do the fallback *after* the `except`
block, not inside it, so that the failed attempt's tensors are gone before you try again:"""),
    code(r"""
def first_batch_that_fits(sizes_gib):
    for size in sizes_gib:
        try:
            result = train_step(size)
        except torch.cuda.OutOfMemoryError as e:
            print(f"{size} GiB: out of memory ({str(e).split('.')[0]})")
            continue  # leaving the except block releases the failed attempt
        return size, result
    raise RuntimeError("nothing fits")


size, result = first_batch_that_fits([2 * total // GiB, total // GiB, 1])
print(f"{size} GiB fits; allocated now {fmt(torch.cuda.memory_allocated() - base)}")
del result
"""),
    md(r"""
## Each cause, explained

An OOM has a handful of usual causes, and the fix differs for each. gpumem_nb explains every
CUDA OOM in the cell that hit it: what was asked, what the GPU had, the most specific cause it
can measure, and what to do next with the bytes each action would free. The cells below run
out of memory on purpose, once per cause; read the explanation under each traceback.

### Fragmentation

One 40 GiB cached segment is carved into 1 GiB pieces; every other piece is freed, leaving 20
holes that cannot merge (their neighbours are alive) and cannot be returned (their segment is
in use). The rest of the GPU is then filled. A 2 GiB request fits in no hole:"""),
    code(r"""
%gpumem cleanup
big = torch.empty(40 * GiB, dtype=torch.uint8, device="cuda")
del big  # one 40 GiB segment, now cached
pieces = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(40)]
keep = pieces[::2]
del pieces
filler = torch.empty(torch.cuda.mem_get_info()[0] - GiB // 2, dtype=torch.uint8, device="cuda")
s = torch.cuda.memory_stats()
print(f"a {fmt(40 * GiB)} segment in {fmt(GiB)} pieces, {len(keep)} of them kept")
print(f"free on the GPU: {fmt(torch.cuda.mem_get_info()[0])}; reserved but unallocated: "
      f"{fmt(s['reserved_bytes.all.current'] - s['allocated_bytes.all.current'])}")
"""),
    code(r"""
y = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
""", raises=True),
    code(r"""
del keep, filler
%gpumem cleanup
"""),
    md(r"""
### Another process

A second process (here a child of this kernel; often your other notebook) holds 60 GiB. Ask
for more than is left:"""),
    code(r"""
import subprocess

HOLD = ("import sys, torch; x = torch.empty(60 * 2**30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()")
child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"child PID {child.pid}; free on the GPU {fmt(torch.cuda.mem_get_info()[0])}; "
      f"asking for {fmt(ask)}")
"""),
    code(r"""
y = torch.empty(ask, dtype=torch.uint8, device="cuda")
""", raises=True),
    code(r"""
child.stdin.close()
child.wait()
%gpumem cleanup
"""),
    md(r"""
### This process, outside PyTorch

Another allocator in the same process (CuPy, a custom CUDA extension, a library's own
buffers) is invisible to PyTorch's counters: NVML charges it to this process, PyTorch does not
count it. Here the CUDA runtime that torch loaded allocates 60 GiB directly, through `ctypes`:"""),
    code(r"""
import ctypes

# The CUDA runtime torch loaded (or, if it is linked in, the driver API on torch's context).
cudart = next((ln.split()[-1] for ln in open("/proc/self/maps") if "libcudart" in ln), None)
ptr = ctypes.c_void_p()
if cudart:
    lib = ctypes.CDLL(cudart)
    err = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(60 * GiB))
    release = lib.cudaFree
else:
    lib = ctypes.CDLL("libcuda.so.1")
    err = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(60 * GiB))
    release = lib.cuMemFree_v2
assert err == 0, f"the second allocator failed with error {err}"
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"allocated {fmt(60 * GiB)} outside PyTorch; PyTorch's allocated: "
      f"{fmt(torch.cuda.memory_allocated())}; asking for {fmt(ask)}")
"""),
    code(r"""
y = torch.empty(ask, dtype=torch.uint8, device="cuda")
""", raises=True),
    code(r"""
release(ptr)
%gpumem cleanup
"""),
    md(r"""
### Memory your session holds

The most common case in a notebook: a variable (or `Out[n]`, or a stored traceback) still
holds a large tensor you no longer need."""),
    code(r"""
held = torch.empty(60 * GiB, dtype=torch.uint8, device="cuda")
ask = torch.cuda.mem_get_info()[0] + 30 * GiB
print(f"asking for {fmt(ask)}")
"""),
    code(r"""
y = torch.empty(ask, dtype=torch.uint8, device="cuda")
""", raises=True),
    code(r"""
del held
%gpumem cleanup
"""),
    md(r"""
## The second request fails: a story, measured

A popular article tells it this way: a service loads a model, serves the first request, and
runs out of memory on the second; the cause, it says, is that the cache was not emptied after
the first request, so call `empty_cache()` after each batch.

Rebuild it: a model with 1 GiB of weights, and a service function with a classic bug. It
keeps each request's output, and the output keeps its autograd graph (no `no_grad`). To make
the GPU as small as the article's, this process is capped just above what one request needs.
"""),
    code(r"""
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
print(f"weights and the rest before a request: {fmt(base)}")
print(f"one request: {fmt(need)} at its peak, {fmt(kept)} still allocated after it")
print(f"cap for this process: {fmt(cap)}")
"""),
    code(r"""
serve(new_request(), results)  # request 1
print(f"after request 1: allocated {fmt(torch.cuda.memory_allocated())}, "
      f"reserved {fmt(torch.cuda.memory_reserved())}")
"""),
    code(r"""
torch.cuda.empty_cache()  # the article's advice
serve(new_request(), results)  # request 2
""", raises=True),
    md(r"""
`empty_cache()` did not help, and could not: the first request's memory was not *cached*, it
was *allocated*, held by `results` (read the explanation above). A cached block is reused by
the same process anyway; emptying the cache only gives memory to other processes, and costs a
synchronization. The fix is to keep only what the caller needs, and not to build a graph at
all when serving:"""),
    code(r"""
results.clear()
%gpumem cleanup


def serve_fixed(request, answers):
    with torch.inference_mode():  # no autograd graph
        answers.append(model(request).argmax(dim=1).cpu())  # keep only the answer


answers, start = [], torch.cuda.memory_allocated()
for i in range(3):
    serve_fixed(new_request(), answers)
    print(f"after request {i + 1}: allocated "
          f"{fmt(torch.cuda.memory_allocated() - start, signed=True)} since before the first, "
          f"reserved {fmt(torch.cuda.memory_reserved())}")
torch.cuda.set_per_process_memory_fraction(1.0)
"""),
    md(r"""
Three requests under the same cap, and `allocated` is back where it started after each.

## The `cudaMallocAsync` backend says it differently

With `PYTORCH_ALLOC_CONF=backend:cudaMallocAsync` the allocation is served by CUDA's own pool,
and the message has another format. Its statistics also differ: the counters printed here
stay at zero after a real OOM under that backend, which is why gpumem_nb counts OOMs itself.
Both backends, in fresh processes:"""),
    code(r"""
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
for r in run_fresh_many(OOM, ["", "backend:cudaMallocAsync"]):
    print(f"--- {r['backend']}: num_ooms {r['num_ooms']}, num_alloc_retries {r['retries']}")
    print(r["message"])
"""),
    code(r"""
%gpumem summary
"""),
]


# ------------------------------------------------------------------------------------------
# 05: allocator settings: backends, options, when read, memory_summary, one table.
# ------------------------------------------------------------------------------------------
NB05 = [
    md(r"""
# 5. Allocator settings, measured side by side

PyTorch's CUDA allocator is configured with one environment variable, `PYTORCH_ALLOC_CONF`
(the older name `PYTORCH_CUDA_ALLOC_CONF` still works), holding comma-separated `key:value`
pairs. This notebook says what each setting changes, which backend honours it and when it is
read; it then runs one workload under each setting, in fresh processes, and compares them in
one table. It ends with `torch.cuda.memory_summary()`, read line by line.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import os

import torch

from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.zeros(1, device="cuda")
print("torch", torch.__version__)
print("allocator backend in this kernel:", torch.cuda.get_allocator_backend())
for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
    print(f"{var} = {os.environ.get(var)!r}")
"""),
    md(r"""
With nothing set, the backend is `native`, PyTorch's own caching allocator (one article
claims a recent torch "defaults to the async pool"; the line above says otherwise).

## The settings

- **`backend:native`** (the default) or **`backend:cudaMallocAsync`**: who manages memory,
  PyTorch's own caching allocator or CUDA's stream-ordered pool, which keeps its own cache and
  reports fewer statistics. *Read when torch is imported.*
- **`expandable_segments:True`**: segments are ranges of virtual memory that grow and shrink
  page by page, so free pages inside a partly used segment can be returned (notebook 3).
  *Native only; read when CUDA starts.*
- **`max_split_size_mb:N`**: cached blocks larger than N MB are never split for smaller
  requests ("oversize" blocks), and are the first to be freed when `cudaMalloc` fails.
  *Native only; read when CUDA starts.*
- **`roundup_power2_divisions:N`**: request sizes are rounded up to one of N steps between
  consecutive powers of two, so sizes that vary a little reuse the same cached blocks; the
  rounding itself costs memory. *Native only; read when CUDA starts.*
- **`garbage_collection_threshold:F`**: with a cap set by
  `torch.cuda.set_per_process_memory_fraction`, once reserved memory passes the fraction F of
  the cap, the allocator frees cached blocks that have not been reused before asking for more,
  rather than waiting for a failed `cudaMalloc`. *Native only; read when CUDA starts.*

`cudaMallocAsync` ignores the last three, and says so; an article that tunes
`max_split_size_mb` to configure `cudaMallocAsync` tunes nothing. The table below shows it.

## One workload under each setting

The workload allocates tensors of varying sizes (like batches of varying length), keeping the
last few alive, under a cap that makes this process's GPU a small one; then it reads the
allocator's statistics and calls `empty_cache()` with the last tensors still alive. Each
setting runs in a fresh process, a few at a time (each process reads only its own statistics).
"""),
    code(r"""
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
torch.cuda.empty_cache()
out["after_empty_cache"] = torch.cuda.memory_reserved()
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
        "inact.split", "retries", "oversize", "after e_c", "OOM at")
print(f"{head[0]:<46}{head[1]:>16}" + "".join(f"{h:>12}" for h in head[2:]))
for conf, r in zip(CONFIGS, results):
    cells = [mib(r["peak_reserved"]), mib(r["reserved"]), mib(r["allocated"]),
             mib(r["requested"]), mib(r["inactive_split"]), r["retries"], r["oversize"],
             mib(r["after_empty_cache"]), "—" if r["oom_at"] is None else r["oom_at"]]
    print(f"{conf or '(default)':<46}{r['backend']:>16}" + "".join(f"{c:>12}" for c in cells))
for conf, r in zip(CONFIGS, results):
    for w in r["warnings"]:
        print(f"warning under {conf!r}: {w.strip()}")
"""),
    md(r"""
How to read it (columns in MiB; *after e_c* is `reserved` after `empty_cache()` with the last
tensors alive):

- **allocated vs requested** is the rounding: under `roundup_power2_divisions` blocks are
  bigger than the requests, by design.
- **oversize** counts blocks above `max_split_size_mb`: zero without the setting, and zero
  under `cudaMallocAsync` even with it.
- **inact.split** and **retries** are the native allocator's fragmentation signals; compare
  the default row with the others. `expandable_segments` reports no inactive split at all,
  which is bookkeeping (notebook 3), and `cudaMallocAsync` reports neither.
- **after e_c**: what `empty_cache()` gave back with the last tensors still alive. The native
  allocator without expandable segments can only return segments that hold no live tensor.
- The two `cudaMallocAsync` rows are the same workload with and without `max_split_size_mb`:
  compare them, and read the warning printed under the table.

## When the options are read

The backend is read when torch is imported (notebook 3 shows what happens if you set it
later). The other options are read when CUDA starts: set `max_split_size_mb` after the first
CUDA call and a large block is not counted as oversize; set it before, and it is.
"""),
    code(r"""
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
"""),
    md(r"""
## `memory_summary()`, line by line

`torch.cuda.memory_summary()` prints the native allocator's statistics as a table. First a small
state to describe: a split 1 GiB segment (as in notebook 3) and some small tensors.
"""),
    code(r"""
a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
del a
b = torch.empty(600 * 10**6, dtype=torch.uint8, device="cuda")
small = [torch.empty(1000, device="cuda") for _ in range(10)]
summary = torch.cuda.memory_summary()
print(summary)
"""),
    md(r"""
The header counts OOMs and `cudaMalloc` retries (notebook 4). Each metric then has four columns:
*Cur Usage* (now), *Peak Usage* (since start or the last `reset_peak_memory_stats`),
*Tot Alloc* and *Tot Freed* (cumulative), and each is split into the large pool and the small
pool of small requests (notebook 1 measures where one ends). What each metric means:
"""),
    code(r"""
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
"""),
    md(r"""
Every row is a size or a count of blocks or segments. None is an operation type (an article
says the summary lists "the operation types that allocated most"; it does not: for that, see
the allocation traces in notebook 7). Its "Inactive split" is today's *Non-releasable memory*,
the statistic `inactive_split_bytes`. The same numbers are available as a dict,
`torch.cuda.memory_stats()`, and `%gpumem summary` puts the important ones in words:"""),
    code(r"""
%gpumem summary
"""),
    code(r"""
del b, small
%gpumem cleanup
"""),
]


# ------------------------------------------------------------------------------------------
# 06: a training memory budget, predicted and measured, and what changes it.
# ------------------------------------------------------------------------------------------
NB06 = [
    md(r"""
# 6. Budgeting training memory

Before a run you want to know whether it fits. The usual estimate adds four parts:

- **parameters**: 4 bytes each in float32;
- **gradients**: the same again;
- **optimizer state**: AdamW keeps two float32 tensors per parameter (`exp_avg`,
  `exp_avg_sq`), 8 bytes per parameter;
- **activations**: what the forward pass saves for the backward pass; it grows with batch size
  and sequence length.

This notebook predicts each part for a small language model built from `torch.nn` alone, then
measures it, and settles an article's claim that a 100M-parameter model with AdamW needs
"nearly 4 GB" for its static part. Then the things that change the budget, each measured:
`no_grad` vs `inference_mode`, bf16 and fp16 autocast, and activation checkpointing.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import contextlib
import copy

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpumem_nb.units import format_bytes as fmt

torch.manual_seed(0)
torch.zeros(1, device="cuda")
allocated = torch.cuda.memory_allocated
"""),
    md(r"""
## The model

A decoder-sized transformer: token embedding, pre-norm transformer layers (attention and
feed-forward), a final norm, and an output head tied to the embedding. Nothing is downloaded.
"""),
    code(r"""
VOCAB, D, HEADS, FF, LAYERS, SEQ, BATCH = 24576, 1024, 16, 4096, 6, 512, 8


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D)
        self.checkpointing = False

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            # Checkpointing keeps only each layer's input and recomputes the rest in backward.
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointing else layer(x)
        return self.norm(x) @ self.embed.weight.T  # logits; the head shares the embedding


def tokens(batch):
    return torch.randint(VOCAB, (batch, SEQ), device="cuda")


def loss_fn(t):
    logits = model(t)
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), t.flatten())


cpu_model = TinyLM()
N = sum(p.numel() for p in cpu_model.parameters())
before = allocated()
model = cpu_model.cuda()
params_measured = allocated() - before
print(f"{N:,} parameters ({N / 1e6:.1f}M)")
"""),
    md(r"""
## Parameters, gradients and AdamW state

One warm-up forward and backward on a tiny batch first: it creates cuBLAS's handles and
workspaces (notebook 1), so they do not count against the first real step. Then each part is
measured as the change in `allocated` when it appears.
"""),
    code(r"""
loss_fn(tokens(1)[:, :16]).backward()  # warm-up
model.zero_grad(set_to_none=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = tokens(BATCH)

before = allocated()
loss = loss_fn(batch)
loss.backward()
del loss
grads_measured = allocated() - before

before = allocated()
torch.cuda.reset_peak_memory_stats()
opt.step()
state_measured = allocated() - before
step_temporaries = torch.cuda.max_memory_allocated() - allocated()
where = next(iter(opt.state.values()))["step"].device

rows = [("parameters", 4 * N, params_measured), ("gradients", 4 * N, grads_measured),
        ("AdamW state", 8 * N, state_measured)]
print(f"{'':<18}{'predicted':>14}{'measured':>14}")
for name, predicted, measured in rows:
    print(f"{name:<18}{fmt(predicted):>14}{fmt(measured):>14}")
static = sum(m for _, _, m in rows)
print(f"{'static total':<18}{fmt(16 * N):>14}{fmt(static):>14}  = {static / 1e9:.2f} GB")
print(f"the article: nearly 4 GB for 100M parameters with AdamW; "
      f"16 bytes per parameter gives {16 * 100e6 / 1e9:.1f} GB")
print(f"AdamW's step counters live on: {where}")
print(f"temporaries during opt.step(), on top: {fmt(step_temporaries)}")
"""),
    md(r"""
Parameters, gradients and AdamW state match the 4 + 4 + 8 bytes per parameter rule closely
(the small differences are the allocator's rounding). The article's "nearly 4 GB" static part
is more than twice what the rule gives for 100M parameters (the two lines above); its own
formula, 4 + 4 + 8 to 16 bytes per parameter, never reaches it.

The rule leaves out `opt.step()`'s temporaries: PyTorch's default (`foreach`) AdamW updates
all parameters with a few fused operations whose intermediate results are the size of the
state lists (last line). A budget needs that headroom at the step.

## Activations: count what autograd saves

Activations are the hard part to estimate by formula; the shape of every saved tensor depends
on the layer's implementation. They can be *counted* instead:
`torch.autograd.graph.saved_tensors_hooks` sees every tensor the forward pass saves for
backward. Count the distinct storages (parameters excluded) at batch 1 and batch 2, and
extrapolate linearly to the real batch; then measure it.
"""),
    code(r"""
region = {"now": "embed"}
for name, module in [("embed", model.embed), ("norm", model.norm),
                     *(("layers", layer) for layer in model.layers)]:
    module.register_forward_pre_hook(lambda m, a, name=name: region.update(now=name))


def saved_bytes(fn):
    # Bytes of the distinct storages autograd saves while fn() runs, by model region.
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:  # counted once, where it was first saved
            seen.setdefault(storage.data_ptr(), (region["now"], storage.nbytes()))
        return t

    region["now"] = "embed"
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    del loss
    by_region = {}
    for where, nbytes in seen.values():
        by_region[where] = by_region.get(where, 0) + nbytes
    return by_region


def predict(fn_of_batch, batch):
    one, two = saved_bytes(lambda: fn_of_batch(1)), saved_bytes(lambda: fn_of_batch(2))
    return {k: one.get(k, 0) + (batch - 1) * (two.get(k, 0) - one.get(k, 0))
            for k in set(one) | set(two)}


def measure_activations(fn):
    before = allocated()
    loss = fn()
    kept = allocated() - before
    loss.backward()
    del loss
    return kept


fp32 = predict(lambda b: loss_fn(tokens(b)), BATCH)
opt.zero_grad(set_to_none=True)
act_measured = measure_activations(lambda: loss_fn(batch))
print(f"activations at batch {BATCH}, predicted from batches 1 and 2: "
      f"{fmt(sum(fp32.values()))}")
for part, key in [("embedding", "embed"), ("layers", "layers"),
                  ("final norm, head and loss", "norm")]:
    print(f"    {part:<26}{fmt(fp32.get(key, 0)):>12}")
print(f"activations at batch {BATCH}, measured: {fmt(act_measured)}")
"""),
    md(r"""
The two lines should agree to within the allocator's rounding; if they did not, something
other than autograd's saved tensors would be kept. Note how much of it is the head and loss:
the logits are batch × sequence × vocabulary floats, and the loss saves them. For language
models with large vocabularies the logits are often the largest single activation.

## A whole training step, and the usual formula

`%%gpumem` measures the step's exact peak. The usual formula simply adds the four parts:"""),
    code(r"""
%%gpumem --reset-peak -q -o
opt.zero_grad(set_to_none=True)
loss_fn(batch).backward()
opt.step()
"""),
    code(r"""
step_peak = _.peak_allocated_bytes
formula = 16 * N + sum(fp32.values())
print(f"formula (params + grads + AdamW + activations): {fmt(formula)}")
print(f"measured peak of the step (%%gpumem):           {fmt(step_peak)}")
print(f"difference:                                     {fmt(step_peak - formula, signed=True)}")
"""),
    md(r"""
The two are not the same thing, for two reasons that pull in opposite directions:

- gradients and activations are not alive at the same time: with `zero_grad(set_to_none=True)`
  there are no gradients during the forward pass, and the backward pass frees activations as
  it creates gradients, so simply adding them overestimates;
- temporaries are not in the formula: the gradient of the logits (as large as the logits), the
  step's intermediate results, the cuBLAS workspaces. These make the real peak higher.

Budget with the measured peak of one real step, as above, and keep the headroom for the
temporaries.

## What changes the budget

Each variant runs the same step (fresh gradients, same batch); the prediction uses the same
counting method, and for checkpointing the layers' part is replaced by what checkpointing
keeps: each layer's input.
"""),
    code(r"""
def step_with(autocast_dtype=None, checkpointing=False):
    def fwd(b, t=None):
        ctx = (torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype
               else contextlib.nullcontext())
        with ctx:
            return loss_fn(tokens(b) if t is None else t)

    predicted = predict(fwd, BATCH)
    if checkpointing:
        predicted["layers"] = LAYERS * BATCH * SEQ * D * 4  # each layer's float32 input
    model.checkpointing = checkpointing
    opt.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    base = allocated()
    measured = measure_activations(lambda: fwd(BATCH, batch))
    opt.step()
    peak = torch.cuda.max_memory_allocated() - base
    model.checkpointing = False
    return sum(predicted.values()), measured, peak


print(f"{'variant':<28}{'activations predicted':>22}{'measured':>12}{'step peak above':>18}")
print(f"{'':<28}{'':>22}{'':>12}{'params + state':>18}")
for name, kwargs in [("float32", {}), ("bf16 autocast", {"autocast_dtype": torch.bfloat16}),
                     ("fp16 autocast", {"autocast_dtype": torch.float16}),
                     ("float32, checkpointing", {"checkpointing": True})]:
    predicted, measured, peak = step_with(**kwargs)
    print(f"{name:<28}{fmt(predicted):>22}{fmt(measured):>12}{fmt(peak):>18}")
"""),
    md(r"""
- **Autocast** (bf16 or fp16) runs matrix products in 16-bit, so most saved activations are
  half the size. Parameters, gradients and AdamW state stay float32 (autocast casts copies of
  the weights for each forward pass, and the graph keeps those copies: they are part of the
  activations). fp16 training also needs a `GradScaler`; compare its row with bf16's.
- **Checkpointing** keeps only each layer's input and recomputes the layer during backward:
  the activations shrink to the layer inputs plus what lies outside the layers (embedding,
  head, loss), at the cost of one extra forward pass per layer. Compare its step peak with
  float32's: during backward one layer's activations come back while it is recomputed, and
  the head's large tensors are not checkpointed.

## Inference: `no_grad`, `inference_mode`, half precision

Without a graph, nothing is saved for backward: only the output (here the logits) stays.
"""),
    code(r"""
def forward_only(mode):
    torch.cuda.reset_peak_memory_stats()
    before = allocated()
    with mode():
        logits = model(batch)
    kept, peak = allocated() - before, torch.cuda.max_memory_allocated() - before
    del logits
    return kept, peak


opt.zero_grad(set_to_none=True)
print(f"{'forward pass':<26}{'kept after it':>16}{'peak during it':>16}")
for name, mode in [("with autograd", contextlib.nullcontext), ("torch.no_grad()", torch.no_grad),
                   ("torch.inference_mode()", torch.inference_mode)]:
    kept, peak = forward_only(mode)
    print(f"{name:<26}{fmt(kept):>16}{fmt(peak):>16}")

before = allocated()
half = copy.deepcopy(model).half()
half_bytes = allocated() - before
del half
print(f"weights in float16: {fmt(half_bytes)}, in float32: {fmt(params_measured)}")
"""),
    md(r"""
Compare the `no_grad` and `inference_mode` rows: the difference between them is speed, not
memory (`inference_mode` also skips autograd's version counters and view tracking). `.half()`
halves the weights (and `.detach()` on a result, like `.item()` in notebook 2, drops its
graph).
"""),
    code(r"""
%gpumem history -n 8
"""),
]


# ------------------------------------------------------------------------------------------
# 07: per-cell allocation traces, snapshots for memory_viz, the offline views.
# ------------------------------------------------------------------------------------------
NB07 = [
    md(r"""
# 7. Where did my memory go? Per-cell traces and snapshots

`allocated` says how much; it does not say which line. PyTorch can record every allocation
with the Python stack that made it (its *allocation history*). `%%gpumem --trace` switches that
recording on for one cell only, then shows the lines that held the most memory at the cell's
peak and the ones still holding memory at its end: the leak candidates. `--save` writes the
recording for PyTorch's own viewer, memory_viz.

""" + PREAMBLE),
    code(r"""
%load_ext gpumem_nb
import os
import re
import tempfile

import torch
from torch import nn

from gpumem_nb.units import format_bytes as fmt

GiB = 2**30
torch.zeros(1, device="cuda");  # tracing needs CUDA started: gpumem_nb never starts it
"""),
    md(r"""
## A leak, traced

A small model, and a helper with a bug: it keeps every step's hidden states in a list. Three
steps run in the traced cell."""),
    code(r"""
model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).cuda()
kept_hidden = []


def forward(batch):
    hidden = model[0](batch)
    kept_hidden.append(hidden)  # the bug: every step's hidden states stay alive
    return model[2](model[1](hidden))
"""),
    code(r"""
%%gpumem --trace --top 5
for _ in range(3):
    x = torch.randn(8192, 4096, device="cuda")
    forward(x).square().mean().backward()
"""),
    md(r"""
Three parts:

- **top sites at the cell's peak**: which lines held the most memory at the moment the cell's
  own allocations peaked (a site inside a function shows the cell line that called it);
- **still alive at the end**: what the cell allocated and did not free. The leak shows as
  the helper's `hidden = model[0](batch)` line (reached from the cell's `forward(x)` call),
  holding one step's hidden states per step. Some of what is alive is expected: the last `x`,
  and the gradients, which `backward()` allocates on autograd's own thread, so they may carry
  no Python line;
- **the timeline**: the cell's live allocations over time, by site. It is drawn with plotly
  from the notebook itself, with no download, and a static picture is saved for viewers that
  run no JavaScript.

The footer says how many history entries the cell produced and what tracing added to its time.

## The cost of tracing

Recording a Python stack for every allocation costs time. The next two cells run the same
ten thousand small allocations without and with tracing:"""),
    code(r"""
import time

N_ALLOC = 10_000


def many_allocations():
    for _ in range(N_ALLOC):
        torch.empty(1024, device="cuda")


t0 = time.perf_counter()
many_allocations()
plain_s = time.perf_counter() - t0
"""),
    code(r"""
%%gpumem --trace --top 1
t0 = time.perf_counter()
many_allocations()
traced_s = time.perf_counter() - t0
"""),
    code(r"""
print(f"untraced: {plain_s / N_ALLOC * 1e6:.2f} µs per allocation")
print(f"traced:   {traced_s / N_ALLOC * 1e6:.2f} µs per allocation "
      f"(+{(traced_s - plain_s) / N_ALLOC * 1e6:.2f} µs)")
"""),
    md(r"""
Cells without `--trace` pay nothing: gpumem_nb switches the recording on before a traced cell
and off after it, and leaves any recording you started yourself as it was.

## Saving a snapshot for memory_viz

`--save FILE` writes the raw recording: every segment and block, and the trace of allocation
events with their stacks. It is pickled with protocol 4, because memory_viz's JavaScript reader
handles protocols 2 to 4 only, and Python 3.14 pickles with protocol 5 by default."""),
    code(r"""
snapshot_path = os.path.join(tempfile.gettempdir(), "gpumem_step.pickle")
kept_hidden.clear()
"""),
    code(r"""
%%gpumem --trace --top 3 --save {snapshot_path}
x = torch.randn(8192, 4096, device="cuda")
forward(x).square().mean().backward()
"""),
    code(r"""
import pickle

with open(snapshot_path, "rb") as f:
    raw = f.read()
snapshot = pickle.loads(raw)
protocol = raw[1] if raw[:1] == b"\x80" else None
print(f"{snapshot_path}: {fmt(len(raw))}, pickle protocol {protocol}")
print("keys:", ", ".join(sorted(snapshot)))
print(f"{len(snapshot['segments'])} segments, "
      f"{sum(len(t) for t in snapshot['device_traces'])} trace entries")
"""),
    md(r"""
To look at it in PyTorch's viewer, open https://pytorch.org/memory_viz and drop the file on the
page: it shows the active memory over time, and each allocation's stack on hover. The file
never leaves your machine; the page itself, though, comes from the network.

The stock offline route does not work offline either. `torch.cuda._memory_viz.trace_plot`
writes a standalone HTML file, but that file loads its JavaScript from a CDN (and that script
loads another library from a second one):"""),
    code(r"""
from torch.cuda import _memory_viz

html = _memory_viz.trace_plot(snapshot)
print(f"trace_plot's HTML: {fmt(len(html))}; it loads:")
for url in sorted(set(re.findall(r"https?://[^\s\"'<>)]+", html))):
    print("  ", url)
"""),
    md(r"""
Two views that do work without a network: the timeline `%%gpumem --trace` draws in the
notebook (above), and the text summaries in `torch.cuda._memory_viz`. `segsum` prints each
segment and how it is filled; its first lines:"""),
    code(r"""
summary = _memory_viz.segsum(snapshot)
print("\n".join(summary.splitlines()[:24]))
"""),
    md(r"""
## A trace at the moment of an OOM

When a traced cell runs out of memory, the OOM explanation also lists the sites that were
holding memory when it failed:"""),
    code(r"""
%%gpumem --trace
activations = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
too_big = torch.empty(2 * torch.cuda.mem_get_info()[1], dtype=torch.uint8, device="cuda")
""", raises=True),
    code(r"""
del activations
kept_hidden.clear()
%gpumem cleanup
"""),
]


TUTORIALS: dict[str, list[dict]] = {
    "00_quickstart.ipynb": NB00,
    "01_allocated_reserved_nvidia_smi.ipynb": NB01,
    "02_rerun_accumulation.ipynb": NB02,
    "03_peaks_fragmentation_live.ipynb": NB03,
    "04_out_of_memory.ipynb": NB04,
    "05_allocator_settings.ipynb": NB05,
    "06_training_memory_budget.ipynb": NB06,
    "07_traces_and_snapshots.ipynb": NB07,
}


def build(name: str, cells: list[dict]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    # What ipykernel reports; run_tutorials.py replaces it with the executing kernel's own.
    # A bare {"name": "python"} made JupyterLab fill it in and open the notebook as modified.
    nb.metadata["language_info"] = {
        "name": "python", "version": platform.python_version(), "mimetype": "text/x-python",
        "file_extension": ".py", "codemirror_mode": {"name": "ipython", "version": 3},
        "nbconvert_exporter": "python", "pygments_lexer": "ipython3"}
    for i, c in enumerate(cells):
        if c["kind"] == "markdown":
            cell = nbformat.v4.new_markdown_cell(c["source"])
        else:
            cell = nbformat.v4.new_code_cell(c["source"])
            if c["runs"] > 1:
                cell.metadata["tutorial"] = {"runs": c["runs"]}
            if c["raises"]:
                cell.metadata["tags"] = ["raises-exception"]  # nbclient: an expected error
        cell.id = f"{Path(name).stem[:2]}-{i:02d}"
        nb.cells.append(cell)
    return nb


def main() -> None:
    for name, cells in TUTORIALS.items():
        nbformat.write(build(name, cells), HERE / name)
        print("wrote", name)


if __name__ == "__main__":
    main()
