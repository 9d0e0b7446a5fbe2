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

# %% [markdown] id="11-00"
# # 11. Generation: the KV cache, token by token
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# Training memory is set by the batch; generation memory keeps growing while it runs. Each new
# token attends to every token before it, so `generate()` keeps the keys and values of every
# layer for every token so far: the *KV cache*. It grows by the same amount with each generated
# token, and it is what runs out first when the batch or the output is long.
#
# This notebook predicts what one token adds, measures it, and then runs a generation out of
# memory to read what gpumem_nb's explanation says about the cache. The model is GPT-2's
# architecture, built by Hugging Face `transformers` from a config: no weights are downloaded,
# and random weights use memory exactly as trained ones do.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="11-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import re
import sys

import torch
import transformers
from claims import claim, near, skipped
from transformers import GPT2Config, GPT2LMHeadModel

from gpumem_nb.units import format_bytes as fmt

transformers.logging.set_verbosity_error()  # no advice about configs on every call
GiB, MiB = 2**30, 2**20
config = GPT2Config(n_embd=1024, n_layer=12, n_head=16, n_positions=1024)
with torch.device("cuda"):
    model = GPT2LMHeadModel(config).eval()
print(f"GPT-2 shape: {config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads; "
      f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, float32, "
      f"transformers {transformers.__version__}")


def generate(batch, prompt, new_tokens):
    # Greedy generation of exactly `new_tokens` tokens (min = max: no early stop).
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


generate(1, 8, 4)  # warm-up: cuBLAS's workspaces and the first kernels
print("warmed up")

# %% [markdown] id="11-02"
# ## One token's worth, predicted
#
# Each layer keeps one key and one value vector per token, per sequence, for each key/value
# head: `2 × layers × batch × KV heads × head size × bytes per number` for every token, prompt
# tokens included. In GPT-2 every query head has its own key/value head, so `KV heads × head
# size` is the model's width; models with grouped-query or multi-query attention keep fewer
# key/value heads than query heads, and so a smaller cache than the width suggests.

# %% id="11-03"
BATCH, PROMPT = 8, 32
element = next(model.parameters()).element_size()
per_token = 2 * config.n_layer * BATCH * config.n_embd * element
print(f"predicted: 2 × {config.n_layer} layers × batch {BATCH} × {config.n_embd} wide × "
      f"{element} bytes = {fmt(per_token)} per token")

# %% id="11-14"
from transformers import LlamaConfig, LlamaForCausalLM

# A small Llama-shaped model from a config (no download): 16 query heads share 4 key/value heads.
gqa = LlamaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16,
                  num_key_value_heads=4, intermediate_size=2048, vocab_size=32000)
small = LlamaForCausalLM(gqa).to("cuda", torch.float16).eval()
ids = torch.randint(0, gqa.vocab_size, (1, 64), device="cuda")
with torch.no_grad():
    out = small(ids, use_cache=True)
measured = sum(t.nbytes for t in cache_tensors(out.past_key_values)) // 64
head = gqa.hidden_size // gqa.num_attention_heads
by_kv_heads = 2 * gqa.num_hidden_layers * gqa.num_key_value_heads * head * 2
by_width = 2 * gqa.num_hidden_layers * gqa.hidden_size * 2
print(f"a sequence's cache per token, float16: measured {fmt(measured)}; "
      f"KV heads × head size {fmt(by_kv_heads)}; width {fmt(by_width)}")
claim(measured == by_kv_heads < by_width,
      "with grouped-query attention the cache follows the key/value heads, not the width",
      measured=fmt(measured), by_kv_heads=fmt(by_kv_heads), by_width=fmt(by_width))
del small, out, ids

# %% [markdown] id="11-04"
# ## Measured
#
# Two generations from prompts of the same length, one twice as long as the other: the cache
# each leaves behind (in the output, `past_key_values`) is read tensor by tensor, and the
# allocator's `requested` bytes (what the tensors asked for, before rounding) are read around
# each call, with the result kept.

# %% id="11-05"
def measured(new_tokens):
    asked = torch.cuda.memory_stats()["requested_bytes.all.current"]
    out = generate(BATCH, PROMPT, new_tokens)
    grew = torch.cuda.memory_stats()["requested_bytes.all.current"] - asked
    tensors = cache_tensors(out.past_key_values)
    tokens = tensors[0].shape[-2]
    result = (sum(t.nbytes for t in tensors), tokens, grew)
    del out, tensors
    return result


short, long = 64, 128
(bytes_short, tokens_short, grew_short) = measured(short)
(bytes_long, tokens_long, grew_long) = measured(long)
for new, nbytes, tokens, grew in ((short, bytes_short, tokens_short, grew_short),
                                  (long, bytes_long, tokens_long, grew_long)):
    print(f"{new:>4} new tokens: the cache holds {tokens} tokens, {fmt(nbytes)}; requested "
          f"grew by {fmt(grew)} with the output kept")
per_token_measured = (bytes_long - bytes_short) // (tokens_long - tokens_short)
print(f"measured: {fmt(per_token_measured)} per token; predicted {fmt(per_token)}")
claim(per_token_measured == per_token and bytes_long == per_token * tokens_long,
      "the cache grows by the predicted bytes per token, to the byte",
      measured=fmt(per_token_measured), predicted=fmt(per_token))
claim(tokens_long == PROMPT + long - 1,
      "it holds the prompt and every generated token but the last (whose keys and values the "
      "next step would compute)", tokens=tokens_long, prompt=PROMPT, generated=long)
claim(near(grew_long - grew_short, bytes_long - bytes_short, within=MiB),
      "the allocator's requested bytes grow by the cache's growth, within 1 MiB",
      allocator=fmt(grew_long - grew_short), cache=fmt(bytes_long - bytes_short))

# %% [markdown] id="11-06"
# So a batch's cache is linear in its tokens: double the batch or the length, double the
# cache. `DynamicCache` (the default) grows its tensors by concatenation, one token at a time,
# so for a moment each layer holds the old tensor and the new one. The out-of-memory error
# below is such a moment: the line printed after its explanation sets the failed request
# beside the size of one layer's keys (or values) at the length the cache had reached.
#
# ## Out of memory in the middle of a generation
#
# The next cells cap this process to a small share of the GPU (as notebook 4 does, with
# `set_per_process_memory_fraction`) and start a generation whose cache cannot fit it: a large
# batch, a long output. It fails part-way, after the cache has grown for a while.

# %% id="11-07"
CAP = 24 * GiB
OOM_BATCH, OOM_PROMPT, OOM_NEW = 512, 128, 768  # 896 tokens: within n_positions
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(CAP / total)
oom_per_token = 2 * config.n_layer * OOM_BATCH * config.n_embd * element
print(f"cap {fmt(CAP)}; batch {OOM_BATCH}: {fmt(oom_per_token)} per token, so "
      f"{OOM_PROMPT + OOM_NEW} tokens would need {fmt(oom_per_token * (OOM_PROMPT + OOM_NEW))}")

# %% id="11-08" tags=["raises-exception"]
out = generate(OOM_BATCH, OOM_PROMPT, OOM_NEW)

# %% id="11-09"
found = get_ipython().run_line_magic("gpumem", "oom -o")
text = str(found)
for line in text.splitlines():
    if "KV cache" in line or line.startswith("Cause:"):
        print(line.strip())
# The failed request beside one layer's keys (or values) at the length the explanation gives.
at_tokens = re.search(r"at (\d+) tokens", text)
asked = re.search(r"Tried to allocate ([\d.]+ \w+)", str(getattr(sys, "last_value", "")))
if at_tokens:
    one_layer = OOM_BATCH * int(at_tokens.group(1)) * config.n_embd * element
    print(f"one layer's keys (or values) at {at_tokens.group(1)} tokens: batch {OOM_BATCH} × "
          f"{at_tokens.group(1)} × {config.n_embd} wide × {element} bytes = {fmt(one_layer)}; "
          f"the failed request: {asked.group(1) if asked else '(not in the message)'}")
claim(found is not None and "KV cache" in text,
      "the explanation names the KV cache generate() was filling, and what it held")
if "per generated token" in text:
    claim(f"growing {fmt(oom_per_token)} per generated token" in text,
          "the explanation's growth per generated token is the predicted one for this batch",
          predicted=fmt(oom_per_token))
else:
    skipped("the explanation's growth per generated token is the predicted one for this batch",
            "the explanation gives no growth per token for this cache")
claim("max_new_tokens" in text,
      "its advice names what to lower: the batch size or max_new_tokens")

# %% [markdown] id="11-10"
# The request that failed is the size of one layer's keys (or values) at that length (the line
# above): the concatenation that grows a layer's cache by a token asks for the whole new tensor
# while the old one is still alive.
#
# The cache was still alive when the error was raised: `generate()`'s local variables hold it,
# and the stored traceback keeps those frames. `%gpumem cleanup` drops the traceback, and with
# it the cache; the cap is lifted again after.

# %% id="11-11"
# %gpumem cleanup

# %% id="11-12"
torch.cuda.set_per_process_memory_fraction(1.0)
left = torch.cuda.memory_allocated() - sum(p.nbytes for p in model.parameters())
print(f"allocated beyond the model's weights after the cleanup: {fmt(left)}")
claim(left < 256 * MiB, "the cleanup freed the cache: little beyond the weights is left",
      left=fmt(left))

# %% [markdown] id="11-13"
# What to take away:
#
# - The KV cache costs `2 × layers × batch × KV heads × head size × bytes per number` per
#   token, prompt included (the width in place of `KV heads × head size` only where every query
#   head has its own key/value head, as in GPT-2), and grows until the generation ends.
# - Memory for generation is set by batch × (prompt + new tokens): lower either, use a smaller
#   number type for the model and the cache, or a cache that keeps less on the GPU
#   (`cache_implementation="offloaded"` or `"quantized"` in `generate()`).
# - A failed generation keeps its cache alive through the stored traceback until you drop it
#   (`%gpumem cleanup`).
