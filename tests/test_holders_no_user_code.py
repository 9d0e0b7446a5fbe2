"""Looking runs no user code (reliability re-test 2026-12-05, A1, A2, A4): the holder walk and
the OOM failure-site reader read modules, optimizers, tensors and namespace keys through the
base classes' own descriptors, so a subclass's override, property or ``__torch_function__``
never runs, however slow, endless or state-changing it is, and the bytes are still found.

Each test counts the user's code that ran (it must stay 0) and checks the bytes it hides
(they must still be found): a test that only did one of the two could pass by finding nothing.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpumem_nb.holders import Scanner, output_cache_names
from gpumem_nb.oom.site import failure_site

from .fakes import FakeTensor, GiB, MiB, node
from .helpers import hang_guard
from .test_holders import HookedModule, Module, Optimizer, torch_with_nn
from .test_oom_rules import raise_in

ran: list[str] = []  # the user's code that ran, by name


def scan(ns: dict, **kw: Any) -> list:
    return Scanner({"torch": torch_with_nn()}).scan(ns, **kw)


def bytes_by_name(holders: list) -> dict[str, int]:
    return {h.name: h.held_bytes for h in holders}


# -- A1: modules and optimizers ------------------------------------------------------------------
class CountingModule(HookedModule):
    """A module whose enumerations count their calls (t22's module_counting_parameters)."""

    def parameters(self, recurse: bool = True):
        ran.append("parameters")
        return super().parameters()

    def buffers(self, recurse: bool = True):
        ran.append("buffers")
        return super().buffers()

    def named_parameters(self, *a: Any, **kw: Any):
        ran.append("named_parameters")
        return iter(())

    def named_modules(self, *a: Any, **kw: Any):
        ran.append("named_modules")
        return iter(())


def counting_model() -> CountingModule:
    weight = FakeTensor(2 * GiB)
    weight.grad = FakeTensor(GiB)
    child = CountingModule(FakeTensor(GiB))
    model = CountingModule(weight, block=child)
    model._buffers["running_mean"] = FakeTensor(MiB)
    return model


def test_a_modules_overridden_parameters_and_buffers_never_run_and_every_byte_is_found():
    # Was: 6 calls of a counting parameters() over one session's looks; here 1 per scan.
    ran.clear()
    model = counting_model()
    (h,) = scan({"model": model})
    assert (h.name, h.kind) == ("model", "module")
    # parameters and their gradient, the buffer, and the child's parameter
    assert h.nbytes == 2 * GiB + GiB + MiB + GiB
    assert h.contents_bytes == 0  # all of it the module's own parameters, not "beyond" them
    assert ran == []


def test_a_parameters_property_that_raises_neither_runs_nor_hides_the_modules_bytes():
    class AsProperty(HookedModule):
        @property
        def parameters(self):
            ran.append("parameters property")
            raise RuntimeError("a property")

        @property
        def buffers(self):
            ran.append("buffers property")
            raise RuntimeError("a property")

    ran.clear()
    (h,) = scan({"net": AsProperty(FakeTensor(GiB))})
    assert (h.nbytes, h.walk_capped) == (GiB, False)
    assert ran == []


def test_a_parameters_that_never_ends_is_never_started_and_the_look_stays_quick():
    # Was: read to a million items on every look, 6.0-13.7 s for `who`, 21.5 s the OOM cell.
    started = []

    class Endless(HookedModule):
        def parameters(self, recurse: bool = True):
            started.append(1)
            while True:
                yield FakeTensor(4)

    model = Endless(FakeTensor(GiB))
    t0 = time.perf_counter()
    (h,) = scan({"model": model})
    assert started == []
    assert h.nbytes == GiB
    assert time.perf_counter() - t0 < hang_guard(2.0)


def test_a_module_tree_with_a_cycle_and_non_str_child_keys_is_walked_once():
    root = CountingModule(FakeTensor(GiB))
    child = CountingModule(FakeTensor(MiB))
    root._modules[0] = child  # a key that is no str: torch would refuse it, the walk reads on
    child._modules["up"] = root
    ran.clear()
    (h,) = scan({"root": root})
    assert h.nbytes == GiB + MiB
    assert ran == []


class StateProperty(Optimizer):
    """An optimizer whose ``state`` is a property counting its reads (optimizer_state_property)."""

    @property
    def state(self):
        ran.append("state")
        return self.__dict__["state"]

    @state.setter
    def state(self, value: Any) -> None:
        self.__dict__["state"] = value


class CountingDict(dict):
    def values(self):
        ran.append("values")
        return super().values()

    def __iter__(self):
        ran.append("__iter__")
        return super().__iter__()


def test_an_optimizers_state_property_and_its_dicts_overrides_never_run_and_bytes_are_found():
    p = FakeTensor(GiB)
    opt = StateProperty(CountingDict({p: CountingDict({"exp_avg": FakeTensor(GiB),
                                                       "exp_avg_sq": FakeTensor(GiB),
                                                       "step": 3})}))
    ran.clear()
    (h,) = scan({"opt": opt})
    assert (h.kind, h.nbytes) == ("optimizer state", 2 * GiB)
    assert ran == []


# -- A2: tensor subclasses -----------------------------------------------------------------------
def _counted(name: str) -> property:
    """A property in place of the base's attribute: counts each read, keeps the value where
    the base (FakeTensor, torch.Tensor's stand-in) keeps it, in the instance's dict."""

    def get(self: Any) -> Any:
        ran.append(name)
        return self.__dict__[name]

    def put(self: Any, value: Any) -> None:
        self.__dict__[name] = value

    return property(get, put)


class Sneaky(FakeTensor):
    """A tensor subclass overriding every fact the walk reads (t22's tensor_subclass_counting,
    and the slow kind: any of these could take seconds)."""

    device = _counted("device")
    grad = _counted("grad")
    grad_fn = _counted("grad_fn")
    is_leaf = _counted("is_leaf")
    shape = _counted("shape")
    dtype = _counted("dtype")

    def untyped_storage(self) -> Any:
        ran.append("untyped_storage")
        return super().untyped_storage()

    def element_size(self) -> int:
        ran.append("element_size")
        return 4

    def nelement(self) -> int:
        ran.append("nelement")
        return super().nelement()


def test_a_tensor_subclasss_overridden_attributes_never_run_and_its_bytes_are_found():
    # Was: 4 calls per tensor per look (40 for 10 tensors), 80 in the OOM cell.
    xs = [Sneaky(GiB) for _ in range(10)]
    w = Sneaky(GiB)
    w.grad = Sneaky(MiB)
    ran.clear()
    got = bytes_by_name(scan({"xs": xs, "w": w, "one": Sneaky(8 * MiB)}))
    assert got == {"xs": 10 * GiB, "w": GiB + MiB, "one": 8 * MiB}
    assert ran == []


def test_a_tensor_subclass_in_a_module_an_optimizer_and_a_graph_runs_no_code():
    weight = Sneaky(GiB)
    weight.grad = Sneaky(GiB)
    model = CountingModule(weight)
    model._buffers["mask"] = Sneaky(MiB)
    opt = Optimizer({weight: {"exp_avg": Sneaky(GiB)}})
    saved = Sneaky(4 * GiB)
    loss = Sneaky(4, grad_fn=node("MulBackward0", self=saved))
    ran.clear()
    holders = scan({"model": model, "opt": opt, "loss": loss})
    got = {h.name: (h.nbytes, h.graph_bytes) for h in holders}
    assert got == {"model": (2 * GiB + MiB, None), "opt": (GiB, None), "loss": (4, 4 * GiB)}
    loss_holder = next(h for h in holders if h.name == "loss")
    assert loss_holder.detail == "float32[1], grad_fn=MulBackward0"
    assert ran == []


def test_the_tensor_reader_describes_and_sizes_without_the_subclass():
    t = Sneaky(GiB, grad_fn=node("AddBackward0"))
    scanner = Scanner({"torch": torch_with_nn()})
    ran.clear()
    assert scanner._tensor_info(t) == ("cuda:0", GiB, ("cuda:0", id(t)))
    assert scanner._describe(t) == f"float32[{GiB // 4}], grad_fn=AddBackward0"
    assert scanner.shape_of(t) == (GiB // 4,)
    assert scanner.own_bytes(t) == GiB
    assert scanner._grad_fn(t) is t.__dict__["grad_fn"]
    assert scanner._grad_of(t) is None  # not a leaf
    assert ran == []


def test_a_look_keeps_no_reference_to_a_tensor_or_its_gradient():
    # A reference the reader kept after the look (a memo of the last tensor read) is memory
    # the user cannot free, and one more reference the retention search cannot explain.
    import sys

    w = Sneaky(GiB, grad_fn=None)
    w.grad = Sneaky(MiB)
    before = (sys.getrefcount(w), sys.getrefcount(w.__dict__["grad"]))
    scanner = Scanner({"torch": torch_with_nn()})
    scanner.scan({"w": w, "m": CountingModule(w)})
    scanner.tensors_of([w])
    scanner._tensor_info(w)
    scanner._describe(w)
    assert (sys.getrefcount(w), sys.getrefcount(w.__dict__["grad"])) == before


class DynamicLayer:
    def __init__(self, tokens: int) -> None:
        self.keys = Sneaky(MiB * tokens)
        self.keys.shape = (4, 16, tokens, 64)
        self.values = Sneaky(MiB * tokens)
        self.values.shape = (4, 16, tokens, 64)


class DynamicCache:
    def __init__(self, layers: int, tokens: int) -> None:
        self.layers = [DynamicLayer(tokens) for _ in range(layers)]


def test_the_failure_site_sizes_a_kv_cache_of_tensor_subclasses_without_running_them():
    cache = DynamicCache(layers=4, tokens=128)
    err = raise_in("/site-packages/transformers/generation/utils.py", "_sample",
                   {"self": object(), "model_kwargs": {"past_key_values": cache}})
    ran.clear()
    site = failure_site(err, {}, modules={"torch": torch_with_nn()})
    assert site.cache is not None
    assert (site.cache.nbytes, site.cache.tokens) == (4 * 2 * 128 * MiB, 128)
    assert site.cache.per_token_bytes == 4 * 2 * MiB
    assert ran == []


def test_the_failure_site_reads_a_modules_children_without_its_dict_property():
    class DictProperty(HookedModule):
        @property  # type: ignore[misc]
        def __dict__(self):
            ran.append("__dict__ property")
            return {}

    attn = HookedModule()
    model = HookedModule(block=DictProperty(attn=attn))
    err = raise_in("/site-packages/model.py", "forward", {"self": attn, "x": 1})
    ran.clear()
    site = failure_site(err, {"model": model}, modules={"torch": torch_with_nn()})
    assert site.module == "model.block.attn (HookedModule)"
    assert ran == []


# -- A4: namespace keys that are str subclasses ----------------------------------------------------
class HStr(str):
    """A str subclass used as a namespace key (``globals()[HStr('weird')] = t``)."""

    def __hash__(self) -> int:
        ran.append("__hash__")
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        ran.append("__eq__")
        return str.__eq__(self, other)

    def startswith(self, *a: Any) -> bool:  # type: ignore[override]
        ran.append("startswith")
        return str.startswith(self, *a)

    def __format__(self, spec: str) -> str:
        ran.append("__format__")
        return str.__format__(self, spec)

    def __getitem__(self, i: Any) -> str:  # type: ignore[override]
        ran.append("__getitem__")
        return str.__getitem__(self, i)

    def __repr__(self) -> str:
        ran.append("__repr__")
        return str.__repr__(self)


def test_a_str_subclass_key_runs_none_of_its_code_and_its_tensor_is_found_by_its_text():
    ns = {HStr("weird"): FakeTensor(GiB), HStr("__dunder"): FakeTensor(MiB),
          HStr("_3"): FakeTensor(2 * MiB), "plain": FakeTensor(4 * MiB)}
    out = {3: FakeTensor(8 * MiB)}
    ran.clear()  # building the dict hashed the keys
    holders = scan(ns, output_cache=out)
    got = bytes_by_name(holders)
    # "_3" is no name the output cache wrote (IPython writes exact strs): it is the user's.
    assert got == {"weird": GiB, "_3": 2 * MiB, "plain": 4 * MiB, "Out[3]": 8 * MiB}
    assert all(type(h.name) is str for h in holders)
    assert ran == []


def test_the_output_cache_names_are_exact_strs_only():
    value = FakeTensor(GiB)
    ns = {HStr("_1"): value, HStr("_"): value, "_2": value}
    ran.clear()
    assert output_cache_names(ns, {1: value, 2: value}) == {"_2"}
    assert ran == []


# -- through the shell: who, cleanup --dry-run and an OOM cell -----------------------------------
@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_who_cleanup_dry_run_and_an_oom_cell_run_no_user_code(loaded, fake_gpu, capsys):
    fake_gpu.torch.nn = SimpleNamespace(Module=Module)
    fake_gpu.torch.optim = SimpleNamespace(Optimizer=Optimizer)
    cuda = fake_gpu.cuda
    model = CountingModule(cuda.tensor(2 * GiB))
    opt = StateProperty(CountingDict({0: CountingDict({"exp_avg": cuda.tensor(GiB)})}))
    act = Sneaky(3 * GiB)
    loaded.user_ns.update({"model": model, "opt": opt, "act": act,
                           HStr("weird"): cuda.tensor(GiB)})
    capsys.readouterr()
    ran.clear()
    report = loaded.run_line_magic("gpumem", "who -o")
    assert ran == []
    got = bytes_by_name(report.holders)
    assert {k: got.get(k) for k in ("model", "opt", "act", "weird")} == {
        "model": 2 * GiB, "opt": GiB, "act": 3 * GiB, "weird": GiB}
    loaded.run_line_magic("gpumem", "cleanup --dry-run --out -o")
    assert ran == []
    loaded.run_cell("y = cuda.tensor(400 * GiB)", store_history=True)
    out = capsys.readouterr().out
    assert "CUDA out of memory" in out
    assert ran == []
    assert all(k in loaded.user_ns for k in ("model", "opt", "act"))


def test_a_users_class_with_next_functions_is_not_taken_for_an_autograd_node():
    """Bare autograd nodes are sized by the graph walk, which reads a node as torch's (its
    `dir()`, `next_functions`, `_raw_saved_*`): a class of the user's that only looks like one
    must be walked as the object it is, its tensors found, and none of its code run."""
    ran.clear()

    class Pipeline:
        __slots__ = ("next_functions", "stage")

        def __dir__(self) -> list[str]:
            ran.append("__dir__")
            return ["next_functions", "_raw_saved_self"]

        def __getattr__(self, name: str) -> Any:
            ran.append(f"__getattr__ {name}")
            raise AttributeError(name)

    p = Pipeline()
    p.next_functions = ((None, 0),)
    p.stage = FakeTensor(GiB)
    holders = scan({"pipe": p, "roots": [node("MeanBackward0", self=FakeTensor(2 * GiB))]})
    assert ran == []
    assert bytes_by_name(holders) == {"pipe": GiB, "roots": 2 * GiB}
