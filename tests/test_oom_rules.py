"""Issue 24's rules, each with fakes: the object walk enters any class without running its
code and says where it was cut, private memory pools are their own cause, a running
backward's root and inputs are the computation, the module at the failure is named, and
generation's KV cache is named with its growth per token."""

from __future__ import annotations

import dataclasses
import gc
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpumem_nb.analysis import held_text, verdict_message
from gpumem_nb.holders import Scanner
from gpumem_nb.ledger import ledger
from gpumem_nb.model import Holder, Verdict
from gpumem_nb.oom import (
    CAUSE_FRAGMENTATION,
    CAUSE_HELD,
    CAUSE_PRIVATE_POOL,
    CAUSE_WORKING_SET,
    KIND_RUNNING,
    POOL_GRAPH,
    POOL_USER,
    OomFacts,
    PoolUse,
    classify,
    failure_site,
    mark_running,
    next_steps,
    pools_in,
)
from gpumem_nb.oom.advice import _workload_action
from gpumem_nb.oom.watch import _segment_facts

from .fakes import FakeTensor, GiB, MiB, fake_torch, node
from .test_holders import Module, torch_with_nn


def scan(ns: dict, **kw: Any) -> list[Holder]:
    return Scanner({"torch": torch_with_nn()}, **kw).scan(ns)


# -- the object walk ---------------------------------------------------------------------------
class Trainer:
    def __init__(self) -> None:
        self.state = {"buffers": [FakeTensor(3 * GiB)]}


@dataclasses.dataclass(slots=True)
class SlotState:
    buf: Any
    step: int = 0


class Plain:
    __slots__ = ("kept", "unset")


def test_a_tensor_on_a_user_class_attribute_is_found_and_named_by_its_path():
    (h,) = scan({"trainer": Trainer()})
    assert h.nbytes == 3 * GiB and h.label == "trainer → state['buffers'][0]"


def test_slots_and_slotted_dataclasses_are_entered_and_an_unset_slot_is_skipped():
    p = Plain()
    p.kept = FakeTensor(GiB)
    holders = scan({"p": p, "s": SlotState(FakeTensor(2 * GiB))})
    assert {(h.name, h.nbytes) for h in holders} == {("p", GiB), ("s", 2 * GiB)}
    assert {h.label for h in holders} == {"p → kept", "s → buf"}


def test_a_closure_cell_that_keeps_a_tensor_is_found():
    def make() -> Any:
        saved = [FakeTensor(5 * GiB)]

        def log() -> int:
            return len(saved)
        return log

    (h,) = scan({"logger": make()})
    assert h.nbytes == 5 * GiB and "closure 'saved'" in h.path


class Hostile:
    """Every way a class can run code when looked at: the walk must trigger none of them."""

    calls: list[str] = []  # noqa: RUF012 (a class-level record is the point)

    def __init__(self) -> None:
        self.__dict__["kept"] = FakeTensor(GiB)

    @property
    def lazy(self) -> Any:
        Hostile.calls.append("property")
        return FakeTensor(GiB)

    def __getattr__(self, name: str) -> Any:
        Hostile.calls.append(f"__getattr__ {name}")
        raise AttributeError(name)

    def __getattribute__(self, name: str) -> Any:
        if name != "__dict__":
            Hostile.calls.append(f"__getattribute__ {name}")
        return object.__getattribute__(self, name)


def test_the_walk_never_runs_a_property_getattr_or_getattribute():
    Hostile.calls.clear()
    (h,) = scan({"h": Hostile()})
    assert h.nbytes == GiB and Hostile.calls == []


def test_a_walk_cut_by_its_object_bound_says_at_least_and_the_ledger_says_so():
    many = [Trainer() for _ in range(10)]  # ten user objects, each holding 3 GiB
    holders = Scanner({"torch": torch_with_nn()}, object_cap=3).scan({"many": many})
    cut = [h for h in holders if h.walk_capped]
    assert cut and all(held_text(h).startswith("≥") for h in cut)
    led = ledger("cuda:0", 10 * GiB, holders)
    assert led.capped and "≥" in led.line() and "cut walk" in led.line()


def test_the_cut_walks_remainder_is_never_the_verdict():
    # Issue 24, point 4: the graph walk hit its bound and "16.34 GiB reachable from nothing"
    # outranked the 122.56 GiB the list's graphs held.
    held = Holder(name="losses", kind="container", device="cuda:0", nbytes=1 * MiB,
                  holds_graph=True, graph_bytes=122 * GiB, graph_bytes_capped=True)
    facts = OomFacts(device=0, requested_bytes=2 * GiB, total_bytes=140 * GiB,
                     free_bytes=0, allocated_bytes=139 * GiB, reserved_bytes=139 * GiB,
                     measured_at="after", unreachable_bytes=16 * GiB, walk_capped=True,
                     backend="cudaMallocAsync")
    causes = classify(facts, [held])
    assert causes[0].kind == CAUSE_HELD and "losses" in causes[0].summary
    remainder = [c for c in causes if "reachable from nothing" in c.summary]
    assert remainder and not remainder[0].covers and "not a cause" in remainder[0].summary


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_numpy_arrays_are_called_arrays_and_gc_finds_are_not_called_unreachable():
    holders = Scanner({}).scan({"a": [np.zeros(10), np.ones(10)]})
    assert holders[0].detail == "2 arrays" and holders[0].arrays
    orphan = [FakeTensor(GiB)]  # this running frame's local: no referrer Python can see
    found = Scanner({"torch": fake_torch()}).scan({}, include_gc=True)
    kinds = {h.kind for h in found if h.nbytes >= GiB}
    assert "unseen" in kinds
    assert not any("unreachable" in h.name for h in found)
    del orphan


def test_not_found_is_shown_over_one_percent_of_allocated_only():
    h = Holder(name="x", kind="variable", device="cuda:0", nbytes=99 * GiB)
    assert "not found" not in ledger("cuda:0", 99 * GiB + 512 * MiB, [h]).line()
    line = ledger("cuda:0", 110 * GiB, [h]).line()
    assert "not found: 11.00 GiB (10%)" in line


# -- memory pools ------------------------------------------------------------------------------
SNAPSHOT = {"segments": [
    {"device": 0, "total_size": 4 * GiB, "allocated_size": 3 * GiB, "segment_pool_id": (0, 0),
     "blocks": [{"size": 3 * GiB, "state": "active_allocated"},
                {"size": GiB, "state": "inactive"}]},
    # A CUDA graph's private pool: 80 GiB wholly free, only the graph's replays can use it.
    {"device": 0, "total_size": 80 * GiB, "allocated_size": 0, "segment_pool_id": (1, 0),
     "blocks": [{"size": 80 * GiB, "state": "inactive"}]},
    {"device": 0, "total_size": 2 * GiB, "allocated_size": 2 * GiB, "segment_pool_id": (0, 3),
     "blocks": [{"size": 2 * GiB, "state": "active_allocated"}]},
]}


def test_segments_are_grouped_by_pool_and_a_pools_free_block_is_not_the_largest_free_piece():
    pools = {p.pool_id: p for p in pools_in(SNAPSHOT["segments"], 0)}
    assert pools[(1, 0)].kind == POOL_GRAPH and pools[(1, 0)].free_bytes == 80 * GiB
    assert pools[(0, 3)].kind == POOL_USER and pools[(0, 3)].allocated_bytes == 2 * GiB
    largest, _, _ = _segment_facts(SNAPSHOT, 0)
    assert largest == GiB


def graph_pool_facts(**kw: Any) -> OomFacts:
    pool = PoolUse((1, 0), POOL_GRAPH, 80 * GiB, 0, owner=kw.pop("owner", "g"))
    return OomFacts(device=0, requested_bytes=70 * GiB, total_bytes=140 * GiB,
                    free_bytes=55 * GiB, allocated_bytes=2 * GiB, reserved_bytes=82 * GiB,
                    pools=(pool,), **kw)


def test_a_cuda_graphs_private_pool_is_its_own_cause_not_fragmentation():
    f = graph_pool_facts()
    causes = classify(f, [])
    assert causes[0].kind == CAUSE_PRIVATE_POOL and causes[0].covers
    assert CAUSE_FRAGMENTATION not in {c.kind for c in causes}
    assert f.unallocated_bytes == 0  # the pool's free bytes are not "reserved but unallocated"
    advice = " ".join(a.text for a in next_steps(f, causes, [], None))
    assert "del g" in advice and "empty_cache" in advice
    assert "expandable_segments:True" not in advice


def test_the_header_says_pytorchs_own_message_counts_a_pools_free_bytes_as_allocated():
    # H200, tutorial 10: PyTorch's message said "83.62 GiB is allocated by PyTorch, with
    # 83.43 GiB allocated in private pools" beside our "PyTorch had 192.00 MiB allocated".
    from gpumem_nb.oom.advice import OomExplanation

    f = graph_pool_facts()
    header = OomExplanation(f, (), (), "", "", "").header()
    assert "PyTorch had 2.00 GiB allocated" in header
    assert "(80.00 GiB of it free to their own allocations only; PyTorch's own message " \
           "counts all of it as allocated)" in header


def test_graph_trees_and_mempools_get_the_advice_that_frees_them():
    trees = PoolUse((2, 0), POOL_GRAPH, 80 * GiB, 0, graph_trees=True)
    f = graph_pool_facts(owner="")
    f = dataclasses.replace(f, pools=(trees,))
    text = " ".join(a.text for a in next_steps(f, classify(f, []), [], None))
    assert "torch.compiler.reset()" in text and "reduce-overhead" in classify(f, [])[0].summary
    user = PoolUse((0, 1), POOL_USER, 80 * GiB, 0, owner="pool")
    f = dataclasses.replace(f, pools=(user,))
    text = " ".join(a.text for a in next_steps(f, classify(f, []), [], None))
    assert "del pool" in text and "use_mem_pool" in text


# -- where it failed ---------------------------------------------------------------------------
class NN:
    """A module the way ``torch.nn.Module`` keeps its children: ``_modules`` in its dict."""

    def __init__(self, **children: Any) -> None:
        self._modules = dict(children)


class Block(NN):
    pass


class Attention(NN):
    pass


def torch_with_module_type() -> Any:
    t = fake_torch()
    t.nn = SimpleNamespace(Module=NN)
    t.optim = SimpleNamespace(Optimizer=type("Optimizer", (), {}))
    return t


def raise_in(filename: str, name: str, local: dict[str, Any]) -> BaseException:
    """An exception whose traceback has a finished frame of ``name`` in ``filename`` with
    these locals, as a library's frame would."""
    params = ", ".join(local)
    src = f"def {name}({params}):\n    raise MemoryError('CUDA out of memory')\n"
    ns: dict[str, Any] = {}
    exec(compile(src, filename, "exec"), ns)
    try:
        ns[name](**local)
    except MemoryError as e:
        return e
    raise AssertionError("did not raise")


def test_the_module_running_at_the_failure_is_named_with_its_path_and_class():
    attn = Attention()
    model = NN(transformer=NN(h=NN(**{"7": Block(attn=attn)})))
    err = raise_in("/site-packages/model.py", "forward", {"self": attn, "x": 1})
    site = failure_site(err, {"model": model}, modules={"torch": torch_with_module_type()})
    assert site.module == "model.transformer.h.7.attn (Attention)"
    assert "Where it failed: model.transformer.h.7.attn (Attention)." in site.lines()


class DynamicLayer:
    def __init__(self, tokens: int) -> None:
        self.keys = FakeTensor(8 * MiB * tokens // 8)
        self.keys.shape = (4, 16, tokens, 64)
        self.values = FakeTensor(8 * MiB * tokens // 8)
        self.values.shape = (4, 16, tokens, 64)


class DynamicCache:
    def __init__(self, layers: int, tokens: int) -> None:
        self.layers = [DynamicLayer(tokens) for _ in range(layers)]


def test_inside_generate_the_kv_cache_is_named_with_its_bytes_and_growth_per_token():
    cache = DynamicCache(layers=12, tokens=512)
    err = raise_in("/site-packages/transformers/generation/utils.py", "_sample",
                   {"self": object(), "model_kwargs": {"past_key_values": cache}})
    site = failure_site(err, {}, modules={"torch": torch_with_module_type()})
    assert site.in_generate and site.cache is not None
    assert site.cache.name.endswith("model_kwargs['past_key_values'] (DynamicCache)")
    assert site.cache.nbytes == 12 * 2 * 512 * MiB and site.cache.tokens == 512
    assert site.cache.per_token_bytes == 24 * MiB
    f = OomFacts(device=0, requested_bytes=GiB, total_bytes=140 * GiB, free_bytes=0,
                 site=site, grad_enabled=False)
    advice = _workload_action(f).text
    assert "max_new_tokens" in advice and "24.00 MiB more per generated token" in advice
    assert "does not apply" in advice and "(torch.utils.checkpoint)" not in advice


def test_a_step_that_failed_halfway_still_gives_the_exact_growth_per_token():
    # H200, GPT-2 in generate(): the OOM came inside a step, after the first layers had
    # appended their token; dividing the whole cache by the longest layer said 47.89 MiB
    # per token for 48.00 MiB.
    cache = DynamicCache(layers=12, tokens=397)
    cache.layers[0] = DynamicLayer(398)
    err = raise_in("/site-packages/transformers/generation/utils.py", "_sample",
                   {"self": object(), "model_kwargs": {"past_key_values": cache}})
    site = failure_site(err, {}, modules={"torch": torch_with_module_type()})
    assert site.cache is not None and site.cache.tokens == 398
    assert site.cache.nbytes == 2 * (11 * 397 + 398) * MiB
    assert site.cache.per_token_bytes == 24 * MiB


class StaticLayer(DynamicLayer):
    pass


class Cache:  # transformers >= 4.56 builds a cache of layers under its own class name
    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers


def test_a_static_cache_is_said_to_be_allocated_up_front_not_to_grow_per_token():
    # generate(..., cache_implementation="static") allocates every layer for its whole
    # length at the start; "growing 24 MiB per generated token" would be false there.
    for cache in (Cache([StaticLayer(1024) for _ in range(12)]),
                  type("StaticCache", (), {})()):
        if not hasattr(cache, "layers"):
            cache.layers = [StaticLayer(1024) for _ in range(12)]
        err = raise_in("/site-packages/transformers/generation/utils.py", "_sample",
                       {"self": object(), "model_kwargs": {"past_key_values": cache}})
        site = failure_site(err, {}, modules={"torch": torch_with_module_type()})
        assert site.cache is not None and site.cache.preallocated, type(cache)
        text = " ".join(site.lines())
        assert "allocated up front for 1024 tokens" in text and "per generated token" not in text
        f = OomFacts(device=0, requested_bytes=GiB, total_bytes=140 * GiB, free_bytes=0,
                     site=site, grad_enabled=False)
        advice = _workload_action(f).text
        assert "per generated token" not in advice and "max_cache_len" in advice


def test_a_dynamic_cache_of_growing_layers_is_not_taken_for_a_static_one():
    class DynamicSlidingWindowLayer(DynamicLayer):
        pass

    for layers in ([DynamicLayer(512) for _ in range(12)],
                   [DynamicSlidingWindowLayer(512) for _ in range(12)],
                   [StaticLayer(512)] + [DynamicLayer(512) for _ in range(11)]):
        err = raise_in("/site-packages/transformers/generation/utils.py", "_sample",
                       {"self": object(), "model_kwargs": {"past_key_values": Cache(layers)}})
        site = failure_site(err, {}, modules={"torch": torch_with_module_type()})
        assert site.cache is not None and not site.cache.preallocated
        assert "24.00 MiB per generated token" in " ".join(site.lines())


def test_a_running_backwards_root_and_inputs_are_the_computation_not_advised_away():
    # Issue 24, point 3: x and y were "held by your session" with `del x`, `del y` advised,
    # though they were the input and output of the backward that was running.
    torch = fake_torch()
    x = FakeTensor(16 * GiB)
    leaf = node("AccumulateGrad", variable=x)
    ckpt = node("CheckpointFunctionBackward", leaf)
    y = FakeTensor(16 * GiB, grad_fn=ckpt)
    root = FakeTensor(4, grad_fn=node("SumBackward0", ckpt))
    err = raise_in("/site-packages/torch/_tensor.py", "backward", {"self": root})
    holders = [Holder(name="x", kind="variable", device="cuda:0", nbytes=16 * GiB),
               Holder(name="y", kind="variable", device="cuda:0", nbytes=16 * GiB,
                      holds_graph=True, graph_bytes=0),
               Holder(name="other", kind="variable", device="cuda:0", nbytes=GiB)]
    ns = {"x": x, "y": y, "other": FakeTensor(GiB)}
    site = failure_site(err, ns, modules={"torch": torch}, holders=holders)
    assert site.in_backward and set(site.running) == {"x", "y"}
    assert site.whole_model_checkpoint
    judged = mark_running(holders, site)
    assert {h.name for h in judged if h.kind == KIND_RUNNING} == {"x", "y"}
    f = OomFacts(device=0, requested_bytes=16 * GiB, total_bytes=140 * GiB, free_bytes=GiB,
                 allocated_bytes=139 * GiB, reserved_bytes=139 * GiB, cell_bytes=106 * GiB,
                 cell_start_bytes=33 * GiB, site=site)
    causes = classify(f, judged)
    assert causes[0].kind == CAUSE_WORKING_SET
    advice = " ".join(a.text for a in next_steps(f, causes, judged, None))
    assert "del x" not in advice and "del y" not in advice
    assert "Checkpoint per block" in advice


def test_a_frame_still_running_is_never_read():
    seen: list[Any] = []

    def running() -> None:
        site = failure_site(MemoryError(), {"m": NN()}, modules={"torch": torch_with_module_type()})
        seen.append(site)
    running()
    assert seen[0].module == "" and not seen[0].in_backward
    gc.collect()
    assert sys.getrefcount(seen[0]) >= 1


# -- the post-cell line of a first run (issue 24, point 5) ---------------------------------------
def test_a_first_runs_own_traceback_is_not_called_earlier_runs():
    tb = Holder(name="traceback: f() locals", kind="traceback", device="cuda:0",
                nbytes=20 * GiB)
    v = Verdict(cell_key="c", execution_count=3, runs=1, device=0, growth_bytes=20 * GiB,
                cause="live tensors", raised=False)
    text = verdict_message(v, [tb])
    assert "earlier runs" not in text and "stored exception" in text


def test_module_holders_keep_their_plain_name():
    (h,) = scan({"net": Module(FakeTensor(GiB))})
    assert h.label == "net"


# -- the reverse search --------------------------------------------------------------------------
class Bottleneck:
    out_saved: list[Any] = []  # noqa: RUF012 (the class-level cache is what users write)


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_who_gc_names_a_class_attribute_that_the_forward_walk_cannot_reach():
    # Out of sample on the H200 (class_attribute_cache): 60 GiB in a class-level list stayed
    # "not found". The garbage collector's referrers name the class and the attribute.
    Bottleneck.out_saved.append(FakeTensor(10 * GiB))
    try:
        ns = {"block": Bottleneck()}
        forward = Scanner({"torch": fake_torch()}).scan(ns)
        assert forward == []
        found = Scanner({"torch": fake_torch()}).scan(ns, include_gc=True)
        (held,) = [h for h in found if h.nbytes == 10 * GiB]
        assert (held.name, held.kind) == (f"{__name__}.Bottleneck.out_saved[0]",
                                          "class attribute")
    finally:
        Bottleneck.out_saved.clear()


@pytest.mark.slow  # a whole-heap retention search, 4-31 s on the 2-core machine
def test_who_gc_follows_an_exception_kept_in_a_variable_to_its_frames_locals():
    def step() -> None:
        acts = FakeTensor(6 * GiB)  # noqa: F841 (kept by the traceback)
        raise RuntimeError("nan")

    try:
        step()
    except RuntimeError as caught:
        ns = {"err": caught}
    found = Scanner({"torch": fake_torch()}).scan(ns, include_gc=True)
    # The forward walk reaches it now (tests/test_oom_gaps.py): the variable is its holder.
    (name,) = [h.name for h in found if h.nbytes == 6 * GiB]
    assert name == "err"
    ns.clear()


def test_a_holder_found_by_the_retention_search_is_advised_by_its_reference_not_del_of_its_path():
    from gpumem_nb.analysis import holder_advice

    named = Holder(name="Bottleneck.out_saved[0]", kind="class attribute", device="cuda:0",
                   nbytes=GiB, code="Bottleneck.out_saved.clear()")
    advice = holder_advice(named)
    assert advice.code == "Bottleneck.out_saved.clear()" and f"`{advice.code}`" in advice.text
    assert "del Bottleneck" not in advice.text
    unseen = Holder(name="referenced from where Python cannot see", kind="unseen",
                    device="cuda:0", nbytes=GiB)
    assert holder_advice(unseen).code == "" and "del " not in holder_advice(unseen).text
