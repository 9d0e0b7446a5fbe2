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

# %% [markdown] id="02-00"
# # 2. Re-running a cell quietly eats memory
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** why does memory keep growing when I re-run a cell that only rebinds
# the same names?
#
# Re-running a cell should cost nothing extra: it rebinds the same names. Three things break that,
# and gpumem_nb names each one: results kept alive by IPython's output cache (`Out[n]`, `_`), a
# stored traceback that keeps a failed cell's frames, and tensors that carry their autograd
# graph.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="02-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import torch
from claims import claim

import gpumem_nb
from gpumem_nb.units import format_bytes as fmt

torch.zeros(1, device="cuda");


def runs_of(first_line, n=3):
    # The history rows of the last n runs of the cell that starts with first_line.
    rows = gpumem_nb.history()
    return rows[rows.source.str.startswith(first_line)].tail(n)


def last_flag():
    # gpumem_nb's last verdict on a cell (history() first: it judges every finished cell).
    from gpumem_nb.magics import current_monitor

    gpumem_nb.history()
    flags = list(current_monitor().verdicts)
    return flags[-1] if flags else None

# %% [markdown] id="02-02"
# ## The output cache
#
# The next cell was run **three times**, as you would re-run it while experimenting (the output
# shows the last run). It rebinds `y`, so memory should stay flat, but its last line displays a
# result, and IPython keeps every displayed result in `Out`. On the third run gpumem_nb flags it,
# says the cause is live tensors, and names who holds them.

# %% id="02-03" tutorial={"runs": 3}
y = torch.randn(4096, 4096, device="cuda")
y @ y

# %% id="02-32"
flag = last_flag()
claim(flag is not None and flag.runs == 3 and flag.cause == "live tensors"
      and any(h.name.startswith("Out[") for h in flag.holders),
      "the third run was flagged: live tensors, held by the output cache",
      flag=flag.message if flag else None)


# %% id="02-04"
# %gpumem who

# %% [markdown] id="02-05"
# `%gpumem cleanup --out` clears the output cache. Your variables, `y` included, are untouched;
# only results IPython kept for you go. The `output cache` row says what that freed.

# %% id="02-06"
out_before = torch.cuda.memory_allocated()
# %gpumem cleanup --out
claim(out_before - torch.cuda.memory_allocated() == 3 * y.nbytes and y.is_cuda,
      "clearing the output cache freed the three kept products; `y` is untouched",
      freed=fmt(out_before - torch.cuda.memory_allocated()))

# %% [markdown] id="02-07"
# To avoid it, end such cells with `;` or assign the result: nothing is displayed, nothing is
# cached.
#
# ## A cell that raised
#
# When a cell fails, Python keeps the exception, its traceback and every frame in it, with all
# their local tensors, so that `%debug` can inspect them. A failed training step can pin its
# activations until the next error. gpumem_nb flags this on the first run.

# %% id="02-08" tags=["raises-exception"]
def step():
    activations = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    raise RuntimeError("shape mismatch in layer 3")


step()

# %% id="02-09"
flag = last_flag()
claim(flag is not None and flag.raised and flag.runs == 1
      and any(h.name.startswith("traceback") for h in flag.holders),
      "the failed cell was flagged on its first run, its traceback named as the holder",
      flag=flag.message if flag else None)
report = get_ipython().run_line_magic("gpumem", "cleanup -o")  # %gpumem cleanup, kept
display(report)
freed = {s.step: s.freed_allocated_bytes or 0 for s in report.steps}
claim(freed.get("last exception", 0) >= 4 * 2**30,
      "the `last exception` row freed the failed step's 4 GiB of activations",
      last_exception=fmt(freed.get("last exception", 0)))
claim(sum(freed.values()) == report.before.allocated_bytes - report.after.allocated_bytes,
      "each row reports what its own step freed: the rows add up to the total",
      rows=fmt(sum(freed.values())),
      total=fmt(report.before.allocated_bytes - report.after.allocated_bytes))

# %% [markdown] id="02-10"
# The `last exception` row dropped the stored exception (the second ✓ line), and the
# `empty_cache` row then returned the freed block to the driver. IPython keeps a failed cell's
# traceback in three places: `sys.last_value` and friends (`sys.last_exc` from Python 3.12), its
# record of the last result, and its traceback formatter, which `%debug` reads. Dropping only
# one of them frees nothing, so the cleanup drops all of them. It changes nothing you can reach
# yourself: an exception you stored in a variable keeps its frames, and the row then says who
# holds it. Each row is measured around its own step (`gc.collect()` runs first, so garbage from
# before is not credited to a later row): the rows add up to the total (the last ✓ line).
#
# ## A stored loss keeps its graph
#
# Appending the loss tensor to a list keeps the whole autograd graph of that step alive, with the
# activations it saved. The next cell was run three times.

# %% id="02-11"
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)
).cuda()
opt = torch.optim.Adam(model.parameters())
batch = torch.randn(8192, 4096, device="cuda")
losses = []

# %% id="02-12" tutorial={"runs": 3}
loss = model(batch).pow(2).mean()
losses.append(loss)

# %% id="02-30"
flag = last_flag()
named = [h for h in flag.holders if h.name.startswith("losses")] if flag else []
claim(named and named[0].holds_graph and named[0].nbytes < 2**10,
      "the flag names `losses`: a few bytes of its own, and the graphs its tensors keep",
      flag=flag.message if flag else None)

# %% [markdown] id="02-13"
# The flag names `losses`: its own storage is a few bytes, but its tensors carry a `grad_fn`,
# and each keeps the autograd graph of its step, with the activations that step saved. The usual
# advice is to store `loss.item()`, a Python float, instead. Try it, again three times:

# %% id="02-14"
losses = [loss.item() for loss in losses]
del loss
# %gpumem cleanup

# %% id="02-15" tutorial={"runs": 3}
loss = model(batch).pow(2).mean()
losses.append(loss.item())


# %% id="02-16"
# %gpumem history -n 3

# %% id="02-28"
first, second, third = runs_of("loss = model(batch).pow(2).mean()").itertuples()
claim(second.allocated_delta_bytes == 0 == third.allocated_delta_bytes,
      "allocated no longer grows after the first run")
claim(second.reserved_delta_bytes > 0 and third.reserved_delta_bytes == 0,
      "reserved grew again on the second run, and not on the third",
      second=fmt(int(second.reserved_delta_bytes), signed=True),
      third=fmt(int(third.reserved_delta_bytes), signed=True))

# %% [markdown] id="02-17"
# Only partly fixed. `allocated` no longer grows after the first run, but look at `reserved Δ`
# on the second run: it grew again. The cause is `loss` itself. The variable still holds the
# last step's loss *tensor*, and with it that step's whole graph. On the second run the forward
# pass executes while the first run's `loss` (and graph) is still bound: two graphs are alive at
# once until the assignment replaces the old one. The cache has to grow to hold both; from the
# third run on, it is big enough.
#
# `%gpumem who` shows the holder: a tensor of a few bytes that holds its autograd graph, and
# the bytes of the tensors that graph saved (tensors another holder keeps, such as `batch`, are
# counted there, and parameters never).

# %% id="02-18"
# %gpumem who

# %% [markdown] id="02-19"
# ## What `who` cannot see
#
# `who` lists Python objects that hold tensors, and the tensors their autograd graphs saved. One
# thing holds GPU memory without being such an object: the matrix libraries' workspaces. ATen
# keeps them per handle and stream (`CublasHandlePool.cpp`). The first product on a new
# (handle, stream) allocates cuBLAS's workspace, whichever path it takes: on CUDA the cuBLASLt
# handle is the cuBLAS handle, so a bias-fused product (`nn.Linear`, `addmm`) attaches it too.
# The bias-fused path then adds cuBLASLt's own, smaller one. In a trace, cuBLAS's is charged to
# whichever product ran first. Notebook 1 ran only a bare `a @ a`, so it made cuBLAS's alone;
# here both exist (so far only forward passes have run). The next cell accounts for
# `allocated` in full: what `who` lists, what deleting `loss` frees (its graph), and what
# dropping the workspaces frees; the cell after it reads the two workspaces from a trace.

# %% id="02-20"
def listed_bytes():
    # What `who` lists on the GPU: each holder's tensors and the tensors its graph saved.
    report = get_ipython().run_line_magic("gpumem", "who -o -n 1000")
    return sum(h.held_bytes for h in report.holders if h.device.startswith("cuda"))


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
workspaces = before - torch.cuda.memory_allocated()
print(f"cuBLAS workspaces freed:   {fmt(workspaces)}")
still = torch.cuda.memory_allocated() - listed_bytes()
print(f"still not listed:          {fmt(still)}")
# `loss` is 4 bytes, and the allocator hands out at least 512: the one gap below 512 B.
claim(workspaces > 0 and 0 <= allocated - listed - workspaces < 512 and still == 0,
      "who lists everything allocated but cuBLAS's workspaces, graphs included",
      not_listed=fmt(allocated - listed), workspaces=fmt(workspaces), still=fmt(still))

# %% [markdown] id="02-33"
# ### The two workspaces, read from a trace
#
# The next cell records the allocator's history around two calls, right after the workspaces
# were dropped: a plain product of a square matrix first, then one forward pass of the model
# (`nn.Linear`'s bias-fused products). Neither keeps its result. What is still allocated at the
# end, and was allocated during the recording, is what the two calls recreated and no tensor
# holds: one block per library, cuBLAS's charged to the plain product because it ran first
# (the model alone makes it too: the first run above), each with the innermost Python line in
# its stack, where the trace names one (the library allocates it from C++, whose frames the
# trace may not name: it prints those as `??`). It drops them again after, so the cells below
# start as before.

# %% id="02-34"
square = torch.randn(1024, 1024, device="cuda")  # made before the recording starts
torch.cuda.memory._record_memory_history(max_entries=100_000)  # Python stacks
with torch.no_grad():
    square @ square  # a plain product
    model(batch)  # bias-fused products; neither result is kept
torch.cuda.synchronize()
trace = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
del square
recreated = [b for seg in trace["segments"] for b in seg["blocks"]
             if b["state"] == "active_allocated" and b.get("frames")]


def made_by_linear(block):
    # Allocated under nn.Linear's forward (torch/nn/modules/linear.py), not the plain product.
    return any(str(f.get("filename", "")).replace("\\", "/").endswith("nn/modules/linear.py")
               for f in block["frames"])


def python_line(block):
    # The innermost frame in Python source: the C++ frames above it may have no name ("??").
    for f in block["frames"]:
        name = str(f.get("filename", "")).replace("\\", "/")
        if name.endswith(".py"):
            return f"{name.rsplit('/', 1)[-1]}:{f['line']}"
    return "(no Python line in its stack)"


for b in sorted(recreated, key=lambda b: -b["size"]):
    where = python_line(b)
    who = "the model (bias-fused: cuBLASLt's own)" if made_by_linear(b) else \
        "the plain product, which ran first (cuBLAS's)"
    print(f"{fmt(b['size']):>10}  allocated by {who}, at {where}")
total = sum(b["size"] for b in recreated)
print(f"together {fmt(total)}; dropping the workspaces above freed {fmt(workspaces)}")
claim(len(recreated) == 2 and total == workspaces,
      "the two calls recreated two blocks that no tensor holds, together the workspaces "
      "dropped above", blocks=len(recreated), together=fmt(total), workspaces=fmt(workspaces))
claim(sorted(map(made_by_linear, recreated)) == [False, True],
      "the plain product, run first, was charged with cuBLAS's workspace, and nn.Linear's "
      "bias-fused products added cuBLASLt's own",
      by_linear=fmt(sum(b["size"] for b in recreated if made_by_linear(b))),
      by_plain_product=fmt(sum(b["size"] for b in recreated if not made_by_linear(b))))
torch._C._cuda_clearCublasWorkspaces()  # as before this cell

# %% [markdown] id="02-21"
# The fix is not to keep the tensor at all. Start from an empty cache and re-run three times:

# %% id="02-22"
# %gpumem cleanup

# %% id="02-23" tutorial={"runs": 3}
losses.append(model(batch).pow(2).mean().item())

# %% id="02-24"
# %gpumem history -n 3

# %% id="02-29"
first, second, third = runs_of("losses.append(model(batch).pow(2).mean().item())").itertuples()
claim(first.allocated_delta_bytes == workspaces,
      "the first run's allocated Δ is the cuBLAS workspaces coming back",
      first=fmt(int(first.allocated_delta_bytes), signed=True), workspaces=fmt(workspaces))
claim(all(r.allocated_delta_bytes == 0 == r.reserved_delta_bytes for r in (second, third)),
      "the second and third runs stay flat",
      **{name: f"allocated {fmt(int(r.allocated_delta_bytes), signed=True)}, reserved "
         f"{fmt(int(r.reserved_delta_bytes), signed=True)}"
         for name, r in (("second", second), ("third", third))})

# %% [markdown] id="02-25"
# The first run fills the cache with the forward pass's blocks and brings back cuBLAS's
# workspaces, which the cell before the cleanup dropped (its `allocated Δ` is their size); the
# second and third reuse everything: `allocated` and `reserved` stay flat.
#
# ## Optimizer state
#
# Adam keeps two tensors per parameter (`exp_avg`, `exp_avg_sq`), created at the first `step()`.
# `%gpumem who` lists the optimizer's state next to the model's parameters.

# %% id="02-26"
model(batch).pow(2).mean().backward()
opt.step()
opt.zero_grad()
state = sum(t.nbytes for s in opt.state.values() for t in s.values() if t.is_cuda)
params = sum(p.nbytes for p in model.parameters())
claim(state == 2 * params, "Adam's state is two tensors per parameter",
      state=fmt(state), parameters=fmt(params))
# %gpumem who

# %% id="02-27"
# %gpumem history -n 12

# %% [markdown] id="02-35"
# What to take away:
#
# - A cell whose last line displays a tensor keeps it in `Out[n]` on every run: end it with `;`
#   or assign the result, and `%gpumem cleanup --out` frees what was kept.
# - A failed cell's traceback keeps its frames' tensors alive; IPython stores it in three
#   places, and `%gpumem cleanup` drops all of them.
# - A stored loss tensor keeps its step's autograd graph: store `loss.item()`, and do not keep
#   the last loss bound either, or two graphs are alive while the next step runs.
# - `%gpumem who` names every Python holder, graphs included; the matrix libraries' workspaces
#   have none, and Adam's state (two tensors per parameter) appears at the first `step()`.
