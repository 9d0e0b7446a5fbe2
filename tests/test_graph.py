"""The autograd graph walk: what a graph's saved tensors keep alive, counted once, without
unpacking anything, within its time budget (fake nodes shaped like torch's)."""

from __future__ import annotations

import itertools
import time
import weakref
from types import SimpleNamespace
from typing import Any

from gpumem_nb.analysis import held_text
from gpumem_nb.graph import GraphWalker
from gpumem_nb.holders import Scanner

from .fakes import (
    AccumulateGrad,
    CppHeld,
    FakeSaved,
    FakeTensor,
    GiB,
    MiB,
    fake_torch,
    node,
    node_type,
)
from .helpers import hang_guard

MOD = {"torch": fake_torch()}


def storage_of(t: Any) -> Any:
    return Scanner(MOD)._tensor_info(t)


def walk(*roots: Any, seen: set | None = None, **kw: Any) -> Any:
    return GraphWalker(storage_of, seen, **kw).size(roots)


def test_a_graph_keeps_the_tensors_its_nodes_saved():
    x, h = FakeTensor(GiB), FakeTensor(2 * GiB)
    relu = node("ReluBackward0", None, result=h)
    mul = node("MulBackward0", relu, self=x, other=h.view())
    size = walk(node("SumBackward0", mul))
    assert size.nodes == 3 and not size.capped
    assert size.bytes_by_device == {"cuda:0": 3 * GiB}  # h and its view: one storage
    assert size.tensors == 2


def test_storages_another_holder_owns_and_parameters_are_not_the_graphs():
    weight, act, held = FakeTensor(GiB), FakeTensor(256 * MiB), FakeTensor(GiB)
    acc = node("AccumulateGrad", variable=weight)
    # mm saves a view of the weight (torch saves weight.t()) and an activation.
    mm = node("MmBackward0", None, acc, self=act, mat2=weight.view())
    add = node("AddBackward0", mm, other=held)
    # A variable and the module (the weight's owner) the scan already attributed.
    seen = {storage_of(held)[2], storage_of(weight)[2]}
    size = walk(add, seen=seen)
    assert size.bytes_by_device == {"cuda:0": 256 * MiB}
    assert storage_of(act)[2] in seen  # credited now: the next graph will not count it again
    assert walk(node("MulBackward0", None, self=act), seen=seen).nbytes == 0


def test_a_cycle_among_nodes_ends_and_counts_each_once():
    a = FakeTensor(GiB)
    first = node("MulBackward0", None, self=a)
    second = node("MulBackward0", first, self=a)
    first.next_functions = ((second, 0),)  # hostile, or a fake: real graphs are acyclic
    size = walk(second)
    assert (size.nodes, size.nbytes, size.tensors) == (2, GiB, 1)


def test_saved_tensor_hooks_are_never_run():
    unpacked: list[int] = []

    def unpack(p: Any) -> Any:
        unpacked.append(1)
        return p

    checkpointed = FakeSaved(FakeTensor(GiB), unpack_hook=unpack, packed=object())
    offloaded = FakeSaved(FakeTensor(GiB), unpack_hook=unpack,
                          packed=FakeTensor(GiB, device="cpu"))
    identity = FakeSaved(None, unpack_hook=unpack, packed=(FakeTensor(MiB), "meta"))
    size = walk(node("MulBackward0", None, self=checkpointed, other=offloaded),
                node("AddBackward0", None, self=identity))
    assert unpacked == [] and checkpointed.unpacks == 0
    # What the pack hooks returned is what the graph holds: sized where it is a tensor.
    assert size.bytes_by_device == {"cpu": GiB, "cuda:0": MiB}
    assert size.hooked == 1


def test_saved_tensors_released_by_backward_count_nothing_and_raise_nothing():
    saved = FakeSaved(FakeTensor(GiB))
    saved.release()
    size = walk(node("MulBackward0", None, self=saved))
    assert (size.nbytes, size.released) == (0, 1)


def test_a_torch_that_cannot_say_whether_hooks_are_set_is_left_alone():
    class OldSaved:  # no .data, no .unpack_hook: only unpacking would tell
        def unpack(self) -> Any:
            raise AssertionError("unpacked")

    size = walk(node("MulBackward0", None, self=OldSaved()))
    assert (size.nbytes, size.unknown) == (0, 1)


def test_tuples_of_saved_tensors_and_a_python_functions_ctx_are_counted():
    class MyFnBackward:  # a Python autograd.Function's node is its ctx: it has a __dict__
        def __init__(self) -> None:
            self.next_functions = ()
            self._raw_saved_tensors = (FakeSaved(FakeTensor(GiB)),)
            self.extra = FakeTensor(2 * GiB)  # ctx.extra = tensor
            self.inputs = [FakeTensor(MiB), None, 3]

    index = node("IndexBackward0", MyFnBackward(),
                 indices=(FakeTensor(MiB), FakeTensor(MiB)))
    assert walk(index).nbytes == 3 * GiB + 3 * MiB


def chain(n: int, saved_every: int = 1) -> Any:
    """A graph of ``n`` nodes in a line, like a long unrolled loop."""
    keep = node_type("AddBackward0", "other")
    bare = node_type("AddBackward0")
    prev = node("AccumulateGrad")
    for i in range(n - 1):
        prev = keep(prev, other=FakeTensor(MiB)) if i % saved_every == 0 else bare(prev)
    return prev


def test_a_100k_node_graph_stops_at_its_time_budget_and_says_at_least():
    big = chain(100_000, saved_every=10)
    ticks = itertools.count()
    size = GraphWalker(storage_of, budget_s=20, clock=lambda: next(ticks)).size([big])
    # The clock advances one unit per look, a look every 32 nodes: 20 units, ~640 nodes.
    assert size.capped and 0 < size.nodes < 1_000
    assert 0 < size.nbytes <= size.nodes * MiB
    # Real time: the default budget (30 ms) holds on a 100k-node graph, with room for a
    # slow shared machine; the whole graph is walked when the budget allows it.
    start = time.perf_counter()
    cut = GraphWalker(storage_of).size([big])
    assert cut.capped and time.perf_counter() - start < hang_guard(0.25)
    whole = GraphWalker(storage_of, budget_s=60).size([big])
    assert not whole.capped and whole.nodes == 100_000 and whole.tensors == 10_000


def test_a_node_cap_also_bounds_the_walk():
    size = GraphWalker(storage_of, node_cap=500, budget_s=60).size([chain(2_000)])
    assert size.capped and size.nodes == 500


# -- in the holder scan -------------------------------------------------------------------------
def scan(ns: dict, **kw: Any) -> list:
    return Scanner(MOD).scan(ns, **kw)


def test_who_shows_an_outputs_graph_beside_its_own_bytes():
    acts = [FakeTensor(GiB) for _ in range(3)]
    graph = node("SumBackward0", *[node("MulBackward0", None, self=a) for a in acts])
    logits = FakeTensor(512 * MiB, grad_fn=graph)
    (h,) = scan({}, output_cache={4: logits})
    assert (h.name, h.nbytes, h.graph_bytes, h.graph_nodes) == ("Out[4]", 512 * MiB, 3 * GiB, 4)
    assert h.held_bytes == 3 * GiB + 512 * MiB
    assert held_text(h) == "512.00 MiB + its graph 3.00 GiB (4 nodes)"


def test_every_tensors_graph_in_a_list_is_walked_not_just_the_first():
    losses = [FakeTensor(4, grad_fn=node("MulBackward0", None, self=FakeTensor(GiB)))
              for _ in range(5)]
    (h,) = scan({"losses": losses})
    assert (h.nbytes, h.graph_bytes, h.graph_nodes) == (20, 5 * GiB, 5)


def test_a_saved_tensor_a_variable_holds_is_the_variables_whatever_the_order():
    act = FakeTensor(GiB)
    loss = FakeTensor(4, grad_fn=node("MulBackward0", None, self=act))
    holders = {h.name: h for h in scan({"loss": loss, "act": act})}  # loss comes first
    assert holders["act"].nbytes == GiB and holders["loss"].graph_bytes == 0


def test_a_graphs_tensors_on_another_device_are_listed_there():
    cpu = FakeTensor(GiB, device="cpu")
    loss = FakeTensor(4, grad_fn=node("MulBackward0", None, self=cpu, other=FakeTensor(MiB)))
    got = sorted((h.device, h.nbytes, h.graph_bytes) for h in scan({"loss": loss}))
    assert got == [("cpu", 0, GiB), ("cuda:0", 4, MiB)]


def test_a_variable_its_graph_also_saves_is_told_to_go_with_the_graph_not_alone():
    """`del x` frees nothing while `preds`' graph saved x (found on the H100: advised 512 MiB,
    freed 0): the advice is the cut set, `del x, preds`."""
    from gpumem_nb.analysis import holder_advice

    x = FakeTensor(GiB)
    preds = [FakeTensor(4, grad_fn=node("MmBackward0", None, self=x))]
    holders = {h.name: h for h in scan({"preds": preds, "x": x})}
    assert holders["x"].also_held_by == ("preds",)
    assert holder_advice(holders["x"]).code == "del x, preds"


def test_a_parameter_a_graph_saves_does_not_make_its_module_part_of_every_cut_set():
    weight = FakeTensor(GiB)
    acc = node("AccumulateGrad", variable=weight)
    out = FakeTensor(4, grad_fn=node("MmBackward0", None, acc, mat2=weight.view()))
    holders = {h.name: h for h in scan({"w": weight, "out": out})}
    assert holders["w"].also_held_by == ()


def test_a_parameter_whose_module_was_deleted_is_kept_by_the_graph_not_lost():
    """`del model` after a forward pass: the weights live on behind the outputs' graphs
    (AccumulateGrad keeps each); on the H100 they were 99.6% "not found"."""
    weight = FakeTensor(8 * GiB)
    acc = node("AccumulateGrad", variable=weight)
    out = FakeTensor(4, grad_fn=node("AddmmBackward0", None, acc, mat1=FakeTensor(MiB)))
    del weight, acc
    (h,) = scan({"out": out})
    assert (h.nbytes, h.graph_bytes) == (4, 8 * GiB + MiB)


def test_a_parameter_a_module_alive_elsewhere_keeps_is_not_counted_in_a_loss_graph():
    """The model lives on in a frame's locals (or a thread, or a module global), which the
    namespace does not show: dropping the loss frees only the activations. On the H100 the
    loss was said to hold 1,642,500 B where dropping it freed 589,828 B."""
    weight = FakeTensor(8 * GiB)
    model = SimpleNamespace(_parameters={"weight": weight})  # the frame's, not the notebook's
    acc = node("AccumulateGrad", variable=weight)
    out = FakeTensor(4, grad_fn=node("AddmmBackward0", None, acc, mat1=FakeTensor(MiB)))
    del weight, acc
    (h,) = scan({"out": out})
    assert (h.nbytes, h.graph_bytes) == (4, MiB)
    assert not h.graph_bytes_capped
    assert model._parameters  # alive through the scan


def leaf_graph(held: CppHeld) -> Any:
    return FakeTensor(4, grad_fn=node("AddmmBackward0", None, AccumulateGrad(held),
                                      mat1=FakeTensor(MiB)))


def test_with_torchs_own_reference_to_a_leaf_a_deleted_models_weight_is_the_graphs():
    """PyTorch 2.11: the graph keeps the parameter's Python object from C++, which the
    collector does not see; with the module gone that is the only reference."""
    weight = FakeTensor(8 * GiB)
    held = CppHeld(weight)
    try:
        del weight
        (h,) = scan({"out": leaf_graph(held)})
        assert h.graph_bytes == 8 * GiB + MiB
    finally:
        held.release()


def test_with_torchs_own_reference_to_a_leaf_a_live_modules_weight_is_not_the_graphs():
    weight = FakeTensor(8 * GiB)
    held = CppHeld(weight)
    try:
        model = SimpleNamespace(_parameters={"weight": weight})
        del weight
        (h,) = scan({"out": leaf_graph(held)})
        assert h.graph_bytes == MiB
        assert model._parameters
    finally:
        held.release()


def test_a_leaf_whose_one_reference_is_a_live_modules_dict_is_not_the_graphs():
    """torch before PyObject preservation: C++ holds no reference to the Python object while
    Python owns it, so a live module's dict is its one reference; the collector finds it."""

    class WeakAccumulateGrad:
        __slots__ = ("_ref", "next_functions")

        def __init__(self, t: Any) -> None:
            self.next_functions = ()
            self._ref = weakref.ref(t)

        @property
        def variable(self) -> Any:
            return self._ref()

    WeakAccumulateGrad.__name__ = "AccumulateGrad"
    model = SimpleNamespace(_parameters={"weight": FakeTensor(8 * GiB)})
    acc = WeakAccumulateGrad(model._parameters["weight"])
    out = FakeTensor(4, grad_fn=node("AddmmBackward0", None, acc, mat1=FakeTensor(MiB)))
    (h,) = scan({"out": out})
    assert h.graph_bytes == MiB


def test_a_leaf_not_judged_in_time_is_left_out_and_the_figure_said_at_least():
    weight = FakeTensor(8 * GiB)
    root = node("AddmmBackward0", None, node("AccumulateGrad", variable=weight),
                mat1=FakeTensor(MiB))
    del weight
    ticks = itertools.count()
    # Each look at the clock is one unit: the deadline (0 + 1) is met at the walk's start
    # (1) and passed when the leaf's heap pass would begin (2).
    size = GraphWalker(storage_of, budget_s=1, clock=lambda: next(ticks)).size([root])
    assert (size.nbytes, size.capped) == (MiB, True)
    assert GraphWalker(storage_of).size([root]).nbytes == 8 * GiB + MiB


def test_two_outputs_of_one_forward_are_both_in_the_cut_set_of_their_shared_graph():
    """`policy, value = model(x); del model`: both outputs' graphs run through the body, which
    the first walk counted as policy's. `del policy` freed 1.5 MB of 56 GiB on the H200: the
    advice is `del policy, value`."""
    from gpumem_nb.analysis import holder_advice

    weight = FakeTensor(8 * GiB)
    body = node("AddmmBackward0", None, node("AccumulateGrad", variable=weight),
                mat1=FakeTensor(GiB))
    policy = FakeTensor(4, grad_fn=node("AddmmBackward0", body, mat1=FakeTensor(MiB)))
    value = FakeTensor(4, grad_fn=node("AddmmBackward0", body, mat1=FakeTensor(MiB)))
    del weight, body
    holders = {h.name: h for h in scan({"policy": policy, "value": value})}
    assert holders["policy"].graph_bytes == 9 * GiB + MiB
    assert holders["policy"].also_held_by == ("value",)
    assert holder_advice(holders["policy"]).code == "del policy, value"
    assert holders["value"].also_held_by == ()


def test_what_a_checkpoints_unpack_hook_keeps_is_its_graphs_never_unsized_or_unpacked():
    """H200, checkpoint_outputs_kept_for_later_backward: non-reentrant checkpointing packs a
    holder object, and its unpack hook closes over a frame whose recomputation closes over
    the input: 34 GiB were "not found" ("12 saved behind saved-tensor hooks, not sized")."""
    calls: list[int] = []

    class Frame:
        pass

    def checkpoint_hooks(x: Any) -> Any:
        frame = Frame()

        def recompute_fn() -> Any:
            return x

        frame.recompute_fn = recompute_fn  # type: ignore[attr-defined]

        def unpack_hook(holder: Any) -> Any:
            calls.append(1)
            return frame.recompute_fn()  # type: ignore[attr-defined]

        return unpack_hook

    hook = checkpoint_hooks(FakeTensor(3 * GiB))
    saved = [FakeSaved(None, unpack_hook=hook, packed=object()) for _ in range(3)]
    size = walk(node("MmBackward0", None, self=saved[0], other=saved[1]),
                node("AddBackward0", None, self=saved[2]))
    assert calls == [] and all(s.unpacks == 0 for s in saved)
    assert size.bytes_by_device == {"cuda:0": 3 * GiB}, size
    # One frame serves all three saved tensors: none of them is left "not sized".
    assert size.hooked == 0, size


def test_a_hooks_closure_is_searched_without_its_modules_globals():
    """What a hook's function keeps is its closure and defaults, never the module it was
    defined in: a tensor in that module's globals is not the graph's."""
    import types as _types

    module = _types.ModuleType("gm_probe_hooks")
    module.big = FakeTensor(5 * GiB)  # type: ignore[attr-defined]
    exec("def unpack_hook(p):\n    return big\n", vars(module))
    import sys as _sys

    _sys.modules["gm_probe_hooks"] = module
    try:
        saved = FakeSaved(None, unpack_hook=module.unpack_hook, packed=object())
        size = walk(node("MulBackward0", None, self=saved))
        assert size.bytes_by_device == {}, size
        assert size.hooked == 1
    finally:
        del _sys.modules["gm_probe_hooks"]
