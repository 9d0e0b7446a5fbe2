"""The eighth batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new8``).

Written as KINDS4 to KINDS7 were: by a helper that had not read the explainer's code (nothing
under ``gpumem_nb/``, ``tests/`` or ``docs/``), each kind from the user report its ``source``
names (the comment above it says what the user hit; "composite" where the kind joins a report
to a pattern the report does not show itself), ``expected`` written by the mechanism before
any run. Every failing cell asks for more than CUDA has free (``FILL``) unless it is a
computation of its own, and no setup leaves a large freed block in the allocator's cache (a
setup that frees temporaries releases them with ``torch.cuda.empty_cache()``), so that ``FILL``
is all the memory the request can get. Sizes follow the card through ``frac()``.

Each mechanism differs from every kind of KINDS3 to KINDS7 and diagnosis2's KINDS: the holders
here are unconsumed DLPack capsules (no tensor object at all), a ``shelve`` shelf's writeback
cache, the namespace IPython keeps of a script run with ``%run`` (``del`` of the copied name
frees nothing), a ``ThreadPool.imap`` iterator's results that the loop never read, the locals
of a function's last call captured by a ``sys.setprofile`` hook, the deep copies
``dataclasses.asdict`` makes of tensor fields, pure-Python LRU caches whose circular linked
lists are left to the collector, raw pointers from ``torch.cuda.caching_allocator_alloc`` kept
as ints in a helper module, classes kept by an ``__init_subclass__`` registry across re-runs of
the cell that defines them, a loader thread blocked in ``Queue.put`` on a full queue, coroutines
pending on an event loop that runs in a thread of its own, garbage cycles moved into the
collector's permanent generation by ``gc.freeze()``, and a tensor constant of a traced
function, held by TorchScript's process-wide compilation unit; the control is a loss whose
``(N, 1)`` prediction and ``(N,)`` target broadcast to ``(N, N)``.

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` or live in other threads (a helper module's pointers, a helper module's class
registry, a blocked loader thread, an event loop thread, the collector's permanent generation,
TorchScript's compilation unit) come after the others, and each one's step undoes it
completely; the two threads end by themselves after 90 s. The very last kind is
``jit_trace_constant_in_global_unit``: its step drops every function of TorchScript's
process-wide compilation unit, which holds only what this kind traced.
"""

from __future__ import annotations

from benchmarks.diagnosis3_kinds6 import FAIL6 as FAIL8
from benchmarks.diagnosis3_kinds6 import GC6 as GC8
from benchmarks.diagnosis3_kinds6 import TB6 as TB8
from benchmarks.diagnosis3_kinds6 import del_step
from benchmarks.gpu_diagnosis2 import Kind, Step

WRITTEN8 = "2026-12-06, by a helper blind to gpumem_nb's code; measured once"

KINDS8: list[Kind] = [
    # ---- objects of library classes in the namespace ----------------------------------------
    # A DLPack capsule made by to_dlpack keeps the tensor's memory until a consumer takes it or
    # the capsule is freed (before the fix, an unconsumed capsule leaked it for good).
    # Composite: here the capsules are kept, queued for an export that never ran.
    Kind("dlpack_capsules_queued_for_export",
         "https://github.com/pytorch/pytorch/pull/9297",
         "held by your session",
         # Each layer's activations handed over as DLPack capsules, queued for another
         # framework to consume later; the tensors are gone. A capsule is no tensor: no Python
         # object but the capsule points at the memory. The last capsule is also named
         # `last_capsule`.
         ("from torch.utils.dlpack import to_dlpack\n"
          "export_queue = []\n"
          "for layer in range(5):\n"
          "    act = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    export_queue.append((f'layer{layer}', to_dlpack(act)))\n"
          "last_capsule = export_queue[-1][1]\n"
          "del act",),
         FAIL8,
         (del_step("export_queue"),
          del_step("last_capsule")),
         written=WRITTEN8),
    # A shelf opened with writeback=True keeps every entry it was given or read in its cache
    # until sync() or close(), and the cache grew until it consumed the process's memory.
    # Composite: here the entries carry CUDA features that their pickled state leaves out.
    Kind("shelve_writeback_cache_keeps_samples",
         "https://github.com/IdentityPython/pysaml2/issues/741",
         "held by your session",
         # Samples stored in a shelf opened with `writeback=True`: each is pickled at once
         # (without its features, which `__getstate__` leaves out), and the live object with
         # its CUDA features stays in the shelf's cache until `samples.sync()` or
         # `samples.close()`.
         ("import os\n"
          "import shelve\n"
          "import tempfile\n"
          "class Sample:\n"
          "    def __init__(self, key, features):\n"
          "        self.key, self.features = key, features\n"
          "    def __getstate__(self):\n"
          "        return {'key': self.key}\n"
          "    def __setstate__(self, state):\n"
          "        self.key, self.features = state['key'], None\n"
          "shelf_dir = tempfile.mkdtemp(prefix='gm_shelf_')\n"
          "samples = shelve.open(os.path.join(shelf_dir, 'samples'), writeback=True)\n"
          "for i in range(5):\n"
          "    s = Sample(f'img{i}', torch.empty(frac(0.09), dtype=torch.uint8, "
          "device='cuda'))\n"
          "    samples[s.key] = s\n"
          "del s",),
         FAIL8,
         (Step("samples", "who:samples",
               "try:\n"
               "    samples.close()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN8),
    # %xdel exists because IPython keeps references the user cannot see: among them the
    # namespace of every script run with %run, cached by its file name. Composite: here the
    # script puts tensors on the GPU and the notebook deletes one of its names.
    Kind("run_magic_script_namespace_cache",
         "https://github.com/ipython/ipython/pull/419",
         "held by your session",
         # A data-preparation script run with `%run`: its globals are copied into the
         # notebook, and IPython keeps the script's own namespace (a module of its cache, by
         # file name). `del vocab_vectors` frees nothing; `position_table` is named twice.
         ("import pathlib\n"
          "import tempfile\n"
          "prep_dir = tempfile.mkdtemp(prefix='gm_run_')\n"
          "prep_script = str(pathlib.Path(prep_dir, 'prepare_features.py'))\n"
          "pathlib.Path(prep_script).write_text(\n"
          "    'import torch\\n'\n"
          "    f'vocab_vectors = torch.empty({frac(0.25)}, dtype=torch.uint8, "
          "device=\"cuda\")\\n'\n"
          "    f'position_table = torch.empty({frac(0.15)}, dtype=torch.uint8, "
          "device=\"cuda\")\\n'\n"
          "    'n_vectors = vocab_vectors.numel()\\n')",
          "%run $prep_script",
          "del vocab_vectors"),
         FAIL8,
         (del_step("position_table"),
          Step("%run namespace", "none", "get_ipython().clear_main_mod_cache()")),
         written=WRITTEN8),
    # Results of a pool's imap that were consumed too slowly backed up in memory. Composite:
    # here a ThreadPool's results are CUDA tensors and the loop stopped after the first.
    Kind("threadpool_imap_unread_results",
         "https://github.com/cfe-lab/MiCall/issues/376",
         "held by your session",
         # Shard embeddings computed by a 4-thread pool through `pool.imap`: the workers run
         # ahead of the reader, and the loop read one result and stopped. The pool is closed
         # and joined (its threads are gone); the iterator keeps the five results nobody read,
         # the first is `first`.
         ("from multiprocessing.pool import ThreadPool\n"
          "def embed_shard(i, nbytes=frac(0.09)):\n"
          "    return torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "pool = ThreadPool(4)\n"
          "shard_embeddings = pool.imap(embed_shard, range(6))\n"
          "first = next(shard_embeddings)\n"
          "pool.close()\n"
          "pool.join()",),
         FAIL8,
         (del_step("shard_embeddings"),
          del_step("first")),
         written=WRITTEN8),
    # ---- functions and copies ----------------------------------------------------------------
    # The Stack Overflow recipe that keeps a function's locals after it returns: a profile
    # hook (sys.setprofile) copies the frame's locals on the 'return' event. Composite: the
    # answer shows the recipe; here the locals it keeps are an encoder's CUDA activations.
    Kind("setprofile_kept_locals_of_last_call",
         "https://coderapp.vercel.app/answer/14124861",
         "held by your session",
         # An encoder decorated to expose its intermediate results for debugging: the profile
         # hook copies the frame's locals as it returns, so `encode.locals` keeps `tokens`,
         # `hidden` and `pooled` of the last call. The notebook names only the function.
         ("import functools\n"
          "import sys\n"
          "def keep_locals(func):\n"
          "    captured = {}\n"
          "    def profile(frame, event, arg):\n"
          "        if event == 'return' and frame.f_code is func.__code__:\n"
          "            captured.clear()\n"
          "            captured.update(frame.f_locals)\n"
          "    @functools.wraps(func)\n"
          "    def wrapper(*args, **kwargs):\n"
          "        previous = sys.getprofile()\n"
          "        sys.setprofile(profile)\n"
          "        try:\n"
          "            return func(*args, **kwargs)\n"
          "        finally:\n"
          "            sys.setprofile(previous)\n"
          "    wrapper.locals = captured\n"
          "    return wrapper\n"
          "@keep_locals\n"
          "def encode(nbytes):\n"
          "    tokens = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    hidden = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    pooled = torch.empty(nbytes // 8, dtype=torch.uint8, device='cuda')\n"
          "    return int(pooled.numel())\n"
          "n_pooled = encode(frac(0.15))",),
         FAIL8,
         (del_step("encode"),),
         written=WRITTEN8),
    # dataclasses.asdict deep-copies every field that is not a dataclass, list, tuple or dict:
    # CUDA tensors are cloned, a transient doubling that "can OOM on large checkpoints".
    # Composite: here the copies are kept in a history.
    Kind("asdict_deep_copies_in_history",
         "https://github.com/python/cpython/issues/88071",
         "held by your session",
         # A per-step log of `dataclasses.asdict(out)`: the originals go with `out` each step,
         # but every dict in the history holds a clone of that step's attention maps. The
         # freed originals are released from the cache.
         ("import dataclasses\n"
          "@dataclasses.dataclass\n"
          "class StepOutput:\n"
          "    step: int\n"
          "    loss: float\n"
          "    attention: torch.Tensor\n"
          "history = []\n"
          "for step in range(4):\n"
          "    out = StepOutput(step, 0.0, torch.empty(frac(0.1), dtype=torch.uint8, "
          "device='cuda'))\n"
          "    history.append(dataclasses.asdict(out))\n"
          "del out\n"
          "torch.cuda.empty_cache()",),
         FAIL8,
         (del_step("history"),),
         written=WRITTEN8),
    # ---- reference cycles left to the collector ----------------------------------------------
    # An expiring cache of LRU caches left orphaned linked-list nodes: a doubly linked list is
    # a cycle, freed only by the collector. Composite: here the cached values are CUDA tables
    # and a new cache is made each epoch.
    Kind("linked_lru_rings_in_loop",
         "https://github.com/matrix-org/synapse/pull/10205",
         "garbage in reference cycles",
         # A hand-written LRU on the pure-Python functools recipe: a circular doubly linked
         # list of [prev, next, key, value] lists whose root refers to itself. A new cache each
         # epoch leaves the old one, table and all, to the collector; the card fills first.
         # Only the last cache is named.
         ("class LinkedLRU:\n"
          "    def __init__(self, maxsize):\n"
          "        self.maxsize = maxsize\n"
          "        self.links = {}\n"
          "        self.root = []\n"
          "        self.root[:] = [self.root, self.root, None, None]\n"
          "    def get(self, key, compute):\n"
          "        link = self.links.get(key)\n"
          "        if link is not None:\n"
          "            return link[3]\n"
          "        value = compute()\n"
          "        root = self.root\n"
          "        last = root[0]\n"
          "        link = [last, root, key, value]\n"
          "        last[1] = root[0] = self.links[key] = link\n"
          "        if len(self.links) > self.maxsize:\n"
          "            oldest = root[1]\n"
          "            root[1] = oldest[1]\n"
          "            oldest[1][0] = root\n"
          "            del self.links[oldest[2]]\n"
          "        return value\n"
          "def rotary_table(nbytes):\n"
          "    return torch.empty(nbytes, dtype=torch.uint8, device='cuda')",),
         "for epoch in range(1000):\n"
         "    tables = LinkedLRU(maxsize=4)\n"
         "    n_rows = tables.get(('rope', 4096), lambda: rotary_table(frac(0.08))).numel()",
         (GC8, del_step("tables", collect=True)),
         written=WRITTEN8),
    # ---- control: a broadcast loss ------------------------------------------------------------
    # Subtracting an (n,) target from an (n, 1) prediction gave a memory error for n over
    # 100,000: the difference is (n, n). Composite: the report's arrays were NumPy's; here a
    # PyTorch loss on the GPU.
    Kind("broadcast_loss_pairwise_working_set",
         "https://github.com/zygmuntz/hyperband/issues/17",
         "working set",
         # A hand-written MSE between a regression head's (n, 1) output and (n,) targets: the
         # difference broadcasts to (n, n), 55% of the card, and its square another 55%. The
         # inputs are a few MiB; nothing stale is held.
         ("n_rows = int((frac(0.55) / 4) ** 0.5)\n"
          "features = torch.randn(n_rows, 64, device='cuda')\n"
          "targets = torch.randn(n_rows, device='cuda')\n"
          "head = torch.nn.Linear(64, 1, device='cuda')\n"
          "def mse(pred, target):\n"
          "    return ((pred - target) ** 2).mean()",),
         "loss = mse(head(features), targets)",
         (TB8,),
         written=WRITTEN8),
    # ---- outlive `%reset`: helper modules in sys.modules -------------------------------------
    # A notebook user took 2 GB with torch.cuda.caching_allocator_alloc; the memory stayed
    # until the kernel restarted. Composite: here the pointers are a kernel wrapper's
    # workspaces, kept as ints in its module.
    Kind("kernel_workspaces_raw_allocator_pointers",
         "https://github.com/pytorch/pytorch/issues/130162",
         "held by your session",
         # A custom kernel's wrapper module takes its per-layer workspaces from PyTorch's
         # allocator with `caching_allocator_alloc` and keeps the raw pointers (ints) in a
         # module dict: memory allocated, no tensor or storage anywhere. The module stays in
         # sys.modules through `%reset`; its step releases the pointers and removes it.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "kernel_dir = tempfile.mkdtemp(prefix='gm_kernels_')\n"
          "pathlib.Path(kernel_dir, 'gm_kernels.py').write_text(\n"
          "    'import torch\\n'\n"
          "    '_WORKSPACES = {}\\n'\n"
          "    'def workspace(name, nbytes):\\n'\n"
          "    '    ptr = _WORKSPACES.get(name)\\n'\n"
          "    '    if ptr is None:\\n'\n"
          "    '        ptr = _WORKSPACES[name] = torch.cuda.caching_allocator_alloc(nbytes)\\n'\n"
          "    '    return ptr\\n'\n"
          "    'def release_all():\\n'\n"
          "    '    for ptr in _WORKSPACES.values():\\n'\n"
          "    '        torch.cuda.caching_allocator_delete(ptr)\\n'\n"
          "    '    _WORKSPACES.clear()\\n')\n"
          "sys.path.insert(0, kernel_dir)\n"
          "importlib.invalidate_caches()",
          "import gm_kernels as kernels\n"
          "for layer in range(4):\n"
          "    ptr = kernels.workspace(f'attn{layer}', frac(0.1))"),
         FAIL8,
         (Step("gm_kernels._WORKSPACES", "who:kernels",
               "import sys\n"
               "_mod = sys.modules.pop('gm_kernels', None)\n"
               "if _mod is not None:\n"
               "    _mod.release_all()\n"
               "del _mod\n"
               "try:\n"
               "    del kernels\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN8),
    # Creating a Schema class adds it to marshmallow's class registry, so classes made again
    # and again with the same name were all kept. Composite: here an `__init_subclass__`
    # registry in a helper module, and a notebook cell that defines a subclass re-run.
    Kind("init_subclass_registry_keeps_redefined_heads",
         "https://github.com/marshmallow-code/marshmallow/issues/732",
         "held by your session",
         # A helper module's base class records every subclass in `HEADS` (from
         # `__init_subclass__`); the cell that defines `AnchorHead`, with its anchor table as a
         # class attribute, is run three times while it is edited. `AnchorHead` names the last
         # class; the registry keeps all three, tables and all. Its step clears the registry
         # and removes the module.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "heads_dir = tempfile.mkdtemp(prefix='gm_heads_')\n"
          "pathlib.Path(heads_dir, 'gm_heads.py').write_text(\n"
          "    'HEADS = []\\n'\n"
          "    'class Head:\\n'\n"
          "    '    def __init_subclass__(cls, **kwargs):\\n'\n"
          "    '        super().__init_subclass__(**kwargs)\\n'\n"
          "    '        HEADS.append(cls)\\n')\n"
          "sys.path.insert(0, heads_dir)\n"
          "importlib.invalidate_caches()\n"
          "import gm_heads",
          *(("class AnchorHead(gm_heads.Head):\n"
             "    ANCHORS = torch.empty(frac(0.12), dtype=torch.uint8, device='cuda')\n"
             "    def forward(self, x):\n"
             "        return x",) * 3)),
         FAIL8,
         (del_step("AnchorHead"),
          Step("gm_heads.HEADS", "who:gm_heads",
               "import sys\n"
               "_mod = sys.modules.pop('gm_heads', None)\n"
               "if _mod is not None:\n"
               "    _mod.HEADS.clear()\n"
               "del _mod\n"
               "try:\n"
               "    del gm_heads\n"
               "except NameError:\n"
               "    pass\n"
               "import gc\n"
               "gc.collect()")),
         written=WRITTEN8),
    # ---- live threads (each ends by itself after 90 s if its step never runs) ----------------
    # Producer threads hung when the caller broke out of iter_batches early, "holding batches
    # in memory" (a GPU OOM for the user).
    Kind("loader_thread_blocked_on_full_queue",
         "https://github.com/ray-project/ray/pull/34819",
         "held by your session",
         # A loader thread feeding a bounded queue (two batches); the training loop breaks
         # after three steps. The queue is full, and the loader holds its next batch in its
         # frame while it waits to put it. The consumed batches are released from the cache.
         ("import queue\n"
          "import threading\n"
          "import time\n"
          "ready = queue.Queue(maxsize=2)\n"
          "stop_loading = threading.Event()\n"
          "produced = threading.Semaphore(0)\n"
          "def load_batches(nbytes):\n"
          "    deadline = time.monotonic() + 90\n"
          "    while not stop_loading.is_set() and time.monotonic() < deadline:\n"
          "        batch = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        produced.release()\n"
          "        while True:\n"
          "            try:\n"
          "                ready.put(batch, timeout=0.2)\n"
          "                break\n"
          "            except queue.Full:\n"
          "                if stop_loading.is_set() or time.monotonic() > deadline:\n"
          "                    return\n"
          "loader = threading.Thread(target=load_batches, args=(frac(0.12),), daemon=True,\n"
          "                          name='gm-loader')\n"
          "loader.start()\n"
          "for step in range(3):\n"
          "    batch = ready.get(timeout=30)\n"
          "    if step == 2:\n"
          "        break\n"
          "del batch\n"
          "for _ in range(6):\n"
          "    assert produced.acquire(timeout=30)\n"
          "torch.cuda.empty_cache()",),
         FAIL8,
         (Step("loader", "who:loader",
               "import threading\n"
               "try:\n"
               "    stop_loading.set()\n"
               "except NameError:\n"
               "    pass\n"
               "for _th in threading.enumerate():\n"
               "    if _th.name == 'gm-loader':\n"
               "        _th.join(95)\n"
               "_th = None"),
          del_step("ready")),
         written=WRITTEN8),
    # A request-batching asyncio server's GPU memory grew with the number of inputs: its
    # queue kept the tensors. Composite: here coroutines pending on an event loop that runs
    # forever in a thread of its own (the usual way round a notebook's own loop).
    Kind("background_loop_pending_uploads",
         "https://github.com/deep-learning-with-pytorch/dlwpt-code/issues/26",
         "held by your session",
         # Each epoch's snapshot handed to an upload coroutine with
         # `asyncio.run_coroutine_threadsafe(upload(...), upload_loop)`; the store is slow (the
         # coroutine waits 600 s) and the notebook never waits for the futures. The tasks,
         # their frames and snapshots live in the loop, whose thread runs it; each future in
         # `uploads` reaches its task too, through the done-callback that chains the two. The
         # loop stops by itself after 90 s; its step cancels the tasks, stops the loop and
         # closes it.
         ("import asyncio\n"
          "import threading\n"
          "upload_loop = asyncio.new_event_loop()\n"
          "def run_loop(loop):\n"
          "    asyncio.set_event_loop(loop)\n"
          "    loop.call_later(90, loop.stop)\n"
          "    loop.run_forever()\n"
          "loop_thread = threading.Thread(target=run_loop, args=(upload_loop,), daemon=True,\n"
          "                               name='gm-upload-loop')\n"
          "loop_thread.start()\n"
          "async def upload(name, snapshot):\n"
          "    await asyncio.sleep(600)\n"
          "    return name, snapshot.numel()\n"
          "uploads = []\n"
          "for epoch in range(4):\n"
          "    snapshot = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    uploads.append(asyncio.run_coroutine_threadsafe(upload(f'epoch{epoch}', "
          "snapshot),\n"
          "                                                    upload_loop))\n"
          "del snapshot",),
         FAIL8,
         (del_step("uploads"),
          Step("upload_loop", "who:upload_loop",
               "import asyncio\n"
               "import sys\n"
               "import threading\n"
               "def _find_upload_loop():\n"
               "    try:\n"
               "        return upload_loop\n"
               "    except NameError:\n"
               "        pass\n"
               "    for th in threading.enumerate():\n"
               "        if th.name == 'gm-upload-loop':\n"
               "            f = sys._current_frames().get(th.ident)\n"
               "            while f is not None:\n"
               "                if isinstance(f.f_locals.get('loop'), "
               "asyncio.AbstractEventLoop):\n"
               "                    return f.f_locals['loop']\n"
               "                f = f.f_back\n"
               "    return None\n"
               "def _stop_uploads(loop):\n"
               "    if loop is None or loop.is_closed():\n"
               "        return\n"
               "    if loop.is_running():\n"
               "        def cancel_all():\n"
               "            for task in asyncio.all_tasks(loop):\n"
               "                task.cancel()\n"
               "            loop.call_soon(loop.stop)\n"
               "        loop.call_soon_threadsafe(cancel_all)\n"
               "        for th in threading.enumerate():\n"
               "            if th.name == 'gm-upload-loop':\n"
               "                th.join(30)\n"
               "    pending = asyncio.all_tasks(loop)\n"
               "    for task in pending:\n"
               "        task.cancel()\n"
               "    if pending:\n"
               "        loop.run_until_complete(asyncio.gather(*pending, "
               "return_exceptions=True))\n"
               "    loop.close()\n"
               "_stop_uploads(_find_upload_loop())\n"
               "del _find_upload_loop, _stop_uploads"),),
         written=WRITTEN8),
    # ---- outlive `%reset`: the collector's permanent generation -------------------------------
    # gc.freeze() moves every tracked object into a permanent generation that no collection
    # visits ("some objects may not be freed ... it looks like a leak"). Composite: here
    # garbage cycles are pending when a notebook freezes its heap after loading, as serving
    # code does after warm-up.
    Kind("gc_freeze_keeps_pending_cycles",
         "https://github.com/python/cpython/issues/75739",
         "garbage in reference cycles",
         # Shard loaders that keep a bound method of their own (`self.on_done = self.close`,
         # a cycle), re-created in a loop with the collector off while loading; then
         # `gc.freeze()` "to keep the loaded objects out of later collections" and the
         # collector back on. The dropped loaders are unreachable but frozen: `gc.collect()`
         # never visits them. Its step unfreezes and collects.
         ("import gc\n"
          "class ShardLoader:\n"
          "    def __init__(self, nbytes):\n"
          "        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "        self.on_done = self.close\n"
          "    def close(self):\n"
          "        self.buffer = None\n"
          "gc.disable()\n"
          "for shard_id in range(5):\n"
          "    loader = ShardLoader(frac(0.09))\n"
          "del loader\n"
          "gc.freeze()\n"
          "gc.enable()",),
         FAIL8,
         (Step("gc permanent generation", "none",
               "import gc\n"
               "gc.enable()\n"
               "gc.unfreeze()\n"
               "gc.collect()"),),
         written=WRITTEN8),
    # ---- last: TorchScript's process-wide compilation unit -----------------------------------
    # Tracing a function that uses a CUDA tensor it was not given makes the tensor a constant
    # of the graph, and the global compilation unit keeps the graph: the memory leaks.
    Kind("jit_trace_constant_in_global_unit",
         "https://github.com/pytorch/pytorch/issues/43119",
         "held by your session",
         # An embedding lookup traced with `torch.jit.trace` for speed; the table is a global
         # of the function, not an input, so the trace bakes it in as a constant. `del
         # embedding_table` ("the traced function is all I use now") and `del fast_lookup`
         # free nothing: TorchScript's process-wide compilation unit keeps both traced graphs
         # (the trace and its check). Its step drops that unit's functions.
         ("width = 1024\n"
          "vocab_rows = frac(0.3) // (4 * width)\n"
          "embedding_table = torch.randn(vocab_rows, width, device='cuda')\n"
          "def lookup(ids):\n"
          "    return embedding_table[ids].sum(dim=1)\n"
          "example_ids = torch.randint(0, vocab_rows, (8, 4), device='cuda')\n"
          "fast_lookup = torch.jit.trace(lookup, (example_ids,))\n"
          "del embedding_table",),
         FAIL8,
         (del_step("fast_lookup"),
          Step("torch.jit compilation unit", "none",
               "import torch\n"
               "torch.jit._state._python_cu.drop_all_functions()")),
         written=WRITTEN8),
]
