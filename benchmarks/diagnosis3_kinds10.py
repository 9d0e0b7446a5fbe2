"""The tenth batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new10``).

Written as KINDS4 to KINDS9 were: by a helper that had not read the explainer's code (nothing
under ``gpumem_nb/``, ``tests/``, ``docs/`` or ``notebooks/``), each kind from the user report
its ``source`` names (the comment above it says what the user hit; "composite" where the kind
joins a report to a pattern the report does not show itself), ``expected`` written by the
mechanism before any run. Every failing cell asks for more than CUDA has free (``FILL``) unless
it is a computation of its own, and no setup leaves a large freed block in the allocator's
cache (a setup that frees temporaries releases them with ``torch.cuda.empty_cache()``), so
that ``FILL`` is all the memory the request can get. Sizes follow the card through ``frac()``.
No setup leaves a value in ``Out`` (each ends with an assignment, a loop or ``del``).

Each mechanism differs from every kind of KINDS3 to KINDS9 and diagnosis2's KINDS: the holders
here are a ``unittest`` result's failure records (each names its TestCase, whose ``setUp``
made a CUDA tensor), the ``__globals__`` of a function defined by a script run with
``runpy.run_path`` (the script's own namespace, not the dict ``run_path`` returned), a data
descriptor's per-instance dict on the class, a generator suspended inside an ``except`` block
(its handled exception, traceback and the failed call's frame), the ``grad_fn`` nodes of
deleted losses (their saved tensors), ipywidgets' registry of open widgets (an
``interactive``'s last ``result``), ``exec`` namespaces that hold the functions defined in
them (cycles, left to the collector), ``typing``'s cache of subscriptions (``Annotated``
metadata), a ``threading.excepthook`` that keeps worker threads' exceptions, a
``sys.unraisablehook`` that keeps the exceptions of failed ``__del__`` calls (the finalized
objects are resurrected by their frames), IPython's custom exception handler
(``set_custom_exc``), a ``logging.Filter`` on a named logger that keeps recent records (their
``args``), and a global optimizer step post-hook that keeps copies of the parameters; the
control is ``torch.combinations`` (its n**r mask).

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` (``typing``'s caches, ``threading.excepthook``, ``sys.unraisablehook``, IPython's
custom exception handler, a logger in ``logging``'s manager, torch's global optimizer hooks)
come after the others, and each one's step undoes it completely.
"""

from __future__ import annotations

from benchmarks.diagnosis3_kinds6 import FAIL6 as FAIL10
from benchmarks.diagnosis3_kinds6 import GC6 as GC10
from benchmarks.diagnosis3_kinds6 import TB6 as TB10
from benchmarks.diagnosis3_kinds6 import del_step
from benchmarks.gpu_diagnosis2 import Kind, Step

WRITTEN10 = "2026-12-07, by a helper blind to gpumem_nb's code; not yet measured"


KINDS10: list[Kind] = [
    # ---- objects of library classes in the namespace ----------------------------------------
    # A test runner's result "holds references to all the TestCase instances whose test
    # methods it executes" (50 MB each, until the OOM killer). Composite: here the result is
    # the stdlib's own TestResult, whose `failures` list pairs each failed TestCase with its
    # formatted traceback, and each TestCase keeps what its `setUp` put on the GPU.
    Kind("unittest_failures_keep_test_instances",
         "https://github.com/xmlrunner/unittest-xml-reporting/issues/30",
         "held by your session",
         # Shape checks run from the notebook with `TextTestRunner`; `setUp` makes a CUDA
         # batch and there is no `tearDown`. All four tests fail; `report.failures` keeps the
         # four TestCase instances, batch and all (the suite itself lets go of them).
         ("import io\n"
          "import unittest\n"
          "class TestEmbeddingShapes(unittest.TestCase):\n"
          "    def setUp(self):\n"
          "        self.batch = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    def test_rows(self):\n"
          "        self.assertEqual(self.batch.numel() % 3, 7)\n"
          "    def test_cols(self):\n"
          "        self.assertEqual(self.batch.numel() % 5, 9)\n"
          "    def test_dtype(self):\n"
          "        self.assertTrue(self.batch.numel() < 0)\n"
          "    def test_device(self):\n"
          "        self.assertFalse(self.batch.is_cuda)\n"
          "suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestEmbeddingShapes)\n"
          "report = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)\n"
          "n_failed = len(report.failures)",),
         FAIL10,
         (del_step("report"),),
         written=WRITTEN10),
    # A function defined by a script run into its own namespace keeps that namespace as its
    # `__globals__`, apart from the notebook's (`f.__globals__['x']` differs from `x`).
    # Composite: here the script is run with `runpy.run_path`, which returns a *copy* of the
    # script's globals: deleting the copy leaves the original alive through the function.
    Kind("runpy_function_globals_keep_script_tensors",
         "https://github.com/spyder-ide/spyder/issues/16201",
         "held by your session",
         # A preprocessing script puts its anchors on the GPU and defines `preprocess`; the
         # notebook takes the function and deletes the returned dict. `preprocess.__globals__`
         # is the script's namespace, anchors and all (and `preprocess` itself: a cycle, so
         # its step also collects).
         ("import pathlib\nimport runpy\nimport tempfile\n"
          "prep_dir = tempfile.mkdtemp(prefix='gm_prep_')\n"
          "prep_path = str(pathlib.Path(prep_dir, 'prep.py'))\n"
          "pathlib.Path(prep_path).write_text(\n"
          "    'import torch\\n'\n"
          "    'anchors = torch.empty(NBYTES, dtype=torch.uint8, device=\"cuda\")\\n'\n"
          "    'def preprocess(batch):\\n'\n"
          "    '    return batch.numel() + anchors.numel()\\n')\n"
          "prep = runpy.run_path(prep_path, init_globals={'NBYTES': frac(0.3)})\n"
          "preprocess = prep['preprocess']\n"
          "del prep",),
         FAIL10,
         (del_step("preprocess", collect=True),),
         written=WRITTEN10),
    # A model field (a data descriptor) stored every instance's value in a dict on the field
    # itself, keyed by the instance: every instance ever assigned leaks.
    Kind("descriptor_field_memory_keeps_instances",
         "https://github.com/jazzband/jsonmodels/issues/64",
         "held by your session",
         # `Sample.features` is such a field; four samples are made in a loop and the last is
         # deleted. The field's `_memory` on the class keeps all four instances and their CUDA
         # features.
         ("class TensorField:\n"
          "    def __init__(self):\n"
          "        self._memory = {}\n"
          "    def __get__(self, obj, objtype=None):\n"
          "        if obj is None:\n"
          "            return self\n"
          "        return self._memory.get(obj)\n"
          "    def __set__(self, obj, value):\n"
          "        self._memory[obj] = value\n"
          "class Sample:\n"
          "    features = TensorField()\n"
          "    def __init__(self, nbytes):\n"
          "        self.features = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "for i in range(4):\n"
          "    sample = Sample(frac(0.09))\n"
          "    n_features = sample.features.numel()\n"
          "del sample",),
         FAIL10,
         (Step("Sample.features", "who:Sample",
               "try:\n"
               "    Sample.features._memory.clear()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN10),
    # "We must not yield active exceptions": a generator suspended inside an `except` block
    # keeps the exception it is handling. Composite: here the exception's traceback keeps the
    # frame of the fast decoder that failed, with its CUDA workspace.
    Kind("generator_suspended_in_except_keeps_error",
         "https://github.com/datalad/datalad-next/pull/303",
         "held by your session",
         # `decode_all` yields a fallback from inside `except RuntimeError:`; the notebook took
         # the first item and stopped. The generator's handled exception -> traceback ->
         # `decode_fast`'s frame -> `workspace`. No name is bound to the exception.
         ("def decode_fast(nbytes):\n"
          "    workspace = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    raise RuntimeError('fused decode kernel failed')\n"
          "def decode_all(sizes):\n"
          "    for nbytes in sizes:\n"
          "        try:\n"
          "            yield decode_fast(nbytes)\n"
          "        except RuntimeError:\n"
          "            yield 'fallback'\n"
          "decoded = decode_all([frac(0.35), frac(0.35)])\n"
          "first = next(decoded)",),
         FAIL10,
         (del_step("decoded"),),
         written=WRITTEN10),
    # A user asked whether the graph is freed by backward, since `loss.grad_fn` stays; and
    # the forum's leak thread: "the function ... (effectively z.grad_fn) holds onto y and in
    # turn x". Composite: here the grad_fn nodes are kept to draw the graph later, and the
    # losses are deleted without a backward.
    Kind("grad_fn_kept_for_graph_drawing",
         "https://discuss.pytorch.org/t/call-backward-to-clear-graph/164294",
         "held by your session",
         # Two forward passes; each loss's `grad_fn` goes into `graph_roots` to draw with
         # torchviz later, then `x`, `h` and `loss` are deleted. The nodes keep their saved
         # tensors: the input `x` (for the weight's gradient) and `h` (tanh's output).
         ("width = 1024\n"
          "rows = frac(0.1) // (4 * width)\n"
          "weight = torch.randn(width, width, device='cuda', requires_grad=True)\n"
          "graph_roots = []\n"
          "for step in range(2):\n"
          "    x = torch.randn(rows, width, device='cuda')\n"
          "    h = torch.tanh(x @ weight)\n"
          "    loss = h.square().mean()\n"
          "    graph_roots.append(loss.grad_fn)\n"
          "del x, h, loss\n"
          "torch.cuda.empty_cache()",),
         FAIL10,
         (del_step("graph_roots"),),
         written=WRITTEN10),
    # All widgets made in a kernel's life stay in ipywidgets' global registry until they are
    # closed. Composite: here the widget is an `interactive` whose function returns a CUDA
    # tensor; its `result` is the last value.
    Kind("widget_registry_keeps_interactive_result",
         "https://github.com/jupyter-widgets/ipywidgets/issues/1345",
         "held by your session",
         # A preview panel made with `widgets.interactive` (it calls the function once when
         # made); the notebook deletes `panel` without closing it. The registry keeps the
         # widget, and the widget keeps `result`.
         ("import ipywidgets as widgets\n"
          "def preview(scale=1.0):\n"
          "    return torch.empty(frac(0.3), dtype=torch.uint8, device='cuda')\n"
          "panel = widgets.interactive(preview, scale=(0.5, 2.0))\n"
          "n_preview = panel.result.numel()\n"
          "del panel",),
         FAIL10,
         (Step("ipywidgets registry", "none",
               "import gc\n"
               "import ipywidgets\n"
               "ipywidgets.Widget.close_all()\n"
               "gc.collect()"),),
         needs="ipywidgets",
         written=WRITTEN10),
    # ---- reference cycles left to the collector ----------------------------------------------
    # "exec() maybe has a memory leak": a function defined by exec'd code keeps the globals
    # dict it was defined in, which keeps the function: a cycle only the collector frees.
    # Composite: here each namespace also holds a CUDA cache.
    Kind("exec_namespace_function_cycle_in_loop",
         "https://github.com/python/cpython/issues/77995",
         "garbage in reference cycles",
         # Per-epoch augmentation recipes run with `exec` into a fresh namespace that holds the
         # epoch's cache; each namespace dropped (rebinding `ns`) is a cycle (ns -> augment ->
         # __globals__ -> ns) with its cache. The card fills before the collector runs; only
         # the last namespace is named.
         ("recipe = ('def augment(batch):\\n'\n"
          "          '    return batch[: cache.numel()]\\n')",),
         "for epoch in range(1000):\n"
         "    ns = {'cache': torch.empty(frac(0.08), dtype=torch.uint8, device='cuda')}\n"
         "    exec(recipe, ns)\n"
         "    n_cached = ns['cache'].numel()",
         (GC10, del_step("ns", collect=True)),
         written=WRITTEN10),
    # ---- control: torch.combinations' mask ---------------------------------------------------
    # torch.combinations materializes "intermediate tensors of size n^r ... even when the
    # final number of combinations is small".
    Kind("combinations_mask_working_set",
         "https://github.com/pytorch/pytorch/issues/153337",
         "working set",
         # All triples of a few thousand int16 ids: the result is about n^3 bytes (60% of the
         # card), the n^3 boolean mask as large again. The input is a few KiB; nothing stale
         # is held.
         ("n_ids = int(frac(0.6) ** (1 / 3))\n"
          "ids = torch.arange(n_ids, device='cuda', dtype=torch.int16)",),
         "triples = torch.combinations(ids, r=3)",
         (TB10,),
         written=WRITTEN10),
    # ---- outlive `%reset`: typing's caches ----------------------------------------------------
    # typing's built-in LRU caches "worsen leaks that exist in other code": they keep every
    # argument a generic was subscripted with. Composite: here an `Annotated` spec carries a
    # reference CUDA tensor as its metadata.
    Kind("typing_cache_keeps_annotated_metadata",
         "https://github.com/python/cpython/issues/98253",
         "held by your session",
         # `like(reference)` builds `Annotated[torch.Tensor, reference]` for a shape checker;
         # the notebook deletes both the spec and the reference. typing's cache keeps the
         # subscription's arguments and its result through `%reset`; its step runs typing's
         # own cache cleanups.
         ("from typing import Annotated\n"
          "def like(reference):\n"
          "    return Annotated[torch.Tensor, reference]\n"
          "reference = torch.empty(frac(0.3), dtype=torch.uint8, device='cuda')\n"
          "BatchSpec = like(reference)\n"
          "del reference, BatchSpec",),
         FAIL10,
         (Step("typing caches", "none",
               "import gc\n"
               "import typing\n"
               "for _cleanup in typing._cleanups:\n"
               "    _cleanup()\n"
               "_cleanup = None\n"
               "del _cleanup\n"
               "gc.collect()"),),
         written=WRITTEN10),
    # ---- outlive `%reset`: interpreter hooks ----------------------------------------------------
    # The docs of threading.excepthook say storing `exc_value` can create a reference cycle and
    # storing `thread` can resurrect it. Composite: here a notebook collects its loader
    # threads' exceptions, and each one's traceback keeps the failed loader's frame.
    Kind("threading_excepthook_keeps_worker_errors",
         "https://github.com/python/cpython/pull/14059",
         "held by your session",
         # Four loader threads each make a shard and fail on its checksum; the hook (a closure
         # in `threading`, not the namespace) keeps each exception. Its step restores the
         # default hook.
         ("import threading\n"
          "def make_error_collector():\n"
          "    errors = []\n"
          "    def collect(args):\n"
          "        errors.append(args.exc_value)\n"
          "    collect.errors = errors\n"
          "    return collect\n"
          "thread_error_hook = make_error_collector()\n"
          "threading.excepthook = thread_error_hook\n"
          "def load_shard(nbytes):\n"
          "    shard = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    raise OSError('shard checksum mismatch')\n"
          "for i in range(4):\n"
          "    loader = threading.Thread(target=load_shard, args=(frac(0.09),))\n"
          "    loader.start()\n"
          "    loader.join()\n"
          "del loader",),
         FAIL10,
         (Step("threading.excepthook", "who:thread_error_hook",
               "import gc\n"
               "import threading\n"
               "_hook = threading.excepthook\n"
               "if getattr(_hook, 'errors', None) is not None:\n"
               "    _hook.errors.clear()\n"
               "threading.excepthook = threading.__excepthook__\n"
               "_hook = None\n"
               "del _hook\n"
               "try:\n"
               "    del thread_error_hook\n"
               "except NameError:\n"
               "    pass\n"
               "gc.collect()"),),
         written=WRITTEN10),
    # A user's `sys.unraisablehook` stores its argument (`v = unraisable_arg`) to look at it
    # later. Composite: here the unraisable exceptions come from `__del__` methods, and each
    # kept exception's traceback keeps the `__del__` frame's `self`: the object is resurrected,
    # its CUDA buffer with it.
    Kind("unraisablehook_keeps_finalized_staging",
         "https://github.com/python/cpython/issues/134732",
         "held by your session",
         # Staging buffers whose `__del__` fails (their stream is still registered); the hook
         # keeps each exception for a summary. Every dropped buffer is alive again through
         # `sys.unraisablehook.log` -> exception -> traceback -> `__del__` frame -> self.
         ("import sys\n"
          "class PinnedStaging:\n"
          "    def __init__(self, nbytes):\n"
          "        self.data = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    def __del__(self):\n"
          "        self.unregister()\n"
          "    def unregister(self):\n"
          "        raise RuntimeError('staging buffer is still registered with its stream')\n"
          "def make_unraisable_log():\n"
          "    log = []\n"
          "    def keep(unraisable):\n"
          "        log.append(unraisable.exc_value)\n"
          "    keep.log = log\n"
          "    return keep\n"
          "unraisable_log = make_unraisable_log()\n"
          "sys.unraisablehook = unraisable_log\n"
          "for step in range(4):\n"
          "    staging = PinnedStaging(frac(0.09))\n"
          "    n_staged = staging.data.numel()\n"
          "del staging",),
         FAIL10,
         (Step("sys.unraisablehook", "who:unraisable_log",
               "import gc\n"
               "import sys\n"
               "_hook = sys.unraisablehook\n"
               "if getattr(_hook, 'log', None) is not None:\n"
               "    _hook.log.clear()\n"
               "sys.unraisablehook = sys.__unraisablehook__\n"
               "_hook = None\n"
               "del _hook\n"
               "try:\n"
               "    del unraisable_log\n"
               "except NameError:\n"
               "    pass\n"
               "gc.collect()"),),
         written=WRITTEN10),
    # A user installs a custom exception handler with `set_custom_exc` to change how errors of
    # one class are shown. Composite: here the handler also keeps each error for a report at
    # the end of the session; IPython keeps the handler (`CustomTB`) through `%reset`.
    Kind("custom_exc_handler_keeps_failures",
         "https://github.com/ipython/ipython/issues/13742",
         "held by your session",
         # Validation errors (ValueError) are shown short and kept; each kept error's
         # traceback keeps `validate`'s frame and its batch. The four failing cells run from
         # one setup cell (`run_cell`), so that the setup itself succeeds. Its step removes
         # the handler.
         ("def make_failure_keeper(keep=8):\n"
          "    kept = []\n"
          "    def keep_failure(shell, etype, value, tb, tb_offset=None):\n"
          "        kept.append(value)\n"
          "        del kept[:-keep]\n"
          "        return [f'{etype.__name__}: {value} (kept for the report)']\n"
          "    keep_failure.kept = kept\n"
          "    return keep_failure\n"
          "get_ipython().set_custom_exc((ValueError,), make_failure_keeper())\n"
          "def validate(nbytes):\n"
          "    batch = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    raise ValueError('labels out of range')",
          "for i in range(4):\n"
          "    get_ipython().run_cell('validate(frac(0.09))', store_history=False)\n"
          "del i"),
         FAIL10,
         (Step("custom exception handler", "none",
               "import gc\n"
               "get_ipython().set_custom_exc((), None)\n"
               "gc.collect()"),),
         written=WRITTEN10),
    # An error reporter kept a history of recent log records (and each record's history):
    # the records keep their arguments. Composite: here a de-duplicating filter on a named
    # logger keeps the last eight records, whose `args` are CUDA tensors; the logger lives in
    # `logging`'s manager through `%reset`.
    Kind("logging_filter_keeps_recent_records",
         "https://github.com/rollbar/pyrollbar/pull/43",
         "held by your session",
         # `train_log.warning('... %s', step, grads)` with a repeat filter; `del grads` frees
         # nothing: `RepeatFilter.recent` keeps the four records and their `args`.
         ("import logging\n"
          "class RepeatFilter(logging.Filter):\n"
          "    def __init__(self, window=8):\n"
          "        super().__init__()\n"
          "        self.window = window\n"
          "        self.recent = []\n"
          "    def filter(self, record):\n"
          "        # the step number only: comparing tensors with == is elementwise\n"
          "        repeated = any(r.msg == record.msg and r.args[0] == record.args[0]\n"
          "                       for r in self.recent)\n"
          "        self.recent = (self.recent + [record])[-self.window:]\n"
          "        return not repeated\n"
          "train_log = logging.getLogger('gm_train')\n"
          "train_log.propagate = False\n"
          "train_log.addHandler(logging.NullHandler())\n"
          "train_log.addFilter(RepeatFilter())\n"
          "for step in range(4):\n"
          "    grads = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    train_log.warning('step %d: non-finite values in %s', step, grads)\n"
          "del grads",),
         FAIL10,
         (Step("logger filters", "who:train_log",
               "import logging\n"
               "_log = logging.getLogger('gm_train')\n"
               "for _f in list(_log.filters):\n"
               "    _log.removeFilter(_f)\n"
               "_f = _log = None\n"
               "del _f, _log\n"
               "try:\n"
               "    del train_log\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN10),
    # ---- last: torch's global optimizer hooks --------------------------------------------------
    # Optimizer step hooks, per optimizer and global (`register_optimizer_step_post_hook`).
    # Composite: here a global post-hook keeps the last good parameters of every optimizer it
    # sees (to roll back after a NaN), keyed by the optimizer's id, so the copies outlive the
    # models and optimizers, and `%reset`.
    Kind("optimizer_global_post_hook_keeps_copies",
         "https://github.com/pytorch/pytorch/pull/89176",
         "held by your session",
         # Two experiments, each a model and an SGD optimizer deleted after one step; the
         # global hook's `last_good` keeps a copy of each model's weight. Its step removes the
         # hook from torch's global registry.
         ("from torch.optim.optimizer import register_optimizer_step_post_hook\n"
          "def make_rollback_hook():\n"
          "    last_good = {}\n"
          "    def keep_last_good(optimizer, args, kwargs):\n"
          "        last_good[id(optimizer)] = [p.detach().clone()\n"
          "                                    for g in optimizer.param_groups "
          "for p in g['params']]\n"
          "    keep_last_good.last_good = last_good\n"
          "    return keep_last_good\n"
          "rollback_handle = register_optimizer_step_post_hook(make_rollback_hook())\n"
          "width = int((frac(0.2) / 4) ** 0.5)\n"
          "for lr in (0.1, 0.01):\n"
          "    model = torch.nn.Linear(width, width, bias=False, device='cuda')\n"
          "    opt = torch.optim.SGD(model.parameters(), lr=lr)\n"
          "    model(torch.randn(8, width, device='cuda')).sum().backward()\n"
          "    opt.step()\n"
          "    opt.zero_grad(set_to_none=True)\n"
          "    del model, opt\n"
          "torch.cuda.empty_cache()",),
         FAIL10,
         (Step("global optimizer hook", "who:rollback_handle",
               "import gc\n"
               "import torch.optim.optimizer as _optimizer\n"
               "for _key, _hook in list(_optimizer._global_optimizer_post_hooks.items()):\n"
               "    if getattr(_hook, '__qualname__', '').startswith('make_rollback_hook.'):\n"
               "        del _optimizer._global_optimizer_post_hooks[_key]\n"
               "_key = _hook = None\n"
               "del _key, _hook, _optimizer\n"
               "try:\n"
               "    del rollback_handle\n"
               "except NameError:\n"
               "    pass\n"
               "gc.collect()"),),
         written=WRITTEN10),
]
