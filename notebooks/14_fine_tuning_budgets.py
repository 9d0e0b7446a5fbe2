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

# %% [markdown] id="14-00"
# # 14. Budgets for fine-tuning: bf16 weights, LoRA, and each optimizer's state
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** how much GPU memory does fine-tuning take, once the weights are bf16, most
# of them are frozen behind LoRA adapters, and the optimizer is not AdamW?
#
# Notebook 6 budgets float32 training with AdamW: four float32 numbers per parameter before
# activations.
# The calculators learners use start elsewhere: weights in bf16, and often only small adapters
# trained. This notebook writes each rule as a formula, prints what it predicts, and measures
# it: the weights and gradients in float32 and bf16, the state each optimizer keeps (SGD, SGD
# with momentum, Adam, AdamW with `foreach` and with `fused`, and Adafactor), then LoRA.
#
# The LoRA adapter here is **written by hand** (a dozen lines below), not the `peft` library's:
# the same idea (a frozen weight plus a trainable low-rank product), with none of peft's
# options. It needs an NVIDIA GPU and torch with CUDA.
#
# > The outputs were produced by running this notebook on the GPU its metadata
# > (`gpumem_nb` key) names, with the driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="14-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import math

import torch
from claims import claim, near, skipped
from torch import nn

from gpumem_nb.units import format_bytes as fmt

MiB = 2**20
torch.manual_seed(0)
torch.zeros(1, device="cuda")
allocated = torch.cuda.memory_allocated
D, FF, LAYERS, BATCH, SEQ = 2048, 8192, 8, 8, 512


class Block(nn.Module):
    # A transformer's feed-forward half: norm, up, GELU, down, residual.
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.up = nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def make_model(dtype):
    with torch.device("cuda"):
        return nn.Sequential(*(Block() for _ in range(LAYERS))).to(dtype)


def batch(dtype):
    return torch.randn(BATCH, SEQ, D, device="cuda", dtype=dtype)


def loss_of(model, x):
    return model(x).float().pow(2).mean()


def round512(nbytes):
    # The caching allocator hands out blocks in multiples of 512 B.
    return max(512, -(-nbytes // 512) * 512)


loss_of(make_model(torch.float32), batch(torch.float32)).backward()  # warm-up: cuBLAS
N = sum(p.numel() for p in make_model(torch.float32).parameters())
torch.cuda.empty_cache()
print(f"{N:,} parameters ({N / 1e6:.0f}M) in {LAYERS} blocks, {D} wide")

# %% [markdown] id="14-02"
# ## Weights and gradients: float32 or bf16
#
# A parameter costs its number type's size, and its gradient the same again: the rule is
# `parameters × bytes per number`, twice. The cell builds the model in each type, measures what
# the weights took, runs one forward and backward pass, and measures what the gradients added.

# %% id="14-03"
def weights_and_grads(dtype):
    before = allocated()
    model = make_model(dtype)
    weights = allocated() - before
    x = batch(dtype)
    loss = loss_of(model, x)
    loss.backward()
    del loss, x
    grads = allocated() - before - weights
    del model
    return weights, grads


print(f"{'':<10}{'weights predicted':>20}{'measured':>12}{'gradients predicted':>22}"
      f"{'measured':>12}")
sizes = {}
for dtype in (torch.float32, torch.bfloat16):
    element = torch.empty(0, dtype=dtype).element_size()
    weights, grads = sizes[dtype] = weights_and_grads(dtype)
    print(f"{str(dtype).removeprefix('torch.'):<10}{fmt(element * N):>20}{fmt(weights):>12}"
          f"{fmt(element * N):>22}{fmt(grads):>12}")
f32_w, f32_g = sizes[torch.float32]
bf_w, bf_g = sizes[torch.bfloat16]
claim(f32_w == f32_g == 4 * N and bf_w == bf_g == 2 * N,
      "weights and gradients take 4 bytes a parameter each in float32, 2 in bf16, to the byte",
      float32=fmt(f32_w), bf16=fmt(bf_w))

# %% [markdown] id="14-04"
# ## Each optimizer's state, predicted and measured
#
# Optimizer state is created at the first `step()`, one set per parameter tensor, in the
# parameter's own type (here bf16: pure-bf16 fine-tuning). The rules, per parameter tensor:
#
# - **SGD** keeps nothing;
# - **SGD with momentum** keeps a momentum buffer, one tensor the size of the parameter;
# - **Adam and AdamW** keep two (`exp_avg`, `exp_avg_sq`); their step counter is a CPU scalar,
#   except with `fused=True`, where it is a one-number float32 tensor on the GPU;
# - **Adafactor** keeps, for a matrix, one number per row and one per column (`row_var`,
#   `col_var`), and a full tensor only for vectors (`variance`); its step counter is on the
#   CPU.
#
# Each tensor is rounded up to the allocator's block size (`round512` above). The cell prints
# each prediction from those rules, then measures the state as the growth of `allocated` across
# the first step, and the step's temporaries as its peak above what it left.

# %% id="14-05"
def state_rule(name, params):
    # Bytes of GPU state the rules above predict, rounded as the allocator rounds.
    total = 0
    for p in params:
        size, element = p.nbytes, p.element_size()
        if name == "SGD with momentum":
            total += round512(size)
        elif name.startswith(("Adam ", "AdamW ")):
            total += 2 * round512(size) + (round512(4) if "fused" in name else 0)
        elif name == "Adafactor":
            if p.dim() >= 2:
                rows, cols = p.shape[-2], p.shape[-1]
                rest = math.prod(p.shape[:-2])
                total += round512(rest * rows * element) + round512(rest * cols * element)
            else:
                total += round512(size)
    return total


OPTIMIZERS = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=1e-3),
    "SGD with momentum": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    "Adam (foreach)": lambda ps: torch.optim.Adam(ps, lr=1e-4, foreach=True),
    "AdamW (foreach)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
    "AdamW (fused)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, fused=True),
}
if hasattr(torch.optim, "Adafactor"):
    OPTIMIZERS["Adafactor"] = lambda ps: torch.optim.Adafactor(ps, lr=1e-3)


def first_step(make_optimizer, dtype=torch.bfloat16):
    model = make_model(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(params)
    loss_of(model, batch(dtype)).backward()
    before = allocated()
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    state = allocated() - before
    temporaries = torch.cuda.max_memory_allocated() - allocated()
    del opt, model
    return params, state, temporaries


states = {}
print(f"{'optimizer (bf16 weights)':<26}{'predicted':>12}{'measured':>12}{'per parameter':>15}"
      f"{'step temporaries':>18}")
for name, make_optimizer in OPTIMIZERS.items():
    params, state, temporaries = first_step(make_optimizer)
    predicted = state_rule(name, params)
    states[name] = (predicted, state, temporaries)
    print(f"{name:<26}{fmt(predicted):>12}{fmt(state):>12}{state / N:>13.3f} B"
          f"{fmt(temporaries):>18}")
    del params
claim(all(near(measured, predicted, within=64 * 1024)
          for predicted, measured, _ in states.values()),
      "every optimizer's state is what its rule predicts, within 64 KiB",
      **{name: f"{fmt(m)} measured, {fmt(p)} by the rule" for name, (p, m, _) in states.items()})
claim(states["SGD"][1] == 0, "plain SGD keeps no state at all", sgd=fmt(states["SGD"][1]))
claim(near(states["AdamW (foreach)"][1], 2 * states["SGD with momentum"][1], rel=0.01),
      "AdamW keeps twice what SGD with momentum keeps")
claim(states["AdamW (fused)"][2] < states["AdamW (foreach)"][2],
      "fused AdamW's step needs fewer temporaries than foreach's",
      fused=fmt(states["AdamW (fused)"][2]), foreach=fmt(states["AdamW (foreach)"][2]))
if "Adafactor" in states:
    claim(states["Adafactor"][1] < states["AdamW (foreach)"][1] / 20,
          "Adafactor's factored state is a small fraction of AdamW's",
          adafactor=fmt(states["Adafactor"][1]), adamw=fmt(states["AdamW (foreach)"][1]))
else:
    skipped("Adafactor's factored state is a small fraction of AdamW's",
            f"torch {torch.__version__} has no torch.optim.Adafactor")

# %% [markdown] id="14-06"
# The step temporaries are the other half of an optimizer's cost: the `foreach` versions update
# all tensors with a few list operations, each making a list of intermediate results; the
# `fused` AdamW does the update in one kernel per group of tensors. A budget needs the state
# *and* the step's temporaries.

# %% [markdown] id="14-08"
# ## LoRA: freeze the model, train small adapters
#
# LoRA leaves each weight `W` frozen and learns a low-rank correction: `W x + (B A x) · α/r`,
# with `A` of shape `r × in` and `B` of shape `out × r`. Only `A` and `B` get gradients and
# optimizer state. The adapter below is written by hand for this notebook; its adapters are
# kept in float32 while the frozen model is bf16 (as peft does by default), so its rule is:
# the model's weights in bf16, and for each adapter parameter four float32 numbers (its weight,
# its gradient, AdamW's two moments).

# %% id="14-09"
RANK = 16


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update (hand-written, not peft's)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 32.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        device = base.weight.device
        self.a = nn.Parameter(torch.randn(rank, base.in_features, device=device) / rank)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        self.scale = alpha / rank

    def forward(self, x):
        update = (x.float() @ self.a.T) @ self.b.T
        return self.base(x) + (update * self.scale).to(x.dtype)


def lora_model():
    model = make_model(torch.bfloat16).requires_grad_(False)
    for block in model:
        block.up, block.down = LoRALinear(block.up, RANK), LoRALinear(block.down, RANK)
    return model


before = allocated()
lora = lora_model()
built = allocated() - before
adapters = [p for p in lora.parameters() if p.requires_grad]
P = sum(p.numel() for p in adapters)
opt = torch.optim.AdamW(adapters, lr=1e-4, foreach=True)
x = batch(torch.bfloat16)
before_step = allocated()
loss_of(lora, x).backward()
grads = allocated() - before_step
opt.step()
lora_state = allocated() - before_step - grads
frozen_grads = sum(p.grad is not None for p in lora.parameters() if not p.requires_grad)

rule_weights = 2 * N + sum(round512(p.nbytes) for p in adapters)
rule_grads = sum(round512(p.nbytes) for p in adapters)
rule_state = state_rule("AdamW (foreach)", adapters)
print(f"rank {RANK}: {P:,} adapter parameters, {100 * P / N:.2f}% of the model's {N:,}")
print(f"{'':<22}{'predicted':>12}{'measured':>12}")
for part, predicted, measured in (("weights", rule_weights, built), ("gradients", rule_grads,
                                                                      grads),
                                  ("AdamW state", rule_state, lora_state)):
    print(f"{part:<22}{fmt(predicted):>12}{fmt(measured):>12}")
lora_static = built + grads + lora_state
print(f"static total: {fmt(lora_static)}; a full bf16 fine-tune with AdamW by the rule "
      f"(2 + 2 + 4 bytes a parameter): {fmt(8 * N)}")
claim(built == rule_weights and grads == rule_grads and near(lora_state, rule_state,
                                                             within=64 * 1024),
      "LoRA's weights, gradients and AdamW state are what its rule predicts",
      weights=fmt(built), gradients=fmt(grads), state=fmt(lora_state))
claim(frozen_grads == 0, "the frozen weights get no gradients")
del opt, x

# %% [markdown] id="14-10"
# LoRA shrinks what depends on the *trained* parameters (gradients and optimizer state) to a
# sliver; the frozen weights stay. Activations are another matter: the backward pass still runs
# through every frozen layer to reach the adapters below it. The two cells below run one whole
# step each, a full bf16 fine-tune with AdamW and the LoRA model, and `%%gpumem --reset-peak`
# measures each step's exact peak.

# %% id="14-11"
full = make_model(torch.bfloat16)
full_opt = torch.optim.AdamW(full.parameters(), lr=1e-4, foreach=True)
lora_opt = torch.optim.AdamW(adapters, lr=1e-4, foreach=True)
x = batch(torch.bfloat16)
for model, opt in ((full, full_opt), (lora, lora_opt)):  # a first step makes the state
    loss_of(model, x).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"allocated, both models and their optimizer state: {fmt(allocated())}")

# %% id="14-12"
# %%gpumem --reset-peak -q
loss_of(full, x).backward()
full_opt.step()
full_opt.zero_grad(set_to_none=True)

# %% id="14-13"
# %%gpumem --reset-peak -q
loss_of(lora, x).backward()
lora_opt.step()
lora_opt.zero_grad(set_to_none=True)

# %% id="14-14"
import gpumem_nb

rows = gpumem_nb.history()
full_row, lora_row = rows.iloc[-2], rows.iloc[-1]  # the two %%gpumem cells above
full_peak = int(full_row.peak_allocated_bytes - full_row.allocated_before_bytes)
lora_peak = int(lora_row.peak_allocated_bytes - lora_row.allocated_before_bytes)
print(f"one step's peak above its start: full bf16 + AdamW {fmt(full_peak)}, "
      f"LoRA rank {RANK} {fmt(lora_peak)}")
print(f"the full model's gradients alone: {fmt(2 * N)}")
claim(full_row.peak_exact and lora_row.peak_exact and lora_peak < full_peak,
      "the LoRA step peaks lower than the full fine-tuning step",
      full=fmt(full_peak), lora=fmt(lora_peak))

# %% [markdown] id="14-15"
# The full step's peak above its start includes the gradients of every weight (they appear
# during the backward pass) and the optimizer's temporaries; the LoRA step needs neither at
# that size. Both keep the activations of the forward pass: that part LoRA does not remove.
# Activation checkpointing (notebook 6) does.
#
# ## The rule for a model you have not built
#
# Bytes per parameter, before activations, as the cells above measured them:

# %% id="14-16"
RULES = {
    "float32 weights, AdamW (notebook 6)": 4 + 4 + 8,
    "bf16 weights, AdamW": 2 + 2 + 4,
    "bf16 weights, SGD with momentum": 2 + 2 + 2,
    "bf16 weights, plain SGD": 2 + 2,
    "bf16 weights frozen (LoRA: adapters extra)": 2,
    "inference, bf16": 2,
}
for params in (1e9, 7e9):
    print(f"a {params / 1e9:.0f}B-parameter model:")
    for rule, per_parameter in RULES.items():
        print(f"    {rule:<46}{per_parameter:>3} B a parameter = "
              f"{per_parameter * params / 2**30:8.1f} GiB")
measured_per_parameter = {
    "bf16 weights, AdamW": (bf_w + bf_g + states["AdamW (foreach)"][1]) / N,
    "bf16 weights, SGD with momentum": (bf_w + bf_g + states["SGD with momentum"][1]) / N}
claim(all(near(v, RULES[k], rel=0.01) for k, v in measured_per_parameter.items()),
      "the rules' bytes per parameter are the ones measured on this model",
      **{k: f"{v:.3f} B" for k, v in measured_per_parameter.items()})

# %% [markdown] id="14-17"
# What to take away:
#
# - A parameter costs its type's size for the weight and again for its gradient: bf16 halves
#   both against float32.
# - Optimizer state, per trained parameter, in the parameter's type: none for SGD, one copy
#   with momentum, two for Adam and AdamW, a row and a column per matrix for Adafactor.
# - `foreach` and `fused` keep the same state; the step's temporaries differ, and the budget
#   needs them too.
# - LoRA removes the gradients and optimizer state of the frozen weights, not the weights
#   themselves nor the activations.
