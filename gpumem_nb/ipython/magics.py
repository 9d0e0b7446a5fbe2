"""``GpumemMagics``: ``%gpumem`` / ``%%gpumem``. Splits the line, finds the subcommand, calls
its handler, and keeps every refusal a short ``UsageError``."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..kernel import Monitor
from .commands import COMMANDS, build_cell_parser, build_line_parser
from .commands.cell import measured_cell
from .grammar import MAX_MESSAGE_CHARS, help_text, parse, short_message, split

__all__ = ["GpumemMagics"]

_HANDLERS = {c.name: c.run for c in COMMANDS}


@magics_class
class GpumemMagics(Magics):
    def __init__(self, shell: InteractiveShell, monitor: Monitor) -> None:
        super().__init__(shell)
        self.ip = shell  # Magics.shell, typed: None only for a magic made without a shell
        self.monitor = monitor
        self.parser = build_line_parser()
        self.cell_parser = build_cell_parser()

    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> Any:
        try:
            return self._gpumem(line, cell)
        except UsageError as e:
            text = str(e)
            if len(text) <= MAX_MESSAGE_CHARS:
                raise
            raise UsageError(short_message(text)) from None

    def _gpumem(self, line: str, cell: str | None) -> Any:
        argv = split(line)
        if "-h" in argv or "--help" in argv:  # help is an answer, never a UsageError
            print(help_text(self.parser, self.cell_parser,
                            None if cell is not None or not argv else argv[0]))
            return None
        if cell is not None:
            return measured_cell(self.monitor, self.ip, self.cell_parser, argv, cell)
        args = parse(self.parser, argv)
        self.monitor.flush()  # earlier cells the sampler has not recorded yet
        return _HANDLERS[args.cmd or "status"](self.monitor, self.ip, args)

    gpumem.__doc__ = help_text(build_line_parser(), build_cell_parser())
