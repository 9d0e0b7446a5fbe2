"""On the GPU machine: the settings file's device is checked against the GPUs NVML really
shows, and %gpumem config --device switches what the live source reads, with a real IPython
shell and real NVML (loading still imports no torch)."""

from __future__ import annotations

import pytest

from .helpers import fresh

pytestmark = pytest.mark.gpu

PRELUDE = """
    import io, json, logging, os, sys, tempfile, contextlib
    cfg = os.path.join(tempfile.mkdtemp(), "config.json")
    os.environ["GPUMEM_NB_CONFIG"] = cfg
    lines = []
    class Keep(logging.Handler):
        def emit(self, record): lines.append(record.getMessage())
    logging.getLogger("gpumem_nb").addHandler(Keep())
    import pynvml
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    def run(src):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ok = ip.run_cell(src).success
        return ok, out.getvalue()
"""


def test_a_settings_device_beyond_the_real_gpu_count_falls_back_to_every_gpu():
    r = fresh(PRELUDE + """
    with open(cfg, "w") as f:
        json.dump({"device": n, "peak": "reset"}, f)
    ok, out = run("%load_ext gpumem_nb")
    from gpumem_nb.magics import current_monitor
    mon = current_monitor(ip)
    print(json.dumps({"ok": ok, "out": out, "lines": lines, "n": n, "cfg": cfg,
                      "device": mon.config.device, "peak": mon.config.peak,
                      "read": [d.index for d in mon.read().devices],
                      "torch": "torch" in sys.modules}))
    """)
    assert r["ok"] and r["device"] is None and r["peak"] == "reset"
    assert r["read"] == list(range(r["n"]))
    assert len(r["lines"]) == 1 and r["cfg"] in r["lines"][0] and '"device"' in r["lines"][0]
    assert f"there is no GPU {r['n']}" in r["lines"][0]
    assert "watching GPU 0:" in r["out"] and not r["torch"]


def test_config_device_switches_the_live_source_and_refuses_a_gpu_that_is_not_there():
    r = fresh(PRELUDE + """
    run("%load_ext gpumem_nb")
    from IPython.core.error import UsageError
    from gpumem_nb.magics import current_monitor
    mon = current_monitor(ip)
    heard = []
    mon.settings_listeners.append(lambda c: heard.append(c.device))
    last = n - 1
    ip.run_line_magic("gpumem", f"config --device {last}")
    one = [d.index for d in mon.read().devices]
    try:
        ip.run_line_magic("gpumem", f"config --device {n}")
        refused = ""
    except UsageError as e:
        refused = str(e)
    after_refusal = [d.index for d in mon.read().devices]
    ip.run_line_magic("gpumem", "config --device all")
    print(json.dumps({"n": n, "one": one, "refused": refused, "after": after_refusal,
                      "all": [d.index for d in mon.read().devices], "heard": heard,
                      "torch": "torch" in sys.modules}))
    """)
    last = r["n"] - 1
    assert r["one"] == [last] and r["after"] == [last]
    assert f"there is no GPU {r['n']}" in r["refused"]
    assert r["all"] == list(range(r["n"])) and r["heard"] == [last, None]
    assert not r["torch"]
