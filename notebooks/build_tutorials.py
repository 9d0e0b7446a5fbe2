"""Write the tutorial notebooks (sources only). Their outputs come from executing them on a
real GPU with ``run_tutorials.py``; no number in the prose is typed by hand, the prose points
at the outputs.

    python notebooks/build_tutorials.py
"""

from __future__ import annotations

import platform
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

PREAMBLE = (
    "> The outputs in this notebook were produced by running it on an NVIDIA H200 "
    "(see the first output for the torch version). Every figure quoted in the text is in an "
    "output above it. Without a GPU you can still read the outputs, and "
    "`%gpumem watch --replay bundled` plays a session recorded on that H200 in the live chart."
)


def md(text: str) -> dict:
    return {"kind": "markdown", "source": text.strip()}


def code(text: str, runs: int = 1, raises: bool = False) -> dict:
    return {"kind": "code", "source": text.strip(), "runs": runs, "raises": raises}


TUTORIALS: dict[str, list[dict]] = {
    "01_allocated_reserved_nvidia_smi.ipynb": [
        md("""
# 1. Allocated, reserved, and what nvidia-smi sees

"I deleted everything and nvidia-smi still says the GPU is full." This notebook shows why, one
step at a time, with PyTorch's caching allocator and NVML (what nvidia-smi reads) side by side.

""" + PREAMBLE),
        code("%load_ext gpumem_nb"),
        code("import torch\nprint(torch.__version__, torch.cuda.get_device_name(0))"),
        md("""
Importing torch puts nothing on the GPU, and neither does loading gpumem_nb: it never creates a
CUDA context. `%gpumem` shows each GPU: NVML's used/total, this process's share, PyTorch's
`allocated` (live tensors) and `reserved` (live tensors plus the cache), and memory outside
PyTorch."""),
        code("%gpumem"),
        md("""
## The CUDA context

The first CUDA operation creates the context: driver state, kernels and library handles. It is
this process's memory, but PyTorch's allocator does not manage it, so it appears as **outside
PyTorch** and never as `reserved`."""),
        code('torch.zeros(1, device="cuda")\n%gpumem'),
        md("""
## A tensor, then `del`

A 20000×20000 float32 tensor is 20000·20000·4 bytes (the first output line). After `del`,
`allocated` falls back but `reserved` does not: the allocator keeps the block for the next
tensor, and the driver still counts it as used. That is the "false leak"."""),
        code('x = torch.randn(20000, 20000, device="cuda")\n'
             'print(f"{x.numel() * x.element_size() / 2**30:.2f} GiB in the tensor")\n%gpumem'),
        code("del x\n%gpumem"),
        md("""
## Reuse

A new tensor of the same size takes the cached block: `allocated` rises, `reserved` and NVML do
not move. The cache is working for you."""),
        code('y = torch.randn(20000, 20000, device="cuda")\n%gpumem'),
        code("del y"),
        md("""
## `empty_cache()`

`torch.cuda.empty_cache()` hands unused cached blocks back to the driver, and NVML drops by the
same amount. Other processes can then use that memory; yours gains nothing, because it would
have reused the cache anyway. It also waits for the GPU to finish queued work, so call it between
phases, not inside a training loop. `%gpumem cleanup` calls it for you, and reports what each
step freed."""),
        code("%gpumem cleanup"),
        code("%gpumem"),
        md("""
## The per-cell record

Every cell above was measured: allocated and reserved before and after, the allocator's peak
during the cell (exact when the cell set a new peak, `≥` otherwise), NVML before, after and at
its sampled peak, and host RAM. `gpumem_nb.history()` returns the same as a DataFrame."""),
        code("%gpumem history"),
    ],
    "02_rerun_accumulation.ipynb": [
        md("""
# 2. Re-running a cell quietly eats memory

Re-running a cell should cost nothing extra: it rebinds the same names. Three things break that,
and gpumem_nb names each one: results kept alive by IPython's output cache (`Out[n]`, `_`), a
stored traceback that keeps a failed cell's frames, and tensors that carry their autograd
graph.

""" + PREAMBLE),
        code('%load_ext gpumem_nb\nimport torch\ntorch.zeros(1, device="cuda");'),
        md("""
## The output cache

The next cell was run **three times**, as you would re-run it while experimenting (the output
shows the last run). It rebinds `y`, so memory should stay flat, but its last line displays a
result, and IPython keeps every displayed result in `Out`. On the third run gpumem_nb flags it,
says the cause is live tensors, and names who holds them."""),
        code('y = torch.randn(4096, 4096, device="cuda")\ny @ y', runs=3),
        code("%gpumem who"),
        md("""
`%gpumem cleanup --out` clears the output cache. Your variables, `y` included, are untouched;
only results IPython kept for you go. The `output cache` row says what that freed."""),
        code("%gpumem cleanup --out"),
        md("""
To avoid it, end such cells with `;` or assign the result: nothing is displayed, nothing is
cached.

## A cell that raised

When a cell fails, Python keeps the exception, its traceback and every frame in it, with all
their local tensors, so that `%debug` can inspect them. A failed training step can pin its
activations until the next error. gpumem_nb flags this on the first run."""),
        code("def step():\n"
             "    activations = torch.empty(4 * 2**30, dtype=torch.uint8, device='cuda')\n"
             "    raise RuntimeError('shape mismatch in layer 3')\n\n"
             "step()", raises=True),
        code("%gpumem cleanup"),
        md("""
The default cleanup dropped the stored traceback (the `last exception` row) and then returned
the cache to the driver (`empty_cache`).

## A stored loss keeps its graph

Appending the loss tensor to a list keeps the whole autograd graph of that step alive, with the
activations it saved. The next cell was run three times."""),
        code("model = torch.nn.Sequential(\n"
             "    torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)\n"
             ").cuda()\n"
             "opt = torch.optim.Adam(model.parameters())\n"
             "batch = torch.randn(8192, 4096, device='cuda')\n"
             "losses = []"),
        code("loss = model(batch).pow(2).mean()\nlosses.append(loss)", runs=3),
        md("""
The flag names `losses` first: its own storage is a few bytes, but one of its tensors carries a
`grad_fn`. Store `loss.item()` (a Python float) instead, and re-runs stay flat:"""),
        code("losses = [l.item() for l in losses]\n"
             "del loss\n"
             "%gpumem cleanup"),
        code("loss = model(batch).pow(2).mean()\nlosses.append(loss.item())", runs=3),
        md("""
## Optimizer state

Adam keeps two tensors per parameter (`exp_avg`, `exp_avg_sq`), created at the first `step()`.
`%gpumem who` lists the optimizer's state next to the model's parameters."""),
        code("model(batch).pow(2).mean().backward()\nopt.step()\nopt.zero_grad()\n%gpumem who"),
        code("%gpumem history -n 12"),
    ],
    "03_peaks_fragmentation_live.ipynb": [
        md("""
# 3. Peaks, fragmentation, and the live chart

An OOM "out of nowhere" is usually a short peak, or memory the allocator holds but cannot hand
out. This notebook measures both, and shows the live chart during a long cell.

""" + PREAMBLE),
        code('%load_ext gpumem_nb\nimport torch\ntorch.zeros(1, device="cuda");'),
        md("""
## Exact peaks

A transient allocation inside a cell (here 8 GiB that lives for a few milliseconds) is invisible
before and after the cell. `%%gpumem` reports the allocator's exact peak during the cell.
gpumem_nb never resets PyTorch's peak counters unless you ask (`--reset-peak`, or
`%gpumem config --peak reset`), so `torch.cuda.max_memory_allocated()` still means what you
think."""),
        code("%%gpumem\n"
             "tmp = torch.empty(8 * 2**30, dtype=torch.uint8, device='cuda')\n"
             "torch.cuda._sleep(10_000_000)  # ten million GPU clock cycles\n"
             "del tmp\n"
             "torch.cuda.synchronize()"),
        code('print(f"max_memory_allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")'),
        md("""
A smaller spike later does not raise the process-wide peak, so without a reset its exact size
is unknown; gpumem_nb reports the best honest lower bound instead of a guess (`%%gpumem` says
"lower bound", the history marks it `≥`). Ask
for a reset and the figure is exact again."""),
        code("%%gpumem\n"
             "tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda'); del tmp"),
        code("%%gpumem --reset-peak\n"
             "tmp = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda'); del tmp"),
        md("""
## Fragmentation

Free a 1 GiB tensor and allocate 600 MB: the allocator splits its cached 1 GiB segment. The
unused part is *inactive split*: reserved, free, and not returnable to the driver while the
600 MB tensor lives in the same segment. `%gpumem summary` explains the state and suggests a
fix."""),
        code("%gpumem cleanup\n"
             "a = torch.empty(2**30, dtype=torch.uint8, device='cuda')\n"
             "del a\n"
             "b = torch.empty(600 * 10**6, dtype=torch.uint8, device='cuda')"),
        code("%gpumem summary"),
        md("""
The allocator's configuration is read when CUDA starts, so comparing settings needs fresh
processes. The same pattern under the default allocator and under
`expandable_segments:True`:"""),
        code("import json, subprocess, sys\n"
             "PATTERN = '''\n"
             "import json, torch\n"
             "a = torch.empty(2**30, dtype=torch.uint8, device='cuda'); del a\n"
             "b = torch.empty(600 * 10**6, dtype=torch.uint8, device='cuda')\n"
             "s = torch.cuda.memory_stats()\n"
             "print(json.dumps({k: s[k] for k in ('allocated_bytes.all.current',\n"
             "      'reserved_bytes.all.current', 'inactive_split_bytes.all.current')}))\n"
             "'''\n"
             "for conf in ('', 'expandable_segments:True'):\n"
             "    env = {**__import__('os').environ, 'PYTORCH_ALLOC_CONF': conf}\n"
             "    out = subprocess.run([sys.executable, '-c', PATTERN], env=env,\n"
             "                         capture_output=True, text=True, check=True)\n"
             "    stats = json.loads(out.stdout.strip().splitlines()[-1])\n"
             "    print(f\"{conf or 'default':26}\", {k.split('.')[0]: f'{v / 2**20:.0f} MiB'\n"
             "                                       for k, v in stats.items()})"),
        code("del b\n%gpumem cleanup"),
        md("""
## The live chart

`%gpumem watch` shows NVML's usage beside PyTorch's `allocated` and `reserved`, with a mark at
every cell. A background thread updates it while a cell runs, so a long training cell is
visible as it happens. The cleanup button runs the same safe cleanup as `%gpumem cleanup`.
(On GitHub or nbviewer the widget cannot run; the numbers below it are its static fallback.)"""),
        code("%gpumem watch"),
        code("# Ten seconds of training: watch the chart move while this cell runs.\n"
             "import time\n"
             "model = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(4)])"
             ".cuda()\n"
             "opt = torch.optim.AdamW(model.parameters())\n"
             "t_end = time.monotonic() + 10\n"
             "steps = 0\n"
             "while time.monotonic() < t_end:\n"
             "    x = torch.randn(4096, 8192, device='cuda')\n"
             "    model(x).square().mean().backward()\n"
             "    opt.step(); opt.zero_grad(set_to_none=True)\n"
             "    steps += 1\n"
             "torch.cuda.synchronize()\n"
             "print(steps, 'steps')"),
        md("""
The chart's header and the allocator agree: the next cell reads `memory_allocated` and
`memory_reserved` and compares them with what the widget shows."""),
        code("from gpumem_nb.magics import current_monitor\n"
             "from gpumem_nb.units import format_bytes\n"
             "mon = current_monitor()\n"
             "mon.sampler.request_tick(); time.sleep(1.0)\n"
             "header = mon.widget.header.value\n"
             "alloc, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()\n"
             "print('allocated', format_bytes(alloc), format_bytes(alloc) in header)\n"
             "print('reserved ', format_bytes(reserved), format_bytes(reserved) in header)\n"
             "print('chart redraws so far:', mon.widget.draws)"),
    ],
}


def build(name: str, cells: list[dict]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    # What ipykernel reports; run_tutorials.py replaces it with the executing kernel's own.
    # A bare {"name": "python"} made JupyterLab fill it in and open the notebook as modified.
    nb.metadata["language_info"] = {
        "name": "python", "version": platform.python_version(), "mimetype": "text/x-python",
        "file_extension": ".py", "codemirror_mode": {"name": "ipython", "version": 3},
        "nbconvert_exporter": "python", "pygments_lexer": "ipython3"}
    for i, c in enumerate(cells):
        if c["kind"] == "markdown":
            cell = nbformat.v4.new_markdown_cell(c["source"])
        else:
            cell = nbformat.v4.new_code_cell(c["source"])
            if c["runs"] > 1:
                cell.metadata["tutorial"] = {"runs": c["runs"]}
            if c["raises"]:
                cell.metadata["tags"] = ["raises-exception"]  # nbclient: an expected error
        cell.id = f"{Path(name).stem[:2]}-{i:02d}"
        nb.cells.append(cell)
    return nb


def main() -> None:
    for name, cells in TUTORIALS.items():
        nbformat.write(build(name, cells), HERE / name)
        print("wrote", name)


if __name__ == "__main__":
    main()
