"""The OOM explainer's advice, run as printed: does each step free what it says it frees?

    python3 benchmarks/gpu_diagnosis3.py --out $OUT
        [--set rerun2|new|new4|new5|new6|new7|new8|new9|new10|new11]
        [--budget-s 500] [--allocators native,expandable,cudaMallocAsync]
        [--only KIND,...] [--skip KIND,...] [--merge EARLIER.json] [--run LABEL] [--commit SHA]
    python3 benchmarks/gpu_diagnosis3.py --dry-run [--set ...] [--allocators ...] [--only ...]

Each kind (``gpu_diagnosis2.Kind``: setup cells, a failing cell, steps that free its holders)
runs under one allocator (native, ``expandable_segments:True``, ``backend:cudaMallocAsync``;
a fresh process each, as the backend is read when torch starts) in a real IPython shell with
``%load_ext gpumem_nb``, as ``gpu_diagnosis2.py`` runs it. After the failing cell:

1. the explanation (the monitor's ``oom.last``) is recorded as diagnosis2 records it;
2. the advice is run: every action with a ``code`` (the exact line a user would type, as its
   text shows it between backticks) and a non-None ``nbytes`` (what it says it frees), in the
   explanation's order, each in its own ``shell.run_cell(code)`` (a ``%gpumem`` line runs as a
   line-magic cell), straight after the failure: nothing of the harness's own runs before or
   between them (no ``gc.collect()``, no ``empty_cache()``, no ``%gpumem who`` or dry run,
   whose exception search collects garbage). Before and after each one the harness reads
   ``memory_allocated``, ``memory_reserved`` and the device's used bytes (``mem_get_info``),
   after ``torch.cuda.synchronize()``, and counts the one the action speaks of: reserved for
   an action about a memory pool (diagnosis2's ``Step.reserved``), the device for one about
   other libraries or processes, else allocated;
3. then diagnosis2's own steps free the holders and are measured (``holders``), on what the
   advice left: a holder the advice freed shows ~0 there (``holders_after_advice: true``).

``--set rerun2`` runs diagnosis2's ``KINDS`` with their expected verdicts; ``--set new`` runs
``KINDS3`` below (written after the code froze at ade3ffb), ``--set new4`` runs ``KINDS4``
(written after it froze at 7d21349; 18 kinds, about 670 s: two device calls, e.g.
``--allocators native,expandable --budget-s 480``, then ``--allocators cudaMallocAsync
--merge <the first call's diagnosis3_<card>.json>``), and ``--set new5`` runs ``KINDS5``
(written on 2026-12-06 by a helper blind to the code; 15 kinds, about 560 s: split it the same
way), and ``--set new6`` runs ``KINDS6`` (``benchmarks/diagnosis3_kinds6.py``, written on
2026-12-06 by another helper blind to the code; 18 kinds, about 220 s an allocator:
``--allocators native,expandable --budget-s 470``, then ``--allocators cudaMallocAsync
--budget-s 300 --merge <the first call's diagnosis3_<card>.json>``), and ``--set new7`` runs
``KINDS7`` (``benchmarks/diagnosis3_kinds7.py``, written the same way; 14 kinds, about 180 s an
allocator, split the same way), and ``--set new8`` runs ``KINDS8``
(``benchmarks/diagnosis3_kinds8.py``, written the same way; 14 kinds, about 180 s an allocator
by the dry run's estimate, split the same way), and ``--set new9`` runs ``KINDS9``
(``benchmarks/diagnosis3_kinds9.py``, written the same way; 14 kinds, about 176 s an allocator
by the dry run's estimate, split the same way), and ``--set new10`` runs ``KINDS10``
(``benchmarks/diagnosis3_kinds10.py``, written the same way; 14 kinds, split the same way), and
``--set new11`` runs ``KINDS11`` (``benchmarks/diagnosis3_kinds11.py``, written the same way on
2026-12-08; 14 kinds).
Sizes follow the card:
the child's namespace has ``G`` (the GPU's total bytes, ``torch.cuda.mem_get_info()[1]``),
``frac(x)`` → ``int(x * G)``, and ``GiB``, which is 2**30 on an H200 (139.8 GiB) and
shrinks in proportion on a smaller card (2 MiB-aligned), so diagnosis2's kinds, written in
``GiB`` for the H200, keep their share of an H100. Kinds sized by shapes do not scale
(``--dry-run`` says which).

Writes ``diagnosis3_<card>.json`` (``h200``, ``h100``, from ``torch.cuda.get_device_name``)
and ``diagnosis3_log.txt`` under ``--out`` after every row and every allocator, so a timeout
keeps the rows so far. ``--budget-s`` bounds the whole run (default 500 s, under a device
call's 9 minutes); split a longer run with ``--allocators`` and ``--only`` and join the calls'
files with ``--merge`` (each new row replaces the earlier one of its kind and allocator, which
it names under ``replaces``). Rows: every field of diagnosis2's rows (``D2_FIELDS``) plus
``NEW_FIELDS``; ``checks`` holds ``not_found_le_2pct``, ``named_ge_98pct``,
``advice_freed_ge_95pct`` and ``verdict_ok``, each null where it cannot be judged, with the
reason in ``note`` (which also says where a step raised, or where its code is not shown in
its text, or not between backticks).

Time: ``--dry-run`` prints an estimate per allocator (diagnosis2's H200 row times + 1.5 s of
advice a row + 15 s to start a child). ``--set rerun2`` comes to about 515 s: two device
calls, e.g. ``--allocators native,expandable --budget-s 420``, then ``--allocators
cudaMallocAsync --budget-s 300 --merge <the first call's diagnosis3_<card>.json>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: benchmarks/ is sys.path[0], the project is not
    sys.path.insert(0, ROOT)

from benchmarks import gpu_diagnosis2 as d2  # noqa: E402
from benchmarks.gpu_diagnosis2 import FILL, Kind, Step  # noqa: E402

ALLOCATORS = d2.ALLOCATORS
ROW = "DIAGNOSIS3-ROW "
META = "DIAGNOSIS3-META "
SETS = ("rerun2", "new", "new4", "new5", "new6", "new7", "new8", "new9", "new10", "new11")

# ============================================================================================
# The new kinds, written after the code was frozen by someone who had not seen the explainer's
# code since, each from a user's report, with `expected` written before any run. How one is
# written:
#
#   WRITTEN3 = "YYYY-MM-DD, after the product code was frozen at <commit>; measured once"
#   KINDS3 = [
#       Kind("dataset_cache_in_two_names",                 # a unique snake_case name
#            "https://github.com/<owner>/<repo>/issues/<n>",  # the user report (source)
#            "held by your session",                       # expected: a cause's kind
#            # setup cells, run in order (each its own cell). Size tensors by the card:
#            # frac(0.4) is 40% of the GPU's total bytes; G is the total; GiB is 2**30 on an
#            # H200 and proportionally less on a smaller card. Cells may use %magics.
#            ("class DS:\n    def __init__(self):\n"
#             "        self.store = torch.empty(frac(0.4), dtype=torch.uint8, device='cuda')\n"
#             "ds = DS()\ndl = [ds]",),
#            # the failing cell: FILL is what CUDA has free now, so this always fails
#            f"y = torch.empty({FILL} + frac(0.1), dtype=torch.uint8, device='cuda')",
#            # optional: diagnosis2's steps, run after the advice (what it left, per holder)
#            (Step("ds", "who:ds", "del ds, dl"),),
#            allocators=("native", "expandable", "cudaMallocAsync"),  # where it can run
#            needs="",              # a module it imports (transformers, cupy), if any
#            written=WRITTEN3),     # required for a new kind: --dry-run refuses one without
#   ]
#
# Every new kind is out of sample (set here). The harness runs the explanation's advice on
# its own: a kind never says what the advice should be.
# ============================================================================================
WRITTEN3 = ("2026-12-05, by a helper blind to gpumem_nb's code (which changed from ade3ffb to "
            "005ff5c meanwhile, not from these kinds); measured once")

# Written on 2026-12-05 without reading the explainer's code, each from the user report its
# `source` names; `expected` is the cause by the mechanism, written before any run. Every
# failing cell asks for more than CUDA has free (FILL) unless it is a computation of its own;
# no setup leaves a large freed block in the allocator's cache (one that leaves its step's
# temporaries there empties the cache), so that FILL is all the memory the request can get.
#
# Order matters for one process per allocator: the kinds whose holders outlive `%reset` (a
# running thread, a module in sys.modules, `gc.disable()`) come last, so that a row that ends
# before its steps leaves nothing behind for the kinds before them. A thread waits at most 90 s
# and then ends by itself; a step reaches a module through sys.modules, whatever the advice
# deleted; the last kind turns the collector back on.
FAIL3 = f"y = torch.empty({FILL} + frac(0.1), dtype=torch.uint8, device='cuda')"
GC3 = Step("garbage", "none", "import gc\ngc.collect()")
TB3 = d2.TB

KINDS3: list[Kind] = [
    # ---- library objects in the namespace ---------------------------------------------------
    Kind("queue_of_prefetched_batches",
         "https://github.com/OpenNMT/OpenNMT-py/pull/1716",
         "held by your session",
         # A batch producer's queue.Queue still full of batches (two tensors each) that the
         # training loop never took: the queue alone holds them.
         ("import queue\n"
          "batches = queue.Queue(maxsize=400)\n"
          "def produce(n):\n"
          "    for i in range(n):\n"
          "        batches.put({'src': torch.empty(frac(0.04), dtype=torch.uint8, "
          "device='cuda'),\n"
          "                     'tgt': torch.empty(frac(0.03), dtype=torch.uint8, "
          "device='cuda'),\n"
          "                     'step': i})\n"
          "produce(8)",),
         FAIL3,
         (Step("batches", "who:batches", "del batches"),),
         written=WRITTEN3),
    Kind("deque_replay_buffer_transitions",
         "https://github.com/pytorch/pytorch/issues/148077",
         "held by your session",
         # An RL replay buffer kept as collections.deque(maxlen=...) of CUDA transitions.
         ("import collections\n"
          "replay = collections.deque(maxlen=100_000)\n"
          "for step in range(10):\n"
          "    obs = torch.empty(frac(0.025), dtype=torch.uint8, device='cuda')\n"
          "    nxt = torch.empty(frac(0.025), dtype=torch.uint8, device='cuda')\n"
          "    replay.append((obs, step % 4, 0.0, nxt, False))\n"
          "del obs, nxt",),
         FAIL3,
         (Step("replay", "who:replay", "replay.clear()"),),
         written=WRITTEN3),
    Kind("dataframe_object_column_embeddings",
         "https://github.com/huggingface/sentence-transformers/issues/487",
         "held by your session",
         # Per-document embeddings left on the GPU, kept in a pandas DataFrame's object column
         # (built as an object array: pandas never tries to convert a CUDA tensor).
         ("import numpy as np\nimport pandas as pd\n"
          "docs = pd.DataFrame({'doc_id': range(6), 'text': [f'document {i}' for i in "
          "range(6)]})\n"
          "def encode(text):\n"
          "    return torch.empty(frac(0.07), dtype=torch.uint8, device='cuda')\n"
          "def embed_column(texts):\n"
          "    out = np.empty(len(texts), dtype=object)\n"
          "    for i, text in enumerate(texts):\n"
          "        out[i] = encode(text)\n"
          "    return out\n"
          "docs['emb'] = embed_column(docs['text'])",),
         FAIL3,
         (Step("docs", "who:docs", "del docs"),),
         needs="pandas", written=WRITTEN3),
    Kind("lru_cache_method_keeps_instance",
         "https://github.com/huggingface/transformers/pull/45780",
         "held by your session",
         # functools.lru_cache on a method: the class-level cache keys on `self`, so the
         # instance (and its tables) outlive `del enc`. No name in the namespace holds it but
         # the class.
         ("import functools\n"
          "class Encoder:\n"
          "    def __init__(self, n):\n"
          "        self.tables = [torch.empty(frac(0.11), dtype=torch.uint8, device='cuda')\n"
          "                       for _ in range(n)]\n"
          "    @functools.lru_cache(maxsize=32)\n"
          "    def anchors(self, size):\n"
          "        return size * 2\n"
          "enc = Encoder(4)\n"
          "enc.anchors(64)\nenc.anchors(128)\n"
          "del enc",),
         FAIL3,
         (Step("Encoder.anchors", "who:Encoder", "Encoder.anchors.cache_clear()"),),
         written=WRITTEN3),
    Kind("dict_subclass_model_output",
         "https://github.com/huggingface/transformers/issues/24315",
         "held by your session",
         # A ModelOutput-like OrderedDict subclass with every layer's hidden state (the last
         # one under two keys).
         ("import collections\n"
          "class ModelOutput(collections.OrderedDict):\n"
          "    def __getattr__(self, name):\n"
          "        try:\n"
          "            return self[name]\n"
          "        except KeyError:\n"
          "            raise AttributeError(name) from None\n"
          "def forward(n_layers):\n"
          "    hs = tuple(torch.empty(frac(0.04), dtype=torch.uint8, device='cuda')\n"
          "               for _ in range(n_layers + 1))\n"
          "    return ModelOutput(last_hidden_state=hs[-1], hidden_states=hs)\n"
          "out = forward(12)",),
         FAIL3,
         (Step("out", "who:out", "del out"),),
         written=WRITTEN3),
    Kind("simplenamespace_structure_params",
         "https://github.com/IMSY-DKFZ/simpa/pull/175",
         "held by your session",
         # A types.SimpleNamespace of settings that also kept the structure's tensors (one of
         # them inside a dict attribute).
         ("import types\n"
          "params = types.SimpleNamespace(name='vessel', radius=3.0, device='cuda')\n"
          "params.volume = torch.empty(frac(0.22), dtype=torch.uint8, device='cuda')\n"
          "params.mask = torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')\n"
          "params.extras = {'distance': torch.empty(frac(0.08), dtype=torch.uint8, "
          "device='cuda')}",),
         FAIL3,
         (Step("params", "who:params", "del params"),),
         written=WRITTEN3),
    Kind("weak_value_cache_also_in_history",
         "https://github.com/pytorch/pytorch/pull/80544",
         "held by your session",
         # A weakref.WeakValueDictionary cache that would let go of its tensors, were they not
         # also appended to a plain list: the list holds them, the weak cache holds nothing.
         ("import weakref\n"
          "cache = weakref.WeakValueDictionary()\n"
          "history = []\n"
          "def lookup(key):\n"
          "    t = cache.get(key)\n"
          "    if t is None:\n"
          "        t = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "        cache[key] = t\n"
          "        history.append(t)\n"
          "    return t\n"
          "for key in range(6):\n"
          "    lookup(key)",),
         FAIL3,
         (Step("cache", "who:cache", "cache.clear()"),
          Step("history", "who:history", "history.clear()")),
         written=WRITTEN3),
    Kind("itertools_cycle_saves_batches",
         "https://github.com/bytedance/UNO/issues/64",
         "held by your session",
         # itertools.cycle(loader) keeps every batch of the first pass to replay it.
         ("import itertools\n"
          "def loader():\n"
          "    for i in range(6):\n"
          "        yield torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "batches = itertools.cycle(loader())\n"
          "for step in range(6):\n"
          "    batch = next(batches)\n"
          "del batch",),
         FAIL3,
         (Step("batches", "who:batches", "del batches"),),
         written=WRITTEN3),
    Kind("itertools_tee_unconsumed_branch",
         "https://github.com/python/cpython/issues/138765",
         "held by your session",
         # itertools.tee: one branch trained on, the other (for logging) never read, so the
         # tee's buffer keeps every batch (two tensors each). Both branches share the buffer.
         ("import itertools\n"
          "def stream():\n"
          "    for i in range(12):\n"
          "        yield {'x': torch.empty(frac(0.04), dtype=torch.uint8, device='cuda'),\n"
          "               'y': torch.empty(frac(0.02), dtype=torch.uint8, device='cuda')}\n"
          "train_it, log_it = itertools.tee(stream())\n"
          "for step, batch in zip(range(8), train_it):\n"
          "    pass\n"
          "del batch",),
         FAIL3,
         (Step("train_it", "who:train_it", "del train_it"),
          Step("log_it", "who:log_it", "del log_it")),
         written=WRITTEN3),
    # ---- more than one reference to one holder ---------------------------------------------
    Kind("dataset_also_held_by_dataloader",
         "https://github.com/pytorch/pytorch/issues/5398",
         "held by your session",
         # A Dataset that keeps its data on the GPU, wrapped in a DataLoader: `del train_ds`
         # frees nothing while `train_dl.dataset` holds it.
         ("from torch.utils.data import DataLoader, Dataset\n"
          "class GPUData(Dataset):\n"
          "    def __init__(self, n, row_bytes):\n"
          "        self.x = torch.empty(n, row_bytes, dtype=torch.uint8, device='cuda')\n"
          "        self.y = torch.zeros(n, dtype=torch.long, device='cuda')\n"
          "    def __len__(self):\n"
          "        return self.x.size(0)\n"
          "    def __getitem__(self, idx):\n"
          "        return self.x[idx], self.y[idx]\n"
          "train_ds = GPUData(4096, frac(0.5) // 4096)\n"
          "train_dl = DataLoader(train_ds, batch_size=16, shuffle=True)\n"
          "xb, yb = next(iter(train_dl))",),
         FAIL3,
         (Step("train_ds", "who:train_ds", "del train_ds"),
          Step("train_dl", "who:train_dl", "del train_dl"),
          Step("xb", "who:xb", "del xb, yb")),
         written=WRITTEN3),
    Kind("optimizer_and_model_share_params",
         "https://github.com/deepspeedai/DeepSpeed/issues/6729",
         "held by your session",
         # Adam's state and the model's parameters after one step: `del model` frees nothing
         # (the optimizer's param_groups hold the parameters); `del opt` frees both. The
         # step's temporaries are released from the cache.
         ("width = int((frac(0.03) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(4)])\n"
          "opt = torch.optim.Adam(model.parameters(), lr=1e-4)\n"
          "x = torch.randn(8, width, device='cuda')\n"
          "model(x).square().mean().backward()\n"
          "opt.step()\n"
          "opt.zero_grad(set_to_none=True)\n"
          "del x\n"
          "torch.cuda.empty_cache()",),
         FAIL3,
         (Step("model", "who:model", "del model"),
          Step("opt", "who:opt", "del opt")),
         written=WRITTEN3),
    Kind("same_embeddings_in_list_and_dict",
         "https://github.com/BM-K/Sentence-Embedding-Is-All-You-Need/issues/8",
         "held by your session",
         # Each embedding kept twice, in a list and in a dict by document id.
         ("embeddings = []\n"
          "by_doc = {}\n"
          "for doc_id in range(6):\n"
          "    emb = torch.empty(frac(0.08), dtype=torch.uint8, device='cuda')\n"
          "    embeddings.append(emb)\n"
          "    by_doc[f'doc{doc_id}'] = emb\n"
          "del emb",),
         FAIL3,
         (Step("embeddings", "who:embeddings", "del embeddings"),
          Step("by_doc", "who:by_doc", "del by_doc")),
         written=WRITTEN3),
    Kind("closure_and_global_share_table",
         "https://github.com/keras-team/keras/pull/23206",
         "held by your session",
         # One table named by a global and captured by a closure.
         ("table = torch.empty(frac(0.45), dtype=torch.uint8, device='cuda')\n"
          "def make_lookup(t):\n"
          "    def lookup(i):\n"
          "        return t[i]\n"
          "    return lookup\n"
          "lookup = make_lookup(table)",),
         FAIL3,
         (Step("table", "who:table", "del table"),
          Step("lookup", "who:lookup", "del lookup")),
         written=WRITTEN3),
    Kind("output_graph_holds_deleted_model",
         "https://github.com/pytorch/pytorch/issues/70431",
         "held by your session",
         # A forward pass outside no_grad, then `del model`: the two outputs share one autograd
         # graph, which holds the weights (8 layers of 5% of the card, each under 2**31
         # elements on an H200), so the parameters stay until both outputs go.
         ("class PolicyValue(torch.nn.Module):\n"
          "    def __init__(self, width):\n"
          "        super().__init__()\n"
          "        self.body = torch.nn.Sequential(*[\n"
          "            m for _ in range(8)\n"
          "            for m in (torch.nn.Linear(width, width, device='cuda'), torch.nn.ReLU())])\n"
          "        self.policy = torch.nn.Linear(width, 9, device='cuda')\n"
          "        self.value = torch.nn.Linear(width, 1, device='cuda')\n"
          "    def forward(self, x):\n"
          "        h = self.body(x)\n"
          "        return self.policy(h), self.value(h)\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = PolicyValue(width)\n"
          "policy, value = model(torch.randn(64, width, device='cuda'))\n"
          "del model",),
         FAIL3,
         (Step("policy", "who:policy", "del policy"),
          Step("value", "who:value", "del value")),
         written=WRITTEN3),
    # ---- controls ---------------------------------------------------------------------------
    Kind("attention_scores_working_set",
         "https://github.com/pytorch/pytorch/issues/133206",
         "working set",
         # Plain attention at a long sequence: the scores take 55% of the card and softmax's
         # output another 55% (32 heads keep each head's matrix under 2**31 elements). q and k
         # are small; nothing stale is held.
         ("heads, head_dim = 32, 64\n"
          "seq = int((frac(0.55) / (4 * heads)) ** 0.5)\n"
          "q = torch.randn(heads, seq, head_dim, device='cuda')\n"
          "k = torch.randn(heads, seq, head_dim, device='cuda')",),
         "attn = torch.softmax(q @ k.transpose(-2, -1), dim=-1)",
         (TB3,),
         written=WRITTEN3),
    Kind("slice_keeps_whole_tensor",
         "https://github.com/pytorch/pytorch/issues/50432",
         "held by your session",
         # `x = x[:1024]`: a 4 KiB view whose base (half the card) has no other name.
         ("x = torch.zeros(frac(0.5) // 4, device='cuda')\n"
          "x = x[:1024]",),
         FAIL3,
         (Step("x", "who:x", "del x"),),
         written=WRITTEN3),
    Kind("gradients_left_after_training_step",
         "https://github.com/NVIDIA/Megatron-LM/issues/662",
         "held by your session",
         # One SGD step and no zero_grad: the model's .grad tensors (as large as its weights)
         # stay with the parameters.
         ("width = int((frac(0.04) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(6)])\n"
          "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
          "x = torch.randn(8, width, device='cuda')\n"
          "loss = model(x).square().mean()\n"
          "loss.backward()\n"
          "opt.step()",),
         FAIL3,
         (Step("model.grad", "who:model", "model.zero_grad(set_to_none=True)"),
          Step("model", "who:model", "del model, opt, loss, x")),
         written=WRITTEN3),
    # ---- reference cycles -----------------------------------------------------------------
    Kind("reachable_parent_child_tree",
         "https://pytorch.org/blog/understanding-gpu-memory-2/",
         "held by your session",
         # The blog's cycles (parent <-> child), but the tree is still reachable from `root`
         # (and a subtree from `mid`): held, not garbage. Once deleted it is garbage, which
         # only a collection frees.
         ("class TreeNode:\n"
          "    def __init__(self, name, data, parent=None):\n"
          "        self.name, self.data, self.parent = name, data, parent\n"
          "        self.children = []\n"
          "        if parent is not None:\n"
          "            parent.children.append(self)\n"
          "root = TreeNode('root', torch.empty(frac(0.1), dtype=torch.uint8, "
          "device='cuda'))\n"
          "for i in range(2):\n"
          "    mid = TreeNode(f'mid{i}', torch.empty(frac(0.08), dtype=torch.uint8, "
          "device='cuda'), root)\n"
          "    for j in range(2):\n"
          "        TreeNode(f'leaf{i}{j}', torch.empty(frac(0.05), dtype=torch.uint8, "
          "device='cuda'), mid)",),
         FAIL3,
         (Step("root", "who:root", "del root, mid"),),
         written=WRITTEN3),
    Kind("module_bound_method_cycle_in_loop",
         "https://github.com/pytorch/pytorch/issues/128211",
         "garbage in reference cycles",
         # A module that stores one of its own bound methods (`self.which_foo = self.foo`) is a
         # cycle; re-creating it in a loop leaves each old one, buffer and all, to the
         # collector, which runs every ~700 container allocations (a module makes ~20): the
         # card fills first. Only the last module is still named (`head`).
         ("class Head(torch.nn.Module):\n"
          "    def __init__(self, nbytes):\n"
          "        super().__init__()\n"
          "        self.register_buffer('table', torch.empty(nbytes, dtype=torch.uint8, "
          "device='cuda'))\n"
          "        self.which_foo = self.foo\n"
          "    def foo(self, x):\n"
          "        return x",),
         "for trial in range(1000):\n    head = Head(frac(0.15))",
         (GC3, Step("head", "who:head", "del head")),
         written=WRITTEN3),
    Kind("cross_linked_nodes_in_loop",
         "https://github.com/pytorch/pytorch/pull/105032",
         "garbage in reference cycles",
         # Two nodes that point at each other, each with a tensor, made in a loop: every
         # pair is garbage the moment the next replaces it; the frame's `a`, `b` (the last
         # pair) stay with the traceback.
         ("class Node:\n"
          "    def __init__(self, t):\n"
          "        self.tensor = t\n"
          "        self.next = None\n"
          "def leak(nbytes, num_iter=1000):\n"
          "    for _ in range(num_iter):\n"
          "        a = Node(torch.zeros(nbytes, dtype=torch.uint8, device='cuda'))\n"
          "        b = Node(torch.zeros(nbytes, dtype=torch.uint8, device='cuda'))\n"
          "        a.next, b.next = b, a",),
         "leak(frac(0.04))",
         (GC3, TB3),
         written=WRITTEN3),
    # ---- live threads (each ends by itself after 90 s if its step never runs) -------------
    Kind("worker_thread_blocked_keeps_last_job",
         "https://github.com/huggingface/transformers/pull/48618",
         "held by your session",
         # An inference worker thread blocked in `jobs.get()` still has the last job's
         # `fn, args` bound in its loop: the job's two tensors live in the thread's frame.
         ("import queue\nimport threading\n"
          "jobs = queue.Queue()\n"
          "done = threading.Event()\n"
          "def worker():\n"
          "    while True:\n"
          "        try:\n"
          "            fn, args = jobs.get(timeout=90)\n"
          "        except queue.Empty:\n"
          "            return\n"
          "        if fn is None:\n"
          "            return\n"
          "        fn(*args)\n"
          "        done.set()\n"
          "t = threading.Thread(target=worker, daemon=True, name='inference-worker')\n"
          "t.start()\n"
          "def score(batch, mask):\n"
          "    return float(batch[:8].float().sum()) + float(mask[:8].float().sum())\n"
          "jobs.put((score, (torch.empty(frac(0.34), dtype=torch.uint8, device='cuda'),\n"
          "                  torch.empty(frac(0.2), dtype=torch.uint8, device='cuda'))))\n"
          "assert done.wait(30)",),
         FAIL3,
         (Step("t", "who:t", "jobs.put((None, None))\nt.join(30)"),),
         written=WRITTEN3),
    Kind("prefetch_thread_holds_batches",
         "https://github.com/ray-project/ray/pull/63660",
         "held by your session",
         # A daemon prefetch thread that moved five batches (two tensors each) to the GPU into
         # a local list and waits for the training loop to ask for them.
         ("import threading\n"
          "stop = threading.Event()\n"
          "ready = threading.Event()\n"
          "def prefetch(n, nbytes):\n"
          "    buffered = []\n"
          "    for i in range(n):\n"
          "        buffered.append((torch.empty(nbytes, dtype=torch.uint8, device='cuda'),\n"
          "                         torch.empty(nbytes // 4, dtype=torch.uint8, "
          "device='cuda')))\n"
          "    ready.set()\n"
          "    stop.wait(90)\n"
          "prefetcher = threading.Thread(target=prefetch, args=(5, frac(0.08)), daemon=True,\n"
          "                              name='prefetcher')\n"
          "prefetcher.start()\n"
          "assert ready.wait(30)",),
         FAIL3,
         (Step("prefetcher", "who:prefetcher", "stop.set()\nprefetcher.join(30)"),),
         written=WRITTEN3),
    Kind("viewer_thread_closure_holds_scene",
         "https://github.com/hwanhuh/2D-GS-Viser-Viewer/issues/19",
         "held by your session",
         # A viewer thread left running after training: its target is a closure over the
         # scene's dict of tensors, which no name in the namespace holds any more.
         ("import threading\nimport time\n"
          "def start_viewer(scene):\n"
          "    stop = threading.Event()\n"
          "    deadline = time.monotonic() + 90\n"
          "    def serve():\n"
          "        while not stop.wait(0.05) and time.monotonic() < deadline:\n"
          "            _ = scene['means'].shape\n"
          "    th = threading.Thread(target=serve, daemon=True, name='viewer')\n"
          "    th.start()\n"
          "    return th, stop\n"
          "scene = {'means': torch.empty(frac(0.2), dtype=torch.uint8, device='cuda'),\n"
          "         'colors': torch.empty(frac(0.15), dtype=torch.uint8, device='cuda'),\n"
          "         'opacity': torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')}\n"
          "viewer, viewer_stop = start_viewer(scene)\n"
          "del scene",),
         FAIL3,
         (Step("viewer", "who:viewer", "viewer_stop.set()\nviewer.join(30)"),),
         written=WRITTEN3),
    # ---- module globals (modules stay in sys.modules through %reset) ----------------------
    Kind("helper_module_alias_prepared_weights",
         "https://github.com/local-inference-lab/vllm/pull/228",
         "held by your session",
         # A helper module written next to the notebook, imported under an alias: its
         # process-global dict of prepared weights is never evicted.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "helper_dir = tempfile.mkdtemp(prefix='gm_helpers_')\n"
          "pathlib.Path(helper_dir, 'gm_prepared_weights.py').write_text(\n"
          "    'import torch\\n'\n"
          "    '_PREPARED = {}\\n'\n"
          "    'def prepare(key, nbytes):\\n'\n"
          "    '    w = _PREPARED.get(key)\\n'\n"
          "    '    if w is None:\\n'\n"
          "    '        w = torch.empty(nbytes, dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    '        _PREPARED[key] = w\\n'\n"
          "    '    return w\\n')\n"
          "sys.path.insert(0, helper_dir)\n"
          "importlib.invalidate_caches()",
          "import gm_prepared_weights as pw\n"
          "for layer in range(6):\n"
          "    pw.prepare(('layer', layer), frac(0.08))"),
         FAIL3,
         (Step("pw._PREPARED", "who:pw",
               "import sys\nsys.modules['gm_prepared_weights']._PREPARED.clear()"),),
         written=WRITTEN3),
    Kind("helper_module_from_import_cache",
         "https://github.com/Stonesjtu/pytorch_memlab/issues/17",
         "held by your session",
         # `from helper import cache, remember`: the notebook's `cache` and the module's are
         # one list; the module also keeps a dict keyed by id (no tensors).
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "helper_dir = tempfile.mkdtemp(prefix='gm_helpers_')\n"
          "pathlib.Path(helper_dir, 'gm_tensor_registry.py').write_text(\n"
          "    'cache = []\\n'\n"
          "    'names = {}\\n'\n"
          "    'def remember(name, t):\\n'\n"
          "    '    cache.append(t)\\n'\n"
          "    '    names[id(t)] = name\\n'\n"
          "    '    return t\\n')\n"
          "sys.path.insert(0, helper_dir)\n"
          "importlib.invalidate_caches()",
          "from gm_tensor_registry import cache, remember\n"
          "for i in range(5):\n"
          "    remember(f'act{i}', torch.empty(frac(0.1), dtype=torch.uint8, "
          "device='cuda'))"),
         FAIL3,
         (Step("cache", "who:cache",
               "import sys\nsys.modules['gm_tensor_registry'].cache.clear()"),),
         written=WRITTEN3),
    Kind("namespace_module_in_sys_modules",
         "https://github.com/pfnet/pytorch-pfn-extras/pull/49",
         "held by your session",
         # A reporting module made with types.ModuleType and registered in sys.modules; its
         # module-level list keeps every reported observation. The notebook names only the
         # imported function `report` (whose globals are the module's).
         ("import sys\nimport types\n"
          "reporting = types.ModuleType('gm_reporting')\n"
          "exec('_OBSERVATIONS = []\\n'\n"
          "     'def report(values):\\n'\n"
          "     '    _OBSERVATIONS.append(dict(values))\\n', reporting.__dict__)\n"
          "sys.modules['gm_reporting'] = reporting\n"
          "del reporting",
          "from gm_reporting import report\n"
          "for it in range(6):\n"
          "    act = torch.empty(frac(0.07), dtype=torch.uint8, device='cuda')\n"
          "    report({'act': act, 'iteration': it})\n"
          "del act"),
         FAIL3,
         (Step("gm_reporting._OBSERVATIONS", "who:report",
               "import sys\nsys.modules['gm_reporting']._OBSERVATIONS.clear()"),),
         written=WRITTEN3),
    # ---- last: turns the cyclic collector off until its step turns it back on -------------
    Kind("self_cycle_garbage_gc_disabled",
         "https://github.com/pytorch/pytorch/issues/50185",
         "garbage in reference cycles",
         # The report's `self.cycle = self` objects, each holding a tensor and dropped at
         # once, with the collector off (as a training loop tuned for speed does): all of it
         # is unreachable and uncollected at the OOM.
         ("import gc\n"
          "gc.disable()\n"
          "class Garbage:\n"
          "    def __init__(self, obj):\n"
          "        self.obj = obj\n"
          "        self.cycle = self\n"
          "for i in range(6):\n"
          "    Garbage(torch.empty(frac(0.09), dtype=torch.uint8, device='cuda'))",),
         FAIL3,
         (Step("garbage", "none", "import gc\ngc.enable()\ngc.collect()"),),
         written=WRITTEN3),
]

# ============================================================================================
# The fourth batch (``--set new4``), written as KINDS3 was: by a helper that had not seen the
# explainer's code, each kind from the user report its `source` names (the comment above it says
# what the user hit), `expected` written by the mechanism before any run, every failing cell
# asking for more than CUDA has free (FILL) unless it is a computation of its own, and no setup
# leaving a large freed block in the cache. Each mechanism differs from every kind of KINDS3 and
# of diagnosis2. Order: the kinds whose holders outlive `%reset` (a live thread, state kept by
# the logging and weakref modules) come last; the timer ends by itself after 80 s.
# ============================================================================================
WRITTEN4 = ("2026-12-06, by a helper blind to gpumem_nb's code (which changed from 7d21349 "
            "to d5ee3c4 meanwhile, from KINDS3's tuned re-run, not from these kinds); "
            "measured once")


def del_step(name: str) -> Step:
    """The step that frees a holder named in the namespace: deletes the name unless the advice
    already did."""
    return Step(name, f"who:{name}", f"try:\n    del {name}\nexcept NameError:\n    pass")


KINDS4: list[Kind] = [
    # ---- library objects and containers in the namespace -------------------------------------
    # A scheduler's thread-pool jobs that raised never gave their memory back (the futures kept the
    # failed jobs' tracebacks).
    Kind("executor_futures_keep_failed_frames",
         "https://github.com/agronholm/apscheduler/issues/235",
         "held by your session",
         # A ThreadPoolExecutor's jobs that raised: each failed Future keeps its exception, whose
         # traceback keeps the job's frame and its GPU workspace. The pool is shut down; only the
         # list of futures holds them (freed workspaces of the jobs that succeeded are released from
         # the cache).
         ("import concurrent.futures\n"
          "def augment(i, nbytes):\n"
          "    workspace = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    if i % 2 == 0:\n"
          "        raise ValueError(f'bad sample {i}')\n"
          "    return int(workspace[:1].sum())\n"
          "with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:\n"
          "    futures = [pool.submit(augment, i, frac(0.1)) for i in range(10)]\n"
          "n_failed = sum(f.exception() is not None for f in futures)\n"
          "torch.cuda.empty_cache()",),
         FAIL3,
         (del_step("futures"),),
         written=WRITTEN4),
    # Turning on stochastic weight averaging ran the GPU out of memory: the averaged model is a deep
    # copy of the whole model.
    Kind("averaged_model_keeps_a_copy",
         "https://github.com/Lightning-AI/pytorch-lightning/issues/7089",
         "held by your session",
         # Stochastic weight averaging: torch.optim.swa_utils.AveragedModel deep-copies the model,
         # so the card holds the weights twice (4 layers of 5% of the card, each under 2**31
         # elements on an H200), once under `model` and once under `swa_model.module`.
         ("from torch.optim.swa_utils import AveragedModel\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(4)])\n"
          "swa_model = AveragedModel(model)\n"
          "swa_model.update_parameters(model)",),
         FAIL3,
         (del_step("swa_model"),
          del_step("model")),
         written=WRITTEN4),
    # A WeakKeyDictionary cache of offloaded activations never let go of them (an entry's value was
    # its own key), and CUDA memory grew without bound.
    Kind("weak_key_dict_value_holds_its_key",
         "https://github.com/vllm-project/llm-compressor/pull/2387",
         "held by your session",
         # A weakref.WeakKeyDictionary offload cache whose values refer back to their keys: no key
         # ever dies, so the "weak" cache keeps every offloaded tensor (no cycle: nothing to
         # collect).
         ("import weakref\n"
          "class Offloaded:\n"
          "    def __init__(self, name):\n"
          "        self.name = name\n"
          "offload_cache = weakref.WeakKeyDictionary()\n"
          "def offload(name, tensor):\n"
          "    key = Offloaded(name)\n"
          "    offload_cache[key] = (key, tensor)\n"
          "    return key\n"
          "for layer in range(5):\n"
          "    offload(f'layer{layer}', torch.empty(frac(0.1), dtype=torch.uint8, "
          "device='cuda'))",),
         FAIL3,
         (Step("offload_cache", "who:offload_cache",
               "try:\n"
               "    offload_cache.clear()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN4),
    # Instance and Field objects (which carry a batch's tensors) turned into `__slots__` classes,
    # with subclasses adding slots to their parents'.
    Kind("inherited_slots_field_objects",
         "https://github.com/allenai/allennlp/pull/4313",
         "held by your session",
         # AllenNLP-style Instance and Field classes made `__slots__` classes, a subclass adding
         # slots to its parent's: the batch's tensors live in slots of two classes of the hierarchy,
         # in tuples inside slotted instances, with no `__dict__` anywhere.
         ("class Field:\n"
          "    __slots__ = ('name',)\n"
          "class TensorField(Field):\n"
          "    __slots__ = ('tensor',)\n"
          "class PaddedTensorField(TensorField):\n"
          "    __slots__ = ('mask', 'lengths')\n"
          "class Instance:\n"
          "    __slots__ = ('fields',)\n"
          "    def __init__(self, fields):\n"
          "        self.fields = fields\n"
          "def make_field(name, nbytes):\n"
          "    f = PaddedTensorField()\n"
          "    f.name, f.lengths = name, None\n"
          "    f.tensor = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    f.mask = torch.empty(nbytes // 4, dtype=torch.uint8, device='cuda')\n"
          "    return f\n"
          "batch = [Instance((make_field('tokens', frac(0.07)), make_field('chars', "
          "frac(0.03))))\n"
          "         for _ in range(4)]",),
         FAIL3,
         (del_step("batch"),),
         written=WRITTEN4),
    # Keras on torch attaches each tensor's mask to the tensor itself (`set_tensor_attr`), so a kept
    # output keeps its mask.
    Kind("mask_attribute_on_small_output",
         "https://github.com/keras-team/keras/pull/20374",
         "held by your session",
         # Keras-style masking: a large boolean mask set as a Python attribute (`_keras_mask`) of a
         # small output tensor. The outputs are kept in a list and the last one under a name; the
         # masks are in the tensors' own `__dict__`.
         ("def masked_embedding(ids, nbytes):\n"
          "    out = torch.zeros(ids.shape[0], 8, device='cuda')\n"
          "    out._keras_mask = torch.ones(nbytes, dtype=torch.bool, device='cuda')\n"
          "    return out\n"
          "ids = torch.arange(16, device='cuda')\n"
          "outputs = [masked_embedding(ids, frac(0.12)) for _ in range(4)]\n"
          "last_output = outputs[-1]",),
         FAIL3,
         (del_step("outputs"),
          del_step("last_output")),
         written=WRITTEN4),
    # ---- functions: defaults, closures, coroutines, autograd ---------------------------------
    # Dicts and tensors used as default arguments "all over the place", shared by every call.
    Kind("mutable_default_argument_cache",
         "https://github.com/talmolab/dreem/issues/40",
         "held by your session",
         # A mutable default argument used as a cache (`_cache={}`): the tables live in the
         # function's `__defaults__`, named by nothing else.
         ("def positional_table(length, dim=64, _cache={}):\n"
          "    key = (length, dim)\n"
          "    if key not in _cache:\n"
          "        _cache[key] = torch.empty(frac(0.11), dtype=torch.uint8, device='cuda')\n"
          "    return _cache[key]\n"
          "for length in (512, 1024, 2048, 4096):\n"
          "    table = positional_table(length)\n"
          "del table",),
         FAIL3,
         (Step("positional_table", "who:positional_table",
               "try:\n"
               "    positional_table.__defaults__[-1].clear()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN4),
    # The decorator docs' memoize example keeps every result (and argument) in its closure's cache
    # for as long as the function lives.
    Kind("stacked_decorators_closure_cache",
         "https://github.com/micheles/decorator/issues/14",
         "held by your session",
         # A hand-written memoize decorator under a timing decorator: the cache is a dict in the
         # inner wrapper's closure, which the outer wrapper's closure (and `__wrapped__`) holds.
         ("import functools\n"
          "import time\n"
          "def memoize(fn):\n"
          "    cache = {}\n"
          "    @functools.wraps(fn)\n"
          "    def wrapper(*args):\n"
          "        if args not in cache:\n"
          "            cache[args] = fn(*args)\n"
          "        return cache[args]\n"
          "    return wrapper\n"
          "def timed(fn):\n"
          "    calls = []\n"
          "    @functools.wraps(fn)\n"
          "    def wrapper(*args):\n"
          "        t0 = time.perf_counter()\n"
          "        out = fn(*args)\n"
          "        calls.append(time.perf_counter() - t0)\n"
          "        return out\n"
          "    return wrapper\n"
          "@timed\n"
          "@memoize\n"
          "def encode_prompt(prompt_id):\n"
          "    return torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')\n"
          "for prompt_id in range(5):\n"
          "    emb = encode_prompt(prompt_id)\n"
          "del emb",),
         FAIL3,
         (del_step("encode_prompt"),),
         written=WRITTEN4),
    # A coroutine that has not finished keeps its locals (its frame) alive; large buffers held
    # across a suspension point stay in memory.
    Kind("suspended_coroutines_hold_staging",
         "https://github.com/python/mypy/pull/21734",
         "held by your session",
         # Upload coroutines driven by hand (`send(None)`) and left suspended at an `await`: each
         # coroutine's frame keeps its staging buffer; a list keeps the coroutines.
         ("class Tick:\n"
          "    def __await__(self):\n"
          "        yield\n"
          "async def upload(nbytes):\n"
          "    staging = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    await Tick()\n"
          "    return staging.numel()\n"
          "pending = []\n"
          "for shard in range(4):\n"
          "    job = upload(frac(0.12))\n"
          "    job.send(None)\n"
          "    pending.append(job)\n"
          "del job",),
         FAIL3,
         (del_step("pending"),),
         written=WRITTEN4),
    # DGL kept backward's tensors in a ctx attribute (`ctx.backward_cache`) instead of
    # save_for_backward, and autograd could not free them: GPU memory leaked.
    Kind("autograd_function_ctx_backward_cache",
         "https://github.com/dmlc/dgl/pull/1060",
         "held by your session",
         # A custom autograd.Function that keeps a large index in a ctx attribute
         # (`ctx.backward_cache`) instead of save_for_backward; backward never runs. Each small
         # output's grad_fn (the ctx) holds its index: a list of outputs is all the namespace names.
         ("class ScatterScale(torch.autograd.Function):\n"
          "    @staticmethod\n"
          "    def forward(ctx, src, nbytes):\n"
          "        index = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        ctx.backward_cache = (index, src.shape)\n"
          "        return src * 2\n"
          "    @staticmethod\n"
          "    def backward(ctx, grad):\n"
          "        ctx.backward_cache = None\n"
          "        return grad * 2, None\n"
          "src = torch.randn(1024, device='cuda', requires_grad=True)\n"
          "outs = [ScatterScale.apply(src, frac(0.1)) for _ in range(4)]",),
         FAIL3,
         (del_step("outs"),),
         written=WRITTEN4),
    # ---- hooks on torch modules --------------------------------------------------------------
    # pytorch-grad-cam's CAM objects registered bound methods as hooks on the target layer: a cycle
    # through the model that kept activations and gradients on the GPU.
    Kind("gradcam_hooks_reachable_cycle",
         "https://github.com/jacobgil/pytorch-grad-cam/issues/88",
         "held by your session",
         # A Grad-CAM object that registers its own bound methods as forward and backward hooks on
         # the target layer and stores the activations and gradients on itself: cam -> model ->
         # layer -> hooks -> cam is a cycle, still reachable from `cam` and from `net`. Deleting one
         # name frees nothing; deleting both leaves garbage. The step's temporaries are released
         # from the cache.
         ("class GradCAM:\n"
          "    def __init__(self, model, target_layer):\n"
          "        self.model, self.target_layer = model, target_layer\n"
          "        self.activations = self.gradients = None\n"
          "        target_layer.register_forward_hook(self.save_activation)\n"
          "        target_layer.register_full_backward_hook(self.save_gradient)\n"
          "    def save_activation(self, module, inputs, output):\n"
          "        self.activations = output.detach()\n"
          "    def save_gradient(self, module, grad_input, grad_output):\n"
          "        self.gradients = grad_output[0].detach()\n"
          "    def __call__(self, x, category):\n"
          "        self.model(x)[:, category].sum().backward()\n"
          "        return float(self.activations[:1].sum())\n"
          "width = 1024\n"
          "net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),\n"
          "                          torch.nn.Linear(width, 8)).cuda()\n"
          "cam = GradCAM(net, net[1])\n"
          "x = torch.randn(frac(0.15) // (4 * width), width, device='cuda')\n"
          "score = cam(x, 3)\n"
          "del x\n"
          "net.zero_grad(set_to_none=True)\n"
          "torch.cuda.empty_cache()",),
         FAIL3,
         (del_step("cam"),
          Step("net", "who:net",
               "try:\n"
               "    del net\n"
               "except NameError:\n"
               "    pass\n"
               "import gc\n"
               "gc.collect()")),
         written=WRITTEN4),
    # tangermeme's deep_lift_shap removed its hooks but left `module.input` and `module.output` on
    # every layer, so each model run left inputs and activations on the GPU.
    Kind("hooks_left_io_on_submodules",
         "https://github.com/jmschrei/tangermeme/pull/84",
         "held by your session",
         # DeepLIFT-style hooks that store each module's input and output as plain attributes
         # (`module.input`, `module.output`); the hooks are removed afterwards, the attributes stay
         # on the submodules. The forward's temporaries are released from the cache.
         ("def save_io(module, inputs, output):\n"
          "    module.input = inputs[0].clone().detach()\n"
          "    module.output = output.clone().detach()\n"
          "width = 2048\n"
          "model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),\n"
          "                            torch.nn.Linear(width, width), torch.nn.ReLU()).cuda()\n"
          "handles = [m.register_forward_hook(save_io) for m in model]\n"
          "with torch.no_grad():\n"
          "    model(torch.randn(frac(0.05) // (4 * width), width, device='cuda'))\n"
          "for h in handles:\n"
          "    h.remove()\n"
          "del handles, h\n"
          "torch.cuda.empty_cache()",),
         FAIL3,
         (del_step("model"),),
         written=WRITTEN4),
    # ---- a class-level registry --------------------------------------------------------------
    # IP-Adapter attention processors stayed in GPU memory after the model was reloaded: a
    # class-level `_instances` collection kept every one.
    Kind("metaclass_instance_registry",
         "https://github.com/Shakker-Labs/ComfyUI-IPAdapter-Flux/pull/76",
         "held by your session",
         # Attention processors tracked in a class-level `_instances` registry, here kept by a
         # metaclass: every processor ever made stays on the card; the last one is also named
         # `proc`.
         ("class InstanceTracker(type):\n"
          "    _instances = {}\n"
          "    def __call__(cls, *args, **kwargs):\n"
          "        inst = super().__call__(*args, **kwargs)\n"
          "        InstanceTracker._instances.setdefault(cls.__name__, []).append(inst)\n"
          "        return inst\n"
          "class AttnProcessor(metaclass=InstanceTracker):\n"
          "    def __init__(self, nbytes):\n"
          "        self.ip_hidden = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "for block in range(4):\n"
          "    proc = AttnProcessor(frac(0.1))",),
         FAIL3,
         (Step("InstanceTracker._instances", "who:InstanceTracker",
               "import gc\n"
               "def _clear_registry(name):\n"
               "    for obj in gc.get_objects():\n"
               "        if isinstance(obj, type) and obj.__name__ == name:\n"
               "            obj._instances.clear()\n"
               "_clear_registry('InstanceTracker')"),
          del_step("proc")),
         written=WRITTEN4),
    # ---- controls ----------------------------------------------------------------------------
    # PatchCore's test step ran out of GPU memory in its distance matrix: expand, subtract, pow and
    # sum materialise (n, m, d) twice.
    Kind("pairwise_distance_expand_working_set",
         "https://github.com/hcw-00/PatchCore_anomaly_detection/issues/19",
         "working set",
         # PatchCore's distance_matrix: both point sets expanded to (n, m, d), then `pow(x - y, 2)`:
         # the difference takes 55% of the card and its square another 55%. The inputs are small;
         # nothing stale is held.
         ("def distance_matrix(x, y, p=2):\n"
          "    n, m, d = x.size(0), y.size(0), x.size(1)\n"
          "    x = x.unsqueeze(1).expand(n, m, d)\n"
          "    y = y.unsqueeze(0).expand(n, m, d)\n"
          "    return torch.pow(x - y, p).sum(2)\n"
          "dim = 64\n"
          "n_points = int((frac(0.55) / (4 * dim)) ** 0.5)\n"
          "embedding = torch.randn(n_points, dim, device='cuda')\n"
          "memory_bank = torch.randn(n_points, dim, device='cuda')",),
         "dist = distance_matrix(embedding, memory_bank)",
         (TB3,),
         written=WRITTEN4),
    # ---- reference cycles left to the collector ----------------------------------------------
    # An exception caught and kept in a variable makes a cycle through its traceback's frame, which
    # keeps that frame's tensors until the collector runs.
    Kind("caught_exception_frame_cycle_in_loop",
         "https://github.com/pytorch/pytorch/pull/182980",
         "garbage in reference cycles",
         # `except ... as e: failure = e` in a training step: the exception's traceback holds the
         # frame, whose `failure` holds the exception, a cycle that keeps the step's activations
         # until the collector runs; a loop of failing steps fills the card first.
         ("def train_step(step, nbytes):\n"
          "    activations = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    failure = None\n"
          "    try:\n"
          "        raise FloatingPointError(f'nan loss at step {step}')\n"
          "    except FloatingPointError as e:\n"
          "        failure = e\n"
          "    return failure is None",),
         "for step in range(1000):\n"
         "    ok = train_step(step, frac(0.08))",
         (GC3,),
         written=WRITTEN4),
    # Recursive helpers nested in torch.cuda's memory_stats captured themselves: a closure cycle
    # that keeps whatever else the closure holds until the collector runs.
    Kind("recursive_inner_function_cycle_in_loop",
         "https://github.com/pytorch/pytorch/pull/191441",
         "garbage in reference cycles",
         # A recursive helper defined inside the function it serves: the inner function's closure
         # holds itself (a cycle) and the outer function's dict of tensors, so each call leaves its
         # tensors to the collector.
         ("def summarize(nbytes):\n"
          "    acts = {'hidden': torch.empty(nbytes, dtype=torch.uint8, device='cuda'), "
          "'logits': None}\n"
          "    def walk(keys):\n"
          "        if not keys:\n"
          "            return 0\n"
          "        t = acts[keys[0]]\n"
          "        return (0 if t is None else t.numel()) + walk(keys[1:])\n"
          "    return walk(list(acts))",),
         "for batch in range(1000):\n"
         "    total = summarize(frac(0.08))",
         (GC3,),
         written=WRITTEN4),
    # ---- outlive `%reset`: a live thread, the logging and weakref modules' own state ---------
    # Model-cleanup threading.Timers, cancelled and re-created, accumulated with what they
    # referenced.
    Kind("timer_thread_partial_autosave",
         "https://github.com/McCloudS/subgen/pull/284",
         "held by your session",
         # A pending threading.Timer for an autosave whose function is a functools.partial with the
         # state dict in its keywords: the live timer thread (and the name `autosave`) holds it. The
         # timer fires after 80 s and ends by itself; its step cancels it by the thread's name.
         ("import functools\n"
          "import threading\n"
          "def save_checkpoint(state, path):\n"
          "    return sum(t.numel() for t in state.values())\n"
          "state = {'weights': torch.empty(frac(0.2), dtype=torch.uint8, device='cuda'),\n"
          "         'optimizer': torch.empty(frac(0.25), dtype=torch.uint8, device='cuda')}\n"
          "autosave = threading.Timer(80, functools.partial(save_checkpoint, state=state,\n"
          "                                                 path='/tmp/gm_autosave.pt'))\n"
          "autosave.name = 'gm-autosave'\n"
          "autosave.daemon = True\n"
          "autosave.start()\n"
          "del state",),
         FAIL3,
         (Step("autosave", "who:autosave",
               "import threading\n"
               "def _stop_autosave():\n"
               "    for th in threading.enumerate():\n"
               "        if th.name == 'gm-autosave':\n"
               "            th.cancel()\n"
               "            th.join(30)\n"
               "_stop_autosave()\n"
               "try:\n"
               "    del autosave\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN4),
    # A logging MemoryHandler without a target never clears its buffer: records (and the objects in
    # their args) grow without bound.
    Kind("memory_handler_without_target",
         "https://github.com/tya5/reyn/pull/6037",
         "held by your session",
         # A logging.handlers.MemoryHandler installed before its target: debug records are buffered,
         # never flushed, and each LogRecord's `args` keeps the tensor it was asked to log. The
         # logger lives in logging's own registry; `log` is only another name for it.
         ("import logging\n"
          "import logging.handlers\n"
          "log = logging.getLogger('gm_train')\n"
          "log.setLevel(logging.DEBUG)\n"
          "log.propagate = False\n"
          "log.addHandler(logging.handlers.MemoryHandler(capacity=10_000))\n"
          "for step in range(5):\n"
          "    grad_norms = torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')\n"
          "    log.debug('step %d grad norms %s', step, grad_norms)\n"
          "del grad_norms",),
         FAIL3,
         (Step("log", "who:log",
               "import logging\n"
               "def _drop_handlers(name):\n"
               "    lg = logging.getLogger(name)\n"
               "    for h in list(lg.handlers):\n"
               "        lg.removeHandler(h)\n"
               "        h.buffer.clear()\n"
               "        h.close()\n"
               "_drop_handlers('gm_train')"),),
         written=WRITTEN4),
    # Search indexes were never garbage collected: `weakref.finalize(self, self.disconnect)` keeps
    # `self` alive from the finalizer registry.
    Kind("finalizer_bound_method_keeps_index",
         "https://github.com/redis/redis-vl-python/issues/656",
         "held by your session",
         # `weakref.finalize(self, self.disconnect)`: the bound method keeps `self` alive from
         # weakref.finalize's class-level registry, so no index is ever collected (no name in the
         # namespace holds one). The step calls the finalizers, as the object's death would.
         ("import weakref\n"
          "class FeatureIndex:\n"
          "    def __init__(self, nbytes):\n"
          "        self.vectors = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        weakref.finalize(self, self.disconnect)\n"
          "    def disconnect(self):\n"
          "        self.vectors = None\n"
          "for shard in range(4):\n"
          "    index = FeatureIndex(frac(0.12))\n"
          "del index",),
         FAIL3,
         (Step("weakref.finalize._registry", "who:FeatureIndex",
               "import weakref\n"
               "def _run_finalizers(cls_name):\n"
               "    for fin in list(weakref.finalize._registry):\n"
               "        info = fin.peek()\n"
               "        if info is not None and type(info[0]).__name__ == cls_name:\n"
               "            fin()\n"
               "_run_finalizers('FeatureIndex')"),),
         written=WRITTEN4),
]

# ============================================================================================
# The fifth batch (``--set new5``), written as KINDS4 was: by a helper that had not seen the
# explainer's code, each kind from the user report its `source` names (the comment above it says
# what the user hit), `expected` written by the mechanism before any run, every failing cell
# asking for more than CUDA has free (FILL) unless it is a computation of its own, and no setup
# leaving a large freed block in the cache. Each mechanism differs from every kind of KINDS4,
# KINDS3 and diagnosis2. Order: the kinds whose holders outlive `%reset` (a context variable of
# the main thread's context, the logging and atexit modules' state, the collector's debug flags)
# come last, and each one's step undoes it completely.
# ============================================================================================
WRITTEN5 = "2026-12-06, by a helper blind to gpumem_nb's code; measured once"

KINDS5: list[Kind] = [
    # ---- containers and library objects in the namespace -------------------------------------
    # pytorch_memlab's reporter kept a dict mapping tensors to their names: the tensors, as keys,
    # could never be collected.
    Kind("tensors_as_dict_keys",
         "https://github.com/Stonesjtu/pytorch_memlab/pull/18",
         "held by your session",
         # A reverse lookup from embedding to document id: the tensors are the dict's keys (hashed
         # by identity), its values are short strings. No name holds a tensor.
         ("def embed(doc_id, nbytes):\n"
          "    return torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "doc_of = {}\n"
          "for doc_id in range(5):\n"
          "    doc_of[embed(doc_id, frac(0.1))] = f'doc{doc_id}'",),
         FAIL3,
         (del_step("doc_of"),),
         written=WRITTEN5),
    # A lambda that captured a tensor-holding object kept it (and its GPU memory) alive as long as
    # the lambda lived.
    Kind("defaultdict_factory_captures_template",
         "https://github.com/pytorch/pytorch/issues/51883",
         "held by your session",
         # Gradient accumulators in a collections.defaultdict whose default_factory is a lambda
         # over a zero template: the template lives in the lambda's closure (named by nothing
         # else), the two accumulators made from it in the dict's values.
         ("import collections\n"
          "def make_accumulators(nbytes):\n"
          "    template = torch.zeros(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    return collections.defaultdict(lambda: template.clone())\n"
          "grad_accum = make_accumulators(frac(0.12))\n"
          "for name in ('encoder', 'decoder'):\n"
          "    grad_accum[name] += 1",),
         FAIL3,
         (del_step("grad_accum"),),
         written=WRITTEN5),
    # Ray Data's chained generators pinned every stage's intermediate batch at each yield point
    # ("ALL PINNED"), until the whole chain moved on.
    Kind("yield_from_chain_pins_each_stage",
         "https://github.com/ray-project/ray/pull/60598",
         "held by your session",
         # Three generators delegating with `yield from`, suspended after the first item: each
         # stage's frame keeps its own buffer; only the outermost generator is named.
         ("def read_shards(nbytes):\n"
          "    for shard in range(3):\n"
          "        raw = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        yield shard\n"
          "def decode(nbytes):\n"
          "    staging = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    yield from read_shards(nbytes)\n"
          "def pipeline(nbytes):\n"
          "    prefetched = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    yield from decode(nbytes)\n"
          "stream = pipeline(frac(0.12))\n"
          "first = next(stream)",),
         FAIL3,
         (del_step("stream"),),
         written=WRITTEN5),
    # A beam search kept its hypotheses in a heapq priority queue (the hypotheses carry their
    # decoder states).
    Kind("heapq_namedtuple_beam_and_best",
         "https://github.com/CUNY-CL/yoyodyne/issues/17",
         "held by your session",
         # Beam hypotheses as typing.NamedTuple records (score, tie-breaker, tokens, hidden state)
         # in a heapq list; the best one is also named `best`: freeing the beam leaves its hidden
         # state.
         ("import heapq\nimport itertools\nfrom typing import NamedTuple\n"
          "class Hypothesis(NamedTuple):\n"
          "    score: float\n"
          "    order: int\n"
          "    tokens: object\n"
          "    hidden: object\n"
          "counter = itertools.count()\n"
          "beam = []\n"
          "for step in range(5):\n"
          "    heapq.heappush(beam, Hypothesis(-float(step), next(counter),\n"
          "                                    torch.zeros(8, dtype=torch.long, device='cuda'),\n"
          "                                    torch.empty(frac(0.09), dtype=torch.uint8, "
          "device='cuda')))\n"
          "best = beam[0]",),
         FAIL3,
         (del_step("beam"),
          del_step("best")),
         written=WRITTEN5),
    # tgm cached tensor-valued properties on its graph objects, which "could eat up GPU".
    Kind("cached_property_on_listed_instances",
         "https://github.com/tgm-team/tgm/issues/51",
         "held by your session",
         # functools.cached_property: each graph snapshot computed its adjacency once and stored it
         # in its own `__dict__`; the snapshots are kept in a list.
         ("import functools\n"
          "class GraphSnapshot:\n"
          "    def __init__(self, num_nodes, nbytes):\n"
          "        self.num_nodes, self.nbytes = num_nodes, nbytes\n"
          "    @functools.cached_property\n"
          "    def adjacency(self):\n"
          "        return torch.empty(self.nbytes, dtype=torch.uint8, device='cuda')\n"
          "snapshots = [GraphSnapshot(1000 * t, frac(0.1)) for t in range(5)]\n"
          "n_edges = [int(g.adjacency[:4].sum()) for g in snapshots]",),
         FAIL3,
         (del_step("snapshots"),),
         written=WRITTEN5),
    # volatility3 layered its type dictionaries in ChainMaps, which keep every layer (shadowed
    # entries included) in memory.
    Kind("chainmap_shadowed_defaults",
         "https://github.com/volatilityfoundation/volatility3/pull/1753",
         "held by your session",
         # A collections.ChainMap of overrides over defaults: the default positional table is
         # shadowed (config['pos_table'] is the override) yet still held in config.maps[1]; the
         # two dicts have no names of their own.
         ("import collections\n"
          "def load_config(nbytes):\n"
          "    defaults = {'pos_table': torch.empty(nbytes, dtype=torch.uint8, device='cuda'),\n"
          "                'vocab_mask': torch.empty(nbytes // 2, dtype=torch.uint8, "
          "device='cuda')}\n"
          "    overrides = {'pos_table': torch.empty(nbytes, dtype=torch.uint8, "
          "device='cuda')}\n"
          "    return collections.ChainMap(overrides, defaults)\n"
          "config = load_config(frac(0.16))",),
         FAIL3,
         (del_step("config"),),
         written=WRITTEN5),
    # A dataclass field with a shared default object (`field(default=TensorProperties())` rather
    # than a default_factory): every instance made without it shares the one object.
    Kind("dataclass_field_default_tensor",
         "https://github.com/pytorch/pytorch/pull/91795",
         "held by your session",
         # A tensor as a dataclass field's default (allowed: tensors hash by identity): the class
         # attribute, the field's `default` and the generated `__init__`'s defaults all hold it,
         # and so does every instance made without the argument; one instance has its own.
         # Instances and class must all go (the class is a cycle: its step collects).
         ("import dataclasses\n"
          "@dataclasses.dataclass\n"
          "class SamplerConfig:\n"
          "    temperature: float = 1.0\n"
          "    logit_bias: object = torch.zeros(frac(0.2), dtype=torch.uint8, device='cuda')\n"
          "configs = [SamplerConfig(temperature=t / 10) for t in range(1, 4)]\n"
          "custom = SamplerConfig(logit_bias=torch.zeros(frac(0.15), dtype=torch.uint8, "
          "device='cuda'))",),
         FAIL3,
         (del_step("configs"),
          del_step("custom"),
          Step("SamplerConfig", "who:SamplerConfig",
               "try:\n"
               "    del SamplerConfig\n"
               "except NameError:\n"
               "    pass\n"
               "import gc\n"
               "gc.collect()")),
         written=WRITTEN5),
    # ---- control -----------------------------------------------------------------------------
    # Segmentation labels turned into one-hot targets take num_classes times the memory of the
    # class indices.
    Kind("one_hot_targets_working_set",
         "https://github.com/microsoft/InnerEye-DeepLearning/issues/338",
         "working set",
         # F.one_hot of (4, H, W) class indices with 150 classes: the int64 one-hot takes 70% of
         # the card and its `.float()` another 35%. The labels are small; nothing stale is held.
         ("import torch.nn.functional as F\n"
          "num_classes = 150\n"
          "side = int((frac(0.7) / (8 * num_classes * 4)) ** 0.5)\n"
          "labels = torch.randint(0, num_classes, (4, side, side), device='cuda')",),
         "target = F.one_hot(labels, num_classes).permute(0, 3, 1, 2).float()",
         (TB3,),
         written=WRITTEN5),
    # ---- reference cycles left to the collector ----------------------------------------------
    # A submodule that keeps a link to its parent module (`self.supmodel = model`) makes the two a
    # cycle.
    Kind("submodule_parent_link_cycle_in_loop",
         "https://github.com/pytorch/pytorch/issues/76920",
         "garbage in reference cycles",
         # A head that keeps a plain link to its parent detector (set through `__dict__`, so it is
         # no registered submodule): parent -> _modules -> head -> parent. Re-creating the detector
         # in a loop leaves each old pair, buffer and all, to the collector; only the last
         # detector is named.
         ("class Head(torch.nn.Module):\n"
          "    def __init__(self, parent, nbytes):\n"
          "        super().__init__()\n"
          "        self.__dict__['owner'] = parent\n"
          "        self.register_buffer('anchors', torch.empty(nbytes, dtype=torch.uint8, "
          "device='cuda'))\n"
          "class Detector(torch.nn.Module):\n"
          "    def __init__(self, nbytes):\n"
          "        super().__init__()\n"
          "        self.head = Head(self, nbytes)",),
         "for trial in range(1000):\n"
         "    detector = Detector(frac(0.15))",
         # The last detector is a cycle too: its step collects after deleting the name.
         (GC3, Step("detector", "who:detector",
                    "try:\n"
                    "    del detector\n"
                    "except NameError:\n"
                    "    pass\n"
                    "import gc\n"
                    "gc.collect()")),
         written=WRITTEN5),
    # A CUDA OOM traced to reference cycles that include CUDA tensors (found with
    # warn_tensor_cycles).
    Kind("tensor_attribute_self_cycle_in_loop",
         "https://github.com/pytorch/tensordict/issues/1187",
         "garbage in reference cycles",
         # The tensor itself is in the cycle: a metadata dict set as its Python attribute refers
         # back to it. Each call returns a small clone and leaves the large tensor to the
         # collector.
         ("def crop_with_meta(nbytes):\n"
          "    x = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    x.meta = {'source': x, 'valid': True}\n"
          "    return x[:16].clone()",),
         "for step in range(1000):\n"
         "    crop = crop_with_meta(frac(0.08))",
         (GC3,),
         written=WRITTEN5),
    # A logger's caller lookup held `inspect.currentframe()` in a local: a self-referencing frame
    # on every call, which pins its locals until the collector runs.
    Kind("currentframe_local_cycle_in_loop",
         "https://github.com/antonioterpin/goggles/pull/220",
         "garbage in reference cycles",
         # `frame = inspect.currentframe()` in a step that logs its caller: once it returns, the
         # frame object holds its locals, `frame` among them (a cycle), and the step's
         # activations with them.
         ("import inspect\n"
          "def train_step(step, nbytes):\n"
          "    activations = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    frame = inspect.currentframe()\n"
          "    return f'{frame.f_code.co_name}:{step}:{activations.numel()}'",),
         "for step in range(1000):\n"
         "    line = train_step(step, frac(0.08))",
         (GC3,),
         written=WRITTEN5),
    # ---- outlive `%reset`: the main thread's context, the logging and atexit modules' state,
    # the collector's debug flags ---------------------------------------------------------------
    # A ContextVar set and never reset leaked the scoped configuration into the surrounding
    # context.
    Kind("context_variable_keeps_batch",
         "https://github.com/topoteretes/cognee/issues/3948",
         "held by your session",
         # A request-scoped contextvars.ContextVar set to the current batch (a dict of two
         # tensors) and never reset: the value lives in the main thread's context, which `%reset`
         # does not touch. Its step sets every variable of that name back to None.
         ("import contextvars\n"
          "current_batch = contextvars.ContextVar('gm_current_batch', default=None)\n"
          "def start_request(nbytes):\n"
          "    batch = {'input_ids': torch.empty(nbytes, dtype=torch.uint8, device='cuda'),\n"
          "             'pixel_values': torch.empty(2 * nbytes, dtype=torch.uint8, "
          "device='cuda')}\n"
          "    current_batch.set(batch)\n"
          "    return len(batch)\n"
          "n_fields = start_request(frac(0.14))",),
         FAIL3,
         (Step("current_batch", "who:current_batch",
               "import contextvars\n"
               "def _reset_context_var(name):\n"
               "    for var in list(contextvars.copy_context()):\n"
               "        if var.name == name:\n"
               "            var.set(None)\n"
               "_reset_context_var('gm_current_batch')"),),
         written=WRITTEN5),
    # pytest's LogCaptureHandler kept each logged exception's traceback (LogRecord.exc_info),
    # whose frames kept objects that should have been released.
    Kind("log_records_exc_info_frames",
         "https://github.com/dask/distributed/issues/6352",
         "held by your session",
         # A caplog-like handler that keeps LogRecords: `log.exception(...)` stores exc_info, whose
         # traceback holds the failed evaluation's frame and its logits. The logger lives in
         # logging's registry; `log` is only another name for it.
         ("import logging\n"
          "class RecordCollector(logging.Handler):\n"
          "    def __init__(self):\n"
          "        super().__init__(logging.WARNING)\n"
          "        self.records = []\n"
          "    def emit(self, record):\n"
          "        self.records.append(record)\n"
          "log = logging.getLogger('gm_eval')\n"
          "log.propagate = False\n"
          "log.addHandler(RecordCollector())\n"
          "def evaluate(batch_id, nbytes):\n"
          "    logits = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    try:\n"
          "        raise ValueError(f'NaN in batch {batch_id}')\n"
          "    except ValueError:\n"
          "        log.exception('evaluation failed for batch %d', batch_id)\n"
          "for batch_id in range(5):\n"
          "    evaluate(batch_id, frac(0.1))",),
         FAIL3,
         (Step("log", "who:log",
               "import logging\n"
               "def _drop_collectors(name):\n"
               "    lg = logging.getLogger(name)\n"
               "    for h in list(lg.handlers):\n"
               "        lg.removeHandler(h)\n"
               "        h.records.clear()\n"
               "        h.close()\n"
               "_drop_collectors('gm_eval')"),),
         written=WRITTEN5),
    # `atexit.register(self.logout)`-style hooks: the bound method in atexit's registry keeps the
    # object from ever being garbage collected in a long-running process.
    Kind("atexit_bound_method_keeps_cache",
         "https://github.com/tenable/nessrest/issues/81",
         "held by your session",
         # Each cache registers `self.flush` with atexit when it is made: re-creating it keeps
         # every old cache (and its table) alive from atexit's registry; no name holds one.
         ("import atexit\n"
          "class EmbeddingCache:\n"
          "    def __init__(self, nbytes):\n"
          "        self.table = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        atexit.register(self.flush)\n"
          "    def flush(self):\n"
          "        self.table = None\n"
          "for reload in range(4):\n"
          "    cache = EmbeddingCache(frac(0.12))\n"
          "del cache",),
         FAIL3,
         (Step("atexit", "who:EmbeddingCache",
               "import atexit\n"
               "import gc\n"
               "def _unregister_caches(cls_name):\n"
               "    for obj in gc.get_objects():\n"
               "        if type(obj).__name__ == cls_name:\n"
               "            atexit.unregister(obj.flush)\n"
               "_unregister_caches('EmbeddingCache')"),),
         written=WRITTEN5),
    # Hunting a GPU memory leak with `gc.set_debug(gc.DEBUG_SAVEALL)`: every collection then
    # moves the unreachable batches into gc.garbage instead of freeing them.
    Kind("debug_saveall_keeps_collected_cycles",
         "https://github.com/sgl-project/sglang/pull/9673",
         "held by your session",
         # Schedule batches and their requests point at each other (a cycle); with DEBUG_SAVEALL
         # on, the user's gc.collect() puts all of them in gc.garbage, a list the gc module
         # holds: reachable, and no further collection frees them. Its step turns the flag off,
         # empties gc.garbage and collects.
         ("import gc\n"
          "gc.set_debug(gc.DEBUG_SAVEALL)\n"
          "class Req:\n"
          "    def __init__(self, batch, nbytes):\n"
          "        self.batch = batch\n"
          "        self.kv_cache = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "class ScheduleBatch:\n"
          "    def __init__(self, n, nbytes):\n"
          "        self.reqs = [Req(self, nbytes) for _ in range(n)]\n"
          "for step in range(3):\n"
          "    ScheduleBatch(2, frac(0.08))\n"
          "n_unreachable = gc.collect()",),
         FAIL3,
         (Step("gc.garbage", "none",
               "import gc\n"
               "gc.set_debug(0)\n"
               "gc.garbage.clear()\n"
               "gc.collect()"),),
         written=WRITTEN5),
]

# ---- sizes relative to the card ------------------------------------------------------------
H200_TOTAL_BYTES = 139.8 * 2**30  # what torch.cuda.mem_get_info()[1] gives on the H200
FRAC_SRC = "def frac(x):\n    return int(x * G)\n"


def scaled_gib(total_bytes: int) -> int:
    """diagnosis2's ``GiB`` on a card of ``total_bytes``: 2**30 on the H200 its kinds were
    written for (within 0.5%: its rows stay comparable), else in proportion, a multiple of
    2 MiB (the native allocator's segment granule, so that ``40 * GiB`` still holds exactly 40
    blocks of ``GiB``, as ``fragmentation_interleaved`` needs)."""
    scale = total_bytes / H200_TOTAL_BYTES
    if abs(scale - 1) < 0.005:
        return 2**30
    return max(1, round(2**30 * scale / 2**21)) * 2**21


def card_slug(name: str) -> str:
    """"NVIDIA H200" → "h200", "NVIDIA H100 80GB HBM3" → "h100"."""
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Za-z]?)\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"


# ---- the row --------------------------------------------------------------------------------
# Every field of diagnosis2's rows (benchmarks/results/diagnosis2_h200.json), present in every
# row here (None where it does not apply), and the new ones.
D2_FIELDS = ("kind", "source", "out_of_sample", "allocator", "expected", "verdict",
             "allocated_at_failure_bytes", "attributed_bytes", "not_found_bytes", "holders",
             "gpu", "torch", "backend", "explain_ms", "stages", "text", "causes", "walk_capped",
             "first_action", "who_ms", "who_text", "dry_run_ms", "dry_run_text", "wall_s",
             "run", "commit", "replaces", "tuned_after_seeing", "written")
NEW_FIELDS = ("set", "reached_failure", "advice", "advice_code", "advice_said_bytes",
              "advice_freed_bytes", "advice_steps", "advice_unrun", "advice_ms", "named_bytes",
              "holders_after_advice", "gpu_total_bytes", "gib_bytes", "checks", "note")
CHECKS = ("not_found_le_2pct", "named_ge_98pct", "advice_freed_ge_95pct", "verdict_ok")
_LISTS = {"holders", "advice", "advice_code", "advice_steps", "advice_unrun"}

# An action about a memory pool frees reserved memory (the pool's segments), not allocated; one
# about other libraries or processes frees device memory PyTorch never counted. The dry run's
# summary line speaks of the cache in passing but says the traceback's and Out's allocated
# bytes.
POOL_WORDS = re.compile(r"memory pool|private pool|MemPool|use_mem_pool|CUDAGraph|graph trees"
                        r"|\bpool\b", re.IGNORECASE)
OUTSIDE_WORDS = re.compile(r"other libraries|CuPy|cupy\.|\bJAX\b")
PROCESS_WORDS = re.compile(r"\bPID \d+")  # another process (its own "pool" is no memory pool)
DRY_RUN_LINE = "%gpumem cleanup --dry-run"


def measured_for(text: str) -> str:
    """Which memory an action's text says it frees: "reserved", "device" or "allocated"."""
    # Another library's pool (CuPy's "memory pool") is device memory PyTorch never counted:
    # its words win over the pool words, or a freed CuPy pool reads as 0 reserved.
    if PROCESS_WORDS.search(text) or OUTSIDE_WORDS.search(text):
        return "device"
    if POOL_WORDS.search(text) and not text.startswith(DRY_RUN_LINE):
        return "reserved"
    return "allocated"


def base_row(k: Kind, allocator: str, which: str) -> dict[str, Any]:
    """A row with every field, before anything ran."""
    row: dict[str, Any] = {f: ([] if f in _LISTS else None) for f in D2_FIELDS + NEW_FIELDS}
    row.update(d2.base_row(k, allocator))
    row.update(set=which, written=k.written or None, reached_failure=False,
               checks=dict.fromkeys(CHECKS), note="")
    if k.out_of_sample:
        # diagnosis2's out-of-sample kinds a rule was changed on seeing; a new kind, never.
        row["tuned_after_seeing"] = which == "rerun2" and k.kind in d2.TUNED_ON
    return row


def ledger_fields(row: dict[str, Any], expl: Any) -> None:
    """named and not-found bytes from the explanation's ledger; None before they exist."""
    led = getattr(expl, "ledger", None)
    row["named_bytes"] = getattr(led, "named_bytes", None) if led is not None else None
    row["not_found_bytes"] = getattr(led, "not_found_bytes", None) if led is not None else None


def run_advice(row: dict[str, Any], actions: Sequence[Any], run_cell: Callable[[str], Any],
               measures: Mapping[str, Callable[[], int]]) -> None:
    """Run every action with code and bytes, in order, each as its own cell, exactly as
    printed; measure each by ``measures`` ("allocated", "reserved", "device": bytes in use
    now). Nothing else runs in between: no collection, no cache release."""
    row["advice"] = [a.text for a in actions]
    chosen = [a for a in actions if getattr(a, "code", "") and a.nbytes is not None]
    row["advice_unrun"] = [
        {"text": a.text[:200], "said_bytes": a.nbytes, "code": getattr(a, "code", "") or "",
         "why": "no code" if a.nbytes is not None else "no bytes"}
        for a in actions if (a.nbytes is not None) != bool(getattr(a, "code", ""))]
    row["advice_code"] = [a.code for a in chosen]
    row["advice_said_bytes"] = sum(a.nbytes for a in chosen)
    steps: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for a in chosen:
        which = measured_for(a.text)
        before = {name: fn() for name, fn in measures.items()}
        t = time.perf_counter()
        result = run_cell(a.code)
        ms = round((time.perf_counter() - t) * 1e3, 2)
        err = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec",
                                                                  None)
        error = f"{type(err).__name__}: {err}"[:300] if err is not None else None
        del result, err  # never keep a cell's result: its exception keeps frames alive
        freed = {name: before[name] - fn() for name, fn in measures.items()}
        steps.append({"code": a.code, "said_bytes": a.nbytes, "freed_bytes": freed.get(which),
                      "measured": which,
                      "freed_allocated_bytes": freed.get("allocated"),
                      "freed_reserved_bytes": freed.get("reserved"),
                      "freed_device_bytes": freed.get("device"),
                      "in_text": a.code in a.text, "in_backticks": f"`{a.code}`" in a.text,
                      "error": error, "ms": ms})
    row["advice_steps"] = steps
    row["advice_ms"] = round((time.perf_counter() - t0) * 1e3, 2) if steps else None
    row["advice_freed_bytes"] = (sum(s["freed_bytes"] or 0 for s in steps) if steps else None)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%"


def checks(row: Mapping[str, Any]) -> tuple[dict[str, bool | None], list[str]]:
    """The row's four checks (None: cannot be judged) and a note for each miss or None."""
    out: dict[str, bool | None] = dict.fromkeys(CHECKS)
    notes: list[str] = []
    if not row.get("reached_failure"):
        notes.append("the failing cell was never reached: nothing could be checked")
        return out, notes
    out["verdict_ok"] = row.get("verdict") == row["expected"]
    if not out["verdict_ok"]:
        notes.append(f"verdict {row.get('verdict')!r}, expected {row['expected']!r}")
    alloc = row.get("allocated_at_failure_bytes")
    if alloc is None:
        notes.append("no OOM explanation (a post-cell line): no ledger and no advice to check")
        return out, notes
    if alloc <= 0:
        notes.append("nothing was allocated at the failure: not found and named are vacuous")
    else:
        nf, named = row.get("not_found_bytes"), row.get("named_bytes")
        if nf is None:
            notes.append("the ledger gave no not_found_bytes")
        else:
            out["not_found_le_2pct"] = 100 * nf <= 2 * alloc
            if not out["not_found_le_2pct"]:
                notes.append(f"not found {nf} B is {_pct(nf, alloc)} of {alloc} B allocated")
        if named is None:
            notes.append("the ledger has no named_bytes")
        else:
            out["named_ge_98pct"] = 100 * named >= 98 * alloc
            if not out["named_ge_98pct"]:
                notes.append(f"named {named} B is {_pct(named, alloc)} of {alloc} B allocated")
    steps = row.get("advice_steps") or []
    said, freed = row.get("advice_said_bytes") or 0, row.get("advice_freed_bytes")
    if not steps:
        unrun = row.get("advice_unrun") or []
        notes.append("no advice was run: no action has both code and bytes"
                     + (f" ({len(unrun)} with one and not the other)" if unrun else ""))
    elif said <= 0:
        notes.append(f"the advice run said it frees {said} B: nothing to hold it to")
    elif freed is None:
        notes.append("the advice ran but nothing was measured")
    else:
        out["advice_freed_ge_95pct"] = 100 * freed >= 95 * said
        if not out["advice_freed_ge_95pct"]:
            notes.append(f"the advice said {said} B and freed {freed} B ({_pct(freed, said)})")
    for s in steps:
        if s.get("error"):
            notes.append(f"`{s['code']}` raised {s['error']}")
        if not s.get("in_text", True):
            notes.append(f"`{s['code']}` is not in its text: the user cannot see what runs")
        elif not s.get("in_backticks", True):
            notes.append(f"`{s['code']}` is in its text but not between backticks")
    return out, notes


def finish_row(row: dict[str, Any], meta: Mapping[str, Any], commit: str,
               run: str) -> dict[str, Any]:
    """The row as written: every field, the run's provenance, the checks and their notes."""
    out: dict[str, Any] = {f: ([] if f in _LISTS else None) for f in D2_FIELDS + NEW_FIELDS}
    out.update({k: v for k, v in meta.items() if row.get(k) is None})
    out.update({k: v for k, v in row.items() if not (k in meta and v is None)})
    out.update(commit=commit, run=run)
    got, notes = checks(out)
    out["checks"] = got
    out["note"] = "; ".join(n for n in [out.get("note") or "", *notes] if n)
    return out


def merge(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[Any]:
    """``old`` with each of ``new``'s rows in place of its (kind, allocator), in ``old``'s
    order, saying what it replaced; a new pair goes at the end."""
    by_key = {(r["kind"], r["allocator"]): dict(r) for r in new}
    out: list[Any] = []
    for r in old:
        fresh = by_key.pop((r["kind"], r["allocator"]), None)
        if fresh is None:
            out.append(dict(r))
            continue
        fresh["replaces"] = {k: r.get(k) for k in ("run", "commit", "verdict", "checks",
                                                   "note") if r.get(k) not in (None, "")}
        out.append(fresh)
    return out + list(by_key.values())


# ---- which kinds, and checking them without a GPU ------------------------------------------
def kinds_of(which: str) -> list[Kind]:
    if which == "rerun2":
        return list(d2.KINDS)
    if which == "new6":  # its own file, which imports this one's dependencies, not this one
        from benchmarks.diagnosis3_kinds6 import KINDS6

        new = KINDS6
    elif which == "new7":
        from benchmarks.diagnosis3_kinds7 import KINDS7

        new = KINDS7
    elif which == "new8":
        from benchmarks.diagnosis3_kinds8 import KINDS8

        new = KINDS8
    elif which == "new9":
        from benchmarks.diagnosis3_kinds9 import KINDS9

        new = KINDS9
    elif which == "new10":
        from benchmarks.diagnosis3_kinds10 import KINDS10

        new = KINDS10
    elif which == "new11":
        from benchmarks.diagnosis3_kinds11 import KINDS11

        new = KINDS11
    else:
        new = {"new4": KINDS4, "new5": KINDS5}.get(which, KINDS3)
    return [dataclasses.replace(k, out_of_sample=True) for k in new]


def selected(which: str, only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Kind]:
    """The set's kinds in diagnosis2's order: out of sample first, torch.compile's last."""
    only, skip = set(only), set(skip)
    kinds = [k for k in kinds_of(which) if (not only or k.kind in only) and k.kind not in skip]
    return sorted(kinds, key=lambda k: (not k.out_of_sample, k.kind.startswith("compile")))


def planned(kinds: Sequence[Kind], allocators: Sequence[str]) -> list[tuple[str, str]]:
    """(allocator, kind) of every row a run makes, in the order it makes them."""
    return [(a, k.kind) for a in allocators for k in kinds if a in k.allocators]


def cells_of(k: Kind) -> list[tuple[str, str]]:
    return ([(f"setup[{i}]", c) for i, c in enumerate(k.setup)] + [("fail", k.fail)]
            + [(f"step {s.name}", s.free) for s in k.steps])


def compile_errors(kinds: Iterable[Kind]) -> list[str]:
    """Every cell of every kind that does not compile, after IPython's transforms (magics)."""
    from IPython.core.inputtransformer2 import TransformerManager

    tm = TransformerManager()
    errors = []
    for k in kinds:
        for label, src in cells_of(k):
            try:
                compile(tm.transform_cell(src), f"<{k.kind} {label}>", "exec")
            except SyntaxError as ex:
                errors.append(f"{k.kind} {label}: {type(ex).__name__}: {ex}")
    return errors


def known_verdicts() -> set[str]:
    verdicts = {"own traceback", "earlier runs"}  # the post-cell lines' (special="postcell")
    try:
        from gpumem_nb.oom import causes
    except Exception:  # the product does not import: its verdicts cannot be checked here
        return set()
    return verdicts | {getattr(causes, n) for n in dir(causes) if n.startswith("CAUSE_")}


def kind_problems(kinds: Sequence[Kind], new: bool) -> list[str]:
    """What makes a kind unfit to run: code that does not compile, an unknown allocator or
    verdict, no source, a name used twice, and for a new kind, no date it was written."""
    problems = compile_errors(kinds)
    verdicts = known_verdicts()
    seen: set[str] = set()
    for k in kinds:
        if k.kind in seen:
            problems.append(f"{k.kind}: the name is used twice")
        seen.add(k.kind)
        if not k.source.startswith(("http://", "https://")):
            problems.append(f"{k.kind}: source is no URL of a user report")
        if verdicts and k.expected not in verdicts:
            problems.append(f"{k.kind}: expected {k.expected!r} is no verdict the explainer "
                            "gives")
        odd = sorted(set(k.allocators) - set(ALLOCATORS))
        if odd:
            problems.append(f"{k.kind}: unknown allocators {odd}")
        if new and not k.written:
            problems.append(f"{k.kind}: a new kind says when it was written (written=...)")
    return problems


def sizing(src: str) -> str:
    """How a cell sizes its memory: by the card (GiB, frac/G, a memory fraction), by what is
    free, or by its tensors' shapes (which do not scale with the card)."""
    tags = [t for t, hit in (("GiB", "GiB" in src),
                             ("frac", "frac(" in src or re.search(r"\bG\b", src) is not None),
                             ("free", "mem_get_info" in src),
                             ("fraction", "memory_fraction(" in src)) if hit]
    return "+".join(tags) or "shape"


# Seconds per row on the H200 (diagnosis2's rows), and what this harness adds.
EST_FROM = os.path.join(ROOT, "benchmarks", "results", "diagnosis2_h200.json")
STARTUP_S = 15.0  # a child: torch, CUDA, IPython and the extension
ADVICE_S = 1.5  # the advice's cells (a %gpumem cleanup scans the session)
NEW_KIND_S = 10.0  # a kind never run


def estimates() -> dict[tuple[str, str], float]:
    try:
        with open(EST_FROM) as f:
            return {(r["kind"], r["allocator"]): float(r.get("wall_s") or 0) for r in json.load(f)}
    except (OSError, ValueError, KeyError):
        return {}


def dry_run(which: str, kinds: Sequence[Kind], allocators: Sequence[str]) -> int:
    rows = planned(kinds, allocators)
    est = estimates()
    by = {k.kind: k for k in kinds}
    print(f"--set {which}: {len(rows)} rows ({len(kinds)} kinds)"
          + ("" if kinds else ": the set is empty until its new kinds are written"))
    print(f"{'allocator':<16} {'kind':<34} {'expected':<22} {'est_s':>6}  sizes (setup / fail)")
    per: dict[str, float] = {}
    for a, name in rows:
        k = by[name]
        s = est.get((name, a), NEW_KIND_S) + ADVICE_S
        per[a] = per.get(a, STARTUP_S) + s
        setup = ",".join(sorted({sizing(c) for c in k.setup})) or "-"
        print(f"{a:<16} {name:<34} {k.expected:<22} {s:>6.1f}  {setup} / {sizing(k.fail)}")
    for a, s in per.items():
        print(f"estimated {a}: {s:.0f} s (H200 times of diagnosis2 + {ADVICE_S} s advice a row "
              f"+ {STARTUP_S:.0f} s start)")
    print(f"estimated in all: {sum(per.values()):.0f} s")
    problems = kind_problems(kinds, new=which in ("new", "new4", "new5", "new6", "new7",
                                                     "new8", "new9", "new10", "new11"))
    for p in problems:
        print(f"PROBLEM {p}")
    print("every kind's code compiles" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


# ============================================================================================
# The parent: one subprocess per allocator
# ============================================================================================
def git_commit() -> str:
    return os.environ.get("GPUMEM_COMMIT") or d2.git_commit()


def run_allocator(allocator: str, which: str, names: Sequence[str], limit_s: float,
                  log: list[str], meta: dict[str, Any],
                  on_row: Callable[[dict[str, Any]], None]) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATORS[allocator]
    env["PYTORCH_ALLOC_CONF"] = ""
    env.setdefault("GPUMEM_NB_CONFIG", os.path.join("/tmp", "gpumem_nb_diagnosis3.json"))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", allocator,
                             "--set", which, "--kinds", ",".join(names)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    done: set[str] = set()
    deadline = time.monotonic() + limit_s
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        try:
            if line.startswith(META):
                meta.update(json.loads(line[len(META):]))
                continue
            if line.startswith(ROW):
                row = json.loads(line[len(ROW):])
                done.add(row["kind"])
                on_row(row)
                continue
        except ValueError as ex:
            log.append(f"[{allocator}] unreadable line ({ex}): {line[:200]}")
            continue
        log.append(f"[{allocator}] {line.rstrip()}")
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        log.append(f"[{allocator}] killed after {limit_s:.0f} s")
    proc.wait()
    last = next((line for line in reversed(log) if line.startswith(f"[{allocator}] ")
                 and line.strip() != f"[{allocator}]"), "")
    why = ("timed out" if timed_out else
           f"the allocator's process ended (rc {proc.returncode}) before it"
           + (f": {last[len(allocator) + 3:][:300]}" if last else ""))
    kinds = {k.kind: k for k in kinds_of(which)}
    for name in names:
        if name not in done:
            on_row(base_row(kinds[name], allocator, which) | {"note": why})


def summary(rows: Sequence[Mapping[str, Any]]) -> str:
    out = [f"{'kind':<34} {'allocator':<16} {'verdict ok':<10} {'nf%':>6} {'named%':>7} "
           f"{'advice said/freed GiB':>22} {'s':>6}"]
    for r in rows:
        alloc = r.get("allocated_at_failure_bytes") or 0
        nf = f"{100 * r['not_found_bytes'] / alloc:.2f}" if alloc and \
            r.get("not_found_bytes") is not None else ""
        named = f"{100 * r['named_bytes'] / alloc:.1f}" if alloc and \
            r.get("named_bytes") is not None else ""
        adv = (f"{(r.get('advice_said_bytes') or 0) / 2**30:.2f}/"
               f"{(r.get('advice_freed_bytes') or 0) / 2**30:.2f}"
               if r.get("advice_steps") else "-")
        out.append(f"{r['kind']:<34} {r['allocator']:<16} "
                   f"{r['checks'].get('verdict_ok')!s:<10} {nf:>6} {named:>7} {adv:>22} "
                   f"{r.get('wall_s') or 0:>6.1f}")
    for c in CHECKS:
        vals = [r["checks"].get(c) for r in rows]
        out.append(f"{c}: {vals.count(True)} pass, {vals.count(False)} fail, "
                   f"{vals.count(None)} not judged (of {len(rows)} rows)")
    return "\n".join(out)


def progress(row: Mapping[str, Any], i: int, n: int) -> str:
    c = row["checks"]
    adv = (f"advice said {(row.get('advice_said_bytes') or 0) / 2**30:.2f} GiB, freed "
           f"{(row.get('advice_freed_bytes') or 0) / 2**30:.2f} GiB "
           f"({c['advice_freed_ge_95pct']})" if row.get("advice_steps") else "no advice run")
    return (f"[{row['allocator']}] {i}/{n} {row['kind']} {row.get('wall_s') or 0:.1f} s: "
            f"verdict {row.get('verdict')!r} ({c['verdict_ok']}), not found ≤2% "
            f"{c['not_found_le_2pct']}, named ≥98% {c['named_ge_98pct']}, {adv}"
            + (f"  NOTE {row['note'][:160]}" if row.get("note") else ""))


def main_parent(args: argparse.Namespace, kinds: Sequence[Kind],
                allocators: Sequence[str]) -> None:
    os.makedirs(args.out, exist_ok=True)
    commit = args.commit or git_commit()
    run = args.run or f"diagnosis3 --set {args.set} at {commit or 'an unknown commit'}"
    earlier: list[Any] = []
    if args.merge:
        with open(args.merge) as f:
            earlier = json.load(f)
    rows: list[dict[str, Any]] = []
    log: list[str] = []
    meta: dict[str, Any] = {}
    written: list[str] = []
    total = len(planned(kinds, allocators))
    start = time.monotonic()

    def write() -> None:
        card = card_slug(meta.get("gpu", "")) if meta.get("gpu") else "unknown"
        path = os.path.join(args.out, f"diagnosis3_{card}.json")
        for old in written:
            if old != path and os.path.exists(old):
                os.remove(old)  # written before the card was known
        written[:] = [path]
        with open(path, "w") as f:
            json.dump(merge(earlier, rows) if args.merge else rows, f, indent=1, default=str)
        with open(os.path.join(args.out, "diagnosis3_log.txt"), "w") as f:
            f.write("\n".join(log[-5000:]) + "\n")

    def on_row(row: dict[str, Any]) -> None:
        row = finish_row(row, meta, commit, run)
        rows.append(row)
        print(progress(row, len(rows), total), flush=True)
        write()

    counts = [sum(1 for k in kinds if a in k.allocators) for a in allocators]
    for i, allocator in enumerate(allocators):
        names = [k.kind for k in kinds if allocator in k.allocators]
        left = args.budget_s - (time.monotonic() - start)
        if left < STARTUP_S:
            for k in kinds:
                if allocator in k.allocators:
                    on_row(base_row(k, allocator, args.set)
                           | {"note": "not started: the budget was spent"})
            continue
        share = left * counts[i] / max(sum(counts[i:]), 1)
        print(f"[{allocator}] {len(names)} kinds, {share:.0f} s of {left:.0f} s left",
              flush=True)
        run_allocator(allocator, args.set, names, share, log, meta, on_row)
        write()
    write()
    print(summary(rows))
    missing: dict[str, list[str]] = {}
    for r in rows:
        if not r.get("reached_failure") and r.get("note", "").startswith(
                ("timed out", "not started", "the allocator's process ended")):
            missing.setdefault(r["allocator"], []).append(r["kind"])
    for a, names in missing.items():
        print(f"not run under {a}: --allocators {a} --only {','.join(names)} --merge "
              f"{written[0] if written else 'THIS.json'}")
    print(f"wrote {written[0] if written else '-'} ({time.monotonic() - start:.0f} s)")


# ============================================================================================
# The child: a real IPython shell, the extension loaded, the kinds in turn
# ============================================================================================
def child(allocator: str, which: str, names: Sequence[str]) -> None:
    import torch
    from IPython.testing.globalipapp import start_ipython

    from benchmarks.gpu_diagnosis import START_ALLOCATED_LIMIT_BYTES, release_everything

    ip = start_ipython()
    ip.displayhook.cache_size = 1000
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    total = int(torch.cuda.mem_get_info(0)[1])
    gib = scaled_gib(total)
    meta = {"gpu": torch.cuda.get_device_name(0), "gpu_total_bytes": total, "gib_bytes": gib,
            "torch": torch.__version__, "backend": torch.cuda.get_allocator_backend()}
    print(META + json.dumps(meta), flush=True)

    def allocated() -> int:
        torch.cuda.synchronize()
        return int(torch.cuda.memory_allocated(0))

    def reserved() -> int:
        torch.cuda.synchronize()
        return int(torch.cuda.memory_reserved(0))

    def device_used() -> int:
        torch.cuda.synchronize()
        free, whole = torch.cuda.mem_get_info(0)
        return int(whole - free)

    measures = {"allocated": allocated, "reserved": reserved, "device": device_used}

    def fresh() -> None:
        release_everything(ip)
        cupy = sys.modules.get("cupy")
        if cupy is not None:  # an earlier kind's CuPy pool keeps what %reset let go of
            cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
        left = allocated()
        if left > START_ALLOCATED_LIMIT_BYTES:
            raise RuntimeError(f"not run: {left} bytes left allocated by the previous kind")
        ip.user_ns.update(torch=torch, G=total, GiB=gib)
        exec(FRAC_SRC, ip.user_ns)  # frac's globals are the user's namespace, as if typed
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        ip.run_cell("warm = 1", store_history=True)

    by_name = {k.kind: k for k in kinds_of(which)}
    for name in names:
        k = by_name[name]
        row = run_kind(ip, k, base_row(k, allocator, which) | meta, fresh=fresh,
                       measures=measures, gib=gib)
        print(ROW + json.dumps(row, default=str), flush=True)
        gc.collect()


def run_kind(ip: Any, k: Kind, row: dict[str, Any], *, fresh: Callable[[], None],
             measures: Mapping[str, Callable[[], int]], gib: int) -> dict[str, Any]:
    """One kind in ``ip``: ``fresh()`` clears the session and loads the extension, the setup
    cells run, the failing cell fails, the explanation is read, its advice runs, then the
    kind's own steps. ``measures`` reads "allocated", "reserved" and "device" bytes in use.
    Any error ends the kind with a note; the row is returned either way."""
    import importlib.util
    import traceback

    from gpumem_nb.magics import current_monitor

    def run(src: str) -> Any:
        return ip.run_cell(src, store_history=True)

    t0 = time.perf_counter()
    foreign = failed = before = e = None
    try:
        if k.needs and importlib.util.find_spec(k.needs) is None:
            raise RuntimeError(f"not run: {k.needs} is not installed here")
        fresh()
        for cell in k.setup:
            failed = run(cell).error_in_exec  # never keep the ExecutionResult
            if failed is not None:
                raise RuntimeError(f"setup failed: {failed!r}"[:300])
        if k.special == "foreign":
            from benchmarks.foreign import ForeignHolder

            foreign = ForeignHolder(60 * gib)
            foreign.__enter__()
        mon = current_monitor(ip)
        if mon is None:
            raise RuntimeError("not run: %load_ext gpumem_nb left no monitor")
        if k.special == "postcell":
            run(k.fail)
            row["reached_failure"] = True
            mon.sampler.tick()
            msgs = [v.message for v in mon.verdicts]
            row["text"] = " | ".join(msgs)[:2000]
            row["verdict"] = ("own traceback" if any("stored exception" in m for m in msgs)
                              else "earlier runs" if any("earlier runs" in m for m in msgs)
                              else None)
            if row["verdict"] is None:
                row["note"] = "no post-cell line was shown for this cell"
        else:
            before = mon.oom.last
            failed = run(k.fail).error_in_exec
            if failed is None:
                raise RuntimeError("the failing cell did not fail")
            e = mon.oom.last
            if e is None or e is before:
                raise RuntimeError(f"no explanation: {failed!r}"[:300])
            failed = before = None
            row["reached_failure"] = True
            d2.explained(row, e)
            ledger_fields(row, e)
            # Straight after the failure, before anything of the harness's own.
            run_advice(row, e.actions, run, measures)
            if k.steps:
                row["holders_after_advice"] = True
                d2.truth(row, k, e, measures["allocated"], measures["reserved"], ip)
    except Exception as ex:
        row["note"] = f"{type(ex).__name__}: {ex}"[:500]
        row["traceback"] = traceback.format_exc()[-2000:]
    finally:
        # Nothing of this kind outlives it here: a failed cell's exception keeps its frames.
        failed = before = e = None
        if foreign is not None:
            foreign.__exit__(None, None, None)
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--set", default="rerun2", choices=SETS)
    p.add_argument("--budget-s", type=float, default=500.0)
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--only", default="", help="only these kinds (comma-separated)")
    p.add_argument("--skip", default="", help="kinds not to run")
    p.add_argument("--merge", default="", help="an earlier run's JSON to put these rows into")
    p.add_argument("--run", default="", help="this run's label in its rows")
    p.add_argument("--commit", default="", help="the commit measured (else $GPUMEM_COMMIT, "
                                                "else git's HEAD)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the rows a run would make and check every kind compiles; no torch")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--kinds", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.set, [n for n in args.kinds.split(",") if n])
        return
    allocators = [a for a in args.allocators.split(",") if a]
    unknown = set(allocators) - set(ALLOCATORS)
    if unknown:
        p.error(f"no such allocator: {', '.join(sorted(unknown))} (of {', '.join(ALLOCATORS)})")
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    names = {k.kind for k in kinds_of(args.set)}
    if only - names or skip - names:
        p.error(f"no such kind in --set {args.set}: {', '.join(sorted((only | skip) - names))}")
    if args.budget_s > 530:
        print(f"warning: --budget-s {args.budget_s:.0f} leaves no margin under a device "
              "call's 9 minutes", file=sys.stderr)
    kinds = selected(args.set, only, skip)
    allocators = [a for a in allocators if any(a in k.allocators for k in kinds)]
    if args.dry_run:
        sys.exit(dry_run(args.set, kinds, allocators))
    if args.merge and not os.path.exists(args.merge):
        p.error(f"--merge: no such file {args.merge}")
    main_parent(args, kinds, allocators)


if __name__ == "__main__":
    main()
