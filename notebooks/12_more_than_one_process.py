# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] id="12-00"
# # 12. More than one process on a GPU
#
# > **To run it you need an NVIDIA GPU and PyTorch.** Anywhere else, read it as it is: its
# > outputs come from a GPU run, and its first code cell stops Run All with one sentence before
# > any other cell runs and replaces them.
#
# PyTorch's statistics are this process's. `nvidia-smi` (NVML) sees every process, and each
# process that touches a GPU pays for a CUDA context of its own there, before it allocates
# anything. So memory on "your" GPU can belong to:
#
# 1. **another process**: a job left running, another user's script, or a stray context
#    another program created on `cuda:0`;
# 2. **this kernel's children**: DataLoader workers that touched CUDA, a multiprocessing pool;
# 3. **a second kernel**: another notebook's, or one started from this one;
# 4. **a Dask cluster's workers**, each a process with its own context and its own allocator.
#
# This notebook sets up each one and shows how `%gpumem` (and `%gpumem cluster`) tells them
# apart. The figures come from NVML's process list, which names each process by its PID.
#
# > The outputs were produced by running this notebook on an NVIDIA H200; its metadata
# > (`gpumem_nb` key) records the GPU, driver, CUDA, torch and gpumem_nb versions, the commit
# > and the date. Each sentence about what was measured is checked by the cell that measured
# > it: the lines starting with ✓ are those checks (`claims.py`, beside this notebook), and a
# > run that contradicts the text stops there instead of saving it. A number in the text is
# > quoted from the output right above or below it.

# %% id="12-01"
from gpumem_nb.tutorial import require_gpu

require_gpu()  # without an NVIDIA GPU and PyTorch: one sentence, and Run All stops here
# %load_ext gpumem_nb
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
from claims import claim

from gpumem_nb.magics import current_monitor
from gpumem_nb.units import format_bytes as fmt

GiB, MiB = 2**30, 2**20
torch.zeros(1, device="cuda")  # this kernel's own context
WORKDIR = tempfile.mkdtemp(prefix="gpumem_12_")


def gpu0():
    # NVML's view of GPU 0 right now, as `%gpumem` reads it: the children's roles (DataLoader
    # worker...) are learned from torch's own objects first, as `%gpumem` does.
    monitor = current_monitor()
    monitor.learn_child_roles()
    return monitor.read().devices[0].nvml


def wait_for(test, timeout_s=120):
    # Until test() holds (processes take a few seconds to start CUDA); its last value.
    deadline = time.monotonic() + timeout_s
    while True:
        value = test()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


before = gpu0()
print(f"before: other processes {fmt(before.other_processes_bytes)}, this kernel's children "
      f"{fmt(before.children_bytes)}")

# %% [markdown] id="12-02"
# ## 1. Another process
#
# The next cell starts a Python process that allocates a tensor on the GPU and waits. It is
# started through a shell that exits at once, so it is no child of this kernel: exactly like a
# job someone else left running.

# %% id="12-03"
STRAY = r'''
import os, sys, time, torch
x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(600)
'''
pid_file = os.path.join(WORKDIR, "stray.pid")
script = os.path.join(WORKDIR, "stray.py")
with open(script, "w") as f:
    f.write(STRAY)
subprocess.run(["sh", "-c", f"'{sys.executable}' '{script}' '{pid_file}' >/dev/null 2>&1 &"],
               check=True)


def written_pid():
    # The PID the stray process wrote, once it has its tensor ("" until then).
    if not os.path.exists(pid_file):
        return ""
    with open(pid_file) as f:
        return f.read().strip()


stray_pid = int(wait_for(written_pid) or 0)
seen = wait_for(lambda: (gpu0().other_processes_bytes or 0) - (before.other_processes_bytes or 0)
                >= 2 * GiB)
after_stray = gpu0()
print(f"the stray process, PID {stray_pid}: other processes now "
      f"{fmt(after_stray.other_processes_bytes)}; this kernel's children "
      f"{fmt(after_stray.children_bytes)}")
# %gpumem
claim(seen and stray_pid not in {c.pid for c in after_stray.children},
      "%gpumem counts it under other processes, not as this kernel's child: its tensor and "
      "its own CUDA context", other_processes=fmt(after_stray.other_processes_bytes))

# %% [markdown] id="12-04"
# Its share is more than its tensor: the difference is its CUDA context. `%gpumem` cannot stop
# another process; its OOM explanation names it by PID (notebook 4 runs out of memory beside
# one). Here it is ours to end:

# %% id="12-05"
os.kill(stray_pid, signal.SIGTERM)
gone = wait_for(lambda: (gpu0().other_processes_bytes or 0)
                <= (before.other_processes_bytes or 0) + 64 * MiB)
print(f"after ending it: other processes {fmt(gpu0().other_processes_bytes)}")
claim(gone, "once it ended, its memory left the GPU with it")

# %% [markdown] id="12-06"
# ## 2. DataLoader workers that touch CUDA
#
# A dataset whose `__getitem__` creates a CUDA tensor (a common slip: moving each sample to the
# GPU in the dataset) gives every DataLoader worker a CUDA context of its own. Worker
# processes are started fresh (`multiprocessing_context="spawn"`), since a worker forked from a
# process whose CUDA has started cannot use CUDA at all. The dataset lives in a small module
# file, so that the workers can import it.

# %% id="12-07"
DATASET = r'''
import torch


class OnTheGpu(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((1024,), float(i), device="cuda")  # the slip: CUDA in a worker
'''
with open(os.path.join(WORKDIR, "tutorial_dataset.py"), "w") as f:
    f.write(DATASET)
sys.path.insert(0, WORKDIR)  # spawned workers get this process's sys.path
OnTheGpu = importlib.import_module("tutorial_dataset").OnTheGpu  # the file just written

loader = torch.utils.data.DataLoader(OnTheGpu(), batch_size=8, num_workers=2,
                                     multiprocessing_context="spawn", persistent_workers=True)
batches = iter(loader)
first = next(batches)
workers = wait_for(lambda: [c for c in gpu0().children if c.role == "DataLoader worker"])
print(f"first batch: {tuple(first.shape)} on {first.device}")
for c in workers:
    print(f"  {c.label}: {fmt(c.nbytes)}")
# %gpumem
claim(len(workers) == 2 and all((c.nbytes or 0) >= 256 * MiB for c in workers),
      "each of the two workers holds a CUDA context of its own, and %gpumem names them as "
      "this kernel's DataLoader workers", workers=len(workers),
      each=", ".join(fmt(c.nbytes) for c in workers))

# %% [markdown] id="12-08"
# Each worker's share is nearly all context: the samples it made are tiny. The fix is to keep
# workers on the CPU and move each batch to the GPU in the main process (with
# `pin_memory=True` for faster copies). On a machine with several GPUs the same slip, or a
# `pin_memory` thread started before `torch.cuda.set_device`, puts the extra contexts on
# `cuda:0` (pytorch/pytorch#58626); that case is described, not run here, on a machine with one
# GPU. Ending the workers frees their contexts:

# %% id="12-09"
del first  # a batch the workers shared with this process: let it go before they end
del batches, loader
no_workers = wait_for(lambda: not [c for c in gpu0().children if c.role == "DataLoader worker"])
print(f"after the loader is gone: this kernel's children {fmt(gpu0().children_bytes)}")
claim(no_workers, "without the loader its workers ended, and their contexts with them")

# %% [markdown] id="12-10"
# The warnings above ("Producer process has been terminated before all shared CUDA tensors
# released") come from the workers as they end. `del first` released the one batch this
# process used, but a DataLoader also prefetches: the workers had already made and sent the
# next batches, which this process never took, so their GPU memory was still shared when the
# workers ended. Nothing uses those batches; the workers' contexts were freed all the same
# (the line above).
#
# ## 3. A second kernel
#
# Two notebooks open in JupyterLab are two kernels: two processes, two contexts, two caches,
# and neither kernel's PyTorch sees the other's tensors. The next cell starts a second kernel
# from this one (as a notebook tab would, but as this kernel's child), and has it allocate.

# %% id="12-11"
from jupyter_client.manager import KernelManager

printed: list[str] = []


def collect(msg):
    # What the second kernel printed (its stream messages).
    if msg["msg_type"] == "stream":
        printed.append(msg["content"]["text"])


# Over IPC (Unix sockets in WORKDIR): over TCP the new kernel warns that its traffic is not
# encrypted.
km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(WORKDIR, "kernel"))
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
kc.execute_interactive(
    "import os, torch\nheld = torch.empty(3 * 2**30, dtype=torch.uint8, device='cuda')\n"
    "print(os.getpid(), torch.cuda.memory_allocated())", timeout=180, output_hook=collect)
second_pid, second_allocated = map(int, "".join(printed).split())
child = wait_for(lambda: next((c for c in gpu0().children if c.pid == second_pid), None))
print(f"the second kernel, PID {second_pid}: its PyTorch allocated {fmt(second_allocated)}; "
      f"NVML: {fmt(child.nbytes) if child else 'not listed'}; this kernel's PyTorch: "
      f"{fmt(torch.cuda.memory_allocated())}")
# %gpumem
claim(child is not None and (child.nbytes or 0) > second_allocated >= 3 * GiB,
      "the second kernel's tensor and context are its own: %gpumem lists it as this kernel's "
      "child, and this kernel's PyTorch does not count them",
      second_kernel=fmt(child.nbytes if child else 0))
torch.cuda.empty_cache()  # this kernel's: it cannot reach another process's memory
still = next((c for c in gpu0().children if c.pid == second_pid), None)
print(f"after this kernel's empty_cache(): the second kernel's NVML share "
      f"{fmt(child.nbytes if child else 0)} -> {fmt(still.nbytes if still else 0)}")

# %% [markdown] id="12-12"
# Opened from JupyterLab instead, the second kernel would be no child of this one: `%gpumem`
# would count it under other processes, like the stray process above. (That case is described,
# not run here: this notebook starts its second kernel itself.) The last line above compares
# the second kernel's memory before and after this kernel's `empty_cache()`: another process's
# memory is out of its reach. Shutting a kernel down (or closing
# its notebook's kernel) is what frees its memory; restarting this one does nothing for it.

# %% id="12-13"
kc.stop_channels()
km.shutdown_kernel(now=True)
gone = wait_for(lambda: not any(c.pid == second_pid for c in gpu0().children))
print(f"after shutting it down: this kernel's children {fmt(gpu0().children_bytes)}")
claim(gone, "shutting the second kernel down freed its memory")

# %% [markdown] id="12-14"
# ## 4. A Dask cluster's workers
#
# A Dask cluster runs tasks in worker processes; each worker that uses PyTorch on a GPU has its
# own context and its own allocator, which the client's process cannot read. `%gpumem cluster`
# asks every worker for its own figures (NVML's view of its GPU, its process's share, its
# PyTorch allocator) and counts each GPU once. The cluster here is two local workers sharing
# this GPU; each allocates a tensor it keeps.

# %% id="12-15"
from distributed import Client, LocalCluster

cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                       dashboard_address=None)
client = Client(cluster)


def hold(nbytes):
    # Runs in a worker: allocate a tensor and keep it there (in the worker's own module).
    import builtins

    import torch

    builtins.gpumem_tutorial_tensor = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return torch.cuda.memory_allocated()


held_by = client.run(hold, 1 * 2**30)
print("allocated in each worker:", {w: fmt(n) for w, n in held_by.items()})

# %% id="12-16"
# %gpumem cluster

# %% id="12-17"
reading = get_ipython().run_line_magic("gpumem", "cluster -o")
rows = [r for r in reading.rows if r.status == "ok"]
for r in rows:
    print(f"{r.worker}: PID {r.pid}, allocated {fmt(r.allocated_bytes)}, its process "
          f"{fmt(r.process_bytes)}")
claim(len(rows) == 2 and all((r.allocated_bytes or 0) >= 2**30 for r in rows),
      "%gpumem cluster reads each worker's own allocator: the tensor it keeps",
      workers=len(rows))
claim(all((r.process_bytes or 0) > (r.allocated_bytes or 0) for r in rows)
      and len({r.uuid for r in rows}) == 1,
      "each worker's NVML share is more than its tensor (its context), and the two share one "
      "GPU, counted once",
      **{f"PID {r.pid}": f"{fmt(r.process_bytes or 0)} for a {fmt(r.allocated_bytes or 0)} tensor"
         for r in rows}, gpus=len({r.uuid for r in rows}))

# %% id="12-18"
client.close()
cluster.close()
gone = wait_for(lambda: not [c for c in gpu0().children if c.nbytes])
print(f"after the cluster closed: this kernel's children {fmt(gpu0().children_bytes)}")
claim(gone, "closing the cluster ended its workers, and freed their memory")

# %% [markdown] id="12-19"
# What to take away:
#
# - Every process on a GPU pays for its own CUDA context; DataLoader workers that touch CUDA,
#   a second kernel and each Dask worker are such processes.
# - `%gpumem` separates this process, this kernel's children (named: DataLoader worker,
#   launched worker, multiprocessing child) and other processes; `%gpumem cluster` reads a Dask
#   cluster's workers from the inside.
# - What another process holds is freed only by that process: end it, shut its kernel down,
#   close its cluster. Nothing in this kernel (`empty_cache`, a cleanup) reaches it.
