"""The eleventh batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new11``).

Written as KINDS4 to KINDS10 were: by a helper that had not read the explainer's code (nothing
under ``gpumem_nb/``, ``tests/``, ``docs/`` or ``notebooks/``), each kind from the user report
its ``source`` names (the comment above it says what the user hit; "composite" where the kind
joins a report to a pattern the report does not show itself), ``expected`` written by the
mechanism before any run. Every failing cell asks for more than CUDA has free (``FILL``) unless
it is a computation of its own, and no setup leaves a large freed block in the allocator's
cache (a setup that frees temporaries releases them with ``torch.cuda.empty_cache()``), so
that ``FILL`` is all the memory the request can get. Sizes follow the card through ``frac()``.
No setup leaves a value in ``Out`` (each ends with an assignment, a loop or ``del``).

Each mechanism differs from every kind of KINDS3 to KINDS10 and diagnosis2's KINDS: the holders
here are finished ``asyncio`` tasks kept in a set (each ``Task`` keeps its result), the
callbacks of ``weakref.ref`` objects that close over their own referents (the "weak" registry
keeps them alive), exceptions whose ``args`` carry a tensor after their tracebacks were cleared,
a function's own ``__dict__`` used as a memo (a rotary table per sequence length),
``torch.utils.benchmark.Timer`` objects kept for re-running (their copied ``globals``), an
optimizer's Adam state left on the GPU after ``model.to('cpu')``, dict subclasses whose
``__dict__`` is the dict itself (a self-cycle per object, left to the collector), a helper
module whose PEP 562 ``__getattr__`` caches what it loads in its globals, one file imported as
two modules under two names (the copy the notebook does not see keeps its table),
``torch.nn.functional.scaled_dot_product_attention`` replaced by a wrapper whose closure keeps
attention maps, a stdlib HTTP server run from a thread whose handler class closes over the
model, a ``TorchFunctionMode`` entered by hand and never exited (torch's C++ mode stack keeps
it), and autocast entered by hand and never exited (its C++ cast cache keeps float16 copies of
the weights); the control is position ids made from a padding mask (``long()`` and ``cumsum``
promote a bool mask to int64, 8 bytes an element, twice).

Three kinds hold one object by two references, so that one deletion frees nothing: the lazy
module's table (a module global and a notebook name), the attention maps (the patched
function's closure and a notebook name) and the HTTP server (a notebook name and the frame of
the thread that serves it).

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` (modules in ``sys.modules``, an attribute of ``torch.nn.functional``, a live server
thread, torch's function-mode stack, autocast's state and cache) come after the others, and each
one's steps undo it completely. The server thread never ends by itself (``serve_forever``): if
its step never runs, the kinds after it start with its memory held. The very last kind is
``autocast_left_entered_keeps_weight_casts``: until its step exits autocast, every float32 op of
the process runs in float16 and every leaf weight it touches is cached.
"""

from __future__ import annotations

from benchmarks.diagnosis3_kinds6 import FAIL6 as FAIL11
from benchmarks.diagnosis3_kinds6 import GC6 as GC11
from benchmarks.diagnosis3_kinds6 import TB6 as TB11
from benchmarks.diagnosis3_kinds6 import del_step
from benchmarks.gpu_diagnosis2 import Kind, Step

WRITTEN11 = "2026-12-08, by a helper blind to gpumem_nb's code; not yet measured"


def del_names_step(label: str, estimate: str, *names: str, collect: bool = False) -> Step:
    """One step that deletes several names bound to the same objects (deleting one of them
    alone frees nothing), each unless the advice already did; ``collect`` also runs the
    collector, for a holder that is in a cycle (a class made in a function is)."""
    code = "\n".join(f"try:\n    del {n}\nexcept NameError:\n    pass" for n in names)
    if collect:
        code += "\nimport gc\ngc.collect()"
    return Step(label, estimate, code)


KINDS11: list[Kind] = [
    # ---- objects of library classes in the namespace ----------------------------------------
    # asyncio's docs say to keep fire-and-forget tasks in a set and to discard each one when it
    # is done; a reviewer: "When tasks finish, ideally, they'd be removed from the set() so it
    # doesn't keep growing forever." Composite: here the tasks return CUDA embeddings, and the
    # notebook keeps the set without the `add_done_callback(background_tasks.discard)` line.
    Kind("asyncio_done_tasks_keep_results",
         "https://github.com/ETS-Next-Gen/writing_observer/pull/192",
         "held by your session",
         # Four shard-embedding tasks started with `asyncio.create_task` inside `asyncio.run`
         # and kept in `background_tasks`; all are done and the loop is closed. Each finished
         # Task keeps its result, a CUDA tensor; nothing else names them.
         ("import asyncio\n"
          "background_tasks = set()\n"
          "async def embed_shard(shard_id, nbytes):\n"
          "    await asyncio.sleep(0)\n"
          "    return torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "async def launch(n_shards, nbytes):\n"
          "    for shard_id in range(n_shards):\n"
          "        task = asyncio.create_task(embed_shard(shard_id, nbytes))\n"
          "        background_tasks.add(task)\n"
          "    await asyncio.gather(*background_tasks)\n"
          "    return len(background_tasks)\n"
          "n_launched = asyncio.run(launch(4, frac(0.07)))",),
         FAIL11,
         (del_step("background_tasks"),),
         written=WRITTEN11),
    # Callbacks kept in a registry held a reference back to the objects they were about, so
    # "no PV object with callbacks is ever garbage collected". Composite: here the callbacks
    # are weakref callbacks, meant to log when each shard is freed, and each names its shard:
    # the weak reference's callback keeps the referent alive for as long as the weakref lives.
    Kind("weakref_callbacks_close_over_referents",
         "https://github.com/pyepics/pyepics/issues/10",
         "held by your session",
         # `watch(shard, name, watchers)` appends `weakref.ref(shard, callback)`, the callback a
         # lambda that logs `shard.numel()`: a closure over the shard. `del shard` frees none of
         # the four; `watchers` (a list of weakref objects) holds them through `__callback__`.
         ("import weakref\n"
          "freed_log = []\n"
          "def watch(t, name, registry):\n"
          "    registry.append(weakref.ref(\n"
          "        t, lambda ref: freed_log.append(f'{name}: {t.numel()} bytes freed')))\n"
          "watchers = []\n"
          "for i in range(4):\n"
          "    shard = torch.empty(frac(0.07), dtype=torch.uint8, device='cuda')\n"
          "    watch(shard, f'shard{i}', watchers)\n"
          "del shard",),
         FAIL11,
         (del_step("watchers"),),
         written=WRITTEN11),
    # PyTorch set `e.__traceback__ = None` after storing caught exceptions, so that their
    # frames' tensors are not kept. Composite: here the notebook does the same before keeping
    # each failure, but the exception carries the offending logits in its `args`.
    Kind("exception_args_keep_logits_after_traceback_cleared",
         "https://github.com/pytorch/pytorch/pull/182980",
         "held by your session",
         # `NonFiniteLoss(message, logits)` from four steps, each kept in `failures` with its
         # traceback cleared: no frame is kept, but `err.args[1]` is the step's CUDA logits.
         ("class NonFiniteLoss(RuntimeError):\n"
          "    pass\n"
          "def train_step(step, nbytes):\n"
          "    logits = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    raise NonFiniteLoss(f'non-finite loss at step {step}', logits)\n"
          "failures = []\n"
          "for step in range(4):\n"
          "    try:\n"
          "        train_step(step, frac(0.07))\n"
          "    except NonFiniteLoss as err:\n"
          "        err.__traceback__ = None\n"
          "        failures.append(err)",),
         FAIL11,
         (del_step("failures"),),
         written=WRITTEN11),
    # ---- a function's own attributes -----------------------------------------------------------
    # A rotary-embedding helper cached its tables by sequence length, so evaluation at many
    # lengths kept one table per length ("incorrectly caching by the sequence length").
    # Composite: here the cache is a dict stored on the function itself (`rope_tables.cache`,
    # the function-attribute "static variable" idiom), not on a module.
    Kind("rope_tables_cached_on_function_attribute",
         "https://github.com/lucidrains/rotary-embedding-torch/issues/15",
         "held by your session",
         # Evaluation at four sequence lengths; each call caches that length's cos/sin rows in
         # the function's `__dict__`. `tables` is deleted; the function keeps all four.
         ("def rope_tables(seq_len, bytes_per_1k):\n"
          "    cache = rope_tables.__dict__.setdefault('cache', {})\n"
          "    if seq_len not in cache:\n"
          "        cache[seq_len] = torch.empty(seq_len // 1024 * bytes_per_1k, "
          "dtype=torch.uint8,\n"
          "                                     device='cuda')\n"
          "    return cache[seq_len]\n"
          "bytes_per_1k = frac(0.0225)\n"
          "for seq_len in (1024, 2048, 3072, 4096):\n"
          "    tables = rope_tables(seq_len, bytes_per_1k)\n"
          "    n_positions = tables.numel() // bytes_per_1k * 1024\n"
          "del tables",),
         FAIL11,
         (del_step("rope_tables"),),
         written=WRITTEN11),
    # A user of a benchmark plugin found that GPU memory "could not be freed between iterations
    # or rounds". Composite: here the notebook times a projection in two dtypes with
    # `torch.utils.benchmark.Timer` and keeps the timers to re-run them later; each Timer keeps
    # a copy of its `globals` (and timeit's compiled inner function keeps that dict).
    Kind("benchmark_timers_keep_their_globals",
         "https://github.com/ionelmc/pytest-benchmark/issues/215",
         "held by your session",
         # Two timers (float16, bfloat16), each given `globals={'a': a, 'w': w}` and run once;
         # `del a, w` frees nothing: `timers` keeps both inputs of both dtypes. The matmul
         # outputs are released from the cache.
         ("from torch.utils import benchmark\n"
          "width = 4096\n"
          "rows = frac(0.1) // (2 * width)\n"
          "timers = {}\n"
          "for dtype in (torch.float16, torch.bfloat16):\n"
          "    a = torch.randn(rows, width, device='cuda', dtype=dtype)\n"
          "    w = torch.randn(width, width, device='cuda', dtype=dtype)\n"
          "    timers[str(dtype)] = benchmark.Timer(stmt='a @ w', globals={'a': a, 'w': w},\n"
          "                                         label='projection', "
          "sub_label=str(dtype))\n"
          "    first_run = timers[str(dtype)].timeit(2)\n"
          "del a, w, first_run\n"
          "torch.cuda.empty_cache()",),
         FAIL11,
         (del_step("timers"),),
         written=WRITTEN11),
    # A user moved the model to the CPU to finish training there and found "something was left
    # on the CUDA device": the optimizer is not moved, as it is not part of the modules.
    Kind("adam_state_left_on_gpu_after_model_cpu",
         "https://github.com/WenjieDu/PyPOTS/issues/599",
         "held by your session",
         # One Adam step on a 3-layer model, then `model.to('cpu')` to make room for the next
         # model: the parameters move, `opt.state`'s exp_avg and exp_avg_sq (twice the weights)
         # stay on the GPU. The step's temporaries and the old parameters are released from the
         # cache.
         ("width = int((frac(0.04) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(3)])\n"
          "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
          "x = torch.randn(8, width, device='cuda')\n"
          "model(x).square().mean().backward()\n"
          "opt.step()\n"
          "opt.zero_grad(set_to_none=True)\n"
          "del x\n"
          "model = model.to('cpu')\n"
          "torch.cuda.empty_cache()",),
         FAIL11,
         (del_step("opt"),),
         written=WRITTEN11),
    # ---- reference cycles left to the collector ----------------------------------------------
    # The `AttrDict` recipe (`self.__dict__ = self`) "causes a memory leak": each object is its
    # own attribute dict, a reference cycle. Composite: here each training batch is such an
    # AttrDict holding its CUDA images.
    Kind("attrdict_batches_self_cycle_in_loop",
         "https://github.com/bsc-s2/pykit/pull/14",
         "garbage in reference cycles",
         # A loop that wraps each batch in an AttrDict (`batch.images`); every replaced batch is
         # a cycle (the object is its own `__dict__`) with its images. The card fills before
         # the collector runs; only the last batch is named.
         ("class AttrDict(dict):\n"
          "    def __init__(self, *args, **kwargs):\n"
          "        super().__init__(*args, **kwargs)\n"
          "        self.__dict__ = self",),
         "for step in range(1000):\n"
         "    batch = AttrDict(images=torch.empty(frac(0.08), dtype=torch.uint8, "
         "device='cuda'), step=step)\n"
         "    n_pixels = batch.images.numel()",
         (GC11, del_step("batch", collect=True)),
         written=WRITTEN11),
    # ---- control: a bool mask promoted to int64 --------------------------------------------------
    # "calling .sum() on the boolean attention mask promotes it to int64, resulting in a
    # temporary tensor exceeding 90 GB". Composite: here the promotion is the position-id
    # recipe `attention_mask.long().cumsum(-1) - 1`.
    Kind("position_ids_from_mask_int64_working_set",
         "https://github.com/modelscope/mcore-bridge/pull/167",
         "working set",
         # Position ids for a packed batch: the padding mask is bool (7% of the card), its
         # `long()` copy and the `cumsum` are int64, 8 times as large each (1.19 of the card in
         # all). The inputs are the sequence lengths, a few MiB; nothing stale is held.
         ("seq_len = 4096\n"
          "n_seqs = frac(0.07) // seq_len\n"
          "lengths = torch.randint(1, seq_len + 1, (n_seqs,), device='cuda')\n"
          "def make_position_ids(lengths, seq_len):\n"
          "    attention_mask = torch.arange(seq_len, device='cuda')[None, :] < "
          "lengths[:, None]\n"
          "    return attention_mask.long().cumsum(-1) - 1",),
         "position_ids = make_position_ids(lengths, seq_len)",
         (TB11,),
         written=WRITTEN11),
    # ---- outlive `%reset`: modules in sys.modules ------------------------------------------------
    # Lazily loaded module attributes were loaded whenever tools looked at them (340 MB).
    # Composite: here a helper module's PEP 562 `__getattr__` loads each table on first access
    # and stores it in the module's globals (so that later lookups skip `__getattr__`), and
    # the notebook names one of the tables too.
    Kind("lazy_module_getattr_caches_tables",
         "https://github.com/pulumi/pulumi/pull/21620",
         "held by your session",
         # `gm_assets.word_vectors` and `gm_assets.char_vectors` are loaded by the module's
         # `__getattr__` and cached in its globals; `vocab` is the word vectors again. Two
         # references to the word vectors: `del vocab` frees nothing. The module stays in
         # sys.modules through `%reset`; its first step removes it and its cached tables.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "assets_dir = tempfile.mkdtemp(prefix='gm_assets_')\n"
          "pathlib.Path(assets_dir, 'gm_assets.py').write_text(\n"
          "    'import torch\\n'\n"
          "    '_SIZES = {}\\n'\n"
          "    'def configure(**sizes):\\n'\n"
          "    '    _SIZES.update(sizes)\\n'\n"
          "    'def __getattr__(name):\\n'\n"
          "    '    if name not in _SIZES:\\n'\n"
          "    '        raise AttributeError(name)\\n'\n"
          "    '    value = torch.empty(_SIZES[name], dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    '    globals()[name] = value\\n'\n"
          "    '    return value\\n')\n"
          "sys.path.insert(0, assets_dir)\n"
          "importlib.invalidate_caches()",
          "import gm_assets as assets\n"
          "assets.configure(word_vectors=frac(0.15), char_vectors=frac(0.1))\n"
          "vocab = assets.word_vectors\n"
          "n_chars = assets.char_vectors.numel()"),
         FAIL11,
         (Step("gm_assets globals", "who:assets",
               "import sys\n"
               "_mod = sys.modules.pop('gm_assets', None)\n"
               "_key = None\n"
               "if _mod is not None:\n"
               "    for _key in ('word_vectors', 'char_vectors'):\n"
               "        _mod.__dict__.pop(_key, None)\n"
               "sys.path[:] = [p for p in sys.path if 'gm_assets_' not in p]\n"
               "_mod = _key = None\n"
               "del _mod, _key\n"
               "try:\n"
               "    del assets\n"
               "except NameError:\n"
               "    pass"),
          del_step("vocab")),
         written=WRITTEN11),
    # "Looks like sys.path.append causes import see module first as non-loaded module": one file
    # imported as `module_dir.first` and as `first` is two modules. Composite: here the file
    # loads a CUDA table into its module global, and the notebook clears the copy it sees.
    Kind("module_imported_twice_under_two_names",
         "https://github.com/python/cpython/issues/120620",
         "held by your session",
         # `gm_proj/augment.py` appends its own folder to sys.path and imports `features`, so
         # `gm_proj/features.py` runs twice: as `gm_proj.features` (the notebook's `features`)
         # and as `features` (reached as `augment.features`). Each loads its TABLE; the notebook
         # sets `features.TABLE = None` and empties the cache, but the other copy's TABLE stays.
         # Both stay in sys.modules through `%reset`; its step removes them.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "proj_root = tempfile.mkdtemp(prefix='gm_twice_')\n"
          "proj_dir = pathlib.Path(proj_root, 'gm_proj')\n"
          "proj_dir.mkdir()\n"
          "(proj_dir / '__init__.py').write_text('')\n"
          "(proj_dir / 'features.py').write_text(\n"
          "    'import torch\\n'\n"
          "    'TABLE = None\\n'\n"
          "    'def load(nbytes):\\n'\n"
          "    '    global TABLE\\n'\n"
          "    '    if TABLE is None:\\n'\n"
          "    '        TABLE = torch.empty(nbytes, dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    '    return TABLE.numel()\\n')\n"
          "(proj_dir / 'augment.py').write_text(\n"
          "    'import os\\n'\n"
          "    'import sys\\n'\n"
          "    'sys.path.append(os.path.dirname(__file__))\\n'\n"
          "    'import features\\n'\n"
          "    'def warm_up(nbytes):\\n'\n"
          "    '    return features.load(nbytes)\\n')\n"
          "sys.path.insert(0, proj_root)\n"
          "importlib.invalidate_caches()",
          "import gm_proj.features as features\n"
          "from gm_proj import augment\n"
          "n_rows = features.load(frac(0.2))\n"
          "n_rows_augment = augment.warm_up(frac(0.2))\n"
          "features.TABLE = None\n"
          "torch.cuda.empty_cache()"),
         FAIL11,
         (Step("sys.modules['features']", "who:augment",
               "import sys\n"
               "_mod = None\n"
               "for _name in ('features', 'gm_proj.augment', 'gm_proj.features', 'gm_proj'):\n"
               "    _mod = sys.modules.pop(_name, None)\n"
               "    if _mod is not None and hasattr(_mod, 'TABLE'):\n"
               "        _mod.TABLE = None\n"
               "sys.path[:] = [p for p in sys.path if 'gm_twice_' not in p]\n"
               "for _name in ('features', 'augment'):\n"
               "    get_ipython().user_ns.pop(_name, None)\n"
               "_mod = _name = None\n"
               "del _mod, _name"),),
         written=WRITTEN11),
    # ---- outlive `%reset`: an attribute of torch.nn.functional -----------------------------------
    # A user wanted the attention maps of a model whose attention runs in
    # `F.scaled_dot_product_attention` ("defined in C and hard to modify its output"); vanilla
    # attention ran out of memory. Composite: here the notebook replaces the function in
    # `torch.nn.functional` by a wrapper that also computes and keeps every map.
    Kind("sdpa_wrapper_keeps_attention_maps",
         "https://github.com/zai-org/CogVideo/issues/109",
         "held by your session",
         # `F.scaled_dot_product_attention = keep_attention_maps(F.scaled_dot_product_attention)`;
         # four attention layers run. The wrapper's closure keeps the four softmax maps, and the
         # notebook names the same list (`attn_maps`): two references, so `del attn_maps` frees
         # nothing while torch's module keeps the wrapper (through `%reset` too). The maps'
         # temporaries and the inputs are released from the cache.
         ("import functools\n"
          "import torch.nn.functional as F\n"
          "def keep_attention_maps(sdpa):\n"
          "    maps = []\n"
          "    @functools.wraps(sdpa)\n"
          "    def sdpa_with_maps(query, key, value, *args, **kwargs):\n"
          "        scale = query.shape[-1] ** -0.5\n"
          "        maps.append(((query @ key.transpose(-2, -1)) * scale).softmax(dim=-1)"
          ".detach())\n"
          "        return sdpa(query, key, value, *args, **kwargs)\n"
          "    sdpa_with_maps.maps = maps\n"
          "    return sdpa_with_maps\n"
          "F.scaled_dot_product_attention = "
          "keep_attention_maps(F.scaled_dot_product_attention)\n"
          "attn_maps = F.scaled_dot_product_attention.maps\n"
          "heads, head_dim = 8, 64\n"
          "seq = int((frac(0.05) / (4 * heads)) ** 0.5)\n"
          "with torch.no_grad():\n"
          "    for layer in range(4):\n"
          "        q, k, v = (torch.randn(1, heads, seq, head_dim, device='cuda') "
          "for _ in range(3))\n"
          "        out = F.scaled_dot_product_attention(q, k, v)\n"
          "del q, k, v, out\n"
          "torch.cuda.empty_cache()",),
         FAIL11,
         (del_step("attn_maps"),
          Step("torch.nn.functional.scaled_dot_product_attention", "none",
               "import torch.nn.functional as _F\n"
               "_fn = _F.scaled_dot_product_attention\n"
               "while hasattr(_fn, '__wrapped__'):\n"
               "    _fn = _fn.__wrapped__\n"
               "_F.scaled_dot_product_attention = _fn\n"
               "_fn = None\n"
               "del _fn, _F")),
         written=WRITTEN11),
    # ---- outlive `%reset`: a live server thread --------------------------------------------------
    # A txt2img web app kept taking more GPU memory with every generation ("Gradio doesn't
    # release the gpu memory"). Composite: here the demo is the stdlib's ThreadingHTTPServer,
    # started from the notebook in a thread, its handler class made in a function that closes
    # over the model's tensors.
    Kind("demo_server_thread_handler_keeps_model",
         "https://github.com/gradio-app/gradio/issues/6971",
         "held by your session",
         # `server.serve_forever` runs in thread 'gm-demo-server'; the handler class closes over
         # `model_state` (weights and head). `del model_state` frees nothing: `server` keeps the
         # handler class, and the serving thread's frame and target keep `server`, so `del
         # server` alone frees nothing either (two references). One request is made to check
         # the demo. The thread never ends by itself; its first step shuts the server down,
         # its second deletes the names and collects (the handler class is a cycle).
         ("import http.client\n"
          "import http.server\n"
          "import threading\n"
          "def make_handler(model_state):\n"
          "    class PredictHandler(http.server.BaseHTTPRequestHandler):\n"
          "        def do_GET(self):\n"
          "            body = str(model_state['weights'].numel()).encode()\n"
          "            self.send_response(200)\n"
          "            self.send_header('Content-Length', str(len(body)))\n"
          "            self.end_headers()\n"
          "            self.wfile.write(body)\n"
          "        def log_message(self, *args):\n"
          "            pass\n"
          "    return PredictHandler\n"
          "model_state = {'weights': torch.empty(frac(0.2), dtype=torch.uint8, "
          "device='cuda'),\n"
          "               'head': torch.empty(frac(0.05), dtype=torch.uint8, device='cuda')}\n"
          "server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), "
          "make_handler(model_state))\n"
          "server_thread = threading.Thread(target=server.serve_forever, daemon=True,\n"
          "                                 name='gm-demo-server')\n"
          "server_thread.start()\n"
          "conn = http.client.HTTPConnection('127.0.0.1', server.server_address[1], "
          "timeout=10)\n"
          "conn.request('GET', '/')\n"
          "reply = conn.getresponse().read()\n"
          "conn.close()\n"
          "del model_state",),
         FAIL11,
         (Step("thread 'gm-demo-server'", "who:server_thread",
               "import threading\n"
               "def _stop_demo_server():\n"
               "    for th in threading.enumerate():\n"
               "        if th.name != 'gm-demo-server':\n"
               "            continue\n"
               "        srv = getattr(getattr(th, '_target', None), '__self__', None)\n"
               "        if srv is not None:\n"
               "            srv.shutdown()\n"
               "            srv.server_close()\n"
               "        srv = None\n"
               "        th.join(30)\n"
               "_stop_demo_server()\n"
               "del _stop_demo_server"),
          del_names_step("server", "who:server", "server", "server_thread", "conn",
                         collect=True)),
         written=WRITTEN11),
    # ---- last: torch's C++ function-mode stack and autocast's cast cache -------------------------
    # Dynamo left a TorchFunctionMode on "the C-level torch function mode stack", which
    # "silently poisons subsequent code". Composite: here the notebook enters its own mode by
    # hand (`__enter__` in a cell: a `with` cannot span cells) to tap the outputs of every
    # linear layer, and then deletes the tap, which leaves it on the stack.
    Kind("function_mode_left_entered_keeps_linear_outputs",
         "https://github.com/pytorch/pytorch/issues/182317",
         "held by your session",
         # `LinearActivationTap.__torch_function__` keeps the output of every
         # `F.linear`; four layers run on one batch. `del tap` frees nothing: torch's mode
         # stack (C++, thread-local) holds the mode and its list. The input is released from
         # the cache; the model (small) stays named. Its step pops the mode.
         ("from torch.overrides import TorchFunctionMode\n"
          "class LinearActivationTap(TorchFunctionMode):\n"
          "    def __init__(self):\n"
          "        super().__init__()\n"
          "        self.outputs = []\n"
          "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
          "        out = func(*args, **(kwargs or {}))\n"
          "        if func is torch.nn.functional.linear:\n"
          "            self.outputs.append(out.detach())\n"
          "        return out\n"
          "tap = LinearActivationTap()\n"
          "tap.__enter__()\n"
          "width = 4096\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device='cuda') "
          "for _ in range(4)])",
          "rows = frac(0.05) // (4 * width)\n"
          "with torch.no_grad():\n"
          "    x = torch.randn(rows, width, device='cuda')\n"
          "    y = model(x)\n"
          "del x, y, tap\n"
          "torch.cuda.empty_cache()"),
         FAIL11,
         (Step("torch function mode stack", "none",
               "import torch\n"
               "def _pop_linear_taps():\n"
               "    while torch._C._len_torch_function_stack() > 0:\n"
               "        top = torch._C._get_function_stack_at("
               "torch._C._len_torch_function_stack() - 1)\n"
               "        if type(top).__name__ != 'LinearActivationTap':\n"
               "            break\n"
               "        torch._C._pop_torch_function_stack()\n"
               "        top.outputs.clear()\n"
               "_pop_linear_taps()\n"
               "del _pop_linear_taps\n"
               "import gc\n"
               "gc.collect()"),
          del_step("model")),
         written=WRITTEN11),
    # Float16 casts of float32 weights built up inside `torch.no_grad()`: "caused by
    # amp.autocast caching lower_precision_fp (float16) casts of fp32 model weights".
    # Composite: here autocast is entered by hand in one cell (to keep mixed precision on for
    # the whole notebook) and never exited, so its cache is never cleared, and the model is
    # deleted after evaluation.
    Kind("autocast_left_entered_keeps_weight_casts",
         "https://github.com/ecmwf/anemoi-core/issues/134",
         "held by your session",
         # `amp = torch.autocast('cuda', dtype=torch.float16); amp.__enter__()`, then three
         # evaluation batches under `no_grad` through four float32 layers: each weight's
         # float16 copy goes into autocast's C++ cache, which only exiting the outermost
         # autocast (or `torch.clear_autocast_cache()`) empties. `del model` and
         # `empty_cache()` leave the copies (and, where the cached copy records its autograd
         # edge, the float32 weights too). Its step exits autocast and clears the cache.
         ("width = int((frac(0.07) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device='cuda') "
          "for _ in range(4)])\n"
          "amp = torch.autocast('cuda', dtype=torch.float16)\n"
          "amp.__enter__()\n"
          "scores = []\n"
          "with torch.no_grad():\n"
          "    for step in range(3):\n"
          "        x = torch.randn(8, width, device='cuda')\n"
          "        scores.append(float(model(x).float().mean()))\n"
          "del x, model\n"
          "torch.cuda.empty_cache()",),
         FAIL11,
         (Step("autocast cache", "none",
               "import gc\n"
               "import torch\n"
               "def _autocast_on():\n"
               "    try:\n"
               "        return torch.is_autocast_enabled('cuda')\n"
               "    except TypeError:\n"
               "        return torch.is_autocast_enabled()\n"
               "if _autocast_on():\n"
               "    try:\n"
               "        amp.__exit__(None, None, None)\n"
               "    except NameError:\n"
               "        try:\n"
               "            torch.set_autocast_enabled('cuda', False)\n"
               "        except TypeError:\n"
               "            torch.set_autocast_enabled(False)\n"
               "        torch.autocast_decrement_nesting()\n"
               "torch.clear_autocast_cache()\n"
               "del _autocast_on\n"
               "try:\n"
               "    del amp\n"
               "except NameError:\n"
               "    pass\n"
               "gc.collect()"),),
         written=WRITTEN11),
]
