"""Does ``del big`` free big's tensors? Proved from reference counts, without a heap search.

The retention search (``verify.py``) answers it for any holder, but it walks up the whole heap:
on an H100 a bare torch process has about 400,000 tracked objects, and checking ``del big`` for
one 60 GiB tensor took 318-471 ms of an explanation whose budget is 100 ms. For the common case
(a name, or a list, tuple or dict a name holds, whose tensors nothing else refers to) reference
counts decide it in one ``gc.get_referrers`` pass:

- every reference to each tensor (and to each container it sits in) is accounted for by the
  namespace entries the cut deletes, the containers those hold, or our own lists;
- since PyTorch's PyObject preservation rework (2.11 has it), a tensor's C++ object holds one
  reference to its Python object exactly while anything in C++ (an autograd graph's saved
  variable, a view's base, a hook) also holds the C++ object. So a Python reference count with
  nothing left over proves that nothing in C++ holds the tensor; before that rework C++ could
  hold it invisibly, and the proof is not tried;
- no other tensor shares a storage: its use count (``torch._C._storage_Use_Count``, what
  ``torch._inductor``'s storage weak references read) is the holder's own tensors on it plus
  the one its Python storage object holds, and that object has no reference but ours and the
  one C++ keeps while the storage lives (a user's ``s = big.untyped_storage()`` would be one).

Anything else (a tensor subclass, a gradient, a view, an alias the cut leaves, a reference
from where Python cannot see) is not proved, and the caller runs the search. No user code runs:
only exact ``torch.Tensor`` objects are read, through the base class's own method.
"""

from __future__ import annotations

import gc
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..referents import referents
from .reading import MISSING, static_attribute

__all__ = ["FIRST_VERSION", "SoleProof"]

# The first PyTorch whose tensors' reference counts show C++'s holders (see above).
FIRST_VERSION = (2, 11)
_VERSION = re.compile(r"^(\d+)\.(\d+)")
_BOXES = (list, tuple, dict)


def _module_dict(module: Any) -> dict[str, Any]:
    try:
        d = object.__getattribute__(module, "__dict__")
    except Exception:
        return {}
    return d if type(d) is dict else {}


class SoleProof:
    """One check's reads of torch: its tensor class, storage getter and use count."""

    def __init__(self, tensor_type: type, storage_of: Callable[[Any], Any],
                 use_count: Callable[[int], int]) -> None:
        self.tensor_type = tensor_type
        self.storage_of = storage_of
        self.use_count = use_count

    @classmethod
    def of(cls, modules: Mapping[str, Any]) -> SoleProof | None:
        """The proof for the torch loaded here, or None where it cannot be made (no torch, a
        torch before the rework, or one without a storage use count)."""
        torch = modules.get("torch")
        if torch is None:
            return None
        names = _module_dict(torch)
        version = names.get("__version__")
        m = _VERSION.match(str.__str__(version)) if isinstance(version, str) else None
        if m is None or (int(m[1]), int(m[2])) < FIRST_VERSION:
            return None
        tensor_type = names.get("Tensor")
        use_count = _module_dict(names.get("_C")).get("_storage_Use_Count")
        if not isinstance(tensor_type, type) or not callable(use_count):
            return None
        getter = static_attribute(tensor_type, "untyped_storage")
        if getter is MISSING or not callable(getter):
            return None
        return cls(tensor_type, getter, use_count)

    def frees(self, ns: dict[Any, Any], names: Iterable[str], tensors: Sequence[Any],
              ours: Iterable[Any] = ()) -> bool:
        """Whether deleting ``names`` from ``ns`` frees every one of ``tensors``' storages.
        ``ours``: the caller's own containers that refer to them (counted, never holders).
        False where it cannot be proved (then the search decides)."""
        try:
            return self._frees(ns, set(names), tensors, list(ours))
        except Exception:
            return False

    def _frees(self, ns: dict[Any, Any], names: set[str], tensors: Sequence[Any],
               ours: list[Any]) -> bool:
        if not tensors or any(type(t) is not self.tensor_type for t in tensors):
            return False
        # The objects a reference count is read for: the tensors and the builtin containers
        # the cut's names hold. Held once each, in ``objs``, by index (no local names one).
        objs: list[Any] = [dict.get(ns, n) for n in names if n in ns]
        if len(objs) != len(names):
            return False
        objs = [o for o in objs if type(o) in _BOXES]
        boxes = len(objs)
        seen = {id(o) for o in objs}
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                objs.append(t)
        t = None
        # Every ns entry that refers to one of them must be one the cut deletes.
        for k, v in dict.items(ns):
            if id(v) in seen and not (type(k) is str and k in names):
                return False
        k = v = None
        # Who refers to them, as the collector sees it: only ns, those containers, our own.
        allowed = {id(ns), id(objs), *(id(o) for o in ours), *(id(objs[i]) for i in range(boxes))}
        refs = gc.get_referrers(*objs)
        if any(id(r) not in allowed for r in refs):
            refs.clear()
            return False
        refs.clear()
        # Every reference counted: what those referrers hold, against each reference count.
        held: dict[int, int] = dict.fromkeys(seen, 0)
        for box in [ns, objs, *ours, *objs[:boxes]]:
            for c in referents(box):
                if id(c) in held:
                    held[id(c)] += 1
        box = c = None
        for i in range(len(objs)):
            # getrefcount's own argument is the one reference more.
            if sys.getrefcount(objs[i]) - 1 != held[id(objs[i])]:
                return False
        return self._storages_alone(objs[boxes:])

    def _storages_alone(self, tensors: list[Any]) -> bool:
        """No tensor but these shares their storages, and no one else holds a storage."""
        stores: list[Any] = []
        sharers: dict[int, int] = {}
        for t in tensors:
            s = self.storage_of(t)
            cdata = int(s._cdata)
            if cdata not in sharers:
                sharers[cdata] = 0
                stores.append(s)
            sharers[cdata] += 1
            s = None
        t = None
        for j in range(len(stores)):
            cdata = int(stores[j]._cdata)
            # The storage's users: the tensors on it, and its Python object (ours now).
            if int(self.use_count(cdata)) != sharers[cdata] + 1:
                return False
            # Its Python object: ``stores``, getrefcount's argument and C++'s own reference
            # (held while anything but that object uses the storage): no one else's.
            if sys.getrefcount(stores[j]) != 3:
                return False
        stores.clear()
        return True
