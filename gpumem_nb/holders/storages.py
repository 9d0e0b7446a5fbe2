"""A bare storage's facts (device, bytes, data pointer), read without running the user's code.

``t.untyped_storage()`` is a Python object of its own (``torch.UntypedStorage``) that keeps the
storage's memory alive with no tensor anywhere: a registry of storages (a dedupe table for
saving shared weights) held 36 GiB on the H100 that a search from tensors never started from.
So a storage object is a search target as a tensor is, keyed the same way (device, data
pointer): a tensor and its storage object are one storage. Its facts are read through
``torch._C.StorageBase``'s own descriptors (a C getset for ``device``, C methods for ``nbytes``
and ``data_ptr``), never a subclass's: ``torch.UntypedStorage`` and any user subclass are Python
classes whose overrides would be the user's code.

torch is never imported: ``torch._C.StorageBase`` comes from the modules given.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from .reading import MISSING, static_attribute
from .tensors import device_name

__all__ = ["StorageReader"]

# A method read from the base class and called on the object: C code in torch, a plain function
# in the test fakes. Anything else (a property someone put there) is not called.
_CALLABLE = (types.MethodDescriptorType, types.FunctionType, types.BuiltinFunctionType,
             types.WrapperDescriptorType)
_DATA_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType, property)


class StorageReader:
    """Reads storage objects of one torch (``base``: ``torch._C.StorageBase``)."""

    def __init__(self, base: type, device: Any, nbytes: Any, data_ptr: Any) -> None:
        self.base = base
        self._device = device
        self._nbytes = nbytes
        self._data_ptr = data_ptr
        self._device_names: dict[Any, str] = {}

    @classmethod
    def of(cls, modules: Mapping[str, Any]) -> StorageReader | None:
        """The reader for the torch in ``modules``, or None without one (or without a storage
        class whose facts are C descriptors)."""
        torch = modules.get("torch")
        c = getattr(torch, "_C", None) if torch is not None else None
        base = getattr(c, "StorageBase", None) if c is not None else None
        if not isinstance(base, type):
            return None
        device = static_attribute(base, "device")
        nbytes = static_attribute(base, "nbytes")
        data_ptr = static_attribute(base, "data_ptr")
        if type(device) not in _DATA_DESCRIPTORS or type(nbytes) not in _CALLABLE or \
                type(data_ptr) not in _CALLABLE or device is MISSING:
            return None
        return cls(base, device, nbytes, data_ptr)

    def info(self, s: Any) -> tuple[str, int, tuple[str, int]]:
        """(device, bytes, storage key), as ``TensorReader.info`` says a tensor's: a tensor and
        its storage object share the key. Raises for what is no storage of this torch."""
        device = device_name(self._device.__get__(s, type(s)), self._device_names)
        return device, int(self._nbytes(s)), (device, int(self._data_ptr(s)))
