"""The ninth batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new9``).

Written as KINDS4 to KINDS8 were: by a helper that had not read the explainer's code (nothing
under ``gpumem_nb/``, ``tests/`` or ``docs/``), each kind from the user report its ``source``
names (the comment above it says what the user hit; "composite" where the kind joins a report
to a pattern the report does not show itself), ``expected`` written by the mechanism before
any run. Every failing cell asks for more than CUDA has free (``FILL``) unless it is a
computation of its own, and no setup leaves a large freed block in the allocator's cache (a
setup that frees temporaries releases them with ``torch.cuda.empty_cache()``), so that ``FILL``
is all the memory the request can get. Sizes follow the card through ``frac()``.

Each mechanism differs from every kind of KINDS3 to KINDS8 and diagnosis2's KINDS: the holders
here are IPython's hidden namespace (names a startup hook pushed with ``interactive=False``,
which ``user_ns_hidden`` keeps after the notebook's ``del``), the ``source`` objects of
ResourceWarnings recorded by ``warnings.catch_warnings(record=True)`` (objects resurrected by
their own ``__del__``), the pools ``itertools.product`` makes of the generators it is given,
a tensor constant that ``torch.fx.symbolic_trace`` stores on its GraphModule,
``contextvars.copy_context()`` snapshots kept for replay, ``torch.nn.utils.parametrize``'s
module-level cache left enabled by a generator suspended inside ``parametrize.cached()``,
objects that keep an unstarted ``threading.Thread`` whose target is their own bound method (a
cycle, left to the collector), a ``post_run_cell`` callback in IPython's event manager, a
callable in ``gc.callbacks`` that snapshots the live tensors after each full collection, a
``unittest.mock`` patch started and never stopped (its mock in a helper module, the patcher in
``mock``'s list of active patches), the ``__context__`` of an exception raised ``from None``
and kept in a helper module's global, a ``sched.scheduler`` whose pending events a runner
thread keeps, and the ``initargs`` of a ``ThreadPoolExecutor`` kept by its idle workers'
frames; the control is ``torch.func.jacrev`` of an elementwise function (its dense standard
basis and dense result).

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` or live in other threads (IPython's event manager, ``gc.callbacks``, ``mock``'s
active patches and a helper module, a helper module's global, a scheduler's runner thread, a
thread pool's workers) come after the others, and each one's step undoes it completely; the
runner thread ends by itself after 90 s. The very last kind is
``executor_initargs_in_idle_workers``: idle workers never end by themselves (they end when
their executor is shut down or collected), so if its step never runs, nothing comes after it.
"""

from __future__ import annotations

from benchmarks.diagnosis3_kinds6 import FAIL6 as FAIL9
from benchmarks.diagnosis3_kinds6 import GC6 as GC9
from benchmarks.diagnosis3_kinds6 import TB6 as TB9
from benchmarks.diagnosis3_kinds6 import del_step
from benchmarks.gpu_diagnosis2 import Kind, Step

WRITTEN9 = "2026-12-07, by a helper blind to gpumem_nb's code; measured once"


def del_names_step(label: str, estimate: str, *names: str) -> Step:
    """One step that deletes several names bound to the same objects (deleting one of them
    alone frees nothing), each unless the advice already did."""
    code = "\n".join(f"try:\n    del {n}\nexcept NameError:\n    pass" for n in names)
    return Step(label, estimate, code)


KINDS9: list[Kind] = [
    # ---- objects of library classes in the namespace ----------------------------------------
    # Names loaded by startup files are hidden from %who by design, which surprised users.
    # Composite: here a startup hook pushes CUDA tables with `push(..., interactive=False)`,
    # and IPython's `user_ns_hidden` keeps its own reference to each value pushed.
    Kind("startup_push_hidden_names",
         "https://github.com/ipython/ipython/pull/4543",
         "held by your session",
         # A startup hook (as an extension's load function or a startup file would) pushes the
         # tokenizer's tables into the notebook with `interactive=False`: `%who` lists neither.
         # The notebook uses `vocab_table` once and deletes it; `user_ns_hidden` still holds
         # it, and `merge_table` is both in the namespace and in `user_ns_hidden`.
         ("def load_startup_tables(shell, nbytes):\n"
          "    shell.push({'vocab_table': torch.empty(nbytes, dtype=torch.uint8, "
          "device='cuda'),\n"
          "                'merge_table': torch.empty(nbytes // 2, dtype=torch.uint8, "
          "device='cuda')},\n"
          "               interactive=False)\n"
          "load_startup_tables(get_ipython(), frac(0.3))",
          "n_vocab = vocab_table.numel()\n"
          "del vocab_table"),
         FAIL9,
         (Step("merge_table", "who:merge_table",
               "_ip = get_ipython()\n"
               "_ip.user_ns.pop('merge_table', None)\n"
               "_ip.user_ns_hidden.pop('merge_table', None)\n"
               "del _ip"),
          Step("user_ns_hidden", "none",
               "_ip = get_ipython()\n"
               "_ip.user_ns_hidden.pop('vocab_table', None)\n"
               "del _ip")),
         written=WRITTEN9),
    # Objects that must be released get a `__del__` that only issues a ResourceWarning, as
    # asyncio and subprocess do (`source=self`). Composite: here the warnings are recorded by
    # `catch_warnings(record=True)`, whose WarningMessage keeps the source alive: the object
    # is resurrected by its own finalizer, its CUDA buffer with it.
    Kind("resource_warning_sources_in_record_list",
         "https://github.com/moderngl/moderngl/issues/431",
         "held by your session",
         # Staging buffers that should be `release()`d warn when dropped without it, naming
         # themselves as the warning's source. The loop records the warnings to print a summary
         # later: each buffer dropped (rebinding `buf`, then `del buf`) ends in `caught`, data
         # and all. Nothing is freed, so nothing is left in the cache.
         ("import warnings\n"
          "class StagingBuffer:\n"
          "    def __init__(self, nbytes):\n"
          "        self.data = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    def release(self):\n"
          "        self.data = None\n"
          "    def __del__(self, _warn=warnings.warn):\n"
          "        if self.data is not None:\n"
          "            _warn('StagingBuffer dropped without release()', ResourceWarning,\n"
          "                  source=self)\n"
          "with warnings.catch_warnings(record=True) as caught:\n"
          "    warnings.simplefilter('always')\n"
          "    for step in range(5):\n"
          "        buf = StagingBuffer(frac(0.09))\n"
          "        n_staged = buf.data.numel()\n"
          "    del buf",),
         FAIL9,
         (del_step("caught"),),
         written=WRITTEN9),
    # itertools.product consumes its inputs whole and keeps them as pools ("Out of Memory
    # Errors" on a product of large iterables). Composite: here the inputs are a generator of
    # CUDA shard embeddings, and the loop over the pairs stops at the first.
    Kind("itertools_product_pools_shard_pairs",
         "https://github.com/python/cpython/issues/84411",
         "held by your session",
         # All pairs of shard embeddings, from a generator "so that only two are on the GPU at
         # a time": `product(..., repeat=2)` has already drawn the five shards into its pool.
         # The loop checked the first pair and stopped; `left` and `right` are both the first
         # shard.
         ("import itertools\n"
          "def shard_embeddings(n_shards, nbytes):\n"
          "    for shard in range(n_shards):\n"
          "        yield torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "shard_pairs = itertools.product(shard_embeddings(5, frac(0.09)), repeat=2)\n"
          "for left, right in shard_pairs:\n"
          "    n_compared = left.numel() + right.numel()\n"
          "    break",),
         FAIL9,
         (del_step("shard_pairs"),
          del_names_step("left, right", "who:left", "left", "right")),
         written=WRITTEN9),
    # FX stores every tensor constant a traced function uses as an attribute of the
    # GraphModule (one per use, before the fix). Composite: here the constant is a large CUDA
    # projection the notebook deletes once the function is traced.
    Kind("fx_graph_module_tensor_constant",
         "https://github.com/pytorch/pytorch/pull/66211",
         "held by your session",
         # A projection traced with `torch.fx.symbolic_trace` to inspect its graph: the matrix
         # is a global of the function, so the trace stores it as `_tensor_constant0` on the
         # GraphModule. `del projection` frees nothing while `fast_project` lives.
         ("import torch.fx\n"
          "width = 1024\n"
          "out_rows = frac(0.3) // (4 * width)\n"
          "projection = torch.empty(width, out_rows, device='cuda')\n"
          "def project(x):\n"
          "    return x @ projection\n"
          "fast_project = torch.fx.symbolic_trace(project)\n"
          "del projection",),
         FAIL9,
         (del_step("fast_project"),),
         written=WRITTEN9),
    # A per-call ContextVar storage chain was never released and kept frames alive on a
    # long-lived thread. Composite: here the notebook keeps `copy_context()` snapshots to
    # replay each step's logging later, and each snapshot keeps that step's batch.
    Kind("context_snapshots_kept_for_replay",
         "https://github.com/DataDog/dd-trace-py/pull/20016",
         "held by your session",
         # Each step sets `current_batch` and saves `contextvars.copy_context()` so that its
         # logging can be re-run with `ctx.run(...)`. The variable is reset to None at the end
         # (the live context holds nothing); every snapshot still maps it to its own batch.
         ("import contextvars\n"
          "current_batch = contextvars.ContextVar('gm_replay_batch', default=None)\n"
          "replay = []\n"
          "for step in range(5):\n"
          "    current_batch.set(torch.empty(frac(0.09), dtype=torch.uint8, device='cuda'))\n"
          "    replay.append(contextvars.copy_context())\n"
          "current_batch.set(None)\n"
          "n_snapshots = len(replay)",),
         FAIL9,
         (del_step("replay"),),
         written=WRITTEN9),
    # parametrize's cache is opt-in through the `cached()` context manager (a user asked
    # whether repeated `module.weight` reads recompute). Composite: here an evaluation
    # generator enters `cached()` and is left suspended after its first result, so the
    # module-level cache stays on and keeps every parametrized weight it computed.
    Kind("parametrize_cache_held_by_suspended_generator",
         "https://github.com/lezcano/geotorch/issues/34",
         "held by your session",
         # Three symmetric (parametrized) layers, frozen, evaluated by a generator inside
         # `parametrize.cached()`; the notebook took the first score and stopped. Until the
         # generator ends, `torch.nn.utils.parametrize._cache` keeps each computed weight, as
         # large as the layer's own; the layers are `layers`. The parametrization's
         # temporaries are released from the cache.
         ("from torch.nn.utils import parametrize\n"
          "class Symmetric(torch.nn.Module):\n"
          "    def forward(self, w):\n"
          "        return w.triu() + w.triu(1).transpose(0, 1)\n"
          "width = int((frac(0.08) / 4) ** 0.5)\n"
          "layers = torch.nn.ModuleList([torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(3)])\n"
          "for layer in layers:\n"
          "    parametrize.register_parametrization(layer, 'weight', Symmetric())\n"
          "layers.requires_grad_(False)\n"
          "def evaluate(batches):\n"
          "    with parametrize.cached():\n"
          "        for x in batches:\n"
          "            for layer in layers:\n"
          "                x = layer(x)\n"
          "            yield float(x.sum())\n"
          "scores = evaluate([torch.randn(4, width, device='cuda') for _ in range(8)])\n"
          "first_score = next(scores)\n"
          "del layer\n"
          "torch.cuda.empty_cache()",),
         FAIL9,
         (del_step("scores"),
          del_step("layers")),
         written=WRITTEN9),
    # ---- reference cycles left to the collector ----------------------------------------------
    # multiprocessing clears a Process's target on start "to avoid a refcycle if the target
    # holds an indirect reference to the process object", as threading does once a thread
    # has run. Composite: here the threads are never started, so the cycle stays.
    Kind("unstarted_thread_target_cycle_in_loop",
         "https://github.com/python/cpython/pull/2470",
         "garbage in reference cycles",
         # A prefetcher makes its worker thread in `__init__` with its own bound method as the
         # target and starts it only in `start()`, which this loop never calls: each dropped
         # prefetcher is a cycle (prefetcher -> thread -> bound method -> prefetcher) with its
         # buffer. The card fills before the collector runs; only the last one is named.
         ("import threading\n"
          "class Prefetcher:\n"
          "    def __init__(self, nbytes):\n"
          "        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        self.worker = threading.Thread(target=self.fill, daemon=True)\n"
          "    def fill(self):\n"
          "        self.buffer.zero_()\n"
          "    def start(self):\n"
          "        self.worker.start()\n"
          "        return self",),
         "for epoch in range(1000):\n"
         "    prefetcher = Prefetcher(frac(0.08))\n"
         "    n_bytes = prefetcher.buffer.numel()",
         (GC9, del_step("prefetcher", collect=True)),
         written=WRITTEN9),
    # ---- control: jacrev's dense basis ---------------------------------------------------------
    # functorch's jacrev ran a 24 GB GPU out of memory ("Tried to allocate 38.00 GiB") for a
    # Jacobian of 74 MB: it vmaps the vjp over a dense standard basis.
    Kind("jacrev_standard_basis_working_set",
         "https://github.com/pytorch/functorch/issues/1058",
         "working set",
         # The Jacobian of an elementwise function of n inputs (n^2 floats = 60% of the card):
         # jacrev builds the n-by-n identity as its basis, then the n-by-n result, where the
         # diagonal would do. The inputs are a few hundred KiB; nothing stale is held.
         ("n_inputs = int((frac(0.6) / 4) ** 0.5)\n"
          "x = torch.randn(n_inputs, device='cuda')\n"
          "def activation(v):\n"
          "    return torch.sin(v)",),
         "jac = torch.func.jacrev(activation)(x)",
         (TB9,),
         written=WRITTEN9),
    # ---- outlive `%reset`: IPython's event manager, the gc module's callbacks ------------------
    # IPython's post_run_cell callbacks are plain functions in the shell's event manager,
    # which a user registered (and could not unregister) from a notebook. Composite: here the
    # callback keeps a history of the `batch` each cell leaves behind.
    Kind("post_run_cell_callback_batch_history",
         "https://github.com/ipython/ipython/issues/12214",
         "held by your session",
         # A helper registered after every cell keeps the last eight distinct objects named
         # `batch` (to compare batches across cells). Four cells each make a new batch; `del
         # batch` frees nothing: the callback's closure (`track_batch.history`) keeps all four,
         # and IPython's event manager keeps the callback through `%reset`. Its step
         # unregisters it.
         ("def make_batch_history(shell, name, keep=8):\n"
          "    history = []\n"
          "    def after_cell(result):\n"
          "        obj = shell.user_ns.get(name)\n"
          "        if obj is not None and not any(obj is seen for seen in history):\n"
          "            history.append(obj)\n"
          "            del history[:-keep]\n"
          "    after_cell.history = history\n"
          "    return after_cell\n"
          "track_batch = make_batch_history(get_ipython(), 'batch')\n"
          "get_ipython().events.register('post_run_cell', track_batch)",
          *(("batch = torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')",) * 4),
          "del batch"),
         FAIL9,
         (Step("post_run_cell callback", "who:track_batch",
               "def _drop_batch_history():\n"
               "    ip = get_ipython()\n"
               "    for cb in list(ip.events.callbacks['post_run_cell']):\n"
               "        if getattr(cb, '__qualname__', '') == "
               "'make_batch_history.<locals>.after_cell':\n"
               "            ip.events.unregister('post_run_cell', cb)\n"
               "_drop_batch_history()\n"
               "del _drop_batch_history\n"
               "try:\n"
               "    del track_batch\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN9),
    # The forum's recipe for hunting GPU leaks walks gc.get_objects() for tensors. Composite:
    # here the hunt runs from a gc callback after every full collection and keeps what it
    # found, so the tensors alive at one collection are alive at the next: the hunter is the
    # leak.
    Kind("gc_callback_tensor_census",
         "https://discuss.pytorch.org/t/how-to-debug-causes-of-gpu-memory-leaks/6741",
         "held by your session",
         # A census in `gc.callbacks` that, after each full collection, lists the CUDA tensors
         # still alive (to see which survive). Its list keeps them: the activations deleted
         # after the first census are in every later one. `del census` leaves it in
         # `gc.callbacks`; its step removes it and clears its list.
         ("import gc\n"
          "class TensorCensus:\n"
          "    def __init__(self):\n"
          "        self.get_objects = gc.get_objects\n"
          "        self.tensor_type = torch.Tensor\n"
          "        self.live = []\n"
          "    def __call__(self, phase, info):\n"
          "        if phase == 'stop' and info['generation'] == 2:\n"
          "            self.live = [o for o in self.get_objects()\n"
          "                         if isinstance(o, self.tensor_type) and o.is_cuda]\n"
          "census = TensorCensus()\n"
          "gc.callbacks.append(census)",
          "activations = [torch.empty(frac(0.1), dtype=torch.uint8, device='cuda') "
          "for _ in range(4)]\n"
          "gc.collect()\n"
          "n_live = len(census.live)\n"
          "del activations"),
         FAIL9,
         (Step("gc.callbacks", "who:census",
               "import gc\n"
               "for _cb in [cb for cb in gc.callbacks if type(cb).__name__ == "
               "'TensorCensus']:\n"
               "    gc.callbacks.remove(_cb)\n"
               "    _cb.live = []\n"
               "_cb = None\n"
               "del _cb\n"
               "try:\n"
               "    del census\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN9),
    # ---- outlive `%reset`: unittest.mock's active patches, helper modules' globals -------------
    # Every started patch lives in one `_active_patches` list shared by all patches, with its
    # mock, until it is stopped. Composite: here a notebook stubs a feature store with a
    # mock whose return value is a CUDA tensor and never stops the patch.
    Kind("mock_patch_started_never_stopped",
         "https://github.com/testing-cabal/mock/issues/422",
         "held by your session",
         # The feature store is unreachable from the notebook, so `load_embeddings` is patched
         # with `mock.patch(..., return_value=cached).start()`. `del cached, emb` frees
         # nothing: the helper module's attribute is the MagicMock (its return value is the
         # tensor) and `mock`'s list of active patches keeps the patcher (its kwargs name the
         # tensor too). Both outlive `%reset`; its step stops the patch, removes the module and
         # collects (a MagicMock and its class are a reference cycle).
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "features_dir = tempfile.mkdtemp(prefix='gm_features_')\n"
          "pathlib.Path(features_dir, 'gm_features.py').write_text(\n"
          "    'def load_embeddings(name):\\n'\n"
          "    '    raise RuntimeError(\"the feature store is not reachable\")\\n')\n"
          "sys.path.insert(0, features_dir)\n"
          "importlib.invalidate_caches()",
          "from unittest import mock\n"
          "import gm_features\n"
          "cached = torch.empty(frac(0.3), dtype=torch.uint8, device='cuda')\n"
          "mock.patch('gm_features.load_embeddings', return_value=cached).start()\n"
          "emb = gm_features.load_embeddings('wiki')\n"
          "del cached, emb"),
         FAIL9,
         (Step("mock patch", "none",
               "import sys\n"
               "from unittest import mock\n"
               "_active = getattr(mock._patch, '_active_patches', None)\n"
               "if _active is None:\n"
               "    mock.patch.stopall()\n"
               "else:\n"
               "    for _p in [p for p in _active if getattr(p, 'attribute', None) == "
               "'load_embeddings']:\n"
               "        _p.stop()\n"
               "_active = _p = None\n"
               "del _active, _p\n"
               "sys.modules.pop('gm_features', None)\n"
               "try:\n"
               "    del gm_features\n"
               "except NameError:\n"
               "    pass\n"
               "import gc\n"
               "gc.collect()"),),
         written=WRITTEN9),
    # A module-level error object kept its traceback, "thus the locals of each frame, in
    # memory forever" (GBs). Composite: here the kept error was raised `from None`, which
    # hides its context from the printed traceback but not from memory: `__context__` keeps
    # the probe's frame and its CUDA workspace.
    Kind("backend_error_context_in_module_global",
         "https://github.com/cpburnz/python-pathspec/pull/112",
         "held by your session",
         # A fast-attention helper probes its kernel with a workspace; the probe fails and
         # `init` raises `BackendUnavailable(...) from None`, kept in the module's
         # `LOAD_ERROR` to explain the fallback later. The error's own frames hold nothing;
         # its `__context__` (the probe's RuntimeError) keeps `_probe`'s frame, workspace and
         # all. The module stays in sys.modules through `%reset`; its step clears the error
         # and removes it.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "attn_dir = tempfile.mkdtemp(prefix='gm_fastattn_')\n"
          "pathlib.Path(attn_dir, 'gm_fastattn.py').write_text(\n"
          "    'import torch\\n'\n"
          "    'LOAD_ERROR = None\\n'\n"
          "    'class BackendUnavailable(RuntimeError):\\n'\n"
          "    '    pass\\n'\n"
          "    'def _probe(nbytes):\\n'\n"
          "    '    workspace = torch.empty(nbytes, dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    '    raise RuntimeError(\"no kernel image is available for this GPU\")\\n'\n"
          "    'def init(nbytes):\\n'\n"
          "    '    global LOAD_ERROR\\n'\n"
          "    '    try:\\n'\n"
          "    '        try:\\n'\n"
          "    '            _probe(nbytes)\\n'\n"
          "    '        except RuntimeError:\\n'\n"
          "    '            raise BackendUnavailable(\"fast attention is off\") from None\\n'\n"
          "    '    except BackendUnavailable as err:\\n'\n"
          "    '        LOAD_ERROR = err\\n'\n"
          "    '    return LOAD_ERROR is None\\n')\n"
          "sys.path.insert(0, attn_dir)\n"
          "importlib.invalidate_caches()",
          "import gm_fastattn as fastattn\n"
          "use_fast_attention = fastattn.init(frac(0.35))"),
         FAIL9,
         (Step("gm_fastattn.LOAD_ERROR", "who:fastattn",
               "import sys\n"
               "_mod = sys.modules.pop('gm_fastattn', None)\n"
               "if _mod is not None:\n"
               "    _mod.LOAD_ERROR = None\n"
               "del _mod\n"
               "try:\n"
               "    del fastattn\n"
               "except NameError:\n"
               "    pass\n"
               "import gc\n"
               "gc.collect()"),),
         written=WRITTEN9),
    # ---- live threads --------------------------------------------------------------------------
    # A `schedule` user passed references to a large dataset as job parameters and saw memory
    # grow. Composite: here the stdlib's sched.scheduler, polled by a runner thread, holds
    # each epoch's snapshot until its save is due, ten minutes later.
    Kind("sched_runner_thread_pending_snapshots",
         "https://github.com/dbader/schedule/issues/206",
         "held by your session",
         # Each epoch schedules `save_snapshot(tag, state)` 600 s ahead on a
         # `sched.scheduler` that a thread polls (`run(blocking=False)` every 0.5 s); the
         # notebook keeps the returned events in `pending` to cancel them. Three holders: the
         # scheduler's queue (`snapshots`), the events in `pending` (each names its
         # arguments), and the runner thread, whose frame keeps the scheduler. The thread
         # stops by itself after 90 s.
         ("import sched\n"
          "import threading\n"
          "import time\n"
          "stop_runner = threading.Event()\n"
          "snapshots = sched.scheduler(time.monotonic, time.sleep)\n"
          "def save_snapshot(tag, state):\n"
          "    torch.save(state.cpu(), f'/tmp/gm_{tag}.pt')\n"
          "def run_pending(s, stop, deadline):\n"
          "    while not stop.is_set() and time.monotonic() < deadline:\n"
          "        s.run(blocking=False)\n"
          "        stop.wait(0.5)\n"
          "runner = threading.Thread(target=run_pending,\n"
          "                          args=(snapshots, stop_runner, time.monotonic() + 90),\n"
          "                          daemon=True, name='gm-snapshots')\n"
          "runner.start()\n"
          "pending = []\n"
          "for epoch in range(4):\n"
          "    state = torch.empty(frac(0.1), dtype=torch.uint8, device='cuda')\n"
          "    pending.append(snapshots.enter(600, 1, save_snapshot,\n"
          "                                   argument=(f'epoch{epoch}', state)))\n"
          "del state",),
         FAIL9,
         (Step("snapshots", "who:snapshots",
               "def _stop_snapshot_runner():\n"
               "    import sys\n"
               "    import threading\n"
               "    for th in threading.enumerate():\n"
               "        if th.name != 'gm-snapshots':\n"
               "            continue\n"
               "        f = sys._current_frames().get(th.ident)\n"
               "        while f is not None:\n"
               "            for value in list(f.f_locals.values()):\n"
               "                if isinstance(value, threading.Event):\n"
               "                    value.set()\n"
               "            f = f.f_back\n"
               "        f = None\n"
               "        th.join(30)\n"
               "_stop_snapshot_runner()\n"
               "del _stop_snapshot_runner\n"
               "try:\n"
               "    for _ev in list(snapshots.queue):\n"
               "        snapshots.cancel(_ev)\n"
               "    _ev = None\n"
               "    del _ev, snapshots\n"
               "except NameError:\n"
               "    pass\n"
               "for _name in ('pending', 'runner'):\n"
               "    get_ipython().user_ns.pop(_name, None)\n"
               "del _name"),),
         written=WRITTEN9),
    # ---- last: a thread pool's idle workers --------------------------------------------------
    # "ThreadPoolExecutor does not free memory when shutdown" (a long thread of users
    # measuring what executors keep). Composite: here the executor's initializer takes a CUDA
    # vocabulary, and each idle worker keeps its `initargs` in its frame for as long as it
    # lives, as the executor keeps them for workers it may start later.
    Kind("executor_initargs_in_idle_workers",
         "https://github.com/python/cpython/issues/98467",
         "held by your session",
         # A tokenizer pool whose initializer checks the shared vocabulary
         # (`initializer=check_vocab, initargs=(vocab,)`); the jobs ran, and `del vocab` frees
         # nothing: the executor keeps `initargs` and each of its idle workers (up to three)
         # keeps them in its `_worker` frame. Idle workers never end by themselves; its step
         # shuts the pool down and joins them.
         ("from concurrent.futures import ThreadPoolExecutor\n"
          "def check_vocab(vocab):\n"
          "    assert vocab.is_cuda\n"
          "def count_tokens(text):\n"
          "    return len(text.split())\n"
          "vocab = torch.empty(frac(0.3), dtype=torch.uint8, device='cuda')\n"
          "pool = ThreadPoolExecutor(max_workers=3, initializer=check_vocab, "
          "initargs=(vocab,),\n"
          "                          thread_name_prefix='gm-tokenize')\n"
          "token_counts = list(pool.map(count_tokens, ['a b c', 'd e'] * 12))\n"
          "del vocab",),
         FAIL9,
         (Step("pool", "who:pool",
               "import threading\n"
               "try:\n"
               "    pool.shutdown(wait=True)\n"
               "    del pool\n"
               "except NameError:\n"
               "    pass\n"
               "for _th in threading.enumerate():\n"
               "    if _th.name.startswith('gm-tokenize'):\n"
               "        _th.join(30)\n"
               "_th = None\n"
               "del _th"),),
         written=WRITTEN9),
]
