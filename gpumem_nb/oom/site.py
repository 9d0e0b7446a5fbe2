"""Where it failed, from the traceback's frames: the module that was running (its path from a
user variable and its class, as TraceML names the layer), whether a backward or a
``generate()`` was running, the KV cache generation was filling, and checkpointing.

Only finished frames are read (the exception has unwound them; a live frame's ``f_locals``
would keep a snapshot of its locals, ``holders.frame_is_live``). Modules are found through
their own ``__dict__['_modules']`` read by the C descriptor, never by calling the user's
code. Nothing here imports torch: its types are looked up in ``sys.modules``.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..graph import GraphWalker
from ..holders import (
    Scanner,
    exception_chain,
    frame_is_live,
    frames_of,
    is_function_frame,
    running_frame_ids,
    traceback_links,
    type_name,
)
from ..holders.tensors import instance_dict, own_item
from ..model import Holder
from ..units import format_bytes
from .causes import KIND_RUNNING

__all__ = ["CacheUse", "FailureSite", "failure_site", "mark_running", "module_paths"]

_MODULE_CAP = 50_000  # modules indexed for their paths
_BUDGET_S = 0.02  # for the whole site: module paths, the cache, the backward's graph
_GENERATE_NAMES = frozenset(("generate", "_sample", "_beam_search", "_assisted_decoding",
                             "_contrastive_search", "_greedy_search", "_prefill"))


@dataclass(frozen=True)
class CacheUse:
    """The KV cache a ``generate()`` was filling, at the failure."""

    name: str  # "traceback: generate() locals → model_kwargs['past_key_values'] (DynamicCache)"
    nbytes: int
    tokens: int | None  # its sequence length (keys' dimension -2)
    per_token_bytes: int | None  # what one more generated token adds, for this batch
    # A static cache (StaticCache, sliding-window and hybrid ones) is allocated up front for its
    # whole length: its bytes are per token of that length, and generating does not grow it.
    preallocated: bool = False


@dataclass(frozen=True)
class FailureSite:
    module: str = ""  # "model.transformer.h.7.attn (GPT2Attention)"
    in_backward: bool = False
    in_generate: bool = False
    checkpoint_frames: int = 0  # frames in torch.utils.checkpoint
    checkpoint_nodes: int = 0  # checkpoint nodes in the running backward's graph
    whole_model_checkpoint: bool = False
    running: tuple[str, ...] = ()  # holders that are the running backward's root or inputs
    running_bytes: int = 0
    cache: CacheUse | None = None

    def lines(self) -> list[str]:
        out = []
        if self.module:
            what = " (in a backward pass)" if self.in_backward else ""
            out.append(f"Where it failed: {self.module}{what}.")
        if self.running:
            out.append(f"The running backward's own root and inputs ({', '.join(self.running)}: "
                       f"{format_bytes(self.running_bytes)}) are part of the computation, "
                       "not memory to let go of.")
        if self.whole_model_checkpoint:
            out.append("One checkpoint wraps the whole model: its backward recomputes every "
                       "layer's activations at once, so checkpointing saves nothing at the "
                       "peak.")
        if self.cache is not None:
            c = self.cache
            if c.preallocated:
                per = (f" ({format_bytes(c.per_token_bytes)} per token of that length)"
                       if c.per_token_bytes else "")
                length = f" for {c.tokens} tokens" if c.tokens else ""
                out.append(f"The KV cache {c.name} held {format_bytes(c.nbytes)}, allocated "
                           f"up front{length}{per}: generating does not grow it.")
            else:
                grow = (f", growing {format_bytes(c.per_token_bytes)} per generated token"
                        if c.per_token_bytes else "")
                at = f" at {c.tokens} tokens" if c.tokens else ""
                out.append(f"The KV cache {c.name} held {format_bytes(c.nbytes)}{at}{grow}.")
        return out


def _code_is(code: types.CodeType, tail: str, names: Sequence[str]) -> bool:
    return code.co_name in names and code.co_filename.replace("\\", "/").endswith(tail)


def _dict_of(obj: object) -> dict[object, object] | None:
    """An instance's ``__dict__`` through its class's C descriptor: no user code runs
    (``object.__getattribute__`` ran a subclass's ``__dict__`` property)."""
    return instance_dict(obj)


def module_paths(user_ns: Mapping[object, object], module_type: type | None,
                 deadline: float) -> dict[int, str]:
    """id(module) -> "model.transformer.h.7.attn", from each user variable that is a module."""
    paths: dict[int, str] = {}
    if module_type is None:
        return paths
    stack: list[tuple[str, object]] = []
    for name, obj in list(user_ns.items()):
        # Exact strs: a str subclass's `startswith` or `__format__` is its own code (A4).
        if type(name) is str and not name.startswith("_"):
            try:
                if issubclass(type(obj), module_type):
                    stack.append((name, obj))
            except Exception:
                continue
    while stack and len(paths) < _MODULE_CAP and time.perf_counter() < deadline:
        path, mod = stack.pop()
        if id(mod) in paths:
            continue
        paths[id(mod)] = path
        d = _dict_of(mod)
        children = own_item(d, "_modules") if d is not None else None
        if type(children) is dict:
            for key, child in reversed(list(children.items())):
                if child is not None and type(key) is str:
                    stack.append((f"{path}.{key}", child))
    return paths


def failure_site(exc: BaseException, user_ns: Mapping[object, object], *,
                 modules: Mapping[str, types.ModuleType] | None = None,
                 holders: Sequence[Holder] = ()) -> FailureSite:
    """Read the failure's frames. Never raises; an unreadable frame is skipped."""
    try:
        return _failure_site(exc, user_ns, sys.modules if modules is None else modules,
                             holders)
    except Exception:
        return FailureSite()


def _failure_site(exc: BaseException, user_ns: Mapping[object, object],
                  mods: Mapping[str, types.ModuleType], holders: Sequence[Holder]) -> FailureSite:
    deadline = time.perf_counter() + _BUDGET_S
    torch = mods.get("torch")
    nn = getattr(torch, "nn", None) if torch is not None else None
    module_type = getattr(nn, "Module", None) if nn is not None else None
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    links = traceback_links(exception_chain(exc))
    running_ids = running_frame_ids()
    frames = [(frame, tbs) for frame, tbs in frames_of(links).values()]
    in_backward = in_generate = False
    checkpoint = 0
    root: object = None
    innermost: object = None
    cache: CacheUse | None = None
    for frame, tbs in frames:
        code = frame.f_code
        file = code.co_filename.replace("\\", "/")
        if _code_is(code, "torch/_tensor.py", ("backward",)) or _code_is(
                code, "torch/autograd/__init__.py", ("backward", "grad")) or \
                code.co_name == "_engine_run_backward":
            in_backward = True
        if code.co_name in _GENERATE_NAMES and "generation" in file:
            in_generate = True
        if file.endswith("torch/utils/checkpoint.py"):
            checkpoint += 1
        if not is_function_frame(frame) or frame_is_live(frame, running_ids, tbs):
            continue
        try:
            local = dict(frame.f_locals)
        except Exception:
            continue
        me = local.get("self")
        if _code_is(code, "torch/_tensor.py", ("backward",)) and root is None:
            root = me
        if module_type is not None and me is not None:
            try:
                if issubclass(type(me), module_type):
                    innermost = me
            except Exception:
                pass
        if in_generate and cache is None:
            cache = _cache_in(local, f"traceback: {code.co_name}() locals", mods, deadline)
    module = ""
    if innermost is not None:
        paths = module_paths(user_ns, module_type, deadline)
        cls = type_name(type(innermost))
        module = f"{paths[id(innermost)]} ({cls})" if id(innermost) in paths else f"a {cls}"
    site = FailureSite(module=module, in_backward=in_backward, in_generate=in_generate,
                       checkpoint_frames=checkpoint, cache=cache)
    if in_backward and root is not None and tensor_type is not None:
        site = _backward_inputs(site, root, user_ns, holders, mods, tensor_type)
    return site


def _cache_in(local: Mapping[str, object], where: str, mods: Mapping[str, types.ModuleType],
              deadline: float) -> CacheUse | None:
    """The first object whose class is a ``…Cache`` among a frame's locals or one dict down
    (``model_kwargs['past_key_values']``), sized by the holder walk."""
    candidates: list[tuple[str, object]] = []
    for name, value in local.items():
        if type_name(type(value)).endswith("Cache"):
            candidates.append((name, value))
        elif type(value) is dict:
            candidates += [(f"{name}[{k!r}]", v) for k, v in list(value.items())
                           if type(k) is str and type_name(type(v)).endswith("Cache")]
    for path, obj in candidates:
        if time.perf_counter() > deadline:
            return None
        scanner = Scanner(mods)
        found = scanner.scan({"cache": obj})
        nbytes = sum(h.nbytes for h in found if h.device.startswith("cuda"))
        if not nbytes:
            continue
        tokens, per = _tokens(obj, scanner, mods)
        return CacheUse(name=f"{where} → {path} ({type_name(type(obj))})", nbytes=nbytes,
                        tokens=tokens, per_token_bytes=per, preallocated=_preallocated(obj))
    return None


# transformers' caches whose tensors are allocated for their whole length at the start:
# StaticCache and its sliding-window and hybrid kin, or (transformers >= 4.56) a cache built
# of such layers. DynamicSlidingWindowLayer grows up to its window, so it is not one.
_STATIC_CACHE_WORDS = ("Static", "Hybrid", "SlidingWindowCache")
_STATIC_LAYERS = ("StaticLayer", "SlidingWindowLayer", "ChunkedSlidingLayer",
                  "StaticSlidingWindowLayer")


def _preallocated(cache: object) -> bool:
    """Whether a cache is a static one, by its class's name or its layers' (read through the
    instance's own dict: no user code runs)."""
    name = type_name(type(cache)).rsplit(".", 1)[-1]
    if any(w in name for w in _STATIC_CACHE_WORDS):
        return True
    layers = own_item(_dict_of(cache) or {}, "layers")
    if type(layers) is not list or not layers:
        return False
    names = {type_name(type(layer)).rsplit(".", 1)[-1] for layer in layers[:512]}
    return all(n in _STATIC_LAYERS or n.startswith("Static") for n in names)


def _tokens(cache: object, scanner: Scanner, mods: Mapping[str, types.ModuleType]
            ) -> tuple[int | None, int | None]:
    """The cache's sequence length (the largest dimension -2 of its 4-D tensors: batch, heads,
    tokens, head size) and what one more token adds to it: each tensor's bytes over its own
    length, summed. Dividing the total by the longest length under-counted: an OOM inside a
    step finds the first layers one token longer than the rest (H200, GPT-2: 47.89 MiB said for
    48.00 MiB)."""
    best = None
    per = 0
    seen: set[tuple[str, int]] = set()
    for t, _ in scanner.tensors_of(cache):
        try:
            # Read as the walk reads a tensor: no subclass's property or __torch_function__.
            shape = scanner.shape_of(t) or ()
            if len(shape) != 4 or type(shape[-2]) is not int or shape[-2] <= 0:
                continue
            length = shape[-2]
            info = scanner._tensor_info(t)
            if info is None or not info[0].startswith("cuda") or info[2] in seen:
                continue
            seen.add(info[2])
            # the tensor's own elements, not a larger storage it may view
            own = scanner.own_bytes(t)
            nbytes = own if own is not None else info[1]
            best = max(best or 0, length)
            per += nbytes // length
        except Exception:
            continue
    return best, (per or None)


def _backward_inputs(site: FailureSite, root: object, user_ns: Mapping[object, object],
                     holders: Sequence[Holder], mods: Mapping[str, types.ModuleType],
                     tensor_type: object) -> FailureSite:
    """The user's variables that are the running backward's root or that its graph saved
    (or holds as a leaf): the computation's inputs, never advised away."""
    scanner = Scanner(mods)
    info = scanner._tensor_info(root)
    keys: set[tuple[str, int]] = set()
    if info is not None:
        keys.add(info[2])
    grad_fn = scanner._grad_fn(root)  # torch.Tensor's own getter: no subclass code runs
    checkpoint_nodes = 0
    walked: set[int] = set()
    if grad_fn is not None:
        # Only the graph's keys are wanted here: whose its leaves are is not asked.
        walker = GraphWalker(scanner._tensor_info, set(), budget_s=0.01, judge_leaves=False)
        walker.size([grad_fn])
        keys |= walker.seen | walker._leaves
        checkpoint_nodes = sum(1 for n in walker._held if "Checkpoint" in type(n).__name__)
        walked = {id(n) for n in walker._held}
    names = {h.name for h in holders if h.kind == "variable"}
    running: list[str] = []
    total = 0
    for name in sorted(names):
        value = user_ns.get(name)
        vi = scanner._tensor_info(value) if value is not None else None
        # The root, a tensor the graph saved or holds as a leaf, or an output whose own
        # node is in the graph being run (``y`` of ``y.sum().backward()``).
        node = scanner._grad_fn(value) if vi is not None else None
        if value is root or (vi is not None and vi[2] in keys) or (
                node is not None and id(node) in walked):
            running.append(name)
            total += sum(h.held_bytes for h in holders if h.name == name)
    # One checkpoint node and hardly any other nodes: the checkpoint wraps the whole model.
    whole = checkpoint_nodes == 1 and grad_fn is not None and walker.nodes <= 16
    return replace(site, running=tuple(running), running_bytes=total,
                   checkpoint_nodes=checkpoint_nodes, whole_model_checkpoint=whole)


def mark_running(holders: Sequence[Holder], site: FailureSite) -> tuple[Holder, ...]:
    """The holders, with the running backward's root and inputs marked as the computation."""
    if not site.running:
        return tuple(holders)
    running = set(site.running)
    return tuple(replace(h, kind=KIND_RUNNING) if h.name in running else h for h in holders)
