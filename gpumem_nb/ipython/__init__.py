"""The IPython layer: ``%gpumem`` / ``%%gpumem``, their completion, and the extension's load
and unload. The only part of the package that imports IPython.

``grammar`` (the parsers, help and messages), ``commands/`` (one family of subcommands to a
module, flags beside handlers), ``magics`` (the thin ``GpumemMagics``), ``completion`` and
``extension`` (load, unload). The engine below it is ``gpumem_nb.kernel``.
"""

from __future__ import annotations

__all__: list[str] = []
