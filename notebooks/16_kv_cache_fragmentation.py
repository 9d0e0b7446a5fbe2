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

# %% [markdown] id="16-00"
# # 16. The KV cache's own fragmentation, and its size under grouped-query attention
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# **The question:** the KV cache should fit, by the formula, so why does generation run out of
# memory with gigabytes still free?
#
# Two answers, each measured. First the formula itself: models with *grouped-query attention*
# (GQA: Llama 3, Mistral and most recent models) keep fewer key and value heads
# than query heads, so the cache per token is `2 × layers × batch × n_kv_heads × head_dim ×
# bytes`, not `... × width`: with the width, the estimate is too large by `n_heads /
# n_kv_heads`. Then the growth: a cache grown with `torch.cat` at every token (as
# `transformers`' default `DynamicCache` does) asks the allocator, at each token, for a tensor
# one token larger than the one it frees. No freed block is ever large enough, so with the
# native allocator each token's request is a new segment and the freed ones pile up in the
# cache: `reserved` climbs far above `allocated`. Notebook 11's out-of-memory error was such a
# moment. A preallocated cache, or `expandable_segments`, avoids it.
#
# Sizes are set from this GPU's memory. It needs an NVIDIA GPU and torch with CUDA, and
# `transformers` (no weights are downloaded: the model is built from a config).
#
# > The outputs were produced by running this notebook on the GPU its metadata
# > (`gpumem_nb` key) names, with the driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="16-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import torch
import transformers
from claims import claim, near
from transformers import LlamaConfig, LlamaForCausalLM

from gpumem_nb.units import format_bytes as fmt

transformers.logging.set_verbosity_error()
MiB = 2**20
torch.zeros(1, device="cuda")
config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=2048)
HEAD_DIM = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
with torch.device("cuda"):
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
print(f"Llama-shaped model: {config.num_hidden_layers} layers, {config.hidden_size} wide, "
      f"{config.num_attention_heads} query heads, {config.num_key_value_heads} key/value heads "
      f"of {HEAD_DIM}; bf16; transformers {transformers.__version__}")


def generate(batch, prompt, new_tokens):
    # Greedy generation of exactly `new_tokens` tokens (as in notebook 11).
    ids = torch.randint(0, config.vocab_size, (batch, prompt), device="cuda")
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, return_dict_in_generate=True)


def cache_tensors(cache):
    # The keys and values a cache holds, whichever version of transformers made it.
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [t for layer in cache.layers for t in (layer.keys, layer.values)
                if t is not None]
    if hasattr(cache, "key_cache"):
        return [*cache.key_cache, *cache.value_cache]
    return [t for kv in cache for t in kv]


generate(1, 8, 4)  # warm-up
print("warmed up")

# %% [markdown] id="16-02"
# ## The cache per token, with grouped-query attention
#
# The cell prints both formulas, then measures: two generations whose outputs differ in
# length, and the cache each leaves behind, tensor by tensor.

# %% id="16-03"
BATCH, PROMPT = 8, 32
element = next(model.parameters()).element_size()
L, H, KV = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
right = 2 * L * BATCH * KV * HEAD_DIM * element
wrong = 2 * L * BATCH * config.hidden_size * element
print(f"with n_kv_heads: 2 × {L} layers × batch {BATCH} × {KV} heads × {HEAD_DIM} × "
      f"{element} bytes = {fmt(right)} per token")
print(f"with the width:  2 × {L} layers × batch {BATCH} × {config.hidden_size} wide × "
      f"{element} bytes = {fmt(wrong)} per token ({wrong // right}× too much)")


def cache_after(new_tokens):
    out = generate(BATCH, PROMPT, new_tokens)
    tensors = cache_tensors(out.past_key_values)
    found = (sum(t.nbytes for t in tensors), tensors[0].shape[-2], tuple(tensors[0].shape))
    del out, tensors
    return found


(short_bytes, short_tokens, shape), (long_bytes, long_tokens, _) = cache_after(32), cache_after(96)
measured = (long_bytes - short_bytes) // (long_tokens - short_tokens)
print(f"one layer's keys: shape {shape} (batch, heads, tokens, head_dim)")
print(f"measured: {fmt(measured)} per token")
claim(measured == right and shape[1] == KV,
      "the cache keeps n_kv_heads heads, and grows by the n_kv_heads formula, to the byte",
      measured=fmt(measured), formula=fmt(right), heads_kept=shape[1])
claim(wrong == right * H // KV, "the width formula overstates it by n_heads / n_kv_heads",
      ratio=wrong // right, heads=H, kv_heads=KV)
del model
torch.cuda.empty_cache()

# %% [markdown] id="16-04"
# ## A cache grown by `torch.cat`, token by token
#
# Now the growth, written out by hand so nothing hides it: each layer's keys and values are a
# `(batch, heads, tokens, head_dim)` bf16 tensor, and each new token is appended with
# `torch.cat`. The shapes are chosen so that one token of one layer's keys is exactly the
# allocator's 2 MiB rounding: every request is then the exact size the cache needs, and the
# arithmetic below is exact. The number of tokens is set from this GPU's memory. `%%gpumem`
# measures the cell.

# %% id="16-05"
B, HEADS, DH, LAYERS, PROMPT_TOKENS = 256, 32, 128, 4, 16
token_bytes = B * HEADS * DH * 2  # one token, one layer, keys or values: 2 MiB
total = torch.cuda.get_device_properties(0).total_memory


def cat_reserves(tokens):
    # What the native allocator reserves for a cat-grown cache that reaches `tokens`, if no
    # freed block is ever reused: every size from the prompt's up, for each tensor.
    return 2 * LAYERS * token_bytes * sum(range(PROMPT_TOKENS, tokens + 1))


TOKENS = PROMPT_TOKENS + 1
while cat_reserves(TOKENS + 1) <= total // 8:
    TOKENS += 1
FINAL = 2 * LAYERS * token_bytes * TOKENS
step_kv = torch.randn(B, HEADS, 1, DH, device="cuda", dtype=torch.bfloat16)
torch.cuda.empty_cache()
print(f"{LAYERS} layers, batch {B}, {HEADS} heads of {DH}: {fmt(token_bytes)} per token per "
      f"tensor; from a {PROMPT_TOKENS}-token prompt to {TOKENS} tokens")
print(f"the cache at the end: {fmt(FINAL)}")

# %% id="16-06"
# %%gpumem -q
cache = [[torch.randn(B, HEADS, PROMPT_TOKENS, DH, device="cuda", dtype=torch.bfloat16)
          for _ in range(2)] for _ in range(LAYERS)]
for _ in range(PROMPT_TOKENS, TOKENS):
    for layer in cache:
        for i in range(2):
            layer[i] = torch.cat([layer[i], step_kv], dim=2)
torch.cuda.synchronize()

# %% id="16-07"
import gpumem_nb

grown = gpumem_nb.history().iloc[-1]  # the %%gpumem cell above
free_blocks = [b["size"] for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
               if b["state"] == "inactive"]
next_request = (TOKENS + 1) * token_bytes
stats = torch.cuda.memory_stats()
print(f"allocated Δ {fmt(int(grown.allocated_delta_bytes))}, reserved Δ "
      f"{fmt(int(grown.reserved_delta_bytes))}; the cache: {fmt(FINAL)}")
print(f"predicted if no freed block is reused: {fmt(cat_reserves(TOKENS))}")
print(f"cached and free: {fmt(sum(free_blocks))} in {len(free_blocks)} blocks, the largest "
      f"{fmt(max(free_blocks))}; the next token asks for {fmt(next_request)} per tensor")
print(f"allocator retries so far: {stats['num_alloc_retries']}")
claim(grown.allocated_delta_bytes == FINAL, "what stays allocated is the cache, to the byte",
      allocated=fmt(int(grown.allocated_delta_bytes)), cache=fmt(FINAL))
claim(near(grown.reserved_delta_bytes, cat_reserves(TOKENS), rel=0.02),
      "reserved grew by every size the cache ever had: no freed block was reused",
      reserved=fmt(int(grown.reserved_delta_bytes)), predicted=fmt(cat_reserves(TOKENS)))
claim(max(free_blocks) < next_request < sum(free_blocks),
      "the next token's request fits in the free cache in total, but in none of its blocks",
      largest=fmt(max(free_blocks)), request=fmt(next_request), free=fmt(sum(free_blocks)))
del cache
torch.cuda.empty_cache()

# %% [markdown] id="16-08"
# Each freed tensor is exactly one token too small for the next request (the largest free block
# against the next request, above): the cache reserves a new segment at every step and keeps
# the old ones. On a card with room to spare, this only inflates `reserved`; on a full one,
# the allocator frees its cache and retries at each step (slow), and when a segment it cannot
# free sits between the pieces, a request fails with far more free in total than asked for:
# notebook 11's error.
#
# ## Preallocated: the cache's final size, once
#
# The same tokens written into tensors allocated once at their final length (what a static
# cache does: `cache_implementation="static"` in `transformers`): each step writes one slice,
# and nothing is allocated while generating.

# %% id="16-09"
# %%gpumem -q
cache = [[torch.empty(B, HEADS, TOKENS, DH, device="cuda", dtype=torch.bfloat16)
          for _ in range(2)] for _ in range(LAYERS)]
for layer in cache:
    for t in layer:
        t[:, :, :PROMPT_TOKENS].normal_()
for position in range(PROMPT_TOKENS, TOKENS):
    for layer in cache:
        for t in layer:
            t[:, :, position:position + 1] = step_kv
torch.cuda.synchronize()

# %% id="16-10"
static = gpumem_nb.history().iloc[-1]  # the %%gpumem cell above
print(f"preallocated: allocated Δ {fmt(int(static.allocated_delta_bytes))}, reserved Δ "
      f"{fmt(int(static.reserved_delta_bytes))}, peak above the start "
      f"{fmt(int(static.peak_allocated_bytes - static.allocated_before_bytes))}")
print(f"grown by cat:  reserved Δ {fmt(int(grown.reserved_delta_bytes))}, peak above the start "
      f"{fmt(int(grown.peak_allocated_bytes - grown.allocated_before_bytes))}")
claim(static.allocated_delta_bytes == static.reserved_delta_bytes == FINAL,
      "preallocated, reserved grows by the cache and no more",
      allocated=fmt(int(static.allocated_delta_bytes)),
      reserved=fmt(int(static.reserved_delta_bytes)), cache=fmt(FINAL))
# At the last cat every tensor has its final size but one, which exists twice: its old length
# and its new one.
grown_peak_rule = FINAL + (TOKENS - 1) * token_bytes
print(f"the cat-grown cache's peak by that rule: {fmt(grown_peak_rule)}")
claim(static.peak_exact and grown.peak_exact
      and static.peak_allocated_bytes - static.allocated_before_bytes == FINAL
      and near(grown.peak_allocated_bytes - grown.allocated_before_bytes, grown_peak_rule,
               within=MiB),
      "the preallocated cache peaks at its size; the cat-grown one at its size plus the "
      "tensor being replaced",
      preallocated=fmt(int(static.peak_allocated_bytes - static.allocated_before_bytes)),
      grown=fmt(int(grown.peak_allocated_bytes - grown.allocated_before_bytes)),
      rule=fmt(grown_peak_rule))
del cache
torch.cuda.empty_cache()

# %% [markdown] id="16-11"
# ## `expandable_segments`: the same growth, reserved once
#
# With `expandable_segments:True` the allocator maps memory into one growing segment, and a
# freed tensor's pages join their free neighbours: after a step, the old tensors of the layers
# already done lie side by side, and together they hold the next one. Allocator settings are
# read when CUDA starts, so the cat-grown cache runs again in two fresh processes, one under
# each setting (the plumbing is in `fresh_process.py` beside this notebook).

# %% id="16-12"
from fresh_process import run_fresh_many

GROW = f'''
import json, torch
B, HEADS, DH, LAYERS = {B}, {HEADS}, {DH}, {LAYERS}
PROMPT_TOKENS, TOKENS = {PROMPT_TOKENS}, {TOKENS}
step_kv = torch.randn(B, HEADS, 1, DH, device="cuda", dtype=torch.bfloat16)
start = torch.cuda.memory_reserved()
cache = [[torch.randn(B, HEADS, PROMPT_TOKENS, DH, device="cuda", dtype=torch.bfloat16)
          for _ in range(2)] for _ in range(LAYERS)]
for _ in range(PROMPT_TOKENS, TOKENS):
    for layer in cache:
        for i in range(2):
            layer[i] = torch.cat([layer[i], step_kv], dim=2)
torch.cuda.synchronize()
print(json.dumps({{"reserved": torch.cuda.memory_reserved() - start,
                  "allocated": sum(t.nbytes for layer in cache for t in layer),
                  "retries": torch.cuda.memory_stats()["num_alloc_retries"]}}))
'''
native, expandable = run_fresh_many(GROW, ["", "expandable_segments:True"])
for name, r in (("native", native), ("expandable_segments", expandable)):
    print(f"{name:<22} cache {fmt(r['allocated'])}, reserved {fmt(r['reserved'])}, "
          f"retries {r['retries']}")
claim(native["allocated"] == expandable["allocated"] == FINAL,
      "both processes grew the same cache")
claim(near(native["reserved"], grown.reserved_delta_bytes, rel=0.02),
      "the fresh native process reserves what this kernel reserved",
      fresh=fmt(native["reserved"]), kernel=fmt(int(grown.reserved_delta_bytes)))
claim(expandable["reserved"] < native["reserved"] / 3,
      "expandable segments reserve a fraction of what the native allocator reserves",
      expandable=fmt(expandable["reserved"]), native=fmt(native["reserved"]))

# %% [markdown] id="16-13"
# What to take away:
#
# - Size a KV cache with the key/value heads: `2 × layers × batch × n_kv_heads × head_dim ×
#   bytes` per token; with grouped-query attention the width overstates it by
#   `n_heads / n_kv_heads`.
# - A cache grown by `torch.cat` asks, at every token, for a block one token larger than any it
#   freed: under the native allocator `reserved` climbs with the sum of every size the cache
#   had, and a full GPU fails with much more free in total than the request.
# - Preallocate the cache at its final length (a static cache), or run with
#   `PYTORCH_ALLOC_CONF=expandable_segments:True`, and the growth reserves about the cache
#   itself.
