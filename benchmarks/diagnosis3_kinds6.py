"""The sixth batch of OOM kinds (``python3 benchmarks/gpu_diagnosis3.py --set new6``).

Written as KINDS4 and KINDS5 were: by a helper that had not read the explainer's code (nothing
under ``gpumem_nb/`` or ``tests/``), each kind from the user report its ``source`` names (the
comment above it says what the user hit; "composite" where the kind joins a report to a pattern
the report does not show itself), ``expected`` written by the mechanism before any run. Every
failing cell asks for more than CUDA has free (``FILL``) unless it is a computation of its own,
and no setup leaves a large freed block in the allocator's cache (a setup whose step frees
temporaries releases them with ``torch.cuda.empty_cache()``), so that ``FILL`` is all the
memory the request can get. Sizes follow the card through ``frac()`` (a share of the GPU's
total bytes), so that a kind holds the same share of an 80 GB H100 and of a 141 GB H200.

Each mechanism differs from every kind of KINDS3, KINDS4, KINDS5 and diagnosis2's KINDS: the
holders here are a list of caught exceptions, a MagicMock's call records, state_dict aliases,
an LR scheduler, pruning's reparametrization, a module's buffer registry, non-reentrant
checkpoint's recomputation closures, a numpy object array's view, a zip over list iterators,
an ExitStack of suspended context managers, a function-local class's method closure, dynamic
classes left to the collector, a global module hook, a package's sibling module, a Thread
subclass's attributes, a signal handler, and ``backward(create_graph=True)``'s C++ cycle; the
control is an autocast float32 upcast.

Order matters (one process runs every kind of an allocator): the kinds whose holders outlive
``%reset`` (a global hook in torch's own module, a package in ``sys.modules``, a live thread, a
signal handler) come after the others, and each one's step undoes it completely; the thread
ends by itself after 90 s. The very last kind is ``create_graph_backward_grad_cycle``: its
parameters and gradients form a reference cycle inside autograd's C++ graph, which Python's
collector cannot see, so advice that deletes the model before clearing the gradients leaks
them for the rest of the process; last, it leaks into no other kind.
"""

from __future__ import annotations

from benchmarks.gpu_diagnosis2 import FILL, Kind, Step

WRITTEN6 = "2026-12-06, by a helper blind to gpumem_nb's code; measured once"

# The failing cell of every kind held by the session: more than CUDA has free, always.
FAIL6 = f"y = torch.empty({FILL} + frac(0.1), dtype=torch.uint8, device='cuda')"
TB6 = Step("traceback", "dry:last exception",
           "get_ipython().run_line_magic('gpumem', 'cleanup')")
GC6 = Step("garbage", "none", "import gc\ngc.collect()")


def del_step(name: str, collect: bool = False) -> Step:
    """The step that frees a holder named in the namespace: deletes the name unless the
    advice already did; ``collect`` also runs the collector, for a holder that is a cycle."""
    code = f"try:\n    del {name}\nexcept NameError:\n    pass"
    if collect:
        code += "\nimport gc\ngc.collect()"
    return Step(name, f"who:{name}", code)


KINDS6: list[Kind] = [
    # ---- stored exceptions -------------------------------------------------------------------
    # Exceptions raised and caught during training leaked memory: each exception's traceback
    # keeps the frames (and the tensors) of the step that raised.
    Kind("exceptions_collected_in_retry_list",
         "https://github.com/pytorch/pytorch/issues/10348",
         "held by your session",
         # A retry loop that keeps every failure for a report at the end: each exception in the
         # list keeps its traceback, whose frame of train_step keeps that step's activations.
         ("def train_step(step, nbytes):\n"
          "    activations = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    raise RuntimeError(f'loss is NaN at step {step}')\n"
          "errors = []\n"
          "for step in range(5):\n"
          "    try:\n"
          "        train_step(step, frac(0.09))\n"
          "    except RuntimeError as e:\n"
          "        errors.append(e)",),
         FAIL6,
         (del_step("errors"),),
         written=WRITTEN6),
    # ---- objects of library classes in the namespace ---------------------------------------
    # mock stores references to the arguments of every call (call_args, call_args_list,
    # mock_calls), not copies.
    Kind("magicmock_tracker_records_tensors",
         "https://github.com/pytest-dev/pytest-mock/issues/37",
         "held by your session",
         # An experiment tracker stubbed with unittest.mock.MagicMock (wandb off in a notebook):
         # every `tracker.log({...})` is recorded with its dict of tensors, in the child mock's
         # call_args_list and in the parent's mock_calls. A mock and its children point at each
         # other: once the name goes, only a collection frees them.
         ("from unittest import mock\n"
          "tracker = mock.MagicMock(name='wandb_run')\n"
          "for step in range(5):\n"
          "    grad_norms = torch.empty(frac(0.09), dtype=torch.uint8, device='cuda')\n"
          "    tracker.log({'grad_norms': grad_norms, 'step': step})\n"
          "del grad_norms",),
         FAIL6,
         (del_step("tracker", collect=True),),
         written=WRITTEN6),
    # ---- more than one reference to one holder -----------------------------------------------
    # `state_dict()` returns references to the module's tensors, not copies.
    Kind("state_dict_snapshot_aliases_weights",
         "https://github.com/pytorch/pytorch/issues/34765",
         "held by your session",
         # "Keep the best weights" with `best_state = model.state_dict()` (no deepcopy), then
         # `del model` and the next fold's model: best_state's tensors are other Python objects
         # than the parameters but share their storage, so the old model's weights stay.
         ("def make_model(width):\n"
          "    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                                 for _ in range(4)])\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = make_model(width)\n"
          "best_state = model.state_dict()\n"
          "del model\n"
          "model = make_model(width)",),
         FAIL6,
         (del_step("best_state"),
          del_step("model")),
         written=WRITTEN6),
    # Schedulers caused memory to accumulate across cross-validation folds although the model
    # and optimizer were deleted.
    Kind("lr_scheduler_keeps_deleted_optimizer",
         "https://github.com/huggingface/transformers/issues/1134",
         "held by your session",
         # `del model, opt` after one Adam step: the scheduler's `optimizer` attribute keeps the
         # optimizer, its param_groups the parameters and its state exp_avg and exp_avg_sq. The
         # step's temporaries are released from the cache.
         ("width = int((frac(0.03) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(4)])\n"
          "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
          "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)\n"
          "x = torch.randn(8, width, device='cuda')\n"
          "model(x).square().mean().backward()\n"
          "opt.step()\n"
          "sched.step()\n"
          "opt.zero_grad(set_to_none=True)\n"
          "del model, opt, x\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (del_step("sched", collect=True),),
         written=WRITTEN6),
    # ---- torch.nn modules: reparametrization, buffers, checkpointing -------------------------
    # CustomFromMask pruning keeps a copy of the user's mask in the forward pre-hook, on top of
    # weight_orig and weight_mask.
    Kind("prune_custom_mask_keeps_copies",
         "https://github.com/pytorch/pytorch/issues/34257",
         "held by your session",
         # torch.nn.utils.prune.custom_from_mask on three layers: each keeps weight_orig (the
         # parameter), weight_mask (a float buffer), weight (orig * mask, a plain attribute) and
         # the hook's own boolean mask: 3.25 times the weights. The masks' temporaries are
         # released from the cache.
         ("import torch.nn.utils.prune as prune\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(3)])\n"
          "for layer in model:\n"
          "    keep = torch.rand(width, width, device='cuda') > 0.5\n"
          "    prune.custom_from_mask(layer, name='weight', mask=keep)\n"
          "del layer, keep\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (del_step("model"),),
         written=WRITTEN6),
    # Tensors registered with register_buffer could not be released ("how to release the
    # tensors which have been registered?").
    Kind("buffer_registered_every_forward",
         "https://github.com/pclucas14/AML/issues/1",
         "held by your session",
         # A module that registers each forward's features as a new non-persistent buffer
         # (`feat_0`, `feat_1`, ...): the module's buffer registry grows with every call. The
         # inputs are released from the cache.
         ("class FeatureCache(torch.nn.Module):\n"
          "    def __init__(self, width):\n"
          "        super().__init__()\n"
          "        self.proj = torch.nn.Linear(width, width, device='cuda')\n"
          "        self.calls = 0\n"
          "    def forward(self, x):\n"
          "        h = self.proj(x)\n"
          "        self.register_buffer(f'feat_{self.calls}', h, persistent=False)\n"
          "        self.calls += 1\n"
          "        return h[:1].sum()\n"
          "width = 4096\n"
          "model = FeatureCache(width)\n"
          "with torch.no_grad():\n"
          "    for _ in range(5):\n"
          "        model(torch.randn(frac(0.08) // (4 * width), width, device='cuda'))\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (del_step("model"),),
         written=WRITTEN6),
    # Non-reentrant checkpointing: "the unpack function is actually saved on the graph, and
    # since unpack references variables in the enclosing scope, those are kept alive as well".
    Kind("checkpoint_outputs_kept_for_later_backward",
         "https://github.com/pytorch/pytorch/issues/81296",
         "held by your session",
         # Micro-batches through torch.utils.checkpoint (use_reentrant=False), their outputs
         # kept in a list for one backward later: each output's graph keeps checkpoint's
         # recomputation closure, which keeps that micro-batch's input (named by nothing else).
         # The blocks' intermediates are released from the cache.
         ("from torch.utils.checkpoint import checkpoint\n"
          "width = 4096\n"
          "block = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),\n"
          "                            torch.nn.Linear(width, width)).cuda()\n"
          "rows = frac(0.08) // (4 * width)\n"
          "outs = []\n"
          "for micro in range(3):\n"
          "    x = torch.randn(rows, width, device='cuda')\n"
          "    outs.append(checkpoint(block, x, use_reentrant=False))\n"
          "del x\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (del_step("outs"),),
         written=WRITTEN6),
    # ---- containers and iterators of the standard library and numpy -----------------------
    # Users keep torch tensors in numpy object arrays (dtype=object) for their indexing.
    Kind("object_array_row_view_keeps_grid",
         "https://github.com/pytorch/pytorch/issues/85606",
         "held by your session",
         # A 4x3 numpy object array of CUDA patches; `row = grid[2]` is a view, so after
         # `del grid` the row's `.base` still holds the whole grid and its 12 tensors.
         ("import numpy as np\n"
          "grid = np.empty((4, 3), dtype=object)\n"
          "for i in range(4):\n"
          "    for j in range(3):\n"
          "        grid[i, j] = torch.empty(frac(0.035), dtype=torch.uint8, device='cuda')\n"
          "row = grid[2]\n"
          "del grid",),
         FAIL6,
         (del_step("row"),),
         needs="numpy", written=WRITTEN6),
    # Iterating on a zip keeps objects alive longer than expected.
    Kind("zip_iterator_keeps_deleted_lists",
         "https://github.com/python/cpython/issues/86702",
         "held by your session",
         # A partly consumed `pairs = zip(inputs, targets)`: after `del inputs, targets` the zip
         # holds the two list iterators, which hold the lists (and the zip's reused result tuple
         # the last pair).
         ("inputs = [torch.empty(frac(0.06), dtype=torch.uint8, device='cuda') for _ in "
          "range(5)]\n"
          "targets = [torch.empty(frac(0.02), dtype=torch.uint8, device='cuda') for _ in "
          "range(5)]\n"
          "pairs = zip(inputs, targets)\n"
          "for step, (x, y) in zip(range(2), pairs):\n"
          "    n = x.numel() + y.numel()\n"
          "del inputs, targets, x, y",),
         FAIL6,
         (del_step("pairs"),),
         written=WRITTEN6),
    # A @contextmanager's exit code runs only when its generator resumes; composite with
    # contextlib.ExitStack, which keeps the entered managers (and its callbacks' arguments)
    # until it is closed.
    Kind("exitstack_open_contextmanagers",
         "https://github.com/jonasoh/spiro/pull/31",
         "held by your session",
         # An ExitStack opened in one cell to keep two scratch workspaces "entered" across
         # cells, plus a callback that would release staging buffers: never closed. Each
         # workspace lives in its suspended generator's frame, the staging list in the
         # callback's arguments.
         ("import contextlib\n"
          "@contextlib.contextmanager\n"
          "def scratch(nbytes):\n"
          "    buf = torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "    try:\n"
          "        yield buf.numel()\n"
          "    finally:\n"
          "        del buf\n"
          "def release(pool):\n"
          "    pool.clear()\n"
          "stack = contextlib.ExitStack()\n"
          "sizes = [stack.enter_context(scratch(frac(0.12))) for _ in range(2)]\n"
          "staging = [torch.empty(frac(0.08), dtype=torch.uint8, device='cuda') for _ in "
          "range(2)]\n"
          "stack.callback(release, staging)\n"
          "del staging",),
         FAIL6,
         (Step("stack", "who:stack",
               "try:\n"
               "    stack.close()\n"
               "except NameError:\n"
               "    pass"),),
         written=WRITTEN6),
    # ---- closures and classes -----------------------------------------------------------------
    # A class defined inside a function is in reference cycles of its own (composite with a
    # method's closure over the function's tensor).
    Kind("factory_class_closure_keeps_table",
         "https://github.com/python/cpython/issues/84472",
         "held by your session",
         # A model factory that defines its module class inside the function: the class's
         # forward closes over the factory's table, so the table is reached from `head` only
         # through type(head).forward's closure. The class is a cycle: `del head` frees the
         # table only at the next collection.
         ("def make_head(table):\n"
          "    class Head(torch.nn.Module):\n"
          "        def forward(self, x):\n"
          "            return x + table[: x.shape[-1]].float()\n"
          "    return Head()\n"
          "head = make_head(torch.empty(frac(0.45), dtype=torch.uint8, device='cuda'))",),
         FAIL6,
         (del_step("head", collect=True),),
         written=WRITTEN6),
    # ---- control: AMP ------------------------------------------------------------------------
    # Under autocast the logits are half precision, and the float32 copy that the loss makes
    # is a second, twice as large spike in the forward.
    Kind("autocast_cross_entropy_fp32_working_set",
         "https://github.com/karpathy/autoresearch/pull/16",
         "working set",
         # A mixed-precision step (autocast + GradScaler) over a 32k vocabulary: the float16
         # logits take 45% of the card and cross_entropy, on autocast's float32 list, upcasts
         # them (90%). The hidden states and the head are small; nothing stale is held.
         ("import torch.nn.functional as F\n"
          "vocab, dim = 32768, 256\n"
          "rows = frac(0.45) // (2 * vocab)\n"
          "head = torch.nn.Linear(dim, vocab, bias=False, device='cuda')\n"
          "opt = torch.optim.SGD(head.parameters(), lr=1e-3)\n"
          "scaler = torch.amp.GradScaler('cuda')\n"
          "hidden = torch.randn(rows, dim, device='cuda')\n"
          "targets = torch.randint(0, vocab, (rows,), device='cuda')\n"
          "def train_step(hidden, targets):\n"
          "    with torch.autocast('cuda', dtype=torch.float16):\n"
          "        logits = head(hidden)\n"
          "        loss = F.cross_entropy(logits, targets)\n"
          "    scaler.scale(loss).backward()\n"
          "    scaler.step(opt)\n"
          "    scaler.update()\n"
          "    opt.zero_grad(set_to_none=True)\n"
          "    return loss.item()",),
         "loss = train_step(hidden, targets)",
         (TB6,),
         written=WRITTEN6),
    # ---- reference cycles left to the collector ----------------------------------------------
    # Classes made at run time are in reference cycles; repeatedly created models are freed
    # only by the collector.
    Kind("dynamic_config_classes_in_loop",
         "https://github.com/pydantic/pydantic/issues/11958",
         "garbage in reference cycles",
         # A sweep that makes a config class per trial with type(), a positional table among
         # its class attributes: every replaced class is a cycle (its __mro__, its __dict__'s
         # descriptors) and keeps its table until the collector runs; the card fills first.
         # Only the last class is named (`cfg`).
         ("def make_trial_config(lr, nbytes):\n"
          "    return type('TrialConfig', (), {\n"
          "        'lr': lr,\n"
          "        'pos_table': torch.empty(nbytes, dtype=torch.uint8, device='cuda')})",),
         "for trial in range(1000):\n"
         "    cfg = make_trial_config(1e-3 * (trial + 1), frac(0.08))",
         (GC6, del_step("cfg", collect=True)),
         written=WRITTEN6),
    # ---- outlive `%reset`: torch's own module state, sys.modules, a live thread, a signal
    # handler ------------------------------------------------------------------------------
    # Global module hooks (torch.nn.modules.module.register_module_forward_hook), added "for
    # plotting or tracing & debugging" every module's calls.
    Kind("global_forward_hook_records_outputs",
         "https://github.com/pytorch/pytorch/pull/38972",
         "held by your session",
         # A debugging recorder registered as a *global* forward hook: it lives in torch's
         # module-level `_global_forward_hooks`, its closure keeps every Probe output. The
         # notebook names only the handle (`recorder`), which deleting does not remove. The
         # inputs are released from the cache. Its step removes the hook by its function's
         # name (whatever the advice did with the handle).
         ("import torch.nn.modules.module as nn_module\n"
          "def attach_recorder():\n"
          "    captured = []\n"
          "    def record(module, inputs, output):\n"
          "        if type(module).__name__ == 'Probe':\n"
          "            captured.append(output.detach())\n"
          "    return nn_module.register_module_forward_hook(record)\n"
          "class Probe(torch.nn.Module):\n"
          "    def __init__(self, width):\n"
          "        super().__init__()\n"
          "        self.proj = torch.nn.Linear(width, width, device='cuda')\n"
          "    def forward(self, x):\n"
          "        return self.proj(x)\n"
          "recorder = attach_recorder()\n"
          "width = 4096\n"
          "probe = Probe(width)\n"
          "with torch.no_grad():\n"
          "    for _ in range(5):\n"
          "        probe(torch.randn(frac(0.08) // (4 * width), width, device='cuda'))\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (Step("recorder", "who:recorder",
               "import torch.nn.modules.module as _nn_module\n"
               "def _drop_global_hooks(fn_name):\n"
               "    hooks = _nn_module._global_forward_hooks\n"
               "    for key, fn in list(hooks.items()):\n"
               "        if getattr(fn, '__name__', '') == fn_name:\n"
               "            del hooks[key]\n"
               "_drop_global_hooks('record')"),),
         written=WRITTEN6),
    # A web UI's pipelines kept in the globals of a `global_obj` utility module, imported by
    # the scripts that used them.
    Kind("package_sibling_module_state",
         "https://github.com/nod-ai/AMD-SHARK-Studio/pull/1194",
         "held by your session",
         # A helper package written next to the notebook: `gm_trainlib.loop.warm_up` stores each
         # loaded component in `gm_trainlib.state.PIPELINE`, a sibling module the notebook never
         # imported by name. The notebook names only the function `warm_up`.
         ("import importlib\nimport pathlib\nimport sys\nimport tempfile\n"
          "pkg_root = tempfile.mkdtemp(prefix='gm_pkg_')\n"
          "pkg_dir = pathlib.Path(pkg_root, 'gm_trainlib')\n"
          "pkg_dir.mkdir()\n"
          "(pkg_dir / '__init__.py').write_text('')\n"
          "(pkg_dir / 'state.py').write_text('PIPELINE = {}\\n')\n"
          "(pkg_dir / 'loop.py').write_text(\n"
          "    'import torch\\n'\n"
          "    'from . import state\\n'\n"
          "    'def warm_up(name, nbytes):\\n'\n"
          "    '    state.PIPELINE[name] = torch.empty(nbytes, dtype=torch.uint8, "
          "device=\"cuda\")\\n'\n"
          "    '    return len(state.PIPELINE)\\n')\n"
          "sys.path.insert(0, pkg_root)\n"
          "importlib.invalidate_caches()",
          "from gm_trainlib.loop import warm_up\n"
          "for name in ('unet', 'vae', 'text_encoder', 'controlnet'):\n"
          "    n_loaded = warm_up(name, frac(0.1))"),
         FAIL6,
         (Step("gm_trainlib.state.PIPELINE", "who:warm_up",
               "import sys\nsys.modules['gm_trainlib.state'].PIPELINE.clear()"),),
         written=WRITTEN6),
    # When models were refreshed on a schedule, the old thread (and thus the old models) were
    # not killed and removed from memory.
    Kind("thread_subclass_attributes_after_del",
         "https://github.com/vc1492a/henosis/issues/20",
         "held by your session",
         # A threading.Thread subclass that keeps its models as attributes (`self.models`) and
         # waits to refresh them: `del refresher` leaves the Thread object alive in threading's
         # registry of running threads. It ends by itself after 90 s; its step stops it by name.
         ("import threading\n"
          "class ModelRefresher(threading.Thread):\n"
          "    def __init__(self, nbytes):\n"
          "        super().__init__(name='model-refresher', daemon=True)\n"
          "        self.models = [torch.empty(nbytes, dtype=torch.uint8, device='cuda')\n"
          "                       for _ in range(3)]\n"
          "        self.stop_event = threading.Event()\n"
          "    def run(self):\n"
          "        self.stop_event.wait(90)\n"
          "refresher = ModelRefresher(frac(0.14))\n"
          "refresher.start()\n"
          "del refresher",),
         FAIL6,
         (Step("thread 'model-refresher'", "who:refresher",
               "import threading\n"
               "def _stop_thread(name):\n"
               "    for th in threading.enumerate():\n"
               "        if th.name == name:\n"
               "            th.stop_event.set()\n"
               "            th.join(30)\n"
               "            th.models.clear()\n"
               "_stop_thread('model-refresher')"),),
         written=WRITTEN6),
    # Saving the last checkpoint on SIGTERM (preemption) with a signal handler; composite with
    # a handler that is a functools.partial over a snapshot of the weights.
    Kind("sigterm_handler_partial_keeps_snapshot",
         "https://github.com/blue-oil/blueoil/pull/348",
         "held by your session",
         # A preemption handler installed with signal.signal(SIGTERM, partial(save, snapshot=
         # ...)): the snapshot (GPU clones of the weights, made inside a helper) is held by the
         # signal module's handler table and by nothing the notebook names. The model itself is
         # also named. Its step puts the default handler back.
         ("import functools\n"
          "import signal\n"
          "def save_on_preempt(signum, frame, snapshot, path):\n"
          "    torch.save(snapshot, path)\n"
          "def install_preemption_handler(model, path):\n"
          "    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}\n"
          "    signal.signal(signal.SIGTERM, functools.partial(save_on_preempt, "
          "snapshot=snapshot,\n"
          "                                                    path=path))\n"
          "width = int((frac(0.05) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(3)])\n"
          "install_preemption_handler(model, '/tmp/gm_preempt.pt')",),
         FAIL6,
         (Step("signal.SIGTERM handler", "none",
               "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)"),
          del_step("model")),
         written=WRITTEN6),
    # ---- last: a cycle inside autograd's C++ graph (leaks if the model goes first) ----------
    # backward(create_graph=True): "the reference cycle is x -> x.grad -> x.grad.grad_fn ->
    # x", in C++, where Python's collector cannot break it.
    Kind("create_graph_backward_grad_cycle",
         "https://github.com/pytorch/pytorch/issues/7343",
         "held by your session",
         # A gradient-penalty style `loss.backward(create_graph=True)`: each parameter's .grad
         # has a graph that leads back to the parameter. The model is named; its gradients
         # (as large as its weights) go with `zero_grad(set_to_none=True)`, and only that
         # breaks the cycle; `del model` first leaks both. The backward's temporaries are
         # released from the cache.
         ("width = int((frac(0.03) / 4) ** 0.5)\n"
          "model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False, "
          "device='cuda')\n"
          "                              for _ in range(4)])\n"
          "x = torch.randn(8, width, device='cuda')\n"
          "loss = model(x).square().mean()\n"
          "loss.backward(create_graph=True)\n"
          "del loss, x\n"
          "torch.cuda.empty_cache()",),
         FAIL6,
         (Step("model.grad", "who:model",
               "try:\n"
               "    model.zero_grad(set_to_none=True)\n"
               "except NameError:\n"
               "    pass"),
          del_step("model", collect=True)),
         written=WRITTEN6),
]
