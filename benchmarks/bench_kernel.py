"""What the extension adds to a cell as users run cells: real ipykernels, cells spaced apart.

For each round, two fresh kernels are started through jupyter_client, one without the
extension and one with ``%load_ext gpumem_nb``; their order alternates from round to round so
drift (thermal, page cache, other tenants) falls on both arms alike. Each kernel runs the same
setup (optionally N small CUDA tensors in the namespace; the sampler at its default interval),
``--warmup`` discarded cells, then ``--cells`` measured cells of ``x = 1`` sent ``--gap-s``
apart after the previous one went idle. Every cell's text is identical in both arms; in the
arm without the extension the ``%load_ext`` cell is ``pass``.

Three measurements per cell:

- hook time, in place: inside the kernel, every pre/post cell callback registered from the
  gpumem_nb package (found generically in ``shell.events.callbacks``) is replaced by a
  ``perf_counter_ns`` wrapper; the figures are fetched at the end;
- kernel-stamped cell time: the execute_reply header date minus the ``started`` stamp in its
  metadata (both taken by ipykernel), and the iopub busy -> idle dates;
- the client's round trip (send to idle), for reference only.

``--train`` adds a training loop of about 1 ms steps (GPU: 1024x1024 matmuls + synchronize;
no GPU: a pure-Python step), each step timed, without the extension, with it, and with it at
``%gpumem config --interval 0.05``. The step size is calibrated once, in the first kernel, and
reused by every kernel so both arms do the same work.

``--fakes N`` runs the kernels on the project's fake NVML and fake torch.cuda with N GPUs
(tests/fakes.py, installed by benchmarks/kernel_probe.py before the extension loads); N > 1 also
runs 1 fake GPU so the two can be compared (flat in GPU count). A comma list picks the counts.

    python3 benchmarks/bench_kernel.py --rounds 3 --cells 60 --tensors 1000 --train
    python3 benchmarks/bench_kernel.py --fakes 8 --rounds 2 --cells 40

Results: a printed table and benchmarks/results/bench_kernel_<host-tag>.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import git_commit, gpu_environment, summarize  # noqa: E402

CELL = "x = 1"
LOAD = "%load_ext gpumem_nb"
FAST_INTERVAL = "%gpumem config --interval 0.05"
PRE_EVENTS = ("pre_execute", "pre_run_cell")
POST_EVENTS = ("post_run_cell", "post_execute")
WITHOUT, WITH = "without", "with"


# --------------------------------------------------------------------------------------------
# One kernel
# --------------------------------------------------------------------------------------------
def _date(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _us(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    return (_date(b) - _date(a)).total_seconds() * 1e6


@dataclass
class CellTiming:
    msg_id: str
    exec_us: float | None  # execute_reply header date - metadata "started" (kernel clock)
    busy_idle_us: float | None  # iopub status busy -> idle dates (kernel clock)
    roundtrip_us: float  # client: send -> idle received
    status: str
    output: str


class Kernel:
    """A fresh ipykernel on this Python, with a private settings file."""

    def __init__(self, workdir: Path, env: dict[str, str], timeout_s: float) -> None:
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        spec_dir = workdir / "kernels" / "gpumem-bench"
        spec_dir.mkdir(parents=True, exist_ok=True)
        (spec_dir / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "gpumem bench", "language": "python"}))
        ksm = KernelSpecManager(kernel_dirs=[str(workdir / "kernels")])
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.km = KernelManager(kernel_name="gpumem-bench", kernel_spec_manager=ksm)
        # The kernel's own stderr (transport warnings, a crash) goes to a log shown on failure.
        self.log_path = workdir / "kernel.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.km.start_kernel(env=env, cwd=str(workdir), stdout=self._log, stderr=self._log)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=timeout_s)
        except RuntimeError:
            self.close()
            raise RuntimeError("the benchmark kernel did not start:\n"
                               + self.log_tail()) from None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def run(self, code: str, *, silent: bool = False, check: bool = True) -> CellTiming:
        kc = self.kc
        t0 = time.perf_counter()
        msg_id = kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False)
        deadline = time.monotonic() + self.timeout_s
        busy = idle = None
        out: list[str] = []
        while idle is None:
            try:
                msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no idle after {self.timeout_s} s for {code!r}\n"
                                   + self.log_tail()) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind == "status":
                state = msg["content"]["execution_state"]
                if state == "busy":
                    busy = msg["header"]["date"]
                elif state == "idle":
                    idle = msg["header"]["date"]
            elif kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
        roundtrip_us = (time.perf_counter() - t0) * 1e6
        while True:
            reply = kc.get_shell_msg(timeout=self.timeout_s)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        status = reply["content"]["status"]
        if check and status != "ok":
            raise RuntimeError(f"cell {code!r} failed in the benchmark kernel: {''.join(out)}"
                               f"\n{self.log_tail()}")
        return CellTiming(
            msg_id=msg_id,
            exec_us=_us(reply["metadata"].get("started"), reply["header"]["date"]),
            busy_idle_us=_us(busy, idle),
            roundtrip_us=roundtrip_us,
            status=status,
            output="".join(out),
        )

    def fetch(self, expr: str) -> Any:
        """The JSON value of ``expr`` (a JSON string), through a file: a silent execute
        triggers no pre/post_run_cell and adds no history."""
        path = self.workdir / "fetch.json"
        path.unlink(missing_ok=True)
        self.run(f"open({str(path)!r}, 'w').write({expr})", silent=True)
        return json.loads(path.read_text())

    def close(self) -> None:
        try:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        finally:
            self._log.close()


# --------------------------------------------------------------------------------------------
# One arm of one round
# --------------------------------------------------------------------------------------------
@dataclass
class ArmResult:
    arm: str
    gpus: int | None  # fake GPU count, None on real hardware
    cells: list[CellTiming]
    hooks: list[dict[str, int]]  # per measured cell: event -> ns
    wrapped: dict[str, int]
    unwrapped_after: int
    timer_overhead_ns: float
    setup_note: str
    load_output: str
    gc_before: dict[str, Any]
    gc_after: dict[str, Any]
    kernel: dict[str, Any]
    train_us: dict[str, list[float]] = field(default_factory=dict)


def kernel_env(workdir: Path, fakes: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["GPUMEM_NB_CONFIG"] = str(workdir / "settings.json")  # defaults, never the user's file
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    for name in ("GPUMEM_NB_AUTO_SHOW", "GPUMEM_NB_REPLAY"):
        env.pop(name, None)
    if fakes is not None:
        env.pop("CUDA_VISIBLE_DEVICES", None)  # it would hide fake GPUs from the mapping
    return env


def run_arm(arm: str, args: argparse.Namespace, fakes: int | None,
            train: dict[str, Any]) -> ArmResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench_kernel_{arm}_"))
    k = Kernel(workdir, kernel_env(workdir, fakes), args.timeout_s)
    try:
        setup = "import gc\nfrom benchmarks import kernel_probe as _bench"
        if fakes is not None:
            setup += f"\n_bench.install_fakes({fakes})"
        k.run(setup)
        load = k.run(LOAD if arm == WITH else "pass")
        k.run(f"_bench_keep, _bench_note = _bench.make_tensors({args.tensors})")
        setup_note = k.fetch("__import__('json').dumps(_bench_note)")
        k.run("_bench_wrapped = _bench.wrap_hooks(get_ipython())\n"
              "_bench_overhead = _bench.timer_overhead_ns()\n"
              "gc.collect()")
        wrapped = k.fetch("__import__('json').dumps(_bench_wrapped)")
        overhead = k.fetch("__import__('json').dumps(_bench_overhead)")
        for _ in range(args.warmup):
            time.sleep(args.gap_s)
            k.run(CELL)
        gc_before = k.fetch("__import__('json').dumps(_bench.gc_state())")
        cells = []
        for _ in range(args.cells):
            time.sleep(args.gap_s)
            cells.append(k.run(CELL))
        gc_after = k.fetch("__import__('json').dumps(_bench.gc_state())")
        records = k.fetch("_bench.hook_records_json()")
        unwrapped = k.fetch("__import__('json').dumps(_bench.unwrapped_hooks(get_ipython()))")
        hooks = [records.get(c.msg_id, {}) for c in cells]
        result = ArmResult(
            arm=arm, gpus=fakes, cells=cells, hooks=hooks, wrapped=wrapped,
            unwrapped_after=unwrapped, timer_overhead_ns=overhead, setup_note=setup_note,
            load_output=load.output.strip(), gc_before=gc_before, gc_after=gc_after,
            kernel=k.fetch("_bench.kernel_info_json()"),
        )
        if args.train:
            run_training(k, arm, args, train, result)
        return result
    finally:
        k.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_training(k: Kernel, arm: str, args: argparse.Namespace, train: dict[str, Any],
                 result: ArmResult) -> None:
    if not train:  # first kernel of the run: calibrate once for every kernel
        train["kind"] = k.fetch("__import__('json').dumps(_bench.train_kind())")
        train["param"] = k.fetch(
            f"__import__('json').dumps(_bench.calibrate({train['kind']!r}))")
    call = (f"_bench_steps = _bench.train({train['kind']!r}, {train['param']}, "
            f"{args.train_steps})")
    runs = [("default", None)] if arm == WITHOUT else [("default", None),
                                                       ("interval_0.05", FAST_INTERVAL)]
    for name, before in runs:
        if before:
            k.run(before)
        time.sleep(args.gap_s)
        k.run(call)
        result.train_us[name] = [ns / 1e3 for ns in k.fetch("_bench_steps")]


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------
def hook_split(rec: dict[str, int]) -> tuple[float, float, float]:
    pre = sum(rec.get(e, 0) for e in PRE_EVENTS) / 1e3
    post = sum(rec.get(e, 0) for e in POST_EVENTS) / 1e3
    return pre, post, pre + post


def _vals(results: list[ArmResult], attr: str) -> list[float]:
    return [v for r in results for c in r.cells if (v := getattr(c, attr)) is not None]


def summarize_config(arms: list[ArmResult]) -> dict[str, Any]:
    without = [a for a in arms if a.arm == WITHOUT]
    with_ = [a for a in arms if a.arm == WITH]
    hook_cells = [hook_split(h) for a in with_ for h in a.hooks]
    missing = sum(1 for a in with_ for h in a.hooks if not h)
    by_event: dict[str, list[float]] = {}
    for a in with_:
        for h in a.hooks:
            for event, ns in h.items():
                by_event.setdefault(event, []).append(ns / 1e3)
    out: dict[str, Any] = {
        "units": "microseconds",
        "hooks_us": {
            "pre": summarize([p for p, _, _ in hook_cells]),
            "post": summarize([q for _, q, _ in hook_cells]),
            "total": summarize([t for _, _, t in hook_cells]),
            "by_event": {e: summarize(v) for e, v in sorted(by_event.items())},
            "callbacks_wrapped": with_[0].wrapped if with_ else {},
            "cells_without_hook_record": missing,
            "callbacks_escaping_timers": sum(a.unwrapped_after for a in with_),
            "timer_overhead_per_callback_ns": (
                round(sum(a.timer_overhead_ns for a in with_) / len(with_)) if with_ else None),
        },
    }
    for metric in ("exec_us", "busy_idle_us", "roundtrip_us"):
        w0, w1 = summarize(_vals(without, metric)), summarize(_vals(with_, metric))
        out[metric.replace("_us", "") + "_us"] = {
            WITHOUT: w0, WITH: w1,
            "added_median": _diff(w1, w0, "median"), "added_p90": _diff(w1, w0, "p90"),
        }
    # The whole kernel's CPU over the measured cells (gaps included), per cell: what the
    # sampler and any deferred work cost besides the hooks.
    cpu = {arm: [(a.gc_after["process_cpu_s"] - a.gc_before["process_cpu_s"]) * 1e6
                 / max(1, len(a.cells)) for a in group]
           for arm, group in ((WITHOUT, without), (WITH, with_))}
    out["kernel_cpu_per_cell_us"] = {arm: summarize(v) for arm, v in cpu.items()}
    # Each round appended its two kernels together, in either order.
    out["exec_added_median_per_round_us"] = [
        _diff(*(summarize(_vals([x], "exec_us")) for x in sorted(pair, key=lambda x: x.arm
                                                                   != WITH)), "median")
        for pair in zip(arms[::2], arms[1::2], strict=False)]
    out["per_round"] = [
        {"arm": a.arm, "exec_median_us": summarize(_vals([a], "exec_us")).get("median"),
         "hooks_total_median_us": (summarize([hook_split(h)[2] for h in a.hooks]).get("median")
                                   if a.arm == WITH else None),
         "gc_collections_during": [x - y for x, y in zip(a.gc_after["collections"],
                                                         a.gc_before["collections"],
                                                         strict=True)]}
        for a in arms]
    if any(a.train_us for a in arms):
        train: dict[str, Any] = {}
        for label, arm, run in ((WITHOUT, without, "default"), (WITH, with_, "default"),
                                ("with_interval_0.05", with_, "interval_0.05")):
            train[label] = summarize([v for a in arm for v in a.train_us.get(run, [])])
        train["added_median"] = _diff(train[WITH], train[WITHOUT], "median")
        train["added_median_at_0.05"] = _diff(train["with_interval_0.05"], train[WITHOUT],
                                              "median")
        out["train_step_us"] = train
    out["notes"] = sorted({a.setup_note for a in arms})
    out["load_output"] = sorted({a.load_output for a in with_})
    out["gc"] = {"enabled": all(a.gc_before["enabled"] for a in arms),
                 "threshold": arms[0].gc_before["threshold"]}
    out["cells_measured_per_arm"] = {WITHOUT: len(_vals(without, "roundtrip_us")),
                                     WITH: len(_vals(with_, "roundtrip_us"))}
    return out


def _diff(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    if key not in a or key not in b:
        return None
    return round(a[key] - b[key], 1)


def print_table(name: str, s: dict[str, Any]) -> None:
    def row(label: str, d: dict[str, Any] | None) -> None:
        if not d or not d.get("n"):
            return
        print(f"  {label:<34} {d['n']:>6} {d['median']:>10.1f} {d['p90']:>10.1f}")

    def added(label: str, d: dict[str, Any]) -> None:
        if d.get("added_median") is not None:
            print(f"  {label:<34} {'':>6} {d['added_median']:>+10.1f} {d['added_p90']:>+10.1f}")

    print(f"== {name}")
    print(f"  {'(µs)':<34} {'n':>6} {'median':>10} {'p90':>10}")
    h = s["hooks_us"]
    row("hooks: pre (in place)", h["pre"])
    row("hooks: post (in place)", h["post"])
    row("hooks: total per cell", h["total"])
    row("cell, kernel-stamped: without", s["exec_us"][WITHOUT])
    row("cell, kernel-stamped: with", s["exec_us"][WITH])
    added("cell, kernel-stamped: added", s["exec_us"])
    row("busy->idle: without", s["busy_idle_us"][WITHOUT])
    row("busy->idle: with", s["busy_idle_us"][WITH])
    added("busy->idle: added", s["busy_idle_us"])
    t = s.get("train_step_us")
    if t:
        row("train step: without", t[WITHOUT])
        row("train step: with", t[WITH])
        row("train step: with, interval 0.05 s", t["with_interval_0.05"])
    cpu = s["kernel_cpu_per_cell_us"]
    if cpu[WITHOUT].get("n") and cpu[WITH].get("n"):
        print(f"  kernel CPU per cell period (all threads, per kernel median): without "
              f"{cpu[WITHOUT]['median']:.0f} µs, with {cpu[WITH]['median']:.0f} µs")
    print(f"  kernel-stamped added median, per round: {s['exec_added_median_per_round_us']}")
    print(f"  callbacks timed: {h['callbacks_wrapped']}; cells without a hook record: "
          f"{h['cells_without_hook_record']}; timer overhead "
          f"{h['timer_overhead_per_callback_ns']} ns per callback")
    for note in s["notes"]:
        print(f"  note: {note}")


# --------------------------------------------------------------------------------------------
# Environment and main
# --------------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": _version("torch"),
        "ipykernel": _version("ipykernel"),
        "jupyter_client": _version("jupyter_client"),
        "ipython": _version("ipython"),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "gpumem_nb_commit": git_commit(str(ROOT)),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    env.update(gpu_environment())
    return env


def host_tag(args: argparse.Namespace, env: dict[str, Any]) -> str:
    if args.tag:
        return str(args.tag)
    if args.fakes:
        return "fakes" + "-".join(str(n) for n in args.fake_counts)
    if env["gpu_count"]:
        name = env["gpus"][0].replace("NVIDIA ", "").replace(" ", "-")
        return f"{env['gpu_count']}x{name}"
    return "nogpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh kernel pairs (default 3)")
    p.add_argument("--cells", type=int, default=60, help="measured cells per kernel")
    p.add_argument("--warmup", type=int, default=10, help="discarded cells per kernel")
    p.add_argument("--gap-s", type=float, default=0.2, help="pause between cells")
    p.add_argument("--tensors", type=int, default=1000,
                   help="small CUDA tensors in the namespace (skipped without torch+CUDA)")
    p.add_argument("--train", action="store_true", help="also time a ~1 ms-step loop")
    p.add_argument("--train-steps", type=int, default=1500)
    p.add_argument("--fakes", default=None, metavar="N[,M]",
                   help="fake NVML + torch.cuda with N GPUs (N > 1 also runs 1 to compare)")
    p.add_argument("--out", default=None, help="results JSON path")
    p.add_argument("--tag", default=None, help="host tag in the default results file name")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per cell and kernel start")
    args = p.parse_args(argv)
    if args.fakes:
        counts = sorted({int(n) for n in str(args.fakes).split(",")})
        if len(counts) == 1 and counts[0] > 1:
            counts = [1, counts[0]]
        if min(counts) < 1:
            p.error("--fakes needs at least one GPU")
        args.fake_counts = counts
    else:
        args.fake_counts = []
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = time.monotonic()
    env = environment(args)
    configs: list[int | None] = list(args.fake_counts) or [None]
    arms: dict[str, list[ArmResult]] = {config_name(c): [] for c in configs}
    train: dict[str, Any] = {}
    for r in range(args.rounds):
        order = (WITHOUT, WITH) if r % 2 == 0 else (WITH, WITHOUT)
        for c in configs if r % 2 == 0 else configs[::-1]:
            for arm in order:
                arms[config_name(c)].append(run_arm(arm, args, c, train))
            print(f"round {r + 1}/{args.rounds} {config_name(c)} done "
                  f"({time.monotonic() - t_start:.0f} s)", flush=True)
    summaries = {name: summarize_config(a) for name, a in arms.items()}
    result: dict[str, Any] = {
        "benchmark": "bench_kernel",
        "environment": env,
        "args": {k: v for k, v in vars(args).items()},
        "cell": CELL,
        "train": train,
        "kernel": next(a.kernel for v in arms.values() for a in v if a.arm == WITH),
        "configs": summaries,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    if len(configs) > 1:
        lo, hi = config_name(configs[0]), config_name(configs[-1])
        m_lo = summaries[lo]["hooks_us"]["total"].get("median")
        m_hi = summaries[hi]["hooks_us"]["total"].get("median")
        result["flatness"] = {
            "hooks_total_median_us": {lo: m_lo, hi: m_hi},
            "ratio": round(m_hi / m_lo, 2) if m_lo and m_hi else None,
            "exec_added_median_us": {n: summaries[n]["exec_us"]["added_median"]
                                     for n in (lo, hi)},
        }
    gpus = ", ".join(env["gpus"]) or "none"
    print(f"\nbench_kernel: {args.rounds} rounds x {args.cells} cells ({args.warmup} warm-up "
          f"discarded), gap {args.gap_s} s, '{CELL}', GPUs: {gpus}, commit "
          f"{env['gpumem_nb_commit']}")
    for name, s in summaries.items():
        print_table(name, s)
    if "flatness" in result:
        f = result["flatness"]
        print(f"== flatness: hooks total median {f['hooks_total_median_us']} µs "
              f"(ratio {f['ratio']}); kernel-stamped added {f['exec_added_median_us']} µs")
    out = Path(args.out) if args.out else (ROOT / "benchmarks" / "results"
                                           / f"bench_kernel_{host_tag(args, env)}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    bench_out = os.environ.get("BENCH_OUT")
    if bench_out and not args.out:
        Path(bench_out).mkdir(parents=True, exist_ok=True)
        (Path(bench_out) / out.name).write_text(out.read_text())
    print(f"results: {out} ({result['wall_s']} s)")
    return result


def config_name(fakes: int | None) -> str:
    return "real" if fakes is None else f"fakes_{fakes}gpu"


if __name__ == "__main__":
    main()
