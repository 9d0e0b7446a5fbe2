"""The real forking launchers, on CPU: each forks a worker that fails the way a worker does when
the kernel has initialised CUDA (torch's own words, raised by hand: there is no CUDA here), and
the message under the cell names that launcher. This is what the H200 run showed
accelerate 1.15 and Lightning 2.6 doing: neither refuses up front any more, both fork and
re-raise the worker's error (elastic's ChildFailedError, torch's ProcessRaisedException), which
gpumem_nb had called "a forked subprocess".

Each launcher runs in a fresh process with a real IPython shell and real torch (skipped where
torch or the launcher is not installed, as in CI)."""

from __future__ import annotations

import pytest

from .gpu.helpers import fresh

# Run by the GPU machine's ``pytest -m gpu`` (CI has no torch, so unmarked it ran nowhere).
pytestmark = pytest.mark.gpu

REINIT = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
          "you must use the 'spawn' start method")

LAUNCH = {
    "accelerate": (
        "from accelerate import notebook_launcher\n"
        "def train():\n    raise RuntimeError(REINIT)\n",
        "notebook_launcher(train, num_processes=2)",
        "accelerate's notebook_launcher forks its workers"),
    "lightning": (
        "from lightning.fabric import Fabric\n"
        "def train(fabric):\n    raise RuntimeError(REINIT)\n",
        "Fabric(accelerator='cpu', devices=1, strategy='ddp_notebook').launch(train)",
        "Lightning's ddp_notebook forks its workers"),
    "torch.multiprocessing": (
        "import torch.multiprocessing as tmp\n"
        "def train(rank):\n    raise RuntimeError(REINIT)\n",
        "tmp.start_processes(train, nprocs=1, start_method='fork')",
        "torch.multiprocessing forked its workers"),
    "DataLoader": (
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Rows(Dataset):\n"
        "    def __len__(self):\n        return 2\n"
        "    def __getitem__(self, i):\n        raise RuntimeError(REINIT)\n",
        "list(DataLoader(Rows(), num_workers=1, multiprocessing_context='fork'))",
        "the DataLoader forks its workers"),
}
NEEDS = {"accelerate": "accelerate", "lightning": "lightning"}


@pytest.mark.parametrize("launcher", list(LAUNCH))
def test_a_real_launchers_failed_worker_is_named_with_the_cell_to_restart_from(launcher):
    pytest.importorskip("torch")
    if launcher in NEEDS:
        pytest.importorskip(NEEDS[launcher])
    setup, call, words = LAUNCH[launcher]
    r = fresh(f"""
        import contextlib, io, json
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_cell("%load_ext gpumem_nb", store_history=True)
        ip.run_cell("import torch", store_history=True)
        ip.user_ns["REINIT"] = {REINIT!r}
        ip.run_cell({setup!r}, store_history=True)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            failed = ip.run_cell({call!r}, store_history=True)
        print(json.dumps({{"error": type(failed.error_in_exec).__name__,
                          "printed": buf.getvalue()[-3000:]}}))
    """)
    assert r["error"] != "NoneType", r  # the launch failed, as it does on a GPU
    assert f"gpumem: {words}: a forked process cannot use CUDA" in r["printed"], r["printed"]
    # CPU torch never starts CUDA, so where it started is honestly not known here.
    assert "gpumem_nb did not see where CUDA started" in r["printed"]
