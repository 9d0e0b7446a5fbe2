"""The extension's load and unload: ``%load_ext gpumem_nb`` builds one ``Monitor``, hooks it
into the shell and registers the magics, the ``GpumemNb`` configurable and the completer;
unload takes every one of them back.

The monitor is stored on the shell itself so that ``%reload_ext`` (which reloads only the
package's top module, then calls unload and load) finds and tears down exactly what the
previous load set up. The history, the settings and a finished session recording stay on the
shell across reloads.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any

from IPython.display import display

from ..configurable import GpumemNb
from ..kernel import Monitor, current_monitor
from ..kernel.monitor import SHELL_ATTR
from ..settings import DeviceChoice, load_settings
from . import completion
from .commands.watch import show_chart
from .compiled import CompiledTexts
from .magics import GpumemMagics

__all__ = ["current_monitor", "load", "show_chart", "unload"]

_HISTORY_ATTR = "_gpumem_nb_history"
_CONFIG_ATTR = "_gpumem_nb_config"
_RECORDED_ATTR = "_gpumem_nb_recorded_session"  # a session kept across %reload_ext
_SESSION_KEYS_ATTR = "_gpumem_nb_session_keys"  # settings changed since the kernel started
_MAGICS_ATTR = "_gpumem_nb_magics"
_TRAITS_ATTR = "_gpumem_nb_traits"  # the GpumemNb configurable (%config GpumemNb)
_COMPILED_ATTR = "_gpumem_nb_compiled"  # the input transformer keeping cells' texts


def _stop_at_exit(ref: Any) -> None:
    monitor = ref()
    if monitor is not None:
        with contextlib.suppress(Exception):
            # The process is ending: the chart's outputs can no longer be replaced, and a
            # message to a closed socket logs an error. Forget the chart; stop the threads.
            monitor.widget = None
            monitor.stop_replay()
            monitor.stop_sampling(timeout_s=0.5)


def load(shell: Any) -> None:
    if current_monitor(shell) is not None:
        return  # already loaded: one monitor, one thread, one set of callbacks
    # History and settings survive %reload_ext; a first load reads the settings file (which
    # never raises: bad values are reported and replaced by defaults).
    history = getattr(shell, _HISTORY_ATTR, None)
    config = getattr(shell, _CONFIG_ATTR, None)
    devices: tuple[DeviceChoice, ...] = ()
    if config is None:
        loaded = load_settings(getattr(shell, "config", None))
        config, devices = loaded.config, loaded.devices
    keys = getattr(shell, _SESSION_KEYS_ATTR, None)
    monitor = Monitor(shell, history=history, config=config,
                      session_keys=keys if isinstance(keys, set) else None,
                      starting_devices=devices)
    monitor.show_explanations_with(display)  # rich output in notebooks, text in terminals
    kept = getattr(shell, _RECORDED_ATTR, None)
    if kept is not None:
        # The session %reload_ext switched off: still there for --session, as the history is.
        monitor.session = kept
        delattr(shell, _RECORDED_ATTR)
    magics: GpumemMagics | None = None
    compiled = CompiledTexts(shell, monitor.traces.cell_texts)
    try:
        line = monitor.start()
        compiled.install()
        setattr(shell, _COMPILED_ATTR, compiled)
        shell.events.register("pre_run_cell", monitor.pre_run_cell)
        shell.events.register("post_run_cell", monitor.post_run_cell)
        # ipykernel sets exit_now while it handles a shutdown or restart request, before it
        # replies: the chart can still turn its outputs into pictures then.
        if hasattr(shell, "observe"):
            shell.observe(monitor.on_shell_exit, names="exit_now")
        magics = GpumemMagics(shell, monitor)
        shell.register_magics(magics)
        _add_traits(shell, monitor)
        completion.register(shell)
        setattr(shell, SHELL_ATTR, monitor)
        # Stop sampling before the kernel closes its sockets: a last tick publishing to a
        # closed socket logs an error at exit.
        atexit.register(_stop_at_exit, weakref.ref(monitor))
        setattr(shell, _MAGICS_ATTR, magics)
        setattr(shell, _HISTORY_ATTR, monitor.history)
        setattr(shell, _CONFIG_ATTR, monitor.config)
        setattr(shell, _SESSION_KEYS_ATTR, monitor.session_keys)
    except BaseException:
        # A load that fails part-way takes back what it did: no sampler thread, no
        # callbacks, no magic left behind on a monitor nobody can reach.
        _teardown(shell, monitor, magics)
        raise
    print(line)
    if monitor.config.auto_show:
        try:
            show_chart(monitor)
        except Exception as e:
            monitor.contain("auto-show", e)


def _add_traits(shell: Any, monitor: Monitor) -> None:
    """The settings as the ``GpumemNb`` configurable, for ``%config GpumemNb``: its traits
    mirror the monitor's settings (a listener), and a trait set there goes through
    ``Monitor.configure``, the one writer."""
    traits = GpumemNb(monitor.config, monitor.configure, monitor.check_device)
    monitor.settings_listeners.append(traits.mirror)
    configurables = getattr(shell, "configurables", None)
    if isinstance(configurables, list):
        configurables.append(traits)
    setattr(shell, _TRAITS_ATTR, traits)


def unload(shell: Any) -> None:
    monitor = current_monitor(shell)
    if monitor is None:
        return
    _teardown(shell, monitor, getattr(shell, _MAGICS_ATTR, None))


def _teardown(shell: Any, monitor: Monitor, magics: GpumemMagics | None) -> None:
    """Undo a load, every step on its own: what one step failed to undo must not keep the
    next from running. Leaves nothing that references ``monitor``."""
    compiled = getattr(shell, _COMPILED_ATTR, None)
    if isinstance(compiled, CompiledTexts) and compiled.texts is monitor.traces.cell_texts:
        with contextlib.suppress(Exception):
            compiled.remove()
        with contextlib.suppress(Exception):
            delattr(shell, _COMPILED_ATTR)
    with contextlib.suppress(Exception):
        completion.unregister(shell)
    for event, fn in (("pre_run_cell", monitor.pre_run_cell),
                      ("post_run_cell", monitor.post_run_cell)):
        with contextlib.suppress(Exception):
            shell.events.unregister(event, fn)
    with contextlib.suppress(Exception):
        shell.unobserve(monitor.on_shell_exit, names="exit_now")
    recorder = monitor.session
    if recorder is not None and recorder.on:
        with contextlib.suppress(Exception):  # unloaded, nothing of ours keeps recording
            recorder.stop()
    if recorder is not None and recorder.kept is not None:
        with contextlib.suppress(Exception):
            setattr(shell, _RECORDED_ATTR, recorder)
    monitor.shutdown()
    manager = getattr(shell, "magics_manager", None)
    if manager is not None:
        for kind in ("line", "cell"):
            fn = manager.magics.get(kind, {}).get("gpumem")
            if magics is not None and getattr(fn, "__self__", None) is magics:
                manager.magics[kind].pop("gpumem", None)
        if magics is not None and manager.registry.get(type(magics).__name__) is magics:
            del manager.registry[type(magics).__name__]
    traits = getattr(shell, _TRAITS_ATTR, None)
    if traits is not None and getattr(traits, "_configure", None) != monitor.configure:
        traits = None  # another load's
    if magics is not None or traits is not None:
        # IPython's Magics.__init__ appends every instance to shell.configurables and nothing
        # ever removes it: without this, each %reload_ext kept the old monitor (its history
        # buffers, sources and file descriptors) alive for the life of the kernel. The
        # GpumemNb configurable holds the monitor's configure: it goes too.
        configurables = getattr(shell, "configurables", [])
        configurables[:] = [c for c in configurables if c is not magics and c is not traits]
    if magics is not None:
        magics.monitor = None  # type: ignore[assignment]
    for attr in (SHELL_ATTR, _MAGICS_ATTR, _TRAITS_ATTR):
        if getattr(shell, attr, None) in (monitor, magics, traits) and hasattr(shell, attr):
            delattr(shell, attr)
