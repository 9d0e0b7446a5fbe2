"""Tab completion of %gpumem and %%gpumem: IPython's own completer offers our subcommands,
flags and choices, registered once however often the extension is loaded, and gone with it."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.completer import provisionalcompleter

from gpumem_nb.ipython import completion


@pytest.fixture(autouse=True)
def no_parsed_stubs_left() -> Any:
    """IPython's completer asks jedi, and parso keeps every module jedi parsed (builtins'
    stubs: 200,000 objects) for the life of the process, where every later test's cleanup,
    OOM explanation and retention search walked them. Dropped after each test."""
    yield
    import parso.cache

    parso.cache.parser_cache.clear()


def matches(ip: Any, line: str) -> list[str]:
    """What IPython's completer offers at the end of ``line`` (as a notebook asks it)."""
    with provisionalcompleter():
        return [c.text for c in ip.Completer.completions(line, len(line))]


def ours(ip: Any) -> int:
    """Our completers in IPython's dispatch, over both magics' keys."""
    strs = ip.strdispatchers[completion.HOOK].strs
    return sum(getattr(f, "__func__", None) is completion.complete
               for key in completion.KEYS if key in strs for _, f in strs[key].chain)


def test_a_subcommand_completes_instead_of_ipythons_magics(loaded):
    found = matches(loaded, "%gpumem hi")
    assert "history" in found
    assert not any(m.lstrip("%") == "hist" for m in found)  # not IPython's %hist
    assert set(matches(loaded, "%gpumem w")) >= {"who", "watch", "whatif"}


def test_a_subcommands_flags_and_a_flags_choices_complete(loaded):
    assert set(matches(loaded, "%gpumem whatif --c")) >= {"--conf", "--capacity"}
    assert "--gc" in matches(loaded, "%gpumem who --")
    after_peak = matches(loaded, "%gpumem config --peak ")
    assert {"preserve", "reset"} <= set(after_peak) and "--save" not in after_peak
    assert set(matches(loaded, "%gpumem record o")) >= {"on", "off"}
    assert "--trace" in matches(loaded, "%%gpumem --tr")


def test_reload_keeps_one_completer_and_unload_removes_it(loaded):
    assert ours(loaded) == len(completion.KEYS)
    loaded.run_line_magic("reload_ext", "gpumem_nb")
    loaded.run_line_magic("reload_ext", "gpumem_nb")
    assert ours(loaded) == len(completion.KEYS)
    assert "history" in matches(loaded, "%gpumem hi")
    loaded.run_line_magic("unload_ext", "gpumem_nb")
    assert ours(loaded) == 0
    assert "history" not in matches(loaded, "%gpumem hi")
