"""What the explanations say lives outside PyTorch's allocator, and that they say it truly.

They said "the CUDA context (about 0.5 GiB), cuBLAS/cuDNN workspaces, ...". ATen takes cuBLAS
and cuDNN workspaces from the caching allocator, so those are inside ``allocated``; and the
context measured 518-610 MiB on the H200, a figure that differs between GPUs and drivers.
What is outside: the context, quoted with its size only as this session measured it, and
other libraries' own allocations.
"""

from __future__ import annotations

from typing import Any

from gpumem_nb.analysis import verdict_message
from gpumem_nb.model import CAUSE_OUTSIDE as VERDICT_OUTSIDE
from gpumem_nb.model import Verdict
from gpumem_nb.oom import CAUSE_OUTSIDE, OomFacts, classify
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource
from gpumem_nb.sources.torch import TorchSource

from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, MiB, fake_torch
from .helpers import spaced
from .test_oom import last, world  # noqa: F401  (the OOM explainer's world, both backends)

WRONG = ("cuBLAS", "cuDNN", "workspace", "0.5 GiB")


def outside_summary(**kw: Any) -> str:
    f = OomFacts(device=0, requested_bytes=30 * GiB, total_bytes=140 * GiB, free_bytes=GiB,
                 allocated_bytes=70 * GiB, reserved_bytes=70 * GiB,
                 this_process_bytes=130 * GiB, **kw)
    cause = next(c for c in classify(f) if c.kind == CAUSE_OUTSIDE)
    return cause.summary


def test_outside_pytorch_is_the_context_and_other_libraries_never_cublas_workspaces():
    text = outside_summary()
    assert "the CUDA context, and other libraries' own allocations (CuPy, JAX, NCCL, a " \
           "custom cudaMalloc)" in text
    assert not any(w in text for w in WRONG), text


def test_the_context_is_sized_only_as_this_session_measured_it():
    assert "MiB" not in outside_summary()  # nothing measured: no figure from elsewhere
    text = outside_summary(idle_process_bytes=518 * MiB)
    assert "the CUDA context (NVML listed this process at 518.00 MiB while PyTorch held " \
           "nothing on this GPU)" in text


def test_the_rerun_verdict_blames_other_libraries_not_cublas():
    v = Verdict("cell-1", 3, runs=3, device=0, growth_bytes=GiB, cause=VERDICT_OUTSIDE)
    text = verdict_message(v, ())
    assert "CuPy, JAX, NCCL" in text and not any(w in text for w in WRONG), text


def live(cuda: FakeCuda) -> LiveSource:
    gpu = FakeGpu("GPU-aaaa-1111")
    cuda.link([gpu])
    return LiveSource(nvml=NvmlSource(module=FakePynvml([gpu])),  # type: ignore[arg-type]
                      torch=TorchSource({"torch": fake_torch(cuda)}))


def test_the_source_measures_this_process_while_pytorch_holds_nothing():
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    src = live(cuda)
    d = cuda.devices[0]
    src.read()
    assert src.idle_process_bytes == {}  # no context yet: nothing listed
    d.reserved = d.allocated = GiB
    cuda._sync()
    src.read()
    assert src.idle_process_bytes == {}  # PyTorch holds memory: not the context alone
    d.reserved = d.allocated = 0  # freed and emptied: the context stays
    cuda._sync()
    src.read(processes=False)
    assert src.idle_process_bytes == {}  # the hooks' reads list no processes
    src.read()
    assert src.idle_process_bytes == {0: cuda.context_bytes}


def test_the_explainer_quotes_the_context_this_session_measured(world):  # noqa: F811
    shell, cuda = world.shell, world.cuda
    shell.run_cell("x = cuda.tensor(GiB); del x; cuda.empty_cache()", store_history=True)
    spaced(shell)  # the sampler reads NVML while PyTorch holds nothing
    cuda.devices[0].outside = 60 * GiB  # CuPy, or a raw cudaMalloc
    cuda._sync()
    shell.run_cell("y = cuda.tensor(100 * GiB)", store_history=True)
    text = str(last(shell))
    assert "the CUDA context (NVML listed this process at 500.00 MiB while PyTorch held " \
           "nothing on this GPU), and other libraries' own allocations" in text, text
    assert not any(w in text for w in ("cuBLAS/cuDNN", "0.5 GiB")), text
