from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpumem_nb.kernel import monitor as monitor_mod
from gpumem_nb.sources.live import LiveSource
from gpumem_nb.sources.nvml import NvmlSource

from . import leaks
from .fakes import FakeCuda, FakeCudaDevice, FakeGpu, FakePynvml, GiB, MiB, fake_torch


def file_marks(path: Path) -> tuple[set[str], set[str]]:
    """The marks a test file's module-level ``pytestmark`` puts on every test in it, and every
    other mark its source names (on a test, a class, a parameter), read without importing it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set(), set()
    named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "pytestmark"):
            value = node.value
            values = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            every = {v.attr for v in values if isinstance(v, ast.Attribute)
                     and isinstance(v.value, ast.Attribute) and v.value.attr == "mark"}
            return every, named - every
    return set(), named


def pytest_ignore_collect(collection_path: Path, config: Any) -> bool | None:
    """A file whose every test ``-m`` deselects is not imported at all. Its imports would stay
    in the process for the rest of the run, and the product's heap scans (cleanup, the OOM
    explainer, the retention search) walk every object in it: nbformat's jsonschema alone
    builds 130,000, and with the browser, kernel and Dask files imported the contributor's
    loop walked 300,000 objects instead of 60,000, taking 2.5 times the CPU. A file is left
    out only when no test in it could be chosen whatever other marks it names carry."""
    chosen = config.getoption("-m") or ""
    name = collection_path.name
    if not chosen or not (name.startswith("test_") and name.endswith(".py")):
        return None
    every, others = file_marks(collection_path)
    if not every or len(others) > 8:
        return None
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(chosen)
        extra = sorted(others)
        for bits in range(1 << len(extra)):
            marks = every | {m for i, m in enumerate(extra) if bits >> i & 1}
            if expression.evaluate(lambda mark, marks=marks, **_: mark in marks):
                return None
    except Exception:  # pytest's own parser moved or refused the expression: collect as ever
        return None
    return True


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """GPU tests run only where a GPU is (``pytest -m gpu`` on the GPU machine); the Binder
    build (minutes) only when asked for (``pytest -m binder``, which CI runs on its own)."""
    chosen = config.getoption("-m") or ""
    reasons = {"gpu": "needs the GPU machine: run with -m gpu there",
               "binder": "builds Binder's environment (minutes): run with -m binder"}
    for marker, reason in reasons.items():
        if marker in chosen:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def left_as_found() -> Any:
    """Each test leaves the process as it found it: no gc callback, thread, sys or threading
    hook, import finder or IPython callback of its own left behind (``tests/leaks.py``). A
    leak fails the test that left it, named, and is taken back so that the next test starts
    clean. First of the autouse fixtures: set up before, and torn down after, the others."""
    before = leaks.snapshot()
    yield
    found = leaks.leaks(before)
    if found:
        stuck = leaks.clean_up(found)
        pytest.fail("the test left behind: " + "; ".join(leak.what for leak in found)
                    + ("; could not take back: " + "; ".join(stuck) if stuck else ""),
                    pytrace=False)


@pytest.fixture(autouse=True)
def private_settings(tmp_path: Any, monkeypatch: Any) -> Any:
    """Never read or write the developer's own settings file."""
    path = tmp_path / "gpumem_nb.json"
    monkeypatch.setenv("GPUMEM_NB_CONFIG", str(path))
    monkeypatch.delenv("GPUMEM_NB_AUTO_SHOW", raising=False)
    monkeypatch.delenv("GPUMEM_NB_REPLAY", raising=False)
    return path


@pytest.fixture(autouse=True)
def unhurried_retention_search(monkeypatch: Any) -> None:
    """Tests check what the retention search names, not how fast: on a loaded two-core CI
    machine, a heap that a whole suite has grown took over its 1 s budget and every tensor
    came back "not searched". Its cost is measured in ``benchmarks/bench_retention.py``; a
    test of the cut passes its own bound."""
    from gpumem_nb.holders import retention, verify

    monkeypatch.setattr(retention, "BUDGET_S", 60.0)
    # The `del` check's own search too: after the whole suite its 0.3 s ran out, the line
    # stayed unchecked, and a tree's cycles got no collection (an order dependence).
    monkeypatch.setattr(verify, "BUDGET_S", 60.0)


@pytest.fixture(scope="session")
def ip() -> Any:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.displayhook.cache_size = 1000
    return shell


@pytest.fixture
def shell(ip: Any, capsys: Any) -> Any:
    """A real InteractiveShell with the extension unloaded and the user's namespace empty,
    before and after: the shell is one for the whole session, and a tensor a test left in
    it (or in ``sys.last_value``) was found by the next test's heap walk. Each clean ends in a
    full collection (a walk of the whole heap, 0.15-0.25 s late in a run), made once a test:
    after every fixture is torn down, since fixtures torn down after this one can still leave
    reference cycles behind (a random-order run, seed 20261207, found 12 GiB of an earlier
    test's failed cell as garbage in the next one)."""
    # The collection before is the one just made after the test before (in this file, with
    # every fixture of that test torn down: ``pytest_runtest_teardown`` below), or its own.
    _clean(ip, collect=not _SHELL_CLEAN["collected"])
    _SHELL_CLEAN["collected"] = False
    capsys.readouterr()
    yield ip
    _clean(ip, collect=False)
    _SHELL_CLEAN["pending"] = ip


# "pending": the shell of a test that ended, whose last clean waits for every fixture to be
# torn down; "collected": that clean was made, and nothing but the next test of the same file
# runs before the next one.
_SHELL_CLEAN: dict[str, Any] = {"pending": None, "collected": False}


def _clean(ip: Any, *, collect: bool = True) -> None:
    import gc

    _unload(ip)
    for attr in ("_gpumem_nb_history", "_gpumem_nb_config", "_gpumem_nb_session_keys",
                 "_gpumem_nb_recorded_session"):
        if hasattr(ip, attr):
            delattr(ip, attr)
    # ``%reset -f`` collects twice (its output cache's flush, then the magic itself), and this
    # runs before and after every test that takes the shell: four full collections a test,
    # each walking the whole heap, took a third of test_magics.py's time. One collection,
    # once the namespace and sys.last_* are cleared, frees the same cycles.
    with _no_collection():
        ip.run_cell("%reset -f", store_history=False)
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    # IPython's traceback formatter keeps the last traceback it showed (`InteractiveTB.tb`),
    # with its frames, until the next error: a random-order run (seed 20261209) found an
    # earlier test's failed cell (12 GiB of cycles) there, freed as garbage by the next error.
    itb = getattr(ip, "InteractiveTB", None)
    if itb is not None and getattr(itb, "tb", None) is not None:
        itb.tb = None
    if collect:
        gc.collect()


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """``gc.collect`` does nothing inside (only the test's own cleanup runs there)."""
    import gc

    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect


@pytest.fixture
def loaded(shell: Any, fake_gpu: Any, capsys: Any) -> Any:
    """The extension loaded over one fake GPU, ``cuda``, ``GiB`` and ``MiB`` in the user's
    namespace: the one way the suite loads it. A file that needs more (other names, a first
    cell) extends it with a fixture of the same name that takes this one."""
    shell.run_cell("%load_ext gpumem_nb", store_history=True)
    shell.user_ns.update(cuda=fake_gpu.cuda, GiB=GiB, MiB=MiB)
    capsys.readouterr()
    return shell


def _unload(ip: Any) -> None:
    from gpumem_nb.ipython import extension

    if "gpumem_nb" in ip.extension_manager.loaded:
        ip.extension_manager.unload_extension("gpumem_nb")
    extension.unload(ip)


@dataclass
class FakeGpuWorld:
    cuda: FakeCuda
    nvml: FakePynvml
    gpu: FakeGpu
    torch: Any


@pytest.fixture
def fake_gpu(monkeypatch: Any) -> FakeGpuWorld:
    """One H200 with torch imported and CUDA initialised, NVML following the allocator."""
    gpu = FakeGpu("GPU-aaaa-1111")
    nvml = FakePynvml([gpu])
    cuda = FakeCuda([FakeCudaDevice("aaaa-1111")], initialized=True)
    cuda.link([gpu])
    torch = fake_torch(cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return FakeGpuWorld(cuda=cuda, nvml=nvml, gpu=gpu, torch=torch)


@pytest.fixture
def no_gpu(monkeypatch: Any) -> FakePynvml:
    """Binder or CI: no driver and no torch."""
    nvml = FakePynvml(library_not_found=True)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return nvml


@pytest.fixture
def two_fake_gpus(monkeypatch: Any) -> FakeCuda:
    """Two H200s with torch up; the notebook has touched neither yet."""
    gpus = [FakeGpu("GPU-a"), FakeGpu("GPU-b", bus_id="00000000:3B:00.0")]
    cuda = FakeCuda([FakeCudaDevice("a"), FakeCudaDevice("b")], initialized=True)
    cuda.link(gpus)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    nvml = FakePynvml(gpus)
    monkeypatch.setattr(monitor_mod, "make_source",
                        lambda: LiveSource(nvml=NvmlSource(module=nvml)))  # type: ignore[arg-type]
    return cuda


# -- the browser tests' fixtures (tests/browser_harness.py holds the machinery) ----------------
# A browser test module may set ``LAB_STARTUP`` (more IPython startup code for the lab's
# kernels) and ``VIEWPORT`` (the page's size); these fixtures read them from the module.
DEFAULT_VIEWPORT = {"width": 1400, "height": 1200}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any, request: Any) -> Any:
    """A private JupyterLab for the module's tests, its versions printed in the output."""
    from .browser_harness import running_lab

    extra = getattr(request.module, "LAB_STARTUP", "")
    with running_lab(tmp_path_factory.mktemp("lab"), extra_startup=extra) as lab:
        print("JupyterLab and kernel versions:", lab.versions)
        yield lab


@pytest.fixture(scope="module")
def browser() -> Any:
    """Debian's chromium through Playwright, one per module."""
    from .browser_harness import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def context(browser: Any, request: Any) -> Any:
    """A fresh browser context per test; a failed test leaves a screenshot of its last page."""
    from .browser_harness import screenshot

    ctx = browser.new_context(viewport=getattr(request.module, "VIEWPORT", DEFAULT_VIEWPORT))
    yield ctx
    report = getattr(request.node, "rep_call", None)
    if (report is None or report.failed) and ctx.pages:
        screenshot(ctx.pages[-1], f"browser-failure-{request.node.name}.png")
    ctx.close()


@pytest.fixture
def page(context: Any) -> Any:
    """One page in the test's context, waiting up to 30 s for what it is asked."""
    page = context.new_page()
    page.set_default_timeout(30_000)
    return page


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """Keep each phase's report on the item, so a fixture can tell whether the test failed
    (the browser tests take a screenshot then)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# -- opt-in: the heap each test file leaves behind --------------------------------------------
# ``GPUMEM_TEST_HEAP=heap.txt pytest ...`` appends to heap.txt, after each test file, the
# objects the collector tracks, the process's RSS, and the types that grew the most. The
# product's heap scans (cleanup, the OOM explainer, the retention search, ``%reset -f``) walk
# every object, so a file that leaves the heap bigger makes every later test slower.
_HEAP_REPORT = {"objects": 0, "types": None, "started_s": 0.0}


def _heap_types() -> Any:
    import collections
    import gc

    return collections.Counter(type(o).__name__ for o in gc.get_objects())


def forget_parsed_sources() -> None:
    """Drop the parsed source files IPython's tracebacks keep. IPython formats a traceback
    with stack_data, which parses the whole file of every frame in it and keeps each tree (and
    each frame's code object) for the life of the process. The suite shows hundreds of
    tracebacks through dozens of files: test_hostile.py alone left 52,000 AST nodes behind,
    which every later test's heap walks (the shell's clean-up collection, cleanup, the OOM
    explainer, the retention search) visited again."""
    for module in ("stack_data.core", "executing.executing"):
        source = getattr(sys.modules.get(module), "Source", None)
        for name in ("__source_cache_with_lines", "__source_cache", "__executing_cache"):
            # executing keeps them as attributes of each Source class, under these names
            cache = vars(source).get(name) if source is not None else None
            if isinstance(cache, dict):
                cache.clear()
    # and, in unbounded lru_caches, every Source a line was looked up in and every node whose
    # statement was asked for: the trees stay alive through these even once the dicts are empty
    executing = sys.modules.get("executing.executing")
    for cached in (getattr(getattr(executing, "Source", None), "statements_at_line", None),
                   getattr(executing, "statement_containing_node", None)):
        clear = getattr(cached, "cache_clear", None)
        if clear is not None:
            clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: Any, nextitem: Any) -> Any:
    """After the test's fixtures are torn down: at the end of each file, the parsed sources
    are dropped and, when asked for, the heap reported."""
    result = yield
    collected = False
    ip = _SHELL_CLEAN["pending"]
    if ip is not None:
        # The whole clean again, with its one collection, once fixtures torn down after the
        # shell have run too: a fixture's teardown can run a cell, and the shell's last
        # execution result (a failed cell's error, its traceback and frames) goes only when
        # the next cell runs. A random-order run (seed 20261209) found 12 GiB of an earlier
        # test's failed cell as garbage in the next one when only a collection was made here.
        _SHELL_CLEAN["pending"] = None
        _clean(ip)
        collected = True
    _SHELL_CLEAN["collected"] = collected and nextitem is not None and \
        nextitem.path == item.path
    if nextitem is None or nextitem.path != item.path:
        # Once a file, not once a test: a file's tests share the trees of their tracebacks.
        forget_parsed_sources()
        _report_heap(item)
    return result


def _report_heap(item: Any) -> None:
    import os

    if not os.environ.get("GPUMEM_TEST_HEAP"):
        return
    import gc
    import time

    gc.collect()
    types = _heap_types()
    objects = sum(types.values())
    rss_mib = 0.0
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            rss_mib = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        pass
    now = time.perf_counter()
    grown = ""
    if _HEAP_REPORT["types"] is not None:
        diff = types - _HEAP_REPORT["types"]
        grown = " ".join(f"{name}+{n}" for name, n in diff.most_common(6))
    took_s = now - _HEAP_REPORT["started_s"] if _HEAP_REPORT["started_s"] else 0.0
    line = (f"HEAP {item.path.name} objects={objects} "
            f"grew={objects - _HEAP_REPORT['objects']:+d} rss_mib={rss_mib:.0f} "
            f"file_s={took_s:.1f} {grown}\n")
    with open(os.environ["GPUMEM_TEST_HEAP"], "a", encoding="utf-8") as report:
        report.write(line)
    _HEAP_REPORT.update(objects=objects, types=types, started_s=time.perf_counter())
