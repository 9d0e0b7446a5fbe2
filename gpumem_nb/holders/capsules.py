"""DLPack capsules: a tensor exported with ``to_dlpack`` and not yet consumed is kept by a
PyCapsule named "dltensor" (or "dltensor_versioned", DLPack 1.x), which the garbage
collector's traversal cannot see into. The capsule's pointer is a C struct whose layout the
DLPack standard fixes (dlpack.h), so where its memory is can be read with ctypes alone: no
code of the exporter or of the user's classes runs, and nothing is consumed. A capsule of
any other name is left alone."""

from __future__ import annotations

import ctypes
import datetime
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CAPSULE_TYPE",
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_MANAGED",
    "ExportedTensor",
    "exported_tensor",
]

# The capsule type, from a capsule the standard library always has.
CAPSULE_TYPE: type = type(datetime.datetime_CAPI)

_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
# DLDeviceType (dlpack.h): the CUDA kinds whose memory is a GPU's.
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_MANAGED = 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version_major", ctypes.c_uint32), ("version_minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# More dimensions than this is not a tensor's struct: the capsule is not read.
_MAX_NDIM = 64


@dataclass(frozen=True)
class ExportedTensor:
    """Where one unconsumed DLPack capsule's tensor is."""

    device_type: int  # DLDeviceType: 2 CUDA, 13 CUDA managed, 1 CPU
    device_id: int
    address: int  # data + byte_offset: the first byte the tensor uses
    nbytes: int  # its elements times their size (a strided view may span more)

    @property
    def device(self) -> str:
        if self.device_type in (KDL_CUDA, KDL_CUDA_MANAGED):
            return f"cuda:{self.device_id}"
        return "cpu" if self.device_type == KDL_CPU else f"dlpack-device-{self.device_type}"


def exported_tensor(obj: Any) -> ExportedTensor | None:
    """The tensor an unconsumed DLPack capsule points to; None for anything else (another
    object, a capsule of another name, a consumed "used_dltensor" one)."""
    if type(obj) is not CAPSULE_TYPE:
        return None
    try:
        name = _get_name(obj)
        if name not in (_NAME, _NAME_VERSIONED):
            return None
        ptr = _get_pointer(obj, name)
        if not ptr:
            return None
        if name == _NAME:
            t = _DLManagedTensor.from_address(ptr).dl_tensor
        else:
            t = _DLManagedTensorVersioned.from_address(ptr).dl_tensor
        ndim = int(t.ndim)
        if not 0 <= ndim <= _MAX_NDIM or (ndim and not t.shape):
            return None
        count = 1
        for i in range(ndim):
            count *= max(int(t.shape[i]), 0)
        width = (int(t.dtype.bits) * max(int(t.dtype.lanes), 1) + 7) // 8
        return ExportedTensor(int(t.device.device_type), int(t.device.device_id),
                              int(t.data or 0) + int(t.byte_offset), count * width)
    except Exception:
        return None
