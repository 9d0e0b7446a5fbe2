"""Who holds GPU memory, and what frees it.

Two searches, one answer:

- ``scan``: the fast path. It walks down from the names a user sees (the namespace, ``Out``,
  the stored exception) through modules, optimizers, containers and objects, within a budget.
- ``retention``: the whole truth. It starts from every live tensor (and bare storage object,
  ``storages.py``) the garbage collector tracks and walks *up* through the collector's own
  traversal (C code: no user code runs) to the roots a user can act on (variables, the
  output cache, stored exceptions, module globals, class attributes, live threads), naming
  each holder by its shortest path and saying which references must all go for its bytes to
  be freed. Whatever it cannot reach is
  said as such: garbage in reference cycles, or references from where Python cannot see.
  Levels whose referrers lie near what it entered are proved by reference counts, without a
  heap pass (``closure.py``).
- ``verify``: each advised cut, run dry on that graph before it is said: the references
  removed, what stays reachable joins the cut or is said as what keeps the bytes.
"""

from .names import INPUT_ALIAS, OUTPUT_ALIAS, SHELL_NAMES, alias_order, output_cache_names
from .reading import UNDERS, running_frame_ids, static_attribute, type_name
from .scan import Scanner
from .stored import (
    CellException,
    StoredException,
    cell_number,
    exception_chain,
    frame_is_live,
    frames_of,
    is_function_frame,
    is_stored,
    last_exception_objects,
    last_value,
    stored_cell_exception,
    traceback_links,
)
from .tally import cuda_bytes

__all__ = [
    "INPUT_ALIAS",
    "OUTPUT_ALIAS",
    "SHELL_NAMES",
    "UNDERS",
    "CellException",
    "Scanner",
    "StoredException",
    "alias_order",
    "cell_number",
    "cuda_bytes",
    "exception_chain",
    "frame_is_live",
    "frames_of",
    "is_function_frame",
    "is_stored",
    "last_exception_objects",
    "last_value",
    "output_cache_names",
    "running_frame_ids",
    "static_attribute",
    "stored_cell_exception",
    "traceback_links",
    "type_name",
]
