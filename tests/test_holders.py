"""The holder scan: names the right things, counts shared storage once, stays fast."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from gpumem_nb.analysis import held_text
from gpumem_nb.holders import Scanner

from .fakes import FakeCuda, FakeTensor, GiB, MiB, fake_torch


class Module:
    """``torch.nn.Module`` as torch keeps one: parameters in its own ``_parameters``, buffers
    in ``_buffers``, children in ``_modules``, where the walk reads them (it never calls
    ``parameters()``: that is the user's code in a subclass)."""

    def __init__(self, *tensors: FakeTensor) -> None:
        self._parameters: dict = {str(i): t for i, t in enumerate(tensors)}
        self._buffers: dict = {}
        self._modules: dict = {}

    def parameters(self):
        return iter(self._parameters.values())

    def buffers(self):
        return iter(self._buffers.values())


class Optimizer:
    def __init__(self, state: dict) -> None:
        self.state = state


def torch_with_nn() -> SimpleNamespace:
    t = fake_torch(FakeCuda(initialized=True))
    t.nn = SimpleNamespace(Module=Module)
    t.optim = SimpleNamespace(Optimizer=Optimizer)
    return t


def scan(ns: dict, **kw) -> list:
    return Scanner({"torch": torch_with_nn()}).scan(ns, **kw)


def test_tensors_inside_modules_optimizers_lists_and_dicts_are_found():
    p = FakeTensor(GiB)
    ns = {
        "model": Module(p, FakeTensor(MiB)),
        "opt": Optimizer({p: {"exp_avg": FakeTensor(GiB), "exp_avg_sq": FakeTensor(GiB)}}),
        "batch": [FakeTensor(4 * MiB), {"mask": FakeTensor(MiB)}],
        "n": 3,
    }
    got = {(h.name, h.kind): h.nbytes for h in scan(ns)}
    assert got == {("model", "module"): GiB + MiB, ("opt", "optimizer state"): 2 * GiB,
                   ("batch", "container"): 5 * MiB}


def test_a_tensor_reachable_twice_is_counted_once_under_the_variable():
    t = FakeTensor(GiB)
    holders = scan({"y": t, "_": t, "_7": t}, output_cache={7: t})
    assert [(h.name, h.nbytes) for h in holders] == [("y", GiB)]


def test_output_cache_entries_carry_their_aliases():
    t = FakeTensor(GiB)
    holders = scan({"_": t, "_7": t}, output_cache={7: t})
    assert [(h.name, h.kind) for h in holders] == [("Out[7] (also _)", "output cache")]


def test_underscore_names_the_user_assigned_are_variables_not_the_output_cache():
    # `--out` keeps these, so `who` must not call them output cache (nor advise --out).
    out, mine, old = FakeTensor(GiB), FakeTensor(MiB), FakeTensor(2 * MiB)
    holders = scan({"_": mine, "_7": old, "_8": out}, output_cache={8: out},
                   hidden={"_": out, "_7": FakeTensor(4), "_8": out})
    assert {(h.name, h.kind) for h in holders} == {
        ("Out[8]", "output cache"), ("_", "variable"), ("_7", "variable")}


def test_frames_of_a_chained_exception_are_attributed():
    def f() -> None:
        big = FakeTensor(GiB)  # noqa: F841 - held by the frame
        raise ValueError

    def g() -> None:
        try:
            f()
        except ValueError:
            raise RuntimeError("wrapped") from None

    try:
        g()
    except RuntimeError as e:
        err = e
    assert [(h.name, h.nbytes) for h in scan({}, last_exception=[err])] == [
        ("traceback: f() locals", GiB)]


def test_a_suspended_generators_frame_is_never_read_through_a_traceback():
    # Reading f_locals of a live frame (Python <= 3.12) stores a snapshot that keeps the
    # generator's locals alive after the generator drops them: observing would leak.
    import weakref

    refs: list = []

    def gen():
        big = FakeTensor(GiB)
        refs.append(weakref.ref(big))
        try:
            raise ZeroDivisionError
        except ZeroDivisionError as e:
            err = e
        yield err
        del big
        yield None

    g = gen()
    err = next(g)  # its traceback runs through g's suspended frame
    holders = scan({}, last_exception=[err])
    assert not [h for h in holders if h.name == "traceback: gen() locals"]
    next(g)
    assert refs[0]() is None


class Node:
    """An autograd node: edges to the nodes that produced its inputs."""

    def __init__(self, *inputs: Node | None) -> None:
        self.next_functions = tuple((n, 0) for n in inputs)


def named(kind: str, *inputs: Node | None) -> Node:
    return type(kind, (Node,), {})(*inputs)


def test_a_stored_loss_reports_its_own_bytes_and_separately_the_graph_it_holds():
    # Issue 11: `who` listed a graph-holding loss as just "4 B".
    acc_w, acc_b = named("AccumulateGrad"), named("AccumulateGrad")
    mm = named("MmBackward0", None, acc_w)  # None: an input that needs no grad
    add = named("AddBackward0", mm, acc_b)
    loss = FakeTensor(4, grad_fn=named("MeanBackward0", named("ReluBackward0", add), add))
    (h,) = scan({"loss": loss})
    assert (h.nbytes, h.holds_graph, h.graph_nodes, h.graph_nodes_capped) == (4, True, 6, False)
    assert "grad_fn=MeanBackward0" in h.detail
    assert held_text(h) == "4 B; its graph (6 nodes) keeps nothing more"  # no saved tensors


def test_a_graph_the_scan_has_no_time_left_for_is_said_not_walked():
    node = named("AccumulateGrad")
    add = type("AddBackward0", (Node,), {})  # one type, as torch's nodes share theirs
    for _ in range(12_000):
        node = add(node)
    loss = FakeTensor(4, grad_fn=node)
    (h,) = Scanner({"torch": fake_torch()}, graph_budget_s=0).scan({"loss": loss})
    assert h.holds_graph and h.graph_nodes is None and h.graph_bytes is None
    assert "not walked" in held_text(h)
    (h,) = Scanner({"torch": fake_torch()}, graph_budget_s=60).scan({"loss": loss})
    assert h.graph_nodes == 12_001 and not h.graph_nodes_capped


def test_a_tensor_without_grad_fn_holds_no_graph():
    (h,) = scan({"w": FakeTensor(GiB)})
    assert not h.holds_graph and h.graph_nodes is None and "autograd" not in h.detail


def test_traceback_locals_are_attributed_to_the_frame():
    def f() -> None:
        big = FakeTensor(2 * GiB)  # noqa: F841 - held by the frame
        raise ValueError

    try:
        f()
    except ValueError as e:
        err = e
    (h,) = scan({}, last_exception=[err])
    assert (h.name, h.kind, h.nbytes) == ("traceback: f() locals", "traceback", 2 * GiB)


def test_without_torch_numpy_arrays_are_still_reported_as_host_memory():
    holders = Scanner({}).scan({"a": np.zeros(1000), "b": [np.ones(10)]})
    assert [(h.name, h.device, h.nbytes) for h in holders] == [("a", "cpu", 8000),
                                                               ("b", "cpu", 80)]


def test_a_tensor_among_a_million_plain_objects_is_still_found():
    # benchmarks/bench_who.py times this namespace; here only the answer matters.
    ns: dict = {f"v{i}": i for i in range(200_000)}
    ns["big_list"] = list(range(1_000_000))
    ns["big_dict"] = {i: float(i) for i in range(300_000)}
    ns["nested"] = [[FakeTensor(GiB)]]
    assert [(h.name, h.nbytes) for h in scan(ns)] == [("nested", GiB)]


def test_a_scan_leaves_the_garbage_collector_as_it_found_it():
    # The walk pauses the collector for speed; it must restore it, even when it fails.
    import gc

    class Broken(dict):
        def items(self):
            raise RuntimeError("no items")

    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            for ns in ({"x": [FakeTensor(GiB)]}, Broken(x=1)):
                scan(ns)
                assert gc.isenabled() is enabled
    finally:
        gc.enable()


# -- holders the first walk never entered (issue 24's second out-of-sample batch, H200) ------
class HookedModule(Module):
    """A module as torch keeps one: children in ``_modules``, hooks in ``_forward_hooks``,
    anything else the user sets in its own dict."""

    def __init__(self, *tensors: FakeTensor, **children: Module) -> None:
        super().__init__(*tensors)
        self._modules = dict(children)
        self._forward_hooks: dict = {}

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._modules.items():
            if isinstance(child, HookedModule):
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name)
            else:
                yield (f"{prefix}.{name}" if prefix else name), child


def test_outputs_a_forward_hooks_closure_keeps_are_the_modules_not_unfound():
    weight = FakeTensor(MiB)
    act = HookedModule()
    net = HookedModule(weight, **{"0": HookedModule(), "1": act})

    def attach(module: HookedModule) -> None:
        feats: list = []
        module._forward_hooks[0] = lambda m, i, o: feats.append(o)
        feats.extend(FakeTensor(GiB) for _ in range(3))

    attach(act)
    (h,) = scan({"net": net})
    assert (h.name, h.kind, h.nbytes) == ("net", "module", 3 * GiB + MiB)


def test_a_tensor_a_module_keeps_as_a_plain_attribute_is_the_modules():
    net = HookedModule(FakeTensor(MiB))
    net.last_out = FakeTensor(GiB)  # `self.last_out = out` in forward
    (h,) = scan({"net": net})
    assert h.nbytes == GiB + MiB


def test_results_an_lru_cache_keeps_are_the_cached_functions():
    import functools

    @functools.cache
    def embed(i: int) -> FakeTensor:
        return FakeTensor(GiB)

    @functools.lru_cache(maxsize=2)
    def small(i: int) -> FakeTensor:
        return FakeTensor(MiB)

    for i in range(3):
        embed(i)
        small(i)
    got = {h.name: h.nbytes for h in scan({"embed": embed, "small": small})}
    assert got == {"embed": 3 * GiB, "small": 2 * MiB}  # small's bound evicted one


def test_a_suspended_generators_batch_is_found_and_the_look_keeps_nothing_alive():
    import weakref

    def batches():
        for i in range(3):
            batch = FakeTensor(GiB)
            yield float(i)
            del batch

    it = batches()
    next(it)
    (h,) = scan({"it": it})
    assert (h.name, h.nbytes) == ("it", GiB)
    # Closing the generator must free its batch: a frame object or locals snapshot made by
    # the look would keep it alive (the H200 row freed 0 B on `it.close()`).
    ref = weakref.ref(next(o for o in __import__("gc").get_referents(it)
                           if isinstance(o, FakeTensor)))
    it.close()
    assert ref() is None


def test_the_advice_for_a_hook_a_cache_or_a_generator_is_the_step_that_frees_it():
    import functools

    from gpumem_nb.analysis import holder_action

    act = HookedModule()
    net = HookedModule(FakeTensor(MiB), **{"1": act})
    feats = [FakeTensor(GiB) for _ in range(4)]
    act._forward_hooks[0] = lambda m, i, o: feats.append(o)

    @functools.cache
    def embed(i: int) -> FakeTensor:
        return FakeTensor(GiB)

    embed(0)

    def batches():
        batch = FakeTensor(GiB)  # noqa: F841 - the suspended frame keeps it
        yield 1.0

    it = batches()
    next(it)
    got = {h.name: (h.label, holder_action(h)) for h in
           scan({"net": net, "embed": embed, "it": it})}
    label, action = got["net"]
    assert label.startswith("net → 1._forward_hooks[0]"), label
    assert "remove the hook" in action and "beyond its parameters" in action
    label, action = got["embed"]
    assert "lru_cache results" in label and "`embed.cache_clear()`" in action
    label, action = got["it"]
    assert "suspended batches() locals" in label and "`del it`" in action


def test_a_model_its_own_hooks_refer_back_to_is_enumerated_once_per_holder():
    # transformers' output recorders hook every submodule with a reference to the model: a
    # walk that enumerated the model per reference grew the H200's GPT-2 scan fourfold.
    calls = []

    class Counted(HookedModule):
        def parameters(self):
            calls.append(self)
            return super().parameters()

    children = {str(i): Counted() for i in range(50)}
    model = Counted(FakeTensor(GiB), **children)
    for child in children.values():
        child._forward_hooks[0] = lambda m, i, o, model=model: model
        child.back = model
    walks = []

    class Counting(Scanner):
        def _module_tensors(self, obj, path):
            walks.append(obj)
            return super()._module_tensors(obj, path)

    (h,) = Counting({"torch": torch_with_nn()}).scan({"model": model})
    assert h.nbytes == GiB
    # Its parameters enumerated once, read from each module's own dict: `parameters()` is
    # the user's code and never runs (A1).
    assert walks.count(model) == 1 and calls == []


def test_a_models_gradients_are_counted_so_the_advice_offers_zero_grad_with_their_bytes():
    from gpumem_nb.analysis import holder_advice

    w, b = FakeTensor(4 * GiB), FakeTensor(GiB)
    w.grad, b.grad = FakeTensor(4 * GiB), FakeTensor(GiB)
    (h,) = scan({"model": Module(w, b)})
    assert (h.nbytes, h.grad_bytes) == (10 * GiB, 5 * GiB)
    advice = holder_advice(h)
    assert advice.code == "model.zero_grad(set_to_none=True)" and advice.nbytes == 5 * GiB


def test_gradients_with_graphs_are_freed_by_zero_grad_not_by_deleting_the_model():
    """H200, create_graph_backward_grad_cycle: `backward(create_graph=True)` left graphs on the
    gradients that lead back to the parameters (a cycle inside autograd's C++ graph); the
    advice said "keep `model.detach()` ... or `del model`", and `del model` freed 0 of 34 GiB."""
    from gpumem_nb.analysis import holder_advice

    from .fakes import node

    w = FakeTensor(4 * GiB)
    w.grad = FakeTensor(4 * GiB, grad_fn=node("MmBackward0",
                                              node("AccumulateGrad", variable=w),
                                              self=FakeTensor(16 * MiB)))
    (h,) = scan({"model": Module(w)})
    assert h.grad_bytes == 4 * GiB and h.graph_bytes, h
    advice = holder_advice(h)
    assert advice.code == "model.zero_grad(set_to_none=True)", advice
    assert advice.nbytes == 4 * GiB + h.graph_bytes, advice
    assert "create_graph" in advice.text and ".detach()" not in advice.text, advice.text


def test_a_model_without_gradients_is_not_told_to_zero_them():
    from gpumem_nb.analysis import holder_advice

    (h,) = scan({"model": Module(FakeTensor(4 * GiB))})
    assert h.grad_bytes == 0 and "zero_grad" not in holder_advice(h).text


def test_a_small_view_of_a_large_storage_is_told_to_clone_and_what_that_frees():
    from gpumem_nb.analysis import holder_advice

    base = FakeTensor(16 * GiB)
    row = FakeTensor(GiB, base=base)
    del base
    (h,) = scan({"row": row})
    assert (h.nbytes, h.view_bytes) == (16 * GiB, GiB)
    advice = holder_advice(h)
    assert advice.code == "row = row.clone()" and advice.nbytes == 15 * GiB


def test_a_view_whose_base_another_name_also_holds_is_not_told_that_clone_frees_it():
    from gpumem_nb.analysis import holder_advice

    base = FakeTensor(16 * GiB)
    ns = {"row": FakeTensor(GiB, base=base), "base": base}
    (row,) = scan(ns)
    assert (row.name, row.view_bytes, row.also_held_by) == ("row", GiB, ("base",))
    assert "clone" not in holder_advice(row).text


def test_a_class_attribute_reached_through_an_instance_is_cleared_on_the_class_not_deleted():
    """`del block` freed 0 of 34 GB on the H100: the list is the class's, shared by every
    instance. The advice clears it where it lives, and running that line frees it."""
    from gpumem_nb.analysis import holder_advice

    class Block:
        cache: ClassVar[list] = []

    Block.__module__ = "__main__"  # defined in the notebook

    Block.cache.extend(FakeTensor(GiB) for _ in range(3))
    (h,) = scan({"block": Block()})
    advice = holder_advice(h)
    assert advice.code == "Block.cache.clear()" and advice.nbytes == 3 * GiB
    assert "del block` frees nothing" in advice.text
    exec(advice.code, {"Block": Block})
    assert Block.cache == []


def test_a_cupy_array_is_freed_back_to_the_gpu_not_only_to_cupys_pool():
    """`del blob` of a CuPy array measured 0 B freed on the device: CuPy keeps it pooled."""
    import numpy as np

    from gpumem_nb.analysis import holder_advice

    class ndarray(np.ndarray):  # CuPy's array, as the scan reads one: C descriptors
        __cuda_array_interface__ = None

    ndarray.__module__ = "cupy"
    blob = np.zeros(4096, dtype=np.uint8).view(ndarray)
    (h,) = scan({"blob": blob})
    assert (h.device, h.arrays, h.array_module) == ("cuda", True, "cupy")
    advice = holder_advice(h)
    assert advice.code == ("del blob; import cupy; "
                           "cupy.get_default_memory_pool().free_all_blocks()")
    assert "CuPy" in advice.text and advice.nbytes == 4096


def test_another_librarys_gpu_array_gets_no_line_that_claims_to_free_the_gpu():
    import numpy as np

    from gpumem_nb.analysis import holder_advice

    class Array(np.ndarray):
        __cuda_array_interface__ = None

    Array.__module__ = "jaxlib.xla_extension"
    (h,) = scan({"arr": np.zeros(4096, dtype=np.uint8).view(Array)})
    advice = holder_advice(h)
    assert advice.nbytes is None and "jaxlib's own memory pool" in advice.text


def test_autograd_nodes_kept_in_a_list_are_named_with_what_their_graphs_saved():
    # KINDS10 on the H100: `graph_roots.append(loss.grad_fn)`, then `del x, h, loss`. The
    # saved tensors have no Python object, so 0.1% was named and the rest "not found".
    from .fakes import node

    def graph(nbytes: int) -> object:
        x, h = FakeTensor(nbytes), FakeTensor(nbytes)
        mm = node("MmBackward0", None, self=x)
        tanh = node("TanhBackward0", mm, result=h)
        return node("MeanBackward0", node("PowBackward0", tanh, self=h))

    ns = {"graph_roots": [graph(GiB), graph(GiB)], "n": 3}
    (h,) = scan(ns)
    assert (h.name, h.device, h.nbytes, h.graph_bytes) == ("graph_roots", "cuda:0", 0, 4 * GiB)
    assert h.held_bytes == 4 * GiB and h.graph_nodes == 8
    assert h.detail == ("2 autograd nodes (MeanBackward0, ...): the tensors their graphs saved")
    assert held_text(h) == "its graph 4.00 GiB (8 nodes)"


def test_one_autograd_node_in_an_attribute_is_named_by_its_path():
    from .fakes import node

    class Plotter:
        pass

    keeper = Plotter()
    keeper.last = node("MeanBackward0", node("ReluBackward0", result=FakeTensor(2 * GiB)))
    (h,) = scan({"viz": keeper})
    assert h.held_bytes == 2 * GiB
    assert h.path.startswith("last") and "ReluBackward0" not in h.path
    assert h.detail == "an autograd node (MeanBackward0): the tensors its graph saved"


def test_a_node_whose_saved_tensor_a_variable_also_holds_is_a_second_reference_to_it():
    from .fakes import node

    x = FakeTensor(GiB)
    ns = {"x": x, "roots": [node("MulBackward0", self=x)]}
    got = {h.name: h for h in scan(ns)}
    assert got["x"].nbytes == GiB and "roots" in got["x"].also_held_by  # `del x` alone: no
    assert "roots" not in got  # nothing of its own to free


def test_nodes_the_graph_time_ran_out_before_make_the_holders_graph_at_least_not_exact():
    """A list of nodes whose later graphs the time for graphs did not reach was said as an
    exact, too small figure (a reliability attack: 110.83 KiB shown for 1.6 MB, no "≥")."""
    from gpumem_nb.graph import GraphSize
    from gpumem_nb.holders.autograd import _size_nodes
    from gpumem_nb.holders.facts import TensorFacts
    from gpumem_nb.holders.tally import Tally

    from .fakes import node

    class OutOfTimeAfterOne:
        calls = 0

        def size(self, roots):
            self.calls += 1
            if self.calls == 1:
                return GraphSize(nodes=2, bytes_by_device={"cuda:0": GiB}, walk=1)
            return GraphSize(nodes=0, capped=True, walk=self.calls)

    tally = Tally(TensorFacts({"torch": torch_with_nn()}))
    for i in range(3):
        tally.add_node("roots", "container", node("MeanBackward0"), (f"[{i}]",))
    (waiting,) = tally.by_name["roots"]
    _size_nodes(waiting, OutOfTimeAfterOne(), tally, {})  # type: ignore[arg-type]
    f = tally.found["roots\0cuda:0"]
    assert (f.graph_bytes, f.node_count, f.graph_capped) == (GiB, 1, True)


def test_a_users_function_subclass_is_walked_as_an_object_not_sized_as_an_autograd_node():
    """torch's own rule: a custom Function's *backward* class (a BackwardCFunction subclass,
    which torch makes) is a node; the user's Function subclass is not, though it shares
    `_FunctionBase`. Taken for one, its `__dir__` and properties ran and its tensor
    attribute was said to be a graph's."""
    ran: list[str] = []

    class FunctionBase:  # torch._C._FunctionBase
        pass

    class BackwardCFunction(FunctionBase):
        pass

    class Scale(FunctionBase):
        def __dir__(self):
            ran.append("__dir__")
            return []

    t = torch_with_nn()
    t._C._FunctionBase = FunctionBase
    t.autograd = SimpleNamespace(function=SimpleNamespace(BackwardCFunction=BackwardCFunction))
    fn = Scale()
    fn.weights = FakeTensor(GiB)
    backward = type("ScaleBackward", (BackwardCFunction,), {})()
    backward.saved = FakeTensor(2 * GiB)  # what a ctx attribute keeps
    holders = Scanner({"torch": t}).scan({"fn": fn, "keep": [backward]})
    got = {h.name: (h.nbytes, h.graph_bytes) for h in holders}
    assert ran == []
    assert got["fn"] == (GiB, None)
    assert got["keep"] == (0, 2 * GiB)
