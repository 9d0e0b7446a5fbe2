"""The seventh batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new7``).

Written as KINDS4, KINDS5 and KINDS6 were: by a helper that had not read the explainer's code
(nothing under ``gpumem_nb/``, ``tests/`` or ``docs/``), each kind from the user report its
``source`` names (the comment above it says what the user hit; "composite" where the kind joins
a report to a pattern the report does not show itself), ``expected`` written by the mechanism
before any run. Every failing cell asks for more than CUDA has free (``FILL``) unless it is a
computation of its own, and no setup leaves a large freed block in the allocator's cache (a
setup that frees temporaries releases them with ``torch.cuda.empty_cache()``), so that ``FILL``
is all the memory the request can get. Sizes follow the card through ``frac()``.

Each mechanism differs from every kind of KINDS3 to KINDS6 and diagnosis2's KINDS: the holders
here are a reused ``pickle.Pickler``'s memo table (C-level, no attribute), ``copy.deepcopy``'s
shared memo (its keep-alive list of originals), an event loop's scheduled ``call_later``
handles, ``inspect.stack()`` frame records, a parameter's tensor hook (``register_hook``) that
keeps every gradient, ``torch.distributions.Categorical`` objects (their normalised logits and
cached probabilities, copies of the logits), bare ``UntypedStorage`` objects in a registry (no
tensor at all), a generator bound to its own instance (a cycle, left to the collector), the
``builtins`` module's namespace, a module re-executed by ``importlib.reload`` while instances
of its older versions live on, ``threading.local`` workspaces of a thread pool's workers, a
single-worker executor's queue of pending work items, and ``saved_tensors_hooks`` left entered
(their hooks live on autograd's C++ thread-local stack, where no Python object reaches them);
the control is an ``F.unfold`` (im2col) blow-up.

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` or live in other threads (a thread pool's thread-local workspaces, an executor's
backlog, ``builtins``, a module in ``sys.modules``, autograd's default saved-tensor hooks) come
after the others, and each one's step undoes it completely; the executor's jobs end by
themselves after 60 s. The very last kind is ``saved_tensors_hooks_left_entered``: until its
step pops the hooks, every tensor autograd saves in this process goes into its list.
"""

from __future__ import annotations

from benchmarks.diagnosis3_kinds6 import FAIL6 as FAIL7
from benchmarks.diagnosis3_kinds6 import GC6 as GC7
from benchmarks.diagnosis3_kinds6 import TB6 as TB7
from benchmarks.diagnosis3_kinds6 import del_step
from benchmarks.gpu_diagnosis2 import Kind, Step

WRITTEN7 = "2026-12-06, by a helper blind to gpumem_nb's code; measured once"

KINDS7: list[Kind] = [
    # ---- objects of library classes in the namespace ----------------------------------------
    # A Pickler reused for several dumps keeps every object it has pickled in its memo (so
    # later dumps can refer back to them) until clear_memo() is called. Composite: the report
    # is about the memo's stale entries, here they are records that carry CUDA tensors.
    Kind("pickler_memo_keeps_dumped_records",
         "https://github.com/python/cpython/issues/125756",
         "held by your session",
         # A run log streamed through one pickle.Pickler: each step's record keeps its
         # activations in memory and pickles only a summary (``__reduce__``), but the C
         # pickler's memo keeps a strong reference to every record it dumped. The memo is no
         # attribute (``step_log.memo`` is a copy made on request).
         ("import os\n"
          "import pickle\n"
          "import tempfile\n"
          "class StepRecord:\n"
          "    def __init__(self, step, activations):\n"
          "        self.step, self.activations = step, activations\n"
          "    def __reduce__(self):\n"
          "        return (dict, ((('step', self.step), ('numel', self.activations.numel())),))\n"
          "log_fd, log_path = tempfile.mkstemp(prefix='gm_steps_', suffix='.pkl')\n"
          "log_file = os.fdopen(log_fd, 'wb')\n"
          "step_log = pickle.Pickler(log_file)\n"
          "for step in range(5):\n"
          "    step_log.dump(StepRecord(step, torch.empty(frac(0.1), dtype=torch.uint8, "
          "device='cuda')))\n"
          "    log_file.flush()",),
         FAIL7,
         (Step("step_log", "who:step_log",
               "try:\n"
               "    step_log.clear_memo()\n"
               "    log_file.close()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN7),
    # deepcopy puts every original it copies into the memo's keep-alive list (memo[id(memo)])
    # and maps each original's id to its copy. Composite: the report describes the keep-alive
    # entry; here the memo is kept after a copy of a model.
    Kind("deepcopy_shared_memo_keeps_originals",
         "https://github.com/python/cpython/issues/123745",
         "held by your session",
         # A teacher copied from the student with an explicit memo (to copy the optimizer
         # against the same memo, so that it points at the copied parameters), the memo kept
         # for later copies: after `del student, opt`, the memo's keep-alive list holds the
         # student's parameters and its values the teacher's. `del teacher` alone frees nothing.
         ("import copy\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "student = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                                for _ in range(4)])\n"
          "opt = torch.optim.SGD(student.parameters(), lr=1e-3)\n"
          "copy_memo = {}\n"
          "teacher = copy.deepcopy(student, copy_memo)\n"
          "teacher_opt = copy.deepcopy(opt, copy_memo)\n"
          "del student, opt",),
         FAIL7,
         (del_step("copy_memo"),
          del_step("teacher"),
          del_step("teacher_opt")),
         written=WRITTEN7),
    # call_later's TimerHandles (and the arguments they carry) stay in the loop until they run
    # or are cancelled. Composite: the report's handles were kept by a library; here by a
    # private event loop that is never run.
    Kind("event_loop_call_later_args",
         "https://github.com/lexiforest/curl_cffi/issues/164",
         "held by your session",
         # A debounced write of each evaluation's predictions, scheduled ten minutes ahead with
         # `flush_loop.call_later(600, write_predictions, preds, path)` on an event loop of its
         # own that the notebook never runs: the loop's `_scheduled` heap keeps every handle and
         # its arguments. Its step closes the loop (which drops the handles).
         ("import asyncio\n"
          "def write_predictions(preds, path):\n"
          "    torch.save(preds.cpu(), path)\n"
          "flush_loop = asyncio.new_event_loop()\n"
          "def evaluate(epoch, nbytes):\n"
          "    preds = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    flush_loop.call_later(600, write_predictions, preds, f'/tmp/gm_preds_{epoch}.pt')\n"
          "    return preds.numel()\n"
          "for epoch in range(4):\n"
          "    n_preds = evaluate(epoch, frac(0.11))",),
         FAIL7,
         (Step("flush_loop", "who:flush_loop",
               "try:\n"
               "    flush_loop.close()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN7),
    # Getting the stack with inspect.stack() keeps every frame on it alive (the report: every
    # object on the stack has its reference count raised, a memory leak).
    Kind("inspect_stack_records_keep_frames",
         "https://github.com/kbengine/kbengine/issues/1255",
         "held by your session",
         # An allocation tracker that records `inspect.stack(0)` with each allocation, for a
         # leak report: the records keep the frames of the allocating function and its caller,
         # and a finished frame keeps its locals (the tensor). The last caller's frame record is
         # also named (`last_site`).
         ("import inspect\n"
          "allocation_log = []\n"
          "def tracked_empty(nbytes, tag):\n"
          "    t = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    allocation_log.append({'tag': tag, 'nbytes': nbytes, 'stack': "
          "inspect.stack(0)})\n"
          "    return t\n"
          "def encode_batch(step, nbytes):\n"
          "    hidden = tracked_empty(nbytes, f'hidden{step}')\n"
          "    return float(hidden[:8].float().sum())\n"
          "for step in range(5):\n"
          "    score = encode_batch(step, frac(0.1))\n"
          "last_site = allocation_log[-1]['stack'][1]",),
         FAIL7,
         (del_step("allocation_log", collect=True),
          del_step("last_site", collect=True)),
         written=WRITTEN7),
    # ---- torch objects: tensor hooks, distributions, storages -------------------------------
    # Hooks that record what flows through a model used more and more GPU memory. Composite:
    # the report's hooks were module hooks; here a tensor hook on each parameter.
    Kind("param_tensor_hook_keeps_gradients",
         "https://github.com/utkuozbulak/pytorch-cnn-visualizations/issues/53",
         "held by your session",
         # A gradient monitor: `p.register_hook(lambda g: history.append((name, g)))` on every
         # parameter, the history in the helper's closure only. Each backward appends every
         # parameter's gradient; zero_grad frees `.grad` but not the history, which lives in the
         # parameters' hook dicts. The notebook names only `model`. The steps' temporaries are
         # released from the cache.
         ("def attach_grad_monitor(model):\n"
          "    history = []\n"
          "    for name, p in model.named_parameters():\n"
          "        p.register_hook(lambda g, name=name: history.append((name, g)))\n"
          "    return len(history)\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(torch.nn.Linear(width, width, bias=False, "
          "device='cuda'),\n"
          "                            torch.nn.Tanh(),\n"
          "                            torch.nn.Linear(width, width, bias=False, "
          "device='cuda'))\n"
          "attach_grad_monitor(model)\n"
          "for step in range(3):\n"
          "    x = torch.randn(8, width, device='cuda')\n"
          "    model(x).square().mean().backward()\n"
          "    model.zero_grad(set_to_none=True)\n"
          "del x\n"
          "torch.cuda.empty_cache()",),
         FAIL7,
         (del_step("model"),),
         written=WRITTEN7),
    # PPO code that stores the action distribution of each rollout step for later. Composite:
    # Categorical(logits=...) keeps a normalised copy of the logits, and its lazily computed
    # probabilities once entropy() has run.
    Kind("categorical_distributions_in_rollout",
         "https://github.com/HorizonRobotics/alf/pull/1783",
         "held by your session",
         # Four rollout steps over a 32k action space, each keeping (dist, actions): the raw
         # logits are gone, but each Categorical holds its normalised logits and its cached
         # `probs`, each as large as the logits. The last one is also named `dist`. The
         # constructor's and entropy's temporaries are released from the cache.
         ("from torch.distributions import Categorical\n"
          "vocab = 32000\n"
          "rows = frac(0.04) // (4 * vocab)\n"
          "rollout = []\n"
          "for step in range(4):\n"
          "    logits = torch.randn(rows, vocab, device='cuda')\n"
          "    dist = Categorical(logits=logits)\n"
          "    actions = torch.randint(0, vocab, (rows,), device='cuda')\n"
          "    entropy = dist.entropy().mean()\n"
          "    rollout.append((dist, actions))\n"
          "del logits\n"
          "torch.cuda.empty_cache()",),
         FAIL7,
         (del_step("rollout"),
          del_step("dist")),
         written=WRITTEN7),
    # A registry keyed by storage pointer kept the buffers alive ("the registry itself kept the
    # buffer alive"). Composite: here the registry holds bare UntypedStorage objects.
    Kind("storage_registry_without_tensors",
         "https://github.com/NVIDIA/cccl/pull/10866",
         "held by your session",
         # A dedupe table for saving shared weights: `registry[st.data_ptr()] = st` with
         # `st = t.untyped_storage()`. The tensors are gone; the storages (no tensor anywhere)
         # keep all their memory.
         ("storage_registry = {}\n"
          "def register_shared(t):\n"
          "    st = t.untyped_storage()\n"
          "    storage_registry.setdefault(st.data_ptr(), st)\n"
          "    return st.nbytes()\n"
          "for layer in range(5):\n"
          "    w = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    register_shared(w)\n"
          "del w",),
         FAIL7,
         (del_step("storage_registry"),),
         written=WRITTEN7),
    # ---- reference cycles left to the collector ----------------------------------------------
    # ElementTree.iterparse's iterator and its generator referred to each other, so an
    # unfinished iterator was freed (with its source) only by the collector.
    Kind("generator_bound_to_instance_cycle_in_loop",
         "https://github.com/python/cpython/pull/114269",
         "garbage in reference cycles",
         # A reader that keeps a generator of its own method (`self._batches = self._read()`)
         # and primes it: reader -> generator -> frame -> self is a cycle, and the suspended
         # frame holds the first batch. Re-creating the reader in a loop leaves each old one to
         # the collector; the card fills first. Only the last reader is named.
         ("class ShardReader:\n"
          "    def __init__(self, nbytes):\n"
          "        self.nbytes = nbytes\n"
          "        self._batches = self._read()\n"
          "        self.first = next(self._batches)\n"
          "    def _read(self):\n"
          "        while True:\n"
          "            batch = torch.empty(self.nbytes, dtype=torch.uint8, device='cuda')\n"
          "            yield batch.numel()",),
         "for epoch in range(1000):\n"
         "    reader = ShardReader(frac(0.08))",
         (GC7, del_step("reader", collect=True)),
         written=WRITTEN7),
    # ---- control: im2col -------------------------------------------------------------------
    # Replacing convolutions with explicit im2col ran out of memory at a quarter of the batch:
    # the columns are k*k times the input.
    Kind("unfold_patches_working_set",
         "https://github.com/aharley/segaware/issues/9",
         "working set",
         # Local contrast normalisation through F.unfold (5x5 patches, 16 images of 8
         # channels): the columns take 55% of the card and the centred copy another 55%. The
         # images are 25 times smaller; nothing stale is held. Each image's columns stay under
         # 2**31 elements on an H200.
         ("import torch.nn.functional as F\n"
          "n_img, channels, k = 16, 8, 5\n"
          "side = int((frac(0.55) / (4 * n_img * channels * k * k)) ** 0.5)\n"
          "images = torch.randn(n_img, channels, side, side, device='cuda')\n"
          "def local_contrast(x, k):\n"
          "    patches = F.unfold(x, kernel_size=k, padding=k // 2)\n"
          "    return patches - patches.mean(dim=1, keepdim=True)",),
         "normed = local_contrast(images, k)",
         (TB7,),
         written=WRITTEN7),
    # ---- outlive `%reset` or live in other threads: worker threads' locals, an executor's
    # queue, builtins, sys.modules, autograd's C++ hook stack --------------------------------
    # Thread-local objects leaked one copy per thread of the pool.
    Kind("thread_local_workspace_in_pool_workers",
         "https://github.com/cherrypy/cherrypy/issues/496",
         "held by your session",
         # Augmentation jobs on a 4-worker ThreadPoolExecutor, each worker keeping a reusable
         # workspace in `threading.local()`: the four workspaces live in the idle workers'
         # thread states, reachable from the `scratch` object only through its per-thread
         # table. The first four jobs wait for each other, so each lands on its own worker.
         # Its step shuts the pool down (whatever the advice did with the name).
         ("import concurrent.futures\n"
          "import threading\n"
          "scratch = threading.local()\n"
          "warm = threading.Barrier(4, timeout=30)\n"
          "def augment(i, nbytes):\n"
          "    buf = getattr(scratch, 'buf', None)\n"
          "    if buf is None:\n"
          "        buf = scratch.buf = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    if i < 4:\n"
          "        warm.wait()\n"
          "    return i\n"
          "workers = concurrent.futures.ThreadPoolExecutor(max_workers=4,\n"
          "                                                thread_name_prefix='gm-augment')\n"
          "done = list(workers.map(augment, range(12), [frac(0.11)] * 12))",),
         FAIL7,
         (Step("workers", "who:workers",
               "import threading\n"
               "try:\n"
               "    workers.shutdown(wait=True)\n"
               "except NameError:\n"
               "    for th in threading.enumerate():\n"
               "        if th.name.startswith('gm-augment'):\n"
               "            th.join(30)"),
          del_step("scratch")),
         written=WRITTEN7),
    # A pool's pending work items kept every submitted argument while the workers were busy.
    # Composite: the report is a ProcessPoolExecutor's pending items; here a ThreadPoolExecutor.
    Kind("executor_backlog_holds_submitted_shards",
         "https://github.com/agronholm/pythonfutures/pull/57",
         "held by your session",
         # Five shards submitted to a one-worker uploader whose first upload is stuck on a slow
         # store: that shard lives in the worker's frame, the other four in the executor's
         # queue of work items. The futures (`pending`) hold no tensor; `del uploader` frees
         # nothing (the worker drains the queue). The jobs end by themselves after 60 s; its
         # step opens the gate and waits for the worker.
         ("import concurrent.futures\n"
          "import threading\n"
          "import time\n"
          "upload_gate = threading.Event()\n"
          "upload_deadline = time.monotonic() + 60\n"
          "def upload(shard_id, shard):\n"
          "    upload_gate.wait(max(0.0, upload_deadline - time.monotonic()))\n"
          "    return shard_id, shard.numel()\n"
          "uploader = concurrent.futures.ThreadPoolExecutor(max_workers=1,\n"
          "                                                 thread_name_prefix='gm-upload')\n"
          "pending = []\n"
          "for shard_id in range(5):\n"
          "    shard = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    pending.append(uploader.submit(upload, shard_id, shard))\n"
          "del shard",),
         FAIL7,
         (Step("uploader", "who:uploader",
               "import threading\n"
               "try:\n"
               "    upload_gate.set()\n"
               "except NameError:\n"
               "    pass\n"
               "try:\n"
               "    uploader.shutdown(wait=True)\n"
               "except NameError:\n"
               "    for th in threading.enumerate():\n"
               "        if th.name.startswith('gm-upload'):\n"
               "            th.join(70)"),),
         written=WRITTEN7),
    # Projects that put their "globals" into the builtins module so that every module sees
    # them. Composite: here the shared object is a dict of CUDA tables.
    Kind("builtins_shared_tables",
         "https://github.com/ShipSoft/FairShip/pull/294",
         "held by your session",
         # Shared lookup tables published as `builtins.GM_SHARED_TABLES` so that helper modules
         # can use them without an import; the notebook's own name `shared` is a second
         # reference. `del shared` (or `%reset`) frees nothing: the builtins module keeps
         # them. Its second step deletes the builtin.
         ("import builtins\n"
          "shared = {'vocab': torch.empty(frac(0.2), dtype=torch.uint8, device='cuda'),\n"
          "          'positions': torch.empty(frac(0.15), dtype=torch.uint8, device='cuda')}\n"
          "builtins.GM_SHARED_TABLES = shared",),
         FAIL7,
         (del_step("shared"),
          Step("builtins.GM_SHARED_TABLES", "none",
               "import builtins\n"
               "try:\n"
               "    del builtins.GM_SHARED_TABLES\n"
               "except AttributeError:\n"
               "    pass")),
         written=WRITTEN7),
    # Re-running the cell that loads a model to pick up a source change left the earlier
    # model's GPU memory in use (the answer: reload the code instead). Composite: here the code
    # is reloaded with importlib.reload, and instances of the older versions stay in a list.
    Kind("module_reload_keeps_older_tables",
         "https://github.com/dvmazur/mixtral-offloading/issues/28",
         "held by your session",
         # A helper module that allocates its projection table at import
         # (`gm_featurizer.PROJ`); each `importlib.reload` runs the module again and allocates
         # a new table, while the Featurizer made before it keeps the old one. After two
         # reloads, `pipeline` holds three tables, the last also the module's global (the module
         # stays in sys.modules through `%reset`). Its step clears the module global and
         # removes the module.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "mod_dir = tempfile.mkdtemp(prefix='gm_reload_')\n"
          "pathlib.Path(mod_dir, 'gm_featurizer.py').write_text(\n"
          "    'import torch\\n'\n"
          "    f'PROJ_BYTES = {frac(0.2)}\\n'\n"
          "    'PROJ = torch.empty(PROJ_BYTES, dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    'class Featurizer:\\n'\n"
          "    '    def __init__(self):\\n'\n"
          "    '        self.proj = PROJ\\n')\n"
          "sys.path.insert(0, mod_dir)\n"
          "importlib.invalidate_caches()",
          "import gm_featurizer\n"
          "pipeline = [gm_featurizer.Featurizer()]",
          "for edit in range(2):\n"
          "    gm_featurizer = importlib.reload(gm_featurizer)\n"
          "    pipeline.append(gm_featurizer.Featurizer())"),
         FAIL7,
         (del_step("pipeline"),
          Step("gm_featurizer.PROJ", "who:gm_featurizer",
               "import sys\n"
               "_mod = sys.modules.pop('gm_featurizer', None)\n"
               "if _mod is not None:\n"
               "    _mod.PROJ = None\n"
               "del _mod\n"
               "try:\n"
               "    del gm_featurizer\n"
               "except NameError:\n"
               "    pass")),
         written=WRITTEN7),
    # ---- last: autograd's default saved-tensor hooks, a C++ thread-local stack -------------
    # GPU memory leaked with a saved_tensors_hooks pair. Composite: here the hooks are entered
    # by hand in one cell (a `with` cannot span notebook cells) and never exited, and the pack
    # hook keeps what it is given.
    Kind("saved_tensors_hooks_left_entered",
         "https://github.com/pytorch/pytorch/issues/115255",
         "held by your session",
         # An activation tap meant to measure what autograd saves: its pack hook appends each
         # saved tensor to `tap.saved`. `tap.start()` entered the hooks and nothing exited them:
         # autograd's C++ stack holds the bound methods, so the saved inputs and activations of
         # three training steps stay after their graphs are gone, and `del tap` frees nothing.
         # Its first step pops the hooks (by the tap if it is still named); the steps'
         # temporaries are released from the cache.
         ("class ActivationTap:\n"
          "    def __init__(self):\n"
          "        self.saved = []\n"
          "        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, "
          "self._unpack)\n"
          "    def _pack(self, t):\n"
          "        self.saved.append(t)\n"
          "        return t\n"
          "    def _unpack(self, t):\n"
          "        return t\n"
          "    def start(self):\n"
          "        self._hooks.__enter__()\n"
          "    def stop(self):\n"
          "        self._hooks.__exit__(None, None, None)\n"
          "tap = ActivationTap()\n"
          "tap.start()",
          "width = 4096\n"
          "model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),\n"
          "                            torch.nn.Linear(width, width)).cuda()\n"
          "rows = frac(0.05) // (4 * width)\n"
          "for step in range(3):\n"
          "    x = torch.randn(rows, width, device='cuda')\n"
          "    model(x).square().mean().backward()\n"
          "model.zero_grad(set_to_none=True)\n"
          "del x\n"
          "torch.cuda.empty_cache()"),
         FAIL7,
         (Step("saved tensor hooks", "none",
               "import torch\n"
               "try:\n"
               "    tap.stop()\n"
               "except NameError:\n"
               "    torch._C._autograd._pop_saved_tensors_default_hooks()"),
          del_step("tap", collect=True),
          del_step("model")),
         written=WRITTEN7),
]
