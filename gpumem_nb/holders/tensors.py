"""A tensor's facts (device, storage, gradient, graph node, shape, dtype) read without running
the user's code.

A tensor subclass can override any of these (``untyped_storage``, a ``device`` property) or
define ``__torch_function__``, which torch then runs on every attribute read and method call.
Looking at a tensor runs neither: each fact is read through the descriptor that the *base*
class (``torch.Tensor``, along its MRO: ``torch._C.TensorBase``'s getsets and methods) defines,
found once by ``static_attribute``, and inside ``torch._C.DisableTorchFunction`` (or
``DisableTorchFunctionSubclass``) where this torch has it, so that no ``__torch_function__``
(a subclass's or a mode's) is dispatched to. A fact the base class keeps in the instance's
``__dict__`` instead (the test fakes' plain attributes) is read from that dict through the
base's own C ``__dict__`` descriptor, its keys compared only as exact ``str``.

torch is never imported: its ``Tensor`` and ``_C`` come from the modules given (``sys.modules``).
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .reading import MISSING, static_attribute, type_name

__all__ = ["TensorReader", "device_name", "dict_descriptor", "instance_dict", "own_item", "sizes"]

# Read as attributes: a data descriptor of the base class, else the instance's own dict.
_FACTS = ("device", "grad", "grad_fn", "is_leaf", "shape", "dtype")
_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)
_DIRECT_CALL = (types.FunctionType, types.MethodDescriptorType, types.BuiltinFunctionType,
                types.WrapperDescriptorType)
# The guards, first found first used: the first also turns torch function modes off.
_GUARDS = ("DisableTorchFunction", "DisableTorchFunctionSubclass")

# id(class) -> (a weak reference to the class, its C ``__dict__`` descriptor or None): weak, so
# that no class (and what its class attributes hold) outlives its last user; an entry whose
# class died is found stale by identity and made again.
_DICT_DESCRIPTORS: dict[int, tuple[Any, Any]] = {}


def dict_descriptor(t: type) -> Any:
    """The first C ``__dict__`` descriptor along the class's MRO, or None. A Python
    ``__dict__`` property a subclass defines is skipped, never run."""
    cached = _DICT_DESCRIPTORS.get(id(t))
    if cached is not None and cached[0]() is t:
        return cached[1]
    found: Any = None
    try:
        for klass in type.__dict__["__mro__"].__get__(t):
            desc = type.__dict__["__dict__"].__get__(klass).get("__dict__", MISSING)
            if type(desc) in _C_DESCRIPTORS:
                found = desc
                break
    except Exception:
        found = None
    try:
        ref = weakref.ref(t)
    except TypeError:
        return found
    if len(_DICT_DESCRIPTORS) > 4096:
        _DICT_DESCRIPTORS.clear()
    _DICT_DESCRIPTORS[id(t)] = (ref, found)
    return found


def instance_dict(obj: Any) -> dict[Any, Any] | None:
    """An object's own ``__dict__`` through its class's C descriptor (no property,
    ``__getattr__`` or ``__getattribute__`` runs); None where it has none."""
    desc = dict_descriptor(type(obj))
    if desc is None:
        return None
    try:
        d = desc.__get__(obj)
    except Exception:
        return None
    return d if type(d) is dict else None


def own_item(d: dict[Any, Any], name: str) -> Any:
    """``d[name]`` for a dict whose keys may be anything: only exact ``str`` keys are compared
    (a key's own ``__hash__``/``__eq__`` never runs); ``MISSING`` where none matches."""
    for key, value in dict.items(d):
        if key is name or (type(key) is str and key == name):
            return value
    return MISSING


_INT_ONLY = frozenset((id(int),))


def sizes(shape: Any) -> tuple[Any, ...] | None:
    """A shape's sizes by ``tuple``'s own iterator, each an exact int or "?" (a symbolic
    size is never formatted); None for a shape that is no tuple (``torch.Size`` is one)."""
    if not issubclass(type(shape), tuple):
        return None
    dims = tuple(tuple.__iter__(shape))
    if _INT_ONLY.issuperset(map(id, map(type, dims))):
        return dims
    return tuple(x if type(x) is int else "?" for x in dims)


def _is_data_descriptor(desc: Any) -> bool:
    kind = type(desc)
    return static_attribute(kind, "__set__") is not MISSING or \
        static_attribute(kind, "__delete__") is not MISSING



def device_name(dev: Any, names: dict[Any, str]) -> str:
    """``"cuda:0"`` for a torch device, named once per device in ``names``: graph walks ask
    for every saved tensor's."""
    try:
        return names[dev]
    except (KeyError, TypeError):  # TypeError: a device object that cannot be hashed
        index = dev.index
        name = f"{dev.type}:{index}" if index is not None else str(dev.type)
        with contextlib.suppress(TypeError):
            names[dev] = name
        return name


class TensorReader:
    """Reads tensors of one torch (its ``Tensor`` class, ``base``) through ``base``'s own
    descriptors, found once at construction. Each method may raise (an object that is no
    tensor of this torch, a tensor without storage): the caller contains it."""

    def __init__(self, base: type, guard: Any = None, dtype_type: Any = None) -> None:
        self.base = base
        self._guard = guard  # a context manager class that turns __torch_function__ off
        self._dtype_type = dtype_type
        self._base_dict = dict_descriptor(base)
        get = {n: self._getter(n) for n in _FACTS}
        self._device = get["device"]
        self._grad = get["grad"]
        self._grad_fn = get["grad_fn"]
        self._is_leaf = get["is_leaf"]
        self._shape = get["shape"]
        self._dtype = get["dtype"]
        self._storage = self._caller("untyped_storage")
        self._element_size = self._caller("element_size")
        self._nelement = self._caller("nelement")
        self._device_names: dict[Any, str] = {}
        self._held = False  # inside ``held()``: the guard is on already, for a whole scan

    @classmethod
    def of(cls, modules: Mapping[str, Any]) -> TensorReader | None:
        """The reader for the torch in ``modules`` (``sys.modules``), or None without one."""
        torch = modules.get("torch")
        if torch is None:
            return None
        base = getattr(torch, "Tensor", None)
        if not isinstance(base, type):
            return None
        c = getattr(torch, "_C", None)
        guard = None
        for name in _GUARDS:
            guard = getattr(c, name, None) if c is not None else None
            if isinstance(guard, type):
                break
            guard = None
        dtype_type = getattr(torch, "dtype", None)
        return cls(base, guard, dtype_type if isinstance(dtype_type, type) else None)

    # -- how each fact is read, decided once --------------------------------------------------
    def _getter(self, name: str) -> Callable[[Any], Any]:
        desc = static_attribute(self.base, name)
        if desc is not MISSING and _is_data_descriptor(desc):
            get: Callable[[Any], Any] = desc.__get__
            return get
        default = desc

        base_dict = self._base_dict

        def from_dict(t: Any) -> Any:
            # ``own_item``, inlined (per tensor and fact). Nothing is memoised across reads: a
            # reference kept to a tensor (or its grad) after the look would be one more the
            # retention search cannot explain, and memory the user cannot free.
            d = base_dict.__get__(t) if base_dict is not None else None
            if type(d) is dict:
                for key, value in dict.items(d):
                    if key is name or (type(key) is str and key == name):
                        return value
            if default is MISSING:
                raise AttributeError(name)
            return default

        return from_dict

    def _caller(self, name: str) -> Callable[[Any], Any] | None:
        desc = static_attribute(self.base, name)
        if desc is MISSING:
            return None
        if type(desc) in _DIRECT_CALL:
            call: Callable[[Any], Any] = desc
            return call
        base = self.base
        return lambda t: desc.__get__(t, base)()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The guard turned on once for a whole scan, not per read (each enter and exit
        cost about 0.4 µs, four reads a tensor)."""
        if self._guard is None or self._held:
            yield
            return
        with self._guard():
            self._held = True
            try:
                yield
            finally:
                self._held = False

    # -- facts ---------------------------------------------------------------------------------
    def info(self, t: Any) -> tuple[str, int, tuple[str, int]]:
        """(device, bytes of its storage, storage key): the key is (device, data pointer), or
        the tensor's id where it has no storage to read (its own elements' bytes then)."""
        guard = self._guard
        if guard is None or self._held:
            return self._info(t)
        with guard():
            return self._info(t)

    def _info(self, t: Any) -> tuple[str, int, tuple[str, int]]:
        device = device_name(self._device(t), self._device_names)
        storage_of = self._storage
        try:
            if storage_of is None:
                raise AttributeError("untyped_storage")
            storage = storage_of(t)
            return device, int(storage.nbytes()), (device, int(storage.data_ptr()))
        except Exception:
            return device, self._elements_bytes(t), (device, id(t))

    def _elements_bytes(self, t: Any) -> int:
        size, count = self._element_size, self._nelement
        if size is None or count is None:
            raise AttributeError("element_size")
        return int(size(t) * count(t))

    def elements_bytes(self, t: Any) -> int:
        """The tensor's own elements' bytes (not a larger storage it may view)."""
        guard = self._guard
        if guard is None or self._held:
            return self._elements_bytes(t)
        with guard():
            return self._elements_bytes(t)

    def leaf_grad(self, t: Any) -> Any:
        """``t.grad`` for a leaf, else None: asking a non-leaf makes torch warn."""
        guard = self._guard
        if guard is None or self._held:
            return self._leaf_grad(t)
        with guard():
            return self._leaf_grad(t)

    def _leaf_grad(self, t: Any) -> Any:
        if self._is_leaf(t) is not True:
            return None
        return self._grad(t)

    def grad_fn(self, t: Any) -> Any:
        guard = self._guard
        if guard is None or self._held:
            return self._grad_fn(t)
        with guard():
            return self._grad_fn(t)

    def shape(self, t: Any) -> tuple[Any, ...] | None:
        """The sizes, each an exact int or "?" (a symbolic size is not formatted); None for a
        shape that is no tuple (``torch.Size`` is one)."""
        guard = self._guard
        if guard is None or self._held:
            shape = self._shape(t)
        else:
            with guard():
                shape = self._shape(t)
        return sizes(shape)

    def dtype_text(self, t: Any) -> str:
        """"float32": a ``torch.dtype`` (or the fakes' plain ``str``) said without "torch."."""
        guard = self._guard
        if guard is None or self._held:
            dtype = self._dtype(t)
        else:
            with guard():
                dtype = self._dtype(t)
        if type(dtype) is str:
            text = dtype
        elif self._dtype_type is not None and type(dtype) is self._dtype_type:
            text = str(dtype)
        else:
            return "?"
        return text.replace("torch.", "")

    def describe(self, t: Any, grad_fn: Any = MISSING) -> str:
        """"float32[1024, 1024], grad_fn=MulBackward0" (``grad_fn`` where the caller read it)."""
        try:
            shape = self.shape(t)
            dims = list(shape) if shape is not None else ["?"]
        except Exception:
            dims = ["?"]
        try:
            dtype = self.dtype_text(t)
        except Exception:
            dtype = "?"
        text = f"{dtype}{dims}"
        if grad_fn is MISSING:
            try:
                grad_fn = self.grad_fn(t)
            except Exception:
                grad_fn = None
        if grad_fn is not None:
            text += f", grad_fn={type_name(type(grad_fn))}"
        return text
