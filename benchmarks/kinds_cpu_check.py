"""A CPU check of a batch of OOM kinds' pure-Python mechanisms, without torch or a GPU.

    PYTHONPATH=$PWD python benchmarks/kinds_cpu_check.py new9|new10|new11

Runs each kind of the batch (``gpu_diagnosis3.py``'s ``--set``) that needs no real torch
(``NEEDS_TORCH``: kinds that need torch's own classes, ops or C++ state) in a real IPython
shell, with a stand-in ``torch`` whose ``empty`` makes small objects that count the bytes they
stand for (``G`` = 1000 bytes) and raise an out-of-memory error past ``G``. For each kind it
checks: the setup runs; its stand-in tensors are still alive after it (the holder holds; a kind
whose failing cell is a computation of its own may hold nothing); the failing cell fails (a
loop that makes garbage cycles, once they fill at least 80% of ``G``); and after the kind's
steps, in order, nothing is alive (the steps undo it completely). A ``dry:`` step (``%gpumem
cleanup``) is replaced by clearing the stored exception, as the product is not loaded here.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref

G = 1000
peak_bytes = 0
_live: weakref.WeakSet[FakeTensor] = weakref.WeakSet()


class FakeOOM(RuntimeError):
    pass


class FakeTensor:
    is_cuda = True

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)

    def numel(self) -> int:
        return self.nbytes

    def cpu(self) -> FakeTensor:
        return self

    def zero_(self) -> FakeTensor:
        return self


def alive_bytes() -> int:
    return sum(t.nbytes for t in list(_live))


def fake_empty(*shape: int, dtype: object = None, device: object = None) -> FakeTensor:
    n = 1
    for s in shape:
        n *= int(s)
    global peak_bytes
    if alive_bytes() + n > G:
        raise FakeOOM(f"CUDA out of memory. Tried to allocate {n} bytes")
    t = FakeTensor(n)
    _live.add(t)
    peak_bytes = max(peak_bytes, alive_bytes())
    return t


def make_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.empty = fake_empty  # type: ignore[attr-defined]
    torch.uint8 = "uint8"  # type: ignore[attr-defined]
    torch.Tensor = FakeTensor  # type: ignore[attr-defined]
    torch.is_tensor = lambda o: isinstance(o, FakeTensor)  # type: ignore[attr-defined]
    torch.save = lambda obj, path: None  # type: ignore[attr-defined]
    cuda = types.SimpleNamespace(empty_cache=lambda: None,
                                 mem_get_info=lambda: (G - alive_bytes(), G))
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


# Per batch, the kinds a stand-in torch cannot run.
NEEDS_TORCH = {
    "new9": {"fx_graph_module_tensor_constant", "parametrize_cache_held_by_suspended_generator",
             "jacrev_standard_basis_working_set"},
    "new10": {"grad_fn_kept_for_graph_drawing", "combinations_mask_working_set",
              "optimizer_global_post_hook_keeps_copies"},
    "new11": {"benchmark_timers_keep_their_globals", "adam_state_left_on_gpu_after_model_cpu",
              "position_ids_from_mask_int64_working_set", "sdpa_wrapper_keeps_attention_maps",
              "function_mode_left_entered_keeps_linear_outputs",
              "autocast_left_entered_keeps_weight_casts"},
}


def main(argv: list[str]) -> int:
    from IPython.core.interactiveshell import InteractiveShell

    from benchmarks.gpu_diagnosis3 import kinds_of

    if len(argv) != 1 or argv[0] not in NEEDS_TORCH:
        raise SystemExit(f"usage: kinds_cpu_check.py {'|'.join(NEEDS_TORCH)}")
    which = argv[0]

    torch = make_torch()
    sys.modules["torch"] = torch
    shell = InteractiveShell.instance()
    failures = 0
    for k in kinds_of(which):
        if k.kind in NEEDS_TORCH[which]:
            print(f"skip  {k.kind} (needs real torch)")
            continue
        shell.reset(new_session=False)
        gc.collect()
        shell.user_ns.update(torch=torch, G=G, frac=lambda x: int(x * G))
        problems = []
        for i, cell in enumerate(k.setup):
            r = shell.run_cell(cell, store_history=True)
            if not r.success:
                problems.append(f"setup[{i}] raised {r.error_in_exec!r}")
        held = alive_bytes()
        computes = k.expected in ("working set", "garbage in reference cycles")
        if held == 0 and not computes:
            problems.append("nothing held after the setup")
        global peak_bytes
        peak_bytes = 0
        r = shell.run_cell(k.fail, store_history=True)
        if r.success or not isinstance(r.error_in_exec, FakeOOM):
            problems.append(f"the failing cell did not fail with OOM: {r.error_in_exec!r}")
        after_fail = alive_bytes()
        if computes and peak_bytes < 0.8 * G:
            problems.append(f"the failing cell's peak was {peak_bytes} of {G} bytes")
        for s in k.steps:
            code = s.free
            if s.estimate.startswith("dry:"):
                code = ("import sys\nsys.last_type = sys.last_value = sys.last_traceback = None\n"
                        "sys.last_exc = None")
            r = shell.run_cell(code, store_history=True)
            if not r.success:
                problems.append(f"step {s.name} raised {r.error_in_exec!r}")
        left = alive_bytes()
        if left:
            problems.append(f"{left} bytes left after the steps")
        failures += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '}  {k.kind}: held {held}, peak in the failing "
              f"cell {peak_bytes}, after it {after_fail}, after the steps {left}"
              + "".join(f"\n      {p}" for p in problems))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
