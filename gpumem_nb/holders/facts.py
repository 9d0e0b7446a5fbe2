"""A tensor's or an array's facts (device, bytes, storage, gradient, graph node, shape) for
the holder walk, whichever library made it: a torch tensor's through ``TensorReader``
(``torch.Tensor``'s own descriptors, ``__torch_function__`` off), a numpy or CuPy array's
through its class's C descriptors. No look runs the class's code, and none raises.

torch is never imported: its classes come from the modules given (``sys.modules``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from .capsules import CAPSULE_TYPE, exported_tensor
from .peek import C_DESCRIPTORS, is_a
from .reading import _TYPE_MRO, MISSING, static_attribute, type_name
from .storages import StorageReader
from .tensors import TensorReader, sizes

__all__ = ["TensorFacts", "TensorInfo"]

# (device, bytes, storage key): the key is the same for every view of one storage.
TensorInfo = tuple[str, int, tuple[str, int]]

# A class attribute that is C code when called (a slot wrapper, a C method).
_C_CALLABLES = (types.WrapperDescriptorType, types.MethodDescriptorType,
                types.BuiltinFunctionType)


class TensorFacts:
    """The facts of one interpreter's tensors and arrays, and torch's classes that the walk
    treats apart (modules, parameters, optimizers), each None without torch."""

    def __init__(self, modules: Mapping[str, Any]) -> None:
        torch = modules.get("torch")
        # A tensor's facts through torch.Tensor's own descriptors, never a subclass's code.
        self.reader = TensorReader.of(modules)
        self.tensor_type: Any = self.reader.base if self.reader is not None else None
        # A bare storage object (``t.untyped_storage()`` kept after its tensors went) keeps its
        # memory as a tensor does: the walk, the heap pass and the search take it as one.
        self.storages = StorageReader.of(modules)
        self.storage_type: Any = self.storages.base if self.storages is not None else None
        nn = getattr(torch, "nn", None) if torch else None
        optim = getattr(torch, "optim", None) if torch else None
        self.module_type: Any = getattr(nn, "Module", None) if nn else None
        self.param_type: Any = getattr(nn, "Parameter", None) if nn else None
        self.optimizer_type: Any = getattr(optim, "Optimizer", None) if optim else None
        self._arrays: dict[int, tuple[type, tuple[Any, Any, bool] | None]] = {}
        self._nodes: dict[int, tuple[type, bool]] = {}
        # Where torch keeps its autograd node classes, for ``is_graph_node``.
        torch_c = getattr(torch, "_C", None) if torch else None
        self._node_classes: Any = getattr(torch_c, "_functions", None)
        function = getattr(getattr(torch, "autograd", None), "function", None) if torch else None
        self._backward_base: Any = getattr(function, "BackwardCFunction", None)

    def forget_classes(self) -> None:
        """Drop the memos of which classes are arrays or graph nodes (each keeps its class)."""
        self._arrays.clear()
        self._nodes.clear()

    def is_graph_node(self, obj: Any) -> bool:
        """Whether ``obj`` is an autograd node (a ``grad_fn``), as torch itself defines one
        (``torch.autograd.graph.Node.__subclasshook__``): a class torch generated, which is
        ``torch._C._functions``' own attribute of that name, or a custom Function's backward
        node class (a ``BackwardCFunction`` subclass, which torch makes; never the user's
        ``Function`` subclass itself, whose instance may carry the user's ``__dir__`` or
        properties). A class of the user's that merely has a ``next_functions`` is not one:
        the graph walk reads a node's attributes as torch's. No code of the class or its
        metaclass runs."""
        t = type(obj)
        cached = self._nodes.get(id(t))
        if cached is None or cached[0] is not t:
            cached = (t, self._is_node_class(t))
            self._nodes[id(t)] = cached
        return cached[1]

    def _is_node_class(self, t: type) -> bool:
        if self._node_classes is None and self._backward_base is None:
            return False
        try:
            if self._node_classes is not None and \
                    getattr(self._node_classes, type_name(t), None) is t:
                return True
            base = self._backward_base
            return isinstance(base, type) and base in _TYPE_MRO.__get__(t)
        except Exception:
            return False

    def info(self, t: Any) -> TensorInfo | None:
        """(device, bytes, storage key) of a tensor or numpy/cupy-like array; never raises."""
        try:
            return self._info_of(t)
        except Exception:
            return None

    def _info_of(self, t: Any) -> TensorInfo | None:
        if self.reader is not None and is_a(t, self.tensor_type):
            # torch.Tensor's own descriptors, with __torch_function__ off: a subclass's
            # override of `device` or `untyped_storage` never runs (tensors.py).
            return self.reader.info(t)
        if self.storages is not None and is_a(t, self.storage_type):
            return self.storages.info(t)
        if type(t) is CAPSULE_TYPE:
            return capsule_info(t)
        plan = self.array_plan(type(t))
        if plan is None:
            return None
        nbytes_desc, base_desc, on_device = plan
        n = int(nbytes_desc.__get__(t, type(t)))
        if n < 0:
            return None
        device = "cuda" if on_device else "cpu"
        base = base_desc.__get__(t, type(t)) if base_desc is not None else None
        return device, n, (device, id(base if base is not None else t))

    def array_plan(self, t: type) -> tuple[Any, Any, bool] | None:
        """How to read an array of this class (numpy's, CuPy's): its ``nbytes`` and ``base``
        descriptors and whether it lives on a GPU, or None for a class that is not one. Only
        C descriptors count: a Python ``nbytes``/``shape``/``dtype`` property (a lazy
        dataset) would be the user's code, run by looking."""
        cached = self._arrays.get(id(t))
        if cached is not None and cached[0] is t:
            return cached[1]
        plan: tuple[Any, Any, bool] | None = None
        found = [static_attribute(t, n) for n in ("nbytes", "shape", "dtype")]
        if all(type(d) in C_DESCRIPTORS for d in found):
            base = static_attribute(t, "base")
            plan = (found[0], base if type(base) in C_DESCRIPTORS else None,
                    static_attribute(t, "__cuda_array_interface__") is not MISSING)
        self._arrays[id(t)] = (t, plan)
        return plan

    def grad_fn(self, t: Any) -> Any:
        if self.reader is None or not is_a(t, self.tensor_type):
            return None
        try:
            return self.reader.grad_fn(t)
        except Exception:
            return None

    def grad_of(self, t: Any) -> Any:
        """A leaf tensor's gradient (only leaves have one; asking a non-leaf makes torch
        warn), read by torch.Tensor's own descriptors."""
        if self.reader is None or not is_a(t, self.tensor_type):
            return None
        try:
            grad = self.reader.leaf_grad(t)
        except Exception:
            return None
        return grad if grad is not None and self.info(grad) is not None else None

    def shape_of(self, t: Any) -> tuple[Any, ...] | None:
        """A tensor's or array's sizes, read as ``info`` reads it (no user code)."""
        try:
            if self.reader is not None and is_a(t, self.tensor_type):
                return self.reader.shape(t)
            plan = self.array_plan(type(t))
            if plan is None:
                return None
            return sizes(static_attribute(type(t), "shape").__get__(t, type(t)))
        except Exception:
            return None

    def own_bytes(self, t: Any) -> int | None:
        """The bytes of a tensor's or array's own elements (not a larger storage it views)."""
        try:
            if self.reader is not None and is_a(t, self.tensor_type):
                return self.reader.elements_bytes(t)
            if self.storages is not None and is_a(t, self.storage_type):
                return self.storages.info(t)[1]
            if type(t) is CAPSULE_TYPE:
                return (capsule_info(t) or ("", None))[1]
            plan = self.array_plan(type(t))
            return int(plan[0].__get__(t, type(t))) if plan is not None else None
        except Exception:
            return None

    def describe(self, t: Any, grad_fn: Any = MISSING) -> str:
        """"float32[1024, 1024], grad_fn=MulBackward0", read as ``info`` reads (no subclass's
        property, override or ``__torch_function__`` runs); ``grad_fn`` where the caller has
        read it already."""
        if self.reader is not None and is_a(t, self.tensor_type):
            return self.reader.describe(t, grad_fn)
        if self.storages is not None and is_a(t, self.storage_type):
            try:
                nbytes: Any = self.storages.info(t)[1]
            except Exception:
                nbytes = "?"
            return f"{type_name(type(t))}[{nbytes} bytes], no tensor"
        if type(t) is CAPSULE_TYPE:
            found = exported_tensor(t)
            return (f"DLPack capsule of {found.nbytes} bytes, not consumed, no tensor"
                    if found is not None else "PyCapsule")
        shape = self.shape_of(t)
        dims = list(shape) if shape is not None else ["?"]
        try:  # an array's dtype by the class's C descriptor (``array_plan`` checked it)
            dtype = static_attribute(type(t), "dtype").__get__(t, type(t))
            # Said only where the dtype's own str and repr are C code (numpy's, CuPy's).
            text = str(dtype) if all(
                type(static_attribute(type(dtype), n)) in _C_CALLABLES
                for n in ("__str__", "__repr__")) else "?"
        except Exception:
            text = "?"
        return f"{text}{dims}"

    def is_torch(self, t: Any) -> bool:
        """A torch tensor, a bare torch storage or a DLPack capsule of a GPU tensor (not
        another library's array): memory in PyTorch's allocator. A capsule's exporter is not
        known from the struct; on a GPU that PyTorch allocates for, it is taken as PyTorch's."""
        return is_a(t, self.tensor_type) or is_a(t, self.storage_type) or \
            type(t) is CAPSULE_TYPE

    def kind_of(self, obj: Any) -> str:
        """What a holder is, for its listing: a module, an optimizer's state, a container."""
        if is_a(obj, self.module_type):
            return "module"
        if is_a(obj, self.optimizer_type):
            return "optimizer state"
        if is_a(obj, (dict, list, tuple, set, frozenset)):
            return "container"
        return "variable"


def capsule_info(cap: Any) -> TensorInfo | None:
    """An unconsumed DLPack capsule's (device, bytes, key): keyed by where its tensor's bytes
    start, as a tensor is by its storage's data pointer, so that a capsule of a whole tensor
    and that tensor, both alive, are one storage. A consumed capsule holds nothing: None."""
    found = exported_tensor(cap)
    if found is None:
        return None
    device = found.device
    return device, found.nbytes, (device, found.address)
