"""Why `it.close()` freed nothing on the H200: which step keeps a suspended generator's
batch alive past its close (each variant in a fresh process)."""
import gc
import sys

import torch
from IPython.testing.globalipapp import start_ipython

ip = start_ipython()
ip.run_cell("%load_ext gpumem_nb", store_history=True)
ip.user_ns.update(torch=torch, GiB=1 << 30)
torch.zeros(1, device="cuda")


def alloc() -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


steps = sys.argv[1]
ip.run_cell("def batches():\n    for i in range(10):\n"
            "        batch = torch.ones(4 * GiB, dtype=torch.uint8, device='cuda')\n"
            "        yield float(i)\nit = batches()\nfirst = next(it)", store_history=True)
if "oom" in steps:
    ip.run_cell("y = torch.empty(int(torch.cuda.mem_get_info()[0]) + 20 * GiB, "
                "dtype=torch.uint8, device='cuda')", store_history=True)
if "who" in steps:
    print(ip.run_line_magic("gpumem", "who -n 500 -o"))
if "dry" in steps:
    ip.run_line_magic("gpumem", "cleanup --dry-run --out -o")
b = alloc()
ip.run_cell("it.close()", store_history=True)
gc.collect()
c = alloc()
print(f"PROBE {steps}: close freed {(b - c) / 2**30:.2f} GiB")
if b - c < 2**30:
    for t in [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda
              and o.numel() >= 2**32]:
        for r in gc.get_referrers(t):
            if r is not sys._getframe():
                print("   held by", type(r).__name__, getattr(getattr(r, "f_code", None),
                      "co_name", ""), repr(r)[:150])
                for rr in gc.get_referrers(r):
                    print("      which is held by", type(rr).__name__, repr(rr)[:150])
