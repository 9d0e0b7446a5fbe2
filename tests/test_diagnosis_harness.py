"""benchmarks/gpu_diagnosis.py runs its workloads one after another in one shell: each must
start with nothing the previous one made still alive. On the first H200 run the GPT-2 step's
failed traceback (137 GiB) outlived the harness's cleanup, and the next three workloads were
explained for what it left (one OOMed building its model, outside any cell)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest

from benchmarks.gpu_diagnosis import release_everything

pytestmark = pytest.mark.slow  # a benchmark script's harness, not the extension


class Activation:
    """Stands for a tensor the failed call held."""


def test_nothing_a_failed_workload_made_survives_the_harness_cleanup(shell: Any, no_gpu: Any):
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.user_ns.update(Activation=Activation, weakref=weakref, alive=[])
    shell.run_cell("def step():\n    acts = Activation()\n    alive.append(weakref.ref(acts))\n"
                   "    raise MemoryError('CUDA out of memory. Tried to allocate 2.00 GiB.')\n"
                   "step()", store_history=True)
    shell.run_cell("Activation()", store_history=True)  # Out keeps one too
    ref = shell.user_ns["alive"][0]
    out = weakref.ref(shell.user_ns["_"])
    assert ref() is not None and out() is not None
    release_everything(shell)
    assert ref() is None, "IPython's records still keep the failed step's frames"
    assert out() is None
