"""Every result a user sees prints the same text in a terminal, through ``print`` and through
IPython's pretty printer, because they share one base (``report.Shown``) instead of each
writing its own trio of ``__str__``, ``_repr_pretty_`` and ``_repr_html_``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gpumem_nb
from gpumem_nb.report import Shown

# The base itself, and the what-if's progress line, which is replaced in place and has no
# notebook view of its own.
NOT_RESULTS = {"Shown", "_Line"}


def _classes() -> list[type]:
    out = []
    for info in pkgutil.walk_packages(gpumem_nb.__path__, "gpumem_nb."):
        mod = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == info.name:
                out.append(cls)
    return out


def test_a_result_class_cannot_give_the_pretty_printer_a_text_of_its_own():
    own = [c for c in _classes()
           if vars(c).get("_repr_pretty_", Shown._repr_pretty_) is not Shown._repr_pretty_
           and c.__name__ not in NOT_RESULTS]
    assert own == [], f"{own}: derive from report.Shown and write __str__ only"


def test_every_result_with_a_notebook_view_derives_from_the_one_base():
    shown = [c for c in _classes() if "_repr_html_" in vars(c) and c.__name__ not in NOT_RESULTS]
    assert len(shown) >= 11
    strays = [c for c in shown if not issubclass(c, Shown)]
    assert strays == [], f"{strays} write their own trio"


def test_the_pretty_printer_shows_what_print_shows_even_for_a_dataclass():
    from dataclasses import dataclass

    from IPython.lib.pretty import pretty

    @dataclass(frozen=True)
    class Answer(Shown):
        n: int = 1

        def __str__(self) -> str:
            return "GPU 0: 1.00 GiB\n<b>not html</b>"

    a = Answer()
    assert pretty(a) == str(a)
    assert a._repr_html_() == "<pre>GPU 0: 1.00 GiB\n&lt;b&gt;not html&lt;/b&gt;</pre>"
