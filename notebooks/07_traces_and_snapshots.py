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

# %% [markdown] id="07-00"
# # 7. Where did my memory go? Per-cell traces and snapshots
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** which line of my code allocated the memory, and which line still
# holds it?
#
# `allocated` says how much; it does not say which line. PyTorch can record every allocation
# with the Python stack that made it (its *allocation history*). `%%gpumem --trace` switches that
# recording on for one cell only, then shows the lines that held the most memory at the cell's
# peak and the ones still holding memory at its end: the leak candidates. `--save` writes the
# recording for PyTorch's own viewer, memory_viz.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="07-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import os
import re
import sys
import tempfile

import torch
from claims import claim
from torch import nn

from gpumem_nb.units import format_bytes as fmt

GiB = 2**30
MiB = 2**20
torch.zeros(1, device="cuda");  # tracing needs CUDA started: gpumem_nb never starts it

# %% [markdown] id="07-02"
# ## A leak, traced
#
# A small model, and a helper with a bug: it keeps every step's hidden states in a list. One
# warm-up step runs first, outside the trace: the first matrix products of a process create
# cuBLAS's workspaces (notebook 1), on the main thread for the forward pass and on autograd's
# thread for the backward pass, and they would otherwise show up in the trace on the first line
# that multiplies matrices. Three steps then run in the traced cell.

# %% id="07-03"
model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).cuda()
kept_hidden = []


def forward(batch):
    hidden = model[0](batch)
    kept_hidden.append(hidden)  # the bug: every step's hidden states stay alive
    return model[2](model[1](hidden))


forward(torch.randn(8, 4096, device="cuda")).square().mean().backward()  # warm-up
kept_hidden.clear()
model.zero_grad(set_to_none=True)
STEPS = """
for _ in range(3):
    x = torch.randn(8192, 4096, device="cuda")
    forward(x).square().mean().backward()
"""

# %% id="07-04"
# %%gpumem --trace --top 5
for _ in range(3):
    x = torch.randn(8192, 4096, device="cuda")
    forward(x).square().mean().backward()

# %% [markdown] id="07-05"
# Three parts:
#
# - **top sites at the cell's peak**: which lines held the most memory at the moment the cell's
#   own allocations peaked (a site inside a function shows the cell line that called it);
# - **still alive at the end**: what the cell allocated and did not free. The leak shows as
#   the helper's `hidden = model[0](batch)` line (reached from the cell's `forward(x)` call),
#   holding one step's hidden states per step. Some of what is alive is expected: the last `x`,
#   and the gradients, which `backward()` allocates on autograd's own thread, so they carry no
#   Python line;
# - **the timeline**: the cell's live allocations over time, by site. JupyterLab draws it with
#   the plotly renderer that plotly's package installs (nothing is downloaded); the same output
#   carries an SVG drawing of it in its HTML, for viewers without that renderer.
#
# The footer says how many history entries the cell produced and what tracing added to its time.
# The next cell runs the same three steps again from the same state, traced quietly, and checks
# these readings against the tensors themselves.

# %% id="07-20"
from gpumem_nb.magics import current_monitor

# The traced cell above was this process's first: what PyTorch's snapshot cost it.
first_snapshot_s = current_monitor().last_trace.snapshot_s
kept_hidden.clear()
del x
model.zero_grad(set_to_none=True)
report = get_ipython().run_cell_magic("gpumem", "--trace -q -o", STEPS)
alive = {sb.site.label: sb.nbytes for sb in report.result.devices[0].alive_at_end}
hidden_line = next((n for label, n in alive.items() if "hidden = model[0](batch)" in label), 0)
no_stack = alive.get("(no Python stack recorded)", 0)
params = sum(p.nbytes for p in model.parameters())
print(f"alive at the end: the hidden line {fmt(hidden_line)}, no Python stack {fmt(no_stack)}")
claim(hidden_line == sum(h.nbytes for h in kept_hidden) == 3 * x.nbytes,
      "the hidden line holds one step's hidden states per step, nothing else",
      hidden_line=fmt(hidden_line), three_steps=fmt(3 * x.nbytes))
claim(no_stack == params, "what carries no Python line is the gradients",
      no_stack=fmt(no_stack), parameters=fmt(params))

# %% id="07-06"
import time

N_ALLOC = 10_000


def many_allocations():
    for _ in range(N_ALLOC):
        torch.empty(1024, device="cuda")


t0 = time.perf_counter()
many_allocations()
plain_s = time.perf_counter() - t0

# %% id="07-07"
# %%gpumem --trace --top 1
t0 = time.perf_counter()
many_allocations()
traced_s = time.perf_counter() - t0

# %% id="07-08"
# The same loop with PyTorch's default recording, C++ frames included, switched on by hand.
torch.cuda.memory._record_memory_history("all", context="all", stacks="all")
t0 = time.perf_counter()
many_allocations()
cpp_s = time.perf_counter() - t0
torch.cuda.memory._record_memory_history(None)
print(f"untraced: {plain_s / N_ALLOC * 1e6:.2f} µs per allocation")
print(f"traced:   {traced_s / N_ALLOC * 1e6:.2f} µs per allocation "
      f"(+{(traced_s - plain_s) / N_ALLOC * 1e6:.2f} µs)")
print(f"with C++ frames too: {cpp_s / N_ALLOC * 1e6:.2f} µs per allocation")
claim(traced_s > plain_s, "recording a stack makes each allocation slower")
claim(cpp_s > traced_s, "recording C++ frames as well makes it slower still")
later = current_monitor().last_trace  # the traced loop's, with many more history entries
print(f"PyTorch's snapshot: {first_snapshot_s * 1e3:.1f} ms for the first traced cell, "
      f"{later.snapshot_s * 1e3:.1f} ms for the loop's {later.entries:,} entries")
claim(first_snapshot_s < 0.2,
      "the first traced cell of a process pays no one-off cost in PyTorch's snapshot",
      first_ms=round(first_snapshot_s * 1e3, 1), later_ms=round(later.snapshot_s * 1e3, 1),
      inductor_imported="torch._inductor" in sys.modules)

# %% [markdown] id="07-09"
# Tracing has two costs, and the lines above show only the first:
#
# - **per allocation**, while the cell runs: recording the stack (the difference above);
# - **per traced cell**, after it: PyTorch's snapshot of the recording and gpumem_nb's analysis
#   of its entries (the footer of each traced cell gives both). It grows with the entries
#   (the last line above). PyTorch's first snapshot in a process used to take seconds
#   whatever its length: its frame symbolizer asks for `torch._inductor`, which imports it.
#   gpumem_nb answers that lookup when nothing has imported inductor (no frame can be its
#   code then), so the first traced cell costs what a later one does. The last ✓ line shows
#   the two snapshots' times, and whether anything in this process has imported inductor.
#
# gpumem_nb asks PyTorch for Python stacks only, the frames its reports name: recording C++
# frames as well (PyTorch's default) costs more per allocation (the last line above). Cells
# without `--trace` pay nothing: gpumem_nb switches the recording on
# before a traced cell and off after it, and leaves any recording you started yourself as it
# was.
#
# ## Saving a snapshot for memory_viz
#
# `--save FILE` writes the raw recording: every segment and block, and the trace of allocation
# events with their stacks. It is pickled with protocol 4, because memory_viz's JavaScript reader
# handles protocols 2 to 4 only, and Python 3.14 pickles with protocol 5 by default.

# %% id="07-10"
snapshot_path = os.path.join(tempfile.gettempdir(), "gpumem_step.pickle")
kept_hidden.clear()

# %% id="07-11"
# %%gpumem --trace --top 3 --save {snapshot_path}
x = torch.randn(8192, 4096, device="cuda")
forward(x).square().mean().backward()

# %% [markdown] id="07-21"
# The output above gives this cell two peaks, far apart, and both are right. `%%gpumem`'s line
# reads the allocator's process-wide peak counter, which the larger peaks of earlier cells
# already hold: without a reset, all it can say is a lower bound, the larger of the cell's start
# and end. The trace's figure is exact for what the cell itself allocated, and leaves out
# what was allocated before it (the weights, the gradients). So the cell's real peak lies
# between the trace's figure and that figure plus what was allocated when the cell started:

# %% id="07-22"
import gpumem_nb

cell = gpumem_nb.history().iloc[-1]  # the traced cell above
own_peak = current_monitor().last_trace.devices[0].peak_bytes
print(f"%%gpumem's lower bound: {fmt(int(cell.peak_allocated_bytes))} "
      f"(exact: {bool(cell.peak_exact)})")
print(f"the trace: the cell's own allocations peaked at {fmt(own_peak)}; allocated at the "
      f"cell's start {fmt(int(cell.allocated_before_bytes))}")
print(f"so the cell's peak was between {fmt(max(own_peak, int(cell.peak_allocated_bytes)))} "
      f"and {fmt(own_peak + int(cell.allocated_before_bytes))}")
claim(not cell.peak_exact and own_peak > cell.peak_allocated_bytes,
      "here the trace's figure is the tighter lower bound of the two",
      gpumem_lower_bound=fmt(int(cell.peak_allocated_bytes)), trace_peak=fmt(own_peak))
claim(cell.peak_allocated_bytes <= own_peak + cell.allocated_before_bytes,
      "%%gpumem's bound is below the trace's upper bound: the two figures agree",
      upper_bound=fmt(own_peak + int(cell.allocated_before_bytes)))

# %% id="07-12"
import pickle

with open(snapshot_path, "rb") as f:
    raw = f.read()
snapshot = pickle.loads(raw)
protocol = raw[1] if raw[:1] == b"\x80" else None
print(f"{snapshot_path}: {fmt(len(raw))}, pickle protocol {protocol}")
print("keys:", ", ".join(sorted(snapshot)))
claim(protocol == 4, "the snapshot is pickled with protocol 4")
print(f"{len(snapshot['segments'])} segments, "
      f"{sum(len(t) for t in snapshot['device_traces'])} trace entries")

# %% [markdown] id="07-13"
# To look at it in PyTorch's viewer, open https://pytorch.org/memory_viz and drop the file on the
# page: it shows the active memory over time, and each allocation's stack on hover. The file
# never leaves your machine; the page itself, though, comes from the network.
#
# The stock offline route does not work offline either. `torch.cuda._memory_viz.trace_plot`
# writes a standalone HTML file, but that file loads its JavaScript from a CDN:

# %% id="07-14"
from torch.cuda import _memory_viz

html = _memory_viz.trace_plot(snapshot)
print(f"trace_plot's HTML: {fmt(len(html))}; it loads:")
urls = sorted(set(re.findall(r"https?://[^\s\"'<>)]+", html)))
for url in urls:
    print("  ", url)
claim(urls, "the offline HTML loads its script from the network", urls=urls)

# %% [markdown] id="07-15"
# Two views that do work without a network: the timeline `%%gpumem --trace` draws in the
# notebook (above), and the text summaries in `torch.cuda._memory_viz`. `segsum` prints each
# segment and how it is filled; its first lines. Mind its words: on a segment's line,
# "allocated" is the segment's size, what these notebooks call `reserved` (a wholly free
# segment reads "allocated" and "free" for the same size), and only `total_allocated`, at the
# end of its full output, means live blocks, as `allocated` does everywhere else here.

# %% id="07-16"
summary = _memory_viz.segsum(snapshot)
print("\n".join(summary.splitlines()[:24]))

# %% [markdown] id="07-17"
# ## A trace at the moment of an OOM
#
# When a traced cell runs out of memory, the OOM explanation also lists the sites that were
# holding memory when it failed:

# %% id="07-18" tags=["raises-exception"]
# %%gpumem --trace
activations = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
too_big = torch.empty(2 * torch.cuda.mem_get_info()[1], dtype=torch.uint8, device="cuda")

# %% id="07-19"
del activations
kept_hidden.clear()
# %gpumem cleanup

# %% [markdown] id="07-23"
# What to take away:
#
# - `%%gpumem --trace` names the lines that held the most at the cell's peak and those still
#   holding memory at its end, where a leak shows.
# - Recording stacks slows every allocation, C++ frames more: trace the cell you investigate,
#   not the whole notebook.
# - Without a reset, `%%gpumem`'s peak for a cell is a lower bound; the trace's figure is exact
#   for what the cell itself allocated.
# - `--save` writes the recording for memory_viz, whose page comes from the network;
#   offline, read the trace's timeline in the notebook or `torch.cuda._memory_viz`'s text
#   summaries.
