"""Who holds memory: tensors reachable from the user's namespace, the output cache and the
last traceback, each attributed once, largest first.

Runs only on demand and on the main thread (it walks user objects, which may change under a
background thread). torch is looked up in ``sys.modules`` and never imported: without torch
there are no tensors, and numpy-like arrays are still reported as host memory.

Attribution order decides whose name a shared tensor gets: a user variable first (deleting it
is what frees the memory), then the output cache, then the stored traceback, then anything
found only through the garbage collector.
"""

from __future__ import annotations

import gc
import re
import sys
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .analysis import GRAPH_NOTE
from .model import Holder

# Names IPython keeps in the user namespace for its own bookkeeping.
_IPYTHON_NAMES = {"In", "Out", "_ih", "_oh", "_dh", "_ii", "_iii", "_i", "exit", "quit",
                  "get_ipython", "__builtin__", "__builtins__", "__name__", "__doc__",
                  "__loader__", "__spec__", "__package__"}
_OUTPUT_ALIAS = re.compile(r"^(_|__|___|_\d+)$")
_INPUT_ALIAS = re.compile(r"^_i\d*$|^_ii+$")
_ATOMS = (int, float, complex, str, bytes, bool, type(None), types.ModuleType, types.FunctionType,
          type)
_ATOM_TYPES = frozenset(_ATOMS)
_CONTAINER_DEPTH = 2


@dataclass
class _Found:
    name: str
    kind: str
    device: str
    nbytes: int = 0
    tensors: int = 0
    details: list[str] = field(default_factory=list)


class Scanner:
    def __init__(self, modules: Mapping[str, Any] | None = None) -> None:
        mods = sys.modules if modules is None else modules
        torch = mods.get("torch")
        self._tensor_type: Any = getattr(torch, "Tensor", None) if torch else None
        nn = getattr(torch, "nn", None) if torch else None
        optim = getattr(torch, "optim", None) if torch else None
        self._module_type: Any = getattr(nn, "Module", None) if nn else None
        self._optimizer_type: Any = getattr(optim, "Optimizer", None) if optim else None
        self._seen: set[tuple[str, int]] = set()

    # -- single objects ----------------------------------------------------------------------
    def _tensor_info(self, t: Any) -> tuple[str, int, tuple[str, int]] | None:
        """(device, bytes, storage key) of a tensor, or of a numpy/cupy-like array."""
        if self._tensor_type is not None and isinstance(t, self._tensor_type):
            dev = t.device
            device = f"{dev.type}:{dev.index}" if dev.index is not None else str(dev.type)
            try:
                storage = t.untyped_storage()
                return device, int(storage.nbytes()), (device, int(storage.data_ptr()))
            except Exception:
                n = int(t.element_size() * t.nelement())
                return device, n, (device, id(t))
        nbytes = getattr(type(t), "nbytes", None)
        if nbytes is not None and hasattr(t, "shape") and hasattr(t, "dtype"):
            try:
                n = int(t.nbytes)
            except Exception:
                return None
            device = "cuda" if hasattr(t, "__cuda_array_interface__") else "cpu"
            base = getattr(t, "base", None)
            return device, n, (device, id(base if base is not None else t))
        return None

    def _tensors_in(self, obj: Any, depth: int) -> Iterator[Any]:
        """Tensors inside obj: modules, optimizers and containers, ``depth`` levels down."""
        if isinstance(obj, _ATOMS):
            return
        if self._tensor_info(obj) is not None:
            yield obj
            # Only leaves have a .grad; asking a non-leaf makes torch warn.
            if self._tensor_type is not None and getattr(obj, "is_leaf", False):
                grad = getattr(obj, "grad", None)
                if grad is not None and self._tensor_info(grad) is not None:
                    yield grad
            return
        if self._module_type is not None and isinstance(obj, self._module_type):
            for p in obj.parameters():
                yield p
                if getattr(p, "grad", None) is not None:
                    yield p.grad
            yield from obj.buffers()
            return
        if self._optimizer_type is not None and isinstance(obj, self._optimizer_type):
            for state in obj.state.values():
                for v in state.values():
                    if self._tensor_info(v) is not None:
                        yield v
            return
        if depth <= 0:
            return
        if isinstance(obj, dict):
            items: Iterable[Any] = obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = obj
        else:
            return
        for item in items:
            # An exact-type set lookup first: containers of plain numbers and strings (the
            # common million-element case) cost one hash probe per item.
            if type(item) not in _ATOM_TYPES and not isinstance(item, _ATOMS):
                yield from self._tensors_in(item, depth - 1)

    def _kind_of(self, obj: Any) -> str:
        if self._module_type is not None and isinstance(obj, self._module_type):
            return "module"
        if self._optimizer_type is not None and isinstance(obj, self._optimizer_type):
            return "optimizer state"
        if isinstance(obj, (dict, list, tuple, set, frozenset)):
            return "container"
        return "variable"

    def _attribute(self, name: str, kind: str, obj: Any, out: dict[str, _Found]) -> None:
        for t in self._tensors_in(obj, _CONTAINER_DEPTH):
            info = self._tensor_info(t)
            if info is None:
                continue
            device, nbytes, key = info
            if key in self._seen:
                continue
            self._seen.add(key)
            slot = f"{name}\0{device}"
            f = out.get(slot)
            if f is None:
                f = out[slot] = _Found(name=name, kind=kind, device=device)
            f.nbytes += nbytes
            f.tensors += 1
            detail = self._describe(t)
            if f.tensors == 1 or (GRAPH_NOTE in detail and not any(
                    GRAPH_NOTE in d for d in f.details)):
                f.details.append(detail)

    def _describe(self, t: Any) -> str:
        shape = tuple(getattr(t, "shape", ()))
        dtype = str(getattr(t, "dtype", "")).replace("torch.", "")
        text = f"{dtype}{list(shape)}"
        grad_fn = getattr(t, "grad_fn", None) if self._tensor_type is not None else None
        if grad_fn is not None:
            text += f", grad_fn={type(grad_fn).__name__} ({GRAPH_NOTE})"
        return text

    # -- whole scans -------------------------------------------------------------------------
    def scan(self, *args: Any, **kwargs: Any) -> list[Holder]:
        """See ``_scan``. Looking at user objects must never print: library warnings that
        mere inspection can trigger are silenced for the duration."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._scan(*args, **kwargs)

    def _scan(
        self,
        user_ns: Mapping[str, Any],
        *,
        output_cache: Mapping[int, Any] | None = None,
        last_exception: Iterable[BaseException | types.TracebackType | None] = (),
        include_gc: bool = False,
    ) -> list[Holder]:
        self._seen.clear()
        found: dict[str, _Found] = {}
        aliases: dict[int, list[str]] = {}
        for name, obj in list(user_ns.items()):
            if _OUTPUT_ALIAS.match(name):
                aliases.setdefault(id(obj), []).append(name)
                continue
            if type(obj) in _ATOM_TYPES or name in _IPYTHON_NAMES or name.startswith("__") \
                    or _INPUT_ALIAS.match(name):
                continue
            self._attribute(name, self._kind_of(obj), obj, found)
        for n, obj in sorted((output_cache or {}).items()):
            label = f"Out[{n}]"
            also = [a for a in aliases.pop(id(obj), []) if a != f"_{n}"]
            if also:
                label += f" (also {', '.join(sorted(also))})"
            self._attribute(label, "output cache", obj, found)
        for names in aliases.values():  # `_` and friends pointing outside Out (rare)
            obj = user_ns.get(names[0])
            self._attribute(" / ".join(sorted(names)), "output cache", obj, found)
        for tb_name, frame_obj in _frames(last_exception):
            self._attribute(tb_name, "traceback", frame_obj, found)
        if include_gc:
            for obj in gc.get_objects():
                if type(obj) not in _ATOM_TYPES and self._tensor_info(obj) is not None:
                    self._attribute("unreachable from your variables", "gc", obj, found)
        holders = [
            Holder(name=f.name, kind=f.kind, device=f.device, nbytes=f.nbytes,
                   detail=_summarize(f))
            for f in found.values()
        ]
        return sorted(holders, key=lambda h: (-h.nbytes, h.name))


def _summarize(f: _Found) -> str:
    if f.tensors == 1:
        return f.details[0]
    graph = next((d for d in f.details if GRAPH_NOTE in d), "")
    return f"{f.tensors} tensors" + (f"; one has {graph.split(', ', 1)[-1]}" if graph else "")


def _frames(
    objs: Iterable[BaseException | types.TracebackType | None],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each frame's locals kept alive by a stored exception, labelled for the user."""
    seen: set[int] = set()
    for obj in objs:
        tb = obj.__traceback__ if isinstance(obj, BaseException) else obj
        while tb is not None:
            frame = tb.tb_frame
            if id(frame) not in seen:
                seen.add(id(frame))
                code = frame.f_code
                # A cell's own frame is module level: its "locals" are the user namespace,
                # which is attributed to the variables themselves.
                if code.co_name != "<module>":
                    yield f"traceback: {code.co_name}() locals", dict(frame.f_locals)
            tb = tb.tb_next


def last_exception_objects(shell: Any = None) -> list[Any]:
    """What keeps the last uncaught exception, and so its frames, alive.

    The interpreter's ``sys.last_*``, IPython's record of the last cell's result (which holds
    the exception in ``error_in_exec``) and its traceback formatter's ``tb``.
    """
    objs = [getattr(sys, name, None) for name in ("last_exc", "last_value", "last_traceback")]
    result = getattr(shell, "last_execution_result", None)
    objs.append(getattr(result, "error_in_exec", None))
    # IPython's traceback formatter keeps the last traceback for %debug.
    objs.append(getattr(getattr(shell, "InteractiveTB", None), "tb", None))
    return objs


def cuda_bytes(holders: Iterable[Holder]) -> int:
    return sum(h.nbytes for h in holders if h.device.startswith("cuda"))
