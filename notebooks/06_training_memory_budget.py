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

# %% [markdown] id="06-00"
# # 6. Budgeting training memory
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** will this training run fit on the GPU, and which part of the
# step takes the memory?
#
# Before a run you want to know whether it fits. The usual estimate adds four parts:
#
# - **parameters**: one float32 each (the first output below prints its size);
# - **gradients**: the same again;
# - **optimizer state**: AdamW keeps two float32 tensors per parameter (`exp_avg`,
#   `exp_avg_sq`);
# - **activations**: what the forward pass saves for the backward pass; it grows with batch size
#   and sequence length.
#
# This notebook predicts each part for a small language model built from `torch.nn` alone, then
# measures it, and settles an article's claim about the static part of a 100M-parameter model
# with AdamW. Then the things that change the budget, each measured: `no_grad` vs
# `inference_mode`, bf16 and fp16 autocast (fp16 with its `GradScaler`), and activation
# checkpointing.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="06-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import contextlib
import copy

import torch
from claims import claim, near
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpumem_nb.units import format_bytes as fmt

torch.manual_seed(0)
torch.zeros(1, device="cuda")
allocated = torch.cuda.memory_allocated
FLOAT32 = torch.empty(0).element_size()
print(f"a float32 takes {FLOAT32} bytes")

# %% [markdown] id="06-02"
# ## The model
#
# A decoder-sized transformer: token embedding, pre-norm transformer layers (attention and
# feed-forward), a final norm, and an output head tied to the embedding. Nothing is downloaded.

# %% id="06-03"
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

# %% [markdown] id="06-04"
# ## Parameters, gradients and AdamW state
#
# One warm-up forward and backward on a tiny batch first: it creates cuBLAS's handles and
# workspaces (notebook 1), so they do not count against the first real step. Then each part is
# measured as the change in `allocated` when it appears.

# %% id="06-05"
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
print(f"the rule: parameters {FLOAT32} bytes + gradients {FLOAT32} bytes + AdamW "
      f"{2 * FLOAT32} bytes = {4 * FLOAT32} bytes per parameter")
print(f"the article: nearly 4 GB for 100M parameters with AdamW; "
      f"16 bytes per parameter gives {16 * 100e6 / 1e9:.1f} GB")
claim(all(p.nbytes % 512 == 0 for p in model.parameters()),
      "every parameter tensor is a multiple of 512 B, so the allocator's rounding adds nothing")
claim(all(measured == predicted for _, predicted, measured in rows),
      "parameters, gradients and AdamW state match the rule to the byte",
      **{name: f"{measured} B measured, {predicted} B by the rule"
         for name, predicted, measured in rows})
print(f"AdamW's step counters live on: {where}")
print(f"temporaries during opt.step(), on top: {fmt(step_temporaries)}; the parameters: "
      f"{fmt(4 * N)}")
claim(near(step_temporaries, 4 * N, rel=0.05),
      "opt.step() needs temporaries on top of the state: about one list the size of the "
      "parameters", temporaries=fmt(step_temporaries), parameters=fmt(4 * N))

# %% [markdown] id="06-06"
# Parameters, gradients and AdamW state match the rule of 16 bytes per parameter exactly here:
# every parameter tensor of this model is a multiple of 512 B, so the allocator's rounding adds
# nothing. The article's "nearly 4 GB" static part is more than twice what the rule gives for
# 100M parameters (the lines above); its own formula never reaches it.
#
# The rule leaves out `opt.step()`'s temporaries: PyTorch's default (`foreach`) AdamW updates
# all parameters with a few fused operations, and `_multi_tensor_adamw` keeps one
# intermediate list (`exp_avg_sq_sqrt`) the size of the parameters (last line). A budget needs
# that headroom at the step.
#
# ## Activations: count what autograd saves
#
# Activations are the hard part to estimate by formula; the shape of every saved tensor depends
# on the layer's implementation. They can be *counted* instead:
# `torch.autograd.graph.saved_tensors_hooks` sees every tensor the forward pass saves for
# backward. Count the distinct storages (parameters and the input tokens excluded) at batch 1
# and batch 2, and extrapolate linearly to the real batch; then measure it, and count again at
# the real batch.

# %% id="06-07"
region = {"now": "embed"}
for name, module in [("embed", model.embed), ("norm", model.norm),
                     *(("layers", layer) for layer in model.layers)]:
    module.register_forward_pre_hook(lambda m, a, name=name: region.update(now=name))


def saved_bytes(fn, then=None, inputs=()):
    # Bytes of the distinct GPU storages autograd saves while fn() runs, by model region,
    # leaving out the parameters and `inputs` (tensors that existed before fn() ran);
    # then(loss) runs before the graph is dropped (a measurement, a backward pass).
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *inputs)}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if t.is_cuda and storage.data_ptr() not in skip:  # once, where first saved
            seen.setdefault(storage.data_ptr(), (region["now"], storage.nbytes()))
        # Not `t` itself: a saved output would then hold its own grad_fn, which holds it,
        # a cycle no garbage collection breaks, and a graph that never runs backward (the
        # counts at batches 1 and 2) would stay allocated. A detached view shares the
        # storage without the grad_fn.
        return t.detach()

    region["now"] = "embed"
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    if then is not None:
        then(loss)
    del loss
    by_region = {}
    for where, nbytes in seen.values():
        by_region[where] = by_region.get(where, 0) + nbytes
    return by_region, len(seen)


def predict(fn_of_batch, batch):
    def count(b):
        t = tokens(b)
        return saved_bytes(lambda: fn_of_batch(b, t), inputs=(t,))[0]

    one, two = count(1), count(2)
    return {k: one.get(k, 0) + (batch - 1) * (two.get(k, 0) - one.get(k, 0))
            for k in set(one) | set(two)}


def requested():
    # What the live tensors asked for, before the allocator's rounding.
    return torch.cuda.memory_stats()["requested_bytes.all.current"]


def measure_activations(fn, backward=lambda loss: loss.backward(), inputs=()):
    # What the forward pass leaves allocated (and requested), and what autograd saved,
    # counted in the same run.
    before, asked, kept = allocated(), requested(), {}

    def then(loss):
        kept["allocated"], kept["requested"] = allocated() - before, requested() - asked
        backward(loss)

    counted, _ = saved_bytes(fn, then, inputs)
    return kept["allocated"], kept["requested"], counted


fp32 = predict(lambda b, t: loss_fn(t), BATCH)
opt.zero_grad(set_to_none=True)
act_measured, act_requested, counted = measure_activations(lambda: loss_fn(batch),
                                                           inputs=(batch,))
PARTS = [("embedding", "embed"), ("layers", "layers"), ("final norm, head and loss", "norm")]
print(f"activations at batch {BATCH}: {'predicted from batches 1 and 2':>32}"
      f"{'counted at batch ' + str(BATCH):>20}")
for part, key in PARTS:
    print(f"    {part:<26}{fmt(fp32.get(key, 0)):>28}{fmt(counted.get(key, 0)):>20}")
print(f"    {'total':<26}{fmt(sum(fp32.values())):>28}{fmt(sum(counted.values())):>20}")
part, key = max(PARTS, key=lambda pk: abs(fp32.get(pk[1], 0) - counted.get(pk[1], 0)))
print(f"the prediction is furthest off in the {part}: "
      f"{fmt(fp32.get(key, 0) - counted.get(key, 0), signed=True)}")
print(f"activations at batch {BATCH}, measured after the forward pass: allocated "
      f"{fmt(act_measured)}, requested {fmt(act_requested)}")
# The forward pass also leaves the loss, one float: 4 bytes requested.
claim(0 <= act_requested - sum(counted.values()) <= 2**20,
      "what the forward pass keeps is what autograd saved (and the loss)",
      requested=fmt(act_requested), counted=fmt(sum(counted.values())))
claim(near(sum(fp32.values()), sum(counted.values()), rel=0.10),
      "extrapolating from batches 1 and 2 comes within 10% of the real batch's count",
      predicted=fmt(sum(fp32.values())), counted=fmt(sum(counted.values())))

# %% [markdown] id="06-08"
# What the forward pass leaves behind is what autograd saved, counted in the same run (the
# first ✓ line, on the bytes the tensors asked for; `allocated` adds the allocator's rounding):
# activations are saved tensors, and nothing else is kept but the loss. The prediction from
# batches 1 and 2 comes within 10% (the second ✓ line); the line under the table names the
# region where it is furthest off. This run does not show why: a saved tensor that does not
# grow in step with the batch, a kernel chosen differently at another batch size, or storages
# shared at one size and separate at another would each do it.
#
# Note how much of it is the head and loss: the logits are batch × sequence × vocabulary floats,
# and the loss saves their log-softmax, as large as they are. For language models with large
# vocabularies the logits are often the largest single activation.
#
# ## A whole training step, and the usual formula
#
# `%%gpumem` measures the step's exact peak, and the history keeps the same record. The usual
# formula simply adds the four parts:

# %% id="06-09"
# %%gpumem --reset-peak -q -o
opt.zero_grad(set_to_none=True)
loss_fn(batch).backward()
opt.step()

# %% id="06-10"
import gpumem_nb

measured = _.record  # what the -o of the cell above returned: its measurement
rows = gpumem_nb.history()
row = rows[rows.source.str.startswith("%%gpumem --reset-peak")].iloc[-1]  # the same cell
step_peak = measured.devices[0].peak_allocated_bytes
claim(row.execution_count == measured.execution_count and row.peak_exact
      and measured.devices[0].peak_exact and row.peak_allocated_bytes == step_peak,
      "the measurement and the history give the cell one exact peak",
      measured=(measured.execution_count, fmt(step_peak)),
      history=(int(row.execution_count), fmt(int(row.peak_allocated_bytes))))
formula = 16 * N + sum(fp32.values())
print(f"formula (params + grads + AdamW + activations): {fmt(formula)}")
print(f"measured peak of the step (%%gpumem):           {fmt(step_peak)}")
print(f"difference:                                     {fmt(step_peak - formula, signed=True)}")
start = measured.devices[0].allocated_before_bytes
print(f"allocated when the step began:                  {fmt(start)}")
print(f"  parameters, gradients and AdamW state:        {fmt(16 * N)}")
print(f"  the rest (workspaces, the batch):             {fmt(start - 16 * N)}")

# The same step again, one phase at a time, from gradients set to None: each phase's peak above
# what was allocated then (less than when the measured step began, which had the last step's
# gradients).
opt.zero_grad(set_to_none=True)
start = allocated()
phases = {}
print(f"allocated when the phases began (gradients None):  {fmt(start)}")
torch.cuda.reset_peak_memory_stats()
loss = loss_fn(batch)
phases["forward"] = torch.cuda.max_memory_allocated() - start
torch.cuda.reset_peak_memory_stats()
loss.backward()
del loss
phases["backward"] = torch.cuda.max_memory_allocated() - start
torch.cuda.reset_peak_memory_stats()
opt.step()
phases["opt.step()"] = torch.cuda.max_memory_allocated() - start
for phase, peak in phases.items():
    print(f"peak during {phase + ',':<12} above what the phases began with: {fmt(peak)}")

# %% [markdown] id="06-11"
# The two are not the same thing. The measured peak counts everything allocated when the step
# began (the lines above: the static parts, and the rest: the batch and the cuBLAS workspaces
# the warm-up created, notebook 1); the formula has no term for that rest. Within the step, two
# things pull in opposite directions:
#
# - gradients and activations are not alive at the same time: with `zero_grad(set_to_none=True)`
#   there are no gradients during the forward pass, and the backward pass frees activations as
#   it creates gradients, so simply adding them overestimates;
# - the step makes tensors the formula does not list: in the backward pass each gradient is
#   made before the activations it consumes are freed (cross-entropy's backward makes the
#   gradient of the logits, as large as the logits, while the saved log-softmax is still
#   alive), and `opt.step()` needs its temporaries (06-05's last line). These make the real
#   peak higher.
#
# The last lines ran the same step again, one phase at a time: the phase with the highest peak
# is the one that decides the budget. Budget with the measured peak of one real step, as above,
# and keep the headroom for the temporaries.
#
# ## What changes the budget
#
# Each variant runs the same step (fresh gradients, same batch); the prediction uses the same
# counting method, and for checkpointing the layers' part is replaced by what checkpointing
# keeps: each layer's input. fp16 runs as fp16 training must, with a `GradScaler`. The "step
# peak above its start" column is the step's peak less what was allocated when it began (the
# parameters, AdamW state and workspaces; the gradients are set to `None` first). The last
# columns split the measured activations by region, as counted in the same run.

# %% id="06-12"
def step_with(autocast_dtype=None, checkpointing=False, scaler=None):
    def fwd(b, t=None):
        ctx = (torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype
               else contextlib.nullcontext())
        with ctx:
            return loss_fn(tokens(b) if t is None else t)

    def backward(loss):
        (scaler.scale(loss) if scaler else loss).backward()

    predicted = predict(fwd, BATCH)
    if checkpointing:
        predicted["layers"] = LAYERS * BATCH * SEQ * D * 4  # each layer's float32 input
    model.checkpointing = checkpointing
    opt.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    base = allocated()
    measured, _, counted = measure_activations(lambda: fwd(BATCH, batch), backward,
                                               inputs=(batch,))
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    peak = torch.cuda.max_memory_allocated() - base
    model.checkpointing = False
    return sum(predicted.values()), measured, peak, counted


print(f"{'variant':<28}{'activations predicted':>22}{'measured':>12}{'step peak above':>18}"
      f"{'layers':>12}{'head, loss':>12}")
print(f"{'':<28}{'':>22}{'':>12}{'its start':>18}")
variants = {}
for name, kwargs in [("float32", {}), ("bf16 autocast", {"autocast_dtype": torch.bfloat16}),
                     ("fp16 autocast + GradScaler",
                      {"autocast_dtype": torch.float16, "scaler": torch.amp.GradScaler("cuda")}),
                     ("float32, checkpointing", {"checkpointing": True})]:
    predicted, measured, peak, counted = variants[name] = step_with(**kwargs)
    print(f"{name:<28}{fmt(predicted):>22}{fmt(measured):>12}{fmt(peak):>18}"
          f"{fmt(counted.get('layers', 0)):>12}{fmt(counted.get('norm', 0)):>12}")
f32, bf16, fp16 = (variants[k][3] for k in ("float32", "bf16 autocast",
                                             "fp16 autocast + GradScaler"))
claim(0.5 * f32["layers"] < bf16["layers"] < 0.75 * f32["layers"],
      "autocast shrinks the layers' saved activations by more than a quarter, not by half",
      bf16=fmt(bf16["layers"]), float32=fmt(f32["layers"]))
claim(bf16["norm"] > f32["norm"],
      "the head and loss part does not shrink (the loss is in float32), it grows a little",
      bf16=fmt(bf16["norm"]), float32=fmt(f32["norm"]))
claim(near(variants["fp16 autocast + GradScaler"][1], variants["bf16 autocast"][1], rel=0.01)
      and near(variants["fp16 autocast + GradScaler"][2], variants["bf16 autocast"][2],
               rel=0.02),
      "fp16 with its GradScaler costs what bf16 costs")
claim(variants["float32, checkpointing"][1] < variants["float32"][1],
      "checkpointing keeps fewer activations")

# %% id="06-18"
weight_copy = VOCAB * D * 2  # autocast's bf16 copy of the tied embedding/head weight
input_saved = BATCH * SEQ * D * (4 - 2)  # the head's input, saved in bf16, not float32
growth = bf16["norm"] - f32["norm"]
print(f"head and loss part: bf16 {fmt(bf16['norm'])}, float32 {fmt(f32['norm'])}, "
      f"growth {fmt(growth, signed=True)}")
print(f"bf16 copy of the tied weight {fmt(weight_copy)}, less the smaller input "
      f"{fmt(input_saved)}: {fmt(weight_copy - input_saved, signed=True)}")
claim(near(growth, weight_copy - input_saved, rel=0.02),
      "the head's growth under autocast is the tied weight's 16-bit copy, less its smaller "
      "input", growth=fmt(growth), copy=fmt(weight_copy), input=fmt(input_saved))

# %% [markdown] id="06-13"
# - **Autocast** (bf16 or fp16) runs matrix products in 16-bit, so the layers' saved
#   activations shrink (the `layers` column), though not to half: the layer norms run, and
#   save their inputs, in float32, and the graph also keeps the 16-bit copies of the weights
#   that autocast makes for each forward pass. The head and loss part does not shrink,
#   because the loss is computed in float32 (`.float()` in `loss_fn`), and it even grows a
#   little: the head's 16-bit input is smaller, but its graph also keeps autocast's 16-bit copy
#   of the head's weight, which is the embedding (the two are tied), for the head's backward.
#   Parameters, gradients and AdamW state stay float32.
# - **fp16** needs a `GradScaler` (fp16's narrow range makes small gradients vanish without
#   it). The scaler keeps only a few scalars: its row matches bf16's. bf16 needs no scaler.
# - **Checkpointing** keeps only each layer's input and recomputes the layer during backward:
#   the activations shrink to the layer inputs plus what lies outside the layers (embedding,
#   head, loss), at the cost of one extra forward pass per layer. Compare its step peak with
#   float32's: during backward one layer's activations come back while it is recomputed, and
#   the head's large tensors are not checkpointed.
#
# ## Inference: `no_grad`, `inference_mode`, half precision
#
# Without a graph, nothing is saved for backward: only the output (here the logits) stays.

# %% id="06-14"
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
kept = {name: forward_only(mode)[0] for name, mode in [
    ("grad", contextlib.nullcontext), ("no_grad", torch.no_grad),
    ("inference", torch.inference_mode)]}
claim(kept["no_grad"] == kept["inference"] < kept["grad"],
      "no_grad and inference_mode keep the same memory, far less than with autograd")
claim(near(half_bytes, params_measured / 2, within=2**20), ".half() halves the weights")

# %% [markdown] id="06-15"
# Compare the `no_grad` and `inference_mode` rows: the difference between them is speed, not
# memory (`inference_mode` also skips autograd's version counters and view tracking). `.half()`
# halves the weights (and `.detach()` on a result, like `.item()` in notebook 2, drops its
# graph).

# %% id="06-16"
# %gpumem history -n 8

# %% [markdown] id="06-17"
# What to take away:
#
# - Parameters, gradients and AdamW state follow the rule to the byte (the weight, its
#   gradient and two AdamW states, each in float32); `opt.step()` needs temporaries on top,
#   about one more list the size of the parameters.
# - Activations are what autograd saves: count them with `saved_tensors_hooks` at small
#   batches and extrapolate, instead of guessing from a formula.
# - The parts do not simply add up: the step's peak is set by one phase, and its temporaries
#   push it up. Budget with the measured peak of one real step.
# - Autocast shrinks the layers' saved activations but not by half, and leaves parameters,
#   gradients and AdamW state in float32; checkpointing keeps fewer activations; under
#   `no_grad` and `inference_mode` nothing is saved for backward, only the output stays.
