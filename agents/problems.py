"""The problem packages. Each registers its `ProblemSpec` on import: the ones of this repository
are listed here; a problem in a distribution of its own declares an entry point in the group
`samm.problems` (`NAME = package` or `NAME = package:PROBLEM`, docs/adding-a-problem.md), found
when the catalogue is first read, after the built-in ones (so none can shadow them)."""
from __future__ import annotations

import importlib
import logging
import threading
import types

PACKAGES = (
    "agents.autoscaling",      # VM autoscaling, LSTM-PPO (the main paper)
    "agents.lra_placement",    # long-running container placement (DRL-Scheduler)
    "agents.oversubscription", # VM oversubscription (C2MARL)
    "agents.deferrable_jobs",  # deferrable-job scheduling (OSDEC)
    "agents.microservice_cores",  # microservice CPU cores (Reclaimer)
)

ENTRY_POINT_GROUP = "samm.problems"

log = logging.getLogger(__name__)

_lock = threading.RLock()
_loaded = False
_loading = False
_plugin_errors: dict[str, str] = {}  # entry point name -> the one line saying why it is not loaded


def load_all() -> None:
    global _loaded, _loading
    if _loaded:
        return
    # another thread waits for the whole catalogue; the loading thread itself may come back here
    # (a plug-in that reads the catalogue while it is imported) and goes on with what is loaded
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            for pkg in PACKAGES:
                importlib.import_module(pkg)
            _load_plugins()
            _loaded = True
        finally:
            _loading = False


def plugin_errors() -> dict[str, str]:
    """Installed problem plug-ins that failed to load, each with its one-line reason."""
    return dict(_plugin_errors)


def _load_plugins() -> None:
    """Every `samm.problems` entry point; a broken one is one warning naming it, never an error
    of the catalogue: `samm --help`, `samm serve` and the built-in problems keep working."""
    from importlib.metadata import entry_points

    try:
        found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (ep.name, ep.value))
    except Exception as exc:  # noqa: BLE001 - an unreadable distribution's metadata on sys.path
        log.warning("problem plug-ins not loaded: cannot read the %s entry points (%s)", ENTRY_POINT_GROUP, exc)
        return
    for ep in found:
        try:
            _load_plugin(ep)
        except Exception as exc:  # noqa: BLE001 - whatever a third-party import raises
            reason = " ".join(str(exc).split())[:300] or "(no message)"
            _plugin_errors[ep.name] = (f"problem plug-in {ep.name!r} ({_origin(ep)}) is not loaded: "
                                       f"{type(exc).__name__}: {reason}")
            log.warning("%s", _plugin_errors[ep.name])


def _load_plugin(ep) -> None:
    from .registry import _PROBLEMS, ProblemSpec, register_problem

    before = set(_PROBLEMS)
    obj = ep.load()
    spec = getattr(obj, "PROBLEM", None) if isinstance(obj, types.ModuleType) else obj
    if spec is None and ep.name in set(_PROBLEMS) - before:
        return  # a module that registered its spec under the entry point's name without naming it PROBLEM
    if not isinstance(spec, ProblemSpec):
        what = f"module {obj.__name__} has no PROBLEM" if isinstance(obj, types.ModuleType) else \
            f"{ep.value} is a {type(obj).__name__}"
        raise TypeError(f"{what}; expected a ProblemSpec (PROBLEM = register_problem(ProblemSpec(...)))")
    register_problem(spec)  # a no-op when its module registered it on import


def _origin(ep) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.name} {dist.version}, " if dist is not None else ""
    return f"{where}entry point {ep.group}: {ep.name} = {ep.value}"
