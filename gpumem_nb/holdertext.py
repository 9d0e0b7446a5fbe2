"""What to say about the objects that hold memory: the holders worth naming, each one's size
in words, and the line of advice that frees it (checked on the retention graph where it can be).

Pure functions over ``Holder`` records: no threads, no I/O, no third-party imports.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .model import (
    CAUSE_CACHE,
    CAUSE_LIVE_TENSORS,
    CAUSE_OUTSIDE,
    Holder,
    Verdict,
)
from .units import format_bytes

__all__ = [
    "Advice",
    "held_text",
    "holder_action",
    "holder_advice",
    "top_holders",
    "verdict_message",
]


def top_holders(holders: Sequence[Holder], cause: str, n: int = 5) -> tuple[Holder, ...]:
    """The holders worth naming for a cause: only GPU memory explains GPU growth.

    What each holds counts its autograd graph's saved tensors (``Holder.held_bytes``). A
    tensor that keeps a graph (``Holder.holds_graph``) is named first whatever its size: a
    stored loss is four bytes, and its graph can be the largest thing in the session.
    """
    if cause != CAUSE_LIVE_TENSORS:
        return ()
    gpu = sorted((h for h in holders if h.device.startswith("cuda")),
                 key=lambda h: -h.held_bytes)
    # Holders users do not think of as theirs come first: a graph behind a stored tensor, a
    # traceback, the output cache. Their own variables follow, largest first.
    rank = {"traceback": 1, "output cache": 2}
    ordered = sorted(gpu, key=lambda h: 0 if h.holds_graph else rank.get(h.kind, 3))
    return tuple(ordered[:n])


def held_text(h: Holder) -> str:
    """``1.53 GiB + its graph 11.50 GiB (615 nodes)``: what a holder keeps, its autograd
    graph's saved tensors apart; ``≥`` where the walk was cut short."""
    own = ("≥" if h.walk_capped else "") + format_bytes(h.nbytes)
    if not h.holds_graph:
        return own
    if h.graph_bytes is None:
        return f"{own} + an autograd graph not walked (the scan's time for graphs ran out)"
    at_least = "≥" if h.graph_bytes_capped else ""
    nodes = "" if h.graph_nodes is None else \
        f" ({at_least}{h.graph_nodes} node{'' if h.graph_nodes == 1 else 's'})"
    hooked = (f", and {h.graph_unsized} saved behind saved-tensor hooks, not sized"
              if h.graph_unsized else "")
    if not h.graph_bytes and not hooked:
        return f"{own}; its graph{nodes} keeps nothing more"
    graph = f"its graph {at_least}{format_bytes(h.graph_bytes)}{nodes}{hooked}"
    # Nothing of its own (autograd nodes kept alone, a graph's share on another device).
    return graph if h.nbytes == 0 and not h.walk_capped else f"{own} + {graph}"


def _cache_clear(name: str, path: str) -> str:
    """The call that clears the lru_cache on this path: the holder itself (`embed`), an
    attribute of it (`model.embed`), a method's cache on the class (`C.emb`); else said as
    where it is, since `name.cache_clear()` would fail on what is no cache."""
    where = path.split("lru_cache results", 1)[0].strip()
    if not where:
        return f"`{name}.cache_clear()`"
    if where.startswith("class ") and re.fullmatch(r"[A-Za-z_][\w.]*", where[6:]):
        return f"`{where[6:]}.cache_clear()`"
    if re.fullmatch(r"[A-Za-z_][\w.]*", where):
        return f"`{name}.{where}.cache_clear()`"
    return f"`.cache_clear()` on the cache at {name} → {where}"


@dataclass(frozen=True)
class Advice:
    """What to do about one holder: the sentence, the one line of code in it that a user
    would run (between backticks in the sentence; "" where the step is no single line), and
    the bytes that line frees."""

    text: str
    code: str = ""
    nbytes: int | None = None


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _del_line(h: Holder) -> str:
    """``del ds, dl``: the holder's name and every other reference that keeps the same bytes
    (all must go); "" where one of them is no plain variable."""
    names = [h.name, *h.also_held_by]
    if not all(_IDENTIFIER.match(n) for n in names):
        return ""
    return "del " + ", ".join(dict.fromkeys(names))


def _also(h: Holder) -> str:
    if not h.also_held_by:
        return ""
    return (f" ({', '.join(h.also_held_by)} also keep{'s' if len(h.also_held_by) == 1 else ''}"
            " them: every reference must go)")


def holder_action(h: Holder) -> str:
    """What to do about one holder, by what it is."""
    return holder_advice(h).text


def holder_advice(h: Holder) -> Advice:
    """What to do about one holder, by what it is, with the line that does it. A ``del`` line
    the walk's names make (whatever the holder is: a generator, a tensor with a graph, a
    plain variable) gives way to the cut the retention graph checked (``holders/verify.py``):
    the line that frees the bytes, with only the bytes it frees, or none where none does."""
    advice = _advice(h)
    if not advice.code or advice.code != _del_line(h):
        return advice
    if h.cut_checked is None:
        if h.cut_note.startswith("not checked"):
            # The check ran out of its bound: what the line frees is not known, and is not
            # claimed (on the H100 such lines freed 0 to 67% of the holder's bytes).
            return Advice(f"{advice.text.removesuffix('.')} ({h.cut_note}; other references "
                          "may keep the bytes).", advice.code, None)
        return advice
    return _checked_advice(h)


def _checked_advice(h: Holder) -> Advice:
    """The advice from the checked cut: ``h.code`` frees ``cut_freed_bytes`` (all its bytes
    where None); with ``cut_checked`` False no ``del`` frees anything, said with what keeps
    the bytes."""
    what = held_text(h)
    where = f": {h.path}" if h.path else ""
    note = f"; {h.cut_note}" if h.cut_note else ""
    if h.cut_checked and h.code:
        freed = h.held_bytes if h.cut_freed_bytes is None else h.cut_freed_bytes
        frees = "" if h.cut_freed_bytes is None else \
            f"; it frees {format_bytes(h.cut_freed_bytes)} of it"
        return Advice(f"`{h.code}` ({h.kind}{where}, {what}{frees}{note}) if you no longer "
                      "need it.", h.code, freed)
    return Advice(f"{h.name} ({h.kind}{where}, {what}): `del {h.name}` alone does not free "
                  f"it{note}.")


def _advice(h: Holder) -> Advice:
    """``holder_advice`` before the check."""
    what = held_text(h)
    freed = h.held_bytes
    graph = bool(h.graph_bytes) or (h.holds_graph and h.graph_bytes is None)
    if h.kind == "output cache":
        return Advice(f"%gpumem cleanup --out clears {h.name} ({what}); end a line with `;` or "
                      "assign its result, and Out will not keep it.", "%gpumem cleanup --out",
                      freed)
    if h.kind == "traceback":
        return Advice(f"%gpumem cleanup drops the stored traceback: {h.label} ({what}).",
                      "%gpumem cleanup", freed)
    if h.kind == "garbage":
        classes = ", ".join(h.classes) or "plain containers"
        return Advice(
            f"{what} is garbage: reference cycles ({classes}) that nothing reaches, which "
            "Python's garbage collector had not collected yet (PyTorch does not run it before "
            f"raising). `{h.code or 'import gc; gc.collect()'}` frees it now; where a loop makes "
            "such cycles (an object that refers to itself, a parent and child that refer to "
            "each other), break them (a weakref, or `del` the back-reference) or collect in "
            "the loop.", h.code or "import gc; gc.collect()", freed)
    if h.kind == "unseen":
        return Advice(
            f"{what} is alive, but only something Python cannot see into refers to it (a C "
            "extension's object, a running frame's locals): no name reaches it.")
    if h.kind == "not searched":
        return Advice(f"{what} not searched: {h.why}.")
    if h.kind == "thread":
        return Advice(
            f"{h.label} keeps {what}: a live thread holds it while that function runs. Stop the "
            "thread (let its function return), or have it drop the reference once used.")
    if h.kind in ("module global", "class attribute", "the shell", "signal handler",
                  "interpreter hook") or (
            h.code and h.kind == "variable" and not _IDENTIFIER.match(h.name)):
        queue = _queue_fix(h)
        if queue is not None:
            return queue
        if h.clear_code:
            container = h.clear_code.removesuffix(".clear()")
            rest = f"; `{h.code}` also frees it" if h.code else ""
            return Advice(f"{h.label} ({h.kind}) keeps {what} in {container}: "
                          f"`{h.clear_code}` empties it and keeps the object{rest}.",
                          h.clear_code, freed)
        if h.code:
            return Advice(f"{h.label} ({h.kind}) keeps {what}{_also(h)}: `{h.code}` lets it go.",
                          h.code, freed)
        return Advice(f"{h.label} ({h.kind}) keeps {what}{_also(h)}: drop that reference.")
    if graph and h.kind == "module" and h.grad_bytes and not h.path.strip():
        # The gradients carry graphs (a backward with create_graph=True): each gradient's
        # graph leads back to its parameter, a cycle inside autograd's C++ graph that Python's
        # collector cannot see, so `del model` alone freed nothing of 34 GiB on the H200.
        zero = f"{h.name}.zero_grad(set_to_none=True)"
        graph_bytes = h.graph_bytes or 0
        return Advice(
            f"{h.name} is a torch.nn.Module whose gradients carry autograd graphs ({what}, "
            f"{format_bytes(h.grad_bytes)} of it gradients), as `backward(create_graph=True)` "
            "leaves them: each gradient's graph refers back to its parameter, a reference "
            f"cycle inside autograd that `del {h.name}` cannot break. `{zero}` frees the "
            f"gradients and their graphs and keeps the model; `del {h.name}` after it frees the "
            "rest if you are done with it.", zero, h.grad_bytes + graph_bytes)
    if graph and h.nodes and not h.nbytes:
        # Nodes kept on their own (to draw the graph later): no tensor to detach, and the
        # saved tensors go only with the nodes.
        line = _del_line(h)
        fix = f"`{line}` frees it" if line else "drop that reference"
        kept = (f"{h.nodes} autograd nodes (`.grad_fn`s), and with them what their graphs"
                if h.nodes > 1 else "an autograd node (a `.grad_fn`), and with it what its graph")
        them = "them" if h.nodes > 1 else "it"
        return Advice(f"{h.name} ({what}) keeps {kept} saved for backward: {fix} if you no "
                      f"longer need {them}; to draw a graph later, keep its picture or a "
                      f"description, not the node{'s' if h.nodes > 1 else ''}.",
                      line, freed if line else None)
    if graph and h.kind == "container":
        return Advice(f"{h.name} ({what}) keeps its tensors' autograd graphs: store "
                      "`loss.item()` (a float) or `t.detach()` instead of the tensors.")
    if graph:
        return Advice(f"{h.name} ({what}) keeps its autograd graph: keep `{h.name}.detach()` "
                      f"(or `.item()` for a number), or `del {h.name}`.",
                      _del_line(h), freed if _del_line(h) else None)
    path = h.path.lstrip()
    if "lru_cache results" in path:
        clear = _cache_clear(h.name, path)
        code = clear.strip("`") if clear.startswith("`") and clear.endswith("`") else ""
        return Advice(f"{h.label} keeps {what}: {clear} lets the results go (or give the "
                      "cache a `maxsize`).", code, freed if code else None)
    if " suspended " in f" {path}":
        # `del`, not `.close()`: on the H200's Python 3.12.3 a closed generator kept its
        # frame's locals (60 GiB) until the generator itself went
        # (benchmarks/probe_generator_close.py).
        return Advice(f"{h.label} keeps {what} in a suspended generator's frame: `del {h.name}` "
                      "(or running it to its end) lets them go; `.close()` alone may not.",
                      _del_line(h), freed if _del_line(h) else None)
    queue = _queue_fix(h)
    if queue is not None:
        return queue
    if h.kind == "module" and path:
        fix = ("remove the hook (`.remove()` on the handle its register call returned) or "
               "stop it keeping outputs" if "_hooks" in path else
               "set that attribute to None once it is used")
        return Advice(f"{h.label} keeps {what} in the module beyond its parameters: {fix}; "
                      f"`del {h.name}` only if you are done with the model.")
    if h.kind == "module" and h.contents_bytes:
        # Hooks and attributes in several places, none with nearly all: saying the
        # parameters hold it all sent the user to the wrong fix.
        return Advice(
            f"{h.name} ({what}) keeps {format_bytes(h.contents_bytes)} of it beyond its "
            "parameters, in more than one of its hooks or attributes: remove the hooks "
            "that keep outputs and set such attributes to None once used; "
            f"`del {h.name}` only if you are done with the model.")
    if h.kind == "module" and h.grad_bytes:
        zero = f"{h.name}.zero_grad(set_to_none=True)"
        return Advice(
            f"{h.name} is a torch.nn.Module: its parameters, gradients and buffers hold "
            f"{what}, {format_bytes(h.grad_bytes)} of it gradients: `{zero}` frees those and "
            f"keeps the model; `del {h.name}` only if you are done with it{_also(h)}.",
            zero, h.grad_bytes)
    if h.kind == "module":
        return Advice(f"{h.name} is a torch.nn.Module: its parameters, gradients and buffers "
                      f"hold {what}; `del {h.name}` only if you are done with it{_also(h)}.")
    if h.kind == "optimizer state":
        return Advice(f"{h.name} is an optimizer: its state holds {what} (Adam keeps two values "
                      f"per parameter); `del {h.name}` only once training is done{_also(h)}.")
    if h.view_bytes is not None and h.nbytes >= 2 * h.view_bytes and not h.also_held_by \
            and _IDENTIFIER.match(h.name):
        clone = f"{h.name} = {h.name}.clone()"
        return Advice(
            f"{h.name} is a view of {format_bytes(h.view_bytes)} that keeps its whole base "
            f"storage ({what}) alive: `{clone}` keeps only its own bytes and frees "
            f"{format_bytes(h.nbytes - h.view_bytes)}.", clone, h.nbytes - h.view_bytes)
    shared = _class_attribute_fix(h, path, what)
    if shared is not None:
        return shared
    if h.arrays and h.device.startswith("cuda") and h.array_module:
        return _array_fix(h, what)
    where = f": {h.path}" if h.path else ""
    if h.cut_checked is not None:
        return _checked_advice(h)  # checked against the retention graph
    line = _del_line(h)
    if line:
        return Advice(f"`{line}` ({h.kind}{where}, {what}){_also(h)} if you no longer need it.",
                      line, freed)
    return Advice(f"del {h.name} ({h.kind}{where}, {what}){_also(h)} if you no longer need "
                  "it.")


_CLASS_ATTRIBUTE = re.compile(r"class ([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)(?: \(([\w.]+)\))?")
_CLEARABLE = {"list", "dict", "set", "deque", "OrderedDict", "defaultdict", "Counter"}


def _class_attribute_fix(h: Holder, path: str, what: str) -> Advice | None:
    """Bytes under a class-level attribute reached through an instance (`block` →
    `class Bottleneck.out_saved`): every instance shares it, so deleting the instance frees
    nothing while the class lives; clearing the attribute does."""
    m = _CLASS_ATTRIBUTE.match(path)
    if m is None:
        return None
    # The attribute's own class only when the path ends there (deeper, it is what is inside).
    owner, attr, cls = m[1], m[2], (m[3] or "") if m.end() == len(path) else ""
    target = f"{owner}.{attr}"
    code = f"{target}.clear()" if cls in _CLEARABLE else f"{target} = None"
    return Advice(
        f"{h.label} keeps {what} in a class attribute, {target}: every instance of "
        f"{owner.rsplit('.', 1)[-1]} shares it, so `del {h.name}` frees nothing while the "
        f"class lives. `{code}` lets them go.", code, h.held_bytes)


def _array_fix(h: Holder, what: str) -> Advice:
    """A GPU array of another library: `del` returns its memory to that library's own pool,
    not to the GPU; CuPy's pool gives it back with ``free_all_blocks()``."""
    line = _del_line(h) or f"del {h.name}"
    if h.array_module == "cupy" and _del_line(h):
        code = f"{line}; import cupy; cupy.get_default_memory_pool().free_all_blocks()"
        return Advice(
            f"{h.label} is a CuPy array ({what}): `{code}` frees it and returns CuPy's pooled "
            f"memory to the GPU (`{line}` alone keeps it in CuPy's pool){_also(h)}.",
            code, h.held_bytes)
    return Advice(
        f"{h.label} is a {h.array_module} array ({what}): `{line}` returns it to "
        f"{h.array_module}'s own memory pool, which keeps it from PyTorch until that library "
        f"releases its pool{_also(h)}.")


def _queue_fix(h: Holder) -> Advice | None:
    """A standard-library queue that keeps its items: draining it frees them and keeps the
    queue (``q.queue.clear()`` under its mutex, as ``Queue`` itself does)."""
    where = f"{h.name} → {h.path.lstrip()}" if h.path else h.name
    m = re.match(r"^([A-Za-z_][\w.]*)\.queue\[", where.replace(" → ", "."))
    if m is None:
        return None
    q = m[1]
    code = f"with {q}.mutex: {q}.queue.clear()"
    return Advice(f"{h.label} keeps {held_text(h)} in a queue's items: `{code}` drains it and "
                  f"keeps the queue{_also(h)}.", code, h.held_bytes)


_RAISED_ADVICE = "the stored exception keeps the failed cell's local tensors alive"
_FIRST_RUN_ADVICE = "tensors this cell made are still referenced"
_ADVICE = {
    CAUSE_LIVE_TENSORS: "tensors from earlier runs are still referenced",
    CAUSE_CACHE: (
        "PyTorch's cache grew while live tensors did not; it is reused, not leaked "
        "(%gpumem cleanup returns its wholly free segments to the driver)"
    ),
    # Growth on every run is not the CUDA context, which a process makes once per GPU.
    CAUSE_OUTSIDE: (
        "memory outside PyTorch's allocator grew: another library's own allocations "
        "(CuPy, JAX, NCCL, a custom cudaMalloc)"
    ),
}


def _holder_text(h: Holder) -> str:
    return f"{h.label} ({held_text(h)})"


def verdict_message(v: Verdict, holders: Sequence[Holder]) -> str:
    label = f"[{v.execution_count}]" if v.execution_count is not None else v.cell_key
    when = "and raised" if v.raised else f"again on run {v.runs}"
    # The stored exception leads only where it holds the most: a loop that kept 135 GiB of
    # graphs in a list and then raised is the list's doing, not the traceback's.
    biggest = max(holders, key=lambda h: h.held_bytes, default=None)
    by_traceback = biggest is None or biggest.kind == "traceback"
    # A traceback that holds the most is the cell's own, whichever run this is: on a first
    # run there are no earlier runs to blame.
    own_traceback = biggest is not None and biggest.kind == "traceback"
    advice = _ADVICE[v.cause]
    if v.cause == CAUSE_LIVE_TENSORS and ((v.raised and by_traceback) or own_traceback):
        advice = _RAISED_ADVICE
    elif v.cause == CAUSE_LIVE_TENSORS and v.runs <= 1:
        advice = _FIRST_RUN_ADVICE
    msg = (
        f"gpumem: cell {label} grew GPU {v.device} memory by "
        f"{format_bytes(v.growth_bytes)} {when} ({v.cause}): {advice}"
    )
    if not holders:
        return msg + "."
    msg += ". Held by: " + ", ".join(_holder_text(h) for h in holders)
    return msg + ". " + " ".join(_kind_advice(holders))


def _kind_advice(holders: Sequence[Holder]) -> list[str]:
    """One line per kind of holder named, in their order: what lets each go."""
    out: list[str] = []
    for h in holders:
        graph = bool(h.graph_bytes) or (h.holds_graph and h.graph_bytes is None)
        if h.kind == "output cache":
            line = ("End the line with `;` or assign the result, so Out does not keep it "
                    "(and its graph); `%gpumem cleanup --out` clears what it keeps now.")
        elif h.kind == "traceback":
            line = "`%gpumem cleanup` drops the stored traceback."
        elif graph and h.kind == "container":
            line = (f"Store `loss.item()` (a float) or `.detach()` in {h.name}, not tensors "
                    "that keep their autograd graphs.")
        elif graph:
            line = f"Keep `{h.name}.detach()` (or `.item()`): its autograd graph then goes."
        else:
            continue
        if line not in out:
            out.append(line)
    return out[:2]
