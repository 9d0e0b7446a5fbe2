"""``json_prefix``: JSON's spelling of a value cut to a few characters, reading only those."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gpumem_nb.jsontext import json_prefix


def _dumps_cut(value: Any, limit: int = 40) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 10**39, 10**4000, 1.5, float("nan"), float("inf"),
    float("-inf"), "", "a\x1b[2J", "\ud800", "x" * 100, [], [1, [2, [3]]], (1, "a"),
    {"a": [1, {"b": None}], 1: 2, None: 3, 1.5: True, False: 0}, [0.5] * 1000,
    {str(i): i for i in range(100)}, [[[]]],
])
def test_a_value_is_spelled_as_json_dumps_then_a_cut_would(value):
    assert json_prefix(value) == _dumps_cut(value)


def test_ten_million_items_cost_what_the_first_few_do():
    value = [0.5] * 10**7
    t0 = time.thread_time()
    assert json_prefix(value) == "[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0..."
    assert json_prefix({"k": value}) == _dumps_cut({"k": [0.5] * 20})
    assert time.thread_time() - t0 < 0.05


def test_a_list_that_holds_itself_is_cut_not_recursed_forever():
    a: list[Any] = []
    a.append(a)
    assert json_prefix(a) == "[" * 37 + "..."


def test_what_json_cannot_spell_raises_as_json_dumps_does():
    for value in (object(), {(1, 2): 3}, [1, {2}]):
        with pytest.raises(TypeError):
            json_prefix(value)
    with pytest.raises(ValueError):
        json_prefix(10**5000)  # past Python's 4,300 digits


def test_no_method_of_a_subclass_runs():
    ran: list[str] = []

    class L(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            ran.append("__iter__")
            return super().__iter__()

        def __getitem__(self, i: Any) -> Any:
            ran.append("__getitem__")
            return super().__getitem__(i)

    class D(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            ran.append("items")
            return super().items()

    class S(str):
        def __getitem__(self, i: Any) -> Any:
            ran.append("str.__getitem__")
            return super().__getitem__(i)

    class F(float):
        def __repr__(self) -> str:
            ran.append("__repr__")
            return "bad"

    assert json_prefix(L([1, D(a=S("bc"), b=F(2.5))])) == '[1, {"a": "bc", "b": 2.5}]'
    assert ran == []
