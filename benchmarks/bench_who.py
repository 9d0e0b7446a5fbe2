"""`%gpumem who` on a namespace of about a million objects (issue 3: stays responsive).

    python benchmarks/bench_who.py
"""

from __future__ import annotations

import sys
import time

sys.path.insert(0, ".")

from benchmarks.common import emit


def main() -> None:
    from gpumem_nb.holders import Scanner

    ns: dict[str, object] = {f"v{i}": i for i in range(200_000)}
    ns["big_list"] = list(range(1_000_000))
    ns["big_dict"] = {i: float(i) for i in range(300_000)}
    ns["records"] = [{"id": i, "name": str(i)} for i in range(100_000)]
    results: dict[str, object] = {"objects_in_namespace_approx": 1_700_000}
    try:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        ns["model"] = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(dev)
        ns["acts"] = [torch.empty(2**20, device=dev) for _ in range(100)]
    except ImportError:
        pass
    scanner = Scanner()
    t0 = time.perf_counter()
    holders = scanner.scan(ns)
    results["scan_s"] = round(time.perf_counter() - t0, 4)
    t0 = time.perf_counter()
    scanner.scan(ns, include_gc=True)
    results["scan_with_gc_s"] = round(time.perf_counter() - t0, 4)
    results["holders"] = [(h.name, h.device, h.nbytes) for h in holders[:5]]
    emit("bench_who", results)


if __name__ == "__main__":
    main()
