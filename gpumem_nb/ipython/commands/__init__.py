"""The ``%gpumem`` subcommands, one family to a module, each declaring its flags beside its
handler; ``COMMANDS`` is their order in the parser and in ``%gpumem?``."""

from __future__ import annotations

from ..grammar import Parser, Subcommand, build_parser
from .cell import build_cell_parser
from .cluster import CLUSTER
from .config import CONFIG
from .holders import CLEANUP, WHO
from .reports import HISTORY, OOM, STATUS, SUMMARY
from .watch import START, STOP, WATCH
from .whatif import RECORD, WHATIF

__all__ = ["COMMANDS", "build_cell_parser", "build_line_parser"]

COMMANDS: tuple[Subcommand, ...] = (
    STATUS, HISTORY, WHO, CLEANUP, CONFIG, SUMMARY, OOM, START, STOP, WATCH, CLUSTER,
    WHATIF, RECORD,
)


def build_line_parser() -> Parser:
    """The line magic's parser, every subcommand with its flags."""
    return build_parser(COMMANDS)
