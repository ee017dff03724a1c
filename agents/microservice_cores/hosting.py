"""Every controller of this problem by name, for the experiment, the REST service and the
real-container loop:

    make_controller("reclaimer", topo, policy_dir=None)   the trained SAC actor (shipped per app)
    make_controller("reclaimer-online", topo, policy_dir=None, out=None, **OnlineConfig fields)
                                                          that policy fine-tuned while it acts (online.py)
    make_controller("autoscale", topo)                    the paper's first baseline
    make_controller("vpa", topo, **params)                a VPA / Autopilot-style recommender
    make_controller("sinan", topo, model_dir=None)        the Sinan-style learned baseline
    make_controller("sinan-explore", topo, out=DIR, seed=0)
                                                          Sinan's data collection on a live app (sinan_live.py)
    make_controller("static-max", topo)                   every service at its cap
    make_controller("static", topo, cores=[...])          a fixed allocation (or fraction=<share of the caps>)

Any of them with `scale_down_window=S` (ours): wrapped in control.ScaleDownWindow, HPA's scale-down
stabilisation over the last S seconds (`--agent-param scale_down_window=10` on the testbed), and/or
with `headroom_floor=K` (ours): wrapped in control.HeadroomFloor, no limit below K times the service's
mean use over the last 5 s, applied after the window, and/or with `throttle_guard=SHARE`
(ours; `throttle_step=X`, default 0.1): wrapped in control.ThrottleGuard, a service throttled in more
than SHARE of its CFS periods in the last second gets at least its limit times 1 + X, outermost.

`make_policy` is what `samm serve --agent NAME[=DIR]` hosts (the Policy protocol): the Reclaimer
policy; the rules are served through the problem's /allocate route, which takes measurements.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from agents.params import check_param_keys, number_param

from .topology import Topology, load_topology

log = logging.getLogger(__name__)

CONTROLLERS = ("reclaimer", "reclaimer-online", "autoscale", "vpa", "sinan", "sinan-explore", "static-max", "static")


def make_controller(name: str, topo: Topology | str, policy_dir=None, **params):
    guard = params.pop("throttle_guard", None)
    step = params.pop("throttle_step", None)
    if step is not None and guard is None:
        raise ValueError("throttle_step needs throttle_guard")
    if guard is not None:            # outermost: it reacts to the kernel after every other rule
        from .control import ThrottleGuard

        inner = make_controller(name, topo, policy_dir=policy_dir, **params)
        return ThrottleGuard(inner, guard, 0.1 if step is None else step)
    floor = params.pop("headroom_floor", None)
    if floor is not None:            # outermost: it bounds what the window (if any) lets through
        from .control import HeadroomFloor

        return HeadroomFloor(make_controller(name, topo, policy_dir=policy_dir, **params), floor)
    window = params.pop("scale_down_window", None)
    if window is not None:
        from .control import ScaleDownWindow

        return ScaleDownWindow(make_controller(name, topo, policy_dir=policy_dir, **params), window)
    topo = topo if isinstance(topo, Topology) else load_topology(topo)
    _refuse_dropped_params(name, params)
    _refuse_unknown_rule_params(name, params)
    if name == "reclaimer":
        from .policy import ReclaimerPolicy, shipped_policy

        return ReclaimerPolicy.load(policy_dir) if policy_dir else shipped_policy(topo.name)
    if name == "reclaimer-online":
        from .online import OnlineReclaimer
        from .policy import ReclaimerPolicy, shipped_policy

        out = params.pop("out", None)
        if out is not None and not (isinstance(out, (str, Path)) and str(out).strip()):
            # "" was Path("") = ".": the policy and online.csv went into the daemon's working folder
            raise ValueError(f"reclaimer-online: out must be a folder (or left out: nothing saved), got {out!r}")
        cfg = _online_config(params)
        earlier = Path(out) / "policy" if out is not None else None
        if earlier is not None and (earlier / "metadata.json").is_file():
            # a restarted learner continues the policy it saved: starting from the base again, its
            # first save would write over everything learned before the restart
            log.warning("reclaimer-online: %s holds the policy an earlier run fine-tuned; continuing it "
                        "(not %s)", earlier, policy_dir or "the shipped policy")
            policy = ReclaimerPolicy.load(earlier)
        else:
            policy = ReclaimerPolicy.load(policy_dir) if policy_dir else shipped_policy(topo.name)
        return OnlineReclaimer(policy, cfg, out=out)
    if name == "autoscale":
        from .autoscale import AutoScale

        return AutoScale(**params)
    if name == "vpa":
        from .vpa import VPAParams, VPARecommender

        return VPARecommender(VPAParams(**params) if params else None)
    if name == "sinan":
        from . import sinan

        return sinan.load_controller(topo, policy_dir or params.pop("model_dir", None), **params)
    if name == "sinan-explore":
        from .sinan_live import SinanCollector

        unknown = sorted(set(params) - {"out", "seed"})
        if unknown:
            raise ValueError(f"sinan-explore: unknown parameter(s) {unknown} (known: out, seed)")
        if not params.get("out"):
            raise ValueError("sinan-explore needs out=DIR: the folder its samples are written to")
        seed = params.get("seed", 0)
        if isinstance(seed, bool) or not (isinstance(seed, int) and seed >= 0):
            # int() took 2.7 as 2 in silence, and -1 failed only when the run had begun
            seed = int(number_param("sinan-explore", "seed", seed, low=0, whole=True))
        return SinanCollector(topo, params.get("out"), seed=seed)
    if name == "static-max":
        from .episode import StaticController

        return StaticController.maximum(topo)
    if name == "static":
        from .episode import StaticController

        if "fraction" in params:
            f = number_param("static", "fraction", params["fraction"])
            if not 0 < f <= 1:
                raise ValueError(f"static: fraction must be in (0, 1] (a share of each service's cap), got {f:g}")
            return StaticController(topo.caps * f, name=f"static-{f:g}")
        if "cores" not in params:
            raise ValueError("static needs cores=[one per service] (or one number for all) or fraction=<share of the caps>")
        cores = params["cores"]
        if isinstance(cores, str):
            cores = [number_param("static", "cores", x) for x in cores.split(",")]
        try:
            cores = np.atleast_1d(np.asarray(cores, dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"static: cores must be numbers, got {params['cores']!r}") from None
        if not (np.isfinite(cores).all() and (cores > 0).all()):
            raise ValueError(f"static: cores must be finite numbers > 0, got {params['cores']!r}")
        if cores.size == 1:
            cores = np.full(topo.n_services, float(cores[0]))
        if cores.size != topo.n_services:
            raise ValueError(f"static: {cores.size} cores given for {topo.n_services} services")
        return StaticController(cores)
    raise ValueError(f"microservice-cores has no controller {name!r} (known: {', '.join(CONTROLLERS)})")


#: the parameters of the controllers that would otherwise drop what they do not read
DROPPING_CONTROLLERS = {"reclaimer": (), "static-max": (), "static": ("cores", "fraction")}


def _refuse_dropped_params(name: str, params: dict) -> None:
    """A misspelt or misplaced parameter of these controllers ran them on their default in silence
    (`static` with both `cores` and `fraction` used the fraction)."""
    if name not in DROPPING_CONTROLLERS:
        return
    known = DROPPING_CONTROLLERS[name]
    unknown = sorted(set(params) - set(known))
    if unknown:
        wrappers = "scale_down_window, headroom_floor, throttle_guard, throttle_step"
        raise ValueError(f"{name}: unknown parameter {unknown[0]!r} (known: {', '.join(known + (wrappers,))})")
    if name == "static" and {"cores", "fraction"} <= set(params):
        raise ValueError("static: give cores or fraction, not both")


WRAPPER_PARAMS = ("scale_down_window", "headroom_floor", "throttle_guard", "throttle_step")


def _online_config(params: dict):
    """reclaimer-online's OnlineConfig, its keys and the values it does not check itself named
    like every agent's: a string where a number goes failed as a bare TypeError ("'>' not
    supported", a seed's "SeedSequence expects int"), and explore="False" left exploring on."""
    from .online import OnlineConfig

    kind = "reclaimer-online"
    check_param_keys(kind, params, ("out",) + tuple(OnlineConfig.__dataclass_fields__) + WRAPPER_PARAMS)
    params = dict(params)
    if params.get("lr") is not None:
        params["lr"] = number_param(kind, "lr", params["lr"], low=0, low_open=True)
    if "seed" in params:
        params["seed"] = int(number_param(kind, "seed", params["seed"], low=0, whole=True))
    if "explore" in params and not isinstance(params["explore"], bool):
        raise ValueError(f"{kind}: explore must be true or false, got {params['explore']!r}")
    return OnlineConfig(**params)


def _rule_params(name: str) -> tuple[str, ...] | None:
    """The parameters each rule's constructor takes (None: not one of these rules)."""
    if name == "autoscale":
        return ("noise", "seed")
    if name == "vpa":
        from .vpa import VPAParams

        return tuple(VPAParams.__dataclass_fields__)
    if name == "sinan":
        from .sinan import SinanParams

        return ("model_dir",) + tuple(SinanParams.__dataclass_fields__)
    return None


def _refuse_unknown_rule_params(name: str, params: dict) -> None:
    """A misspelt key of AutoScale, the VPA or Sinan was a constructor's TypeError ("unexpected
    keyword argument") without the keys the rule takes: one line naming both, as check_param_keys."""
    known = _rule_params(name)
    if known is not None:
        check_param_keys(name, params, known + WRAPPER_PARAMS)


def make_policy(agent: str, policy_dir=None, **params):
    from .policy import KIND, ReclaimerPolicy, shipped_policy

    if agent != KIND:
        raise ValueError(f"microservice-cores hosts {KIND!r} as a policy; the rules are controllers "
                         f"(POST /v1/agents/{KIND}/allocate)")
    unknown = sorted(set(params) - {"app"})
    if unknown:   # the rules' parameters (scale_down_window, ...) are the /allocate route's, not a policy's
        raise ValueError(f"{KIND}: unknown parameter {unknown[0]!r} (known: app)")
    app = params.get("app", "hotel")
    if not isinstance(app, str):
        raise ValueError(f"{KIND}: app must be an application's name, got {app!r}")
    if policy_dir:
        policy = ReclaimerPolicy.load(Path(policy_dir))
        if "app" in params and policy.topo.name != app:   # it would control another app's services
            raise ValueError(f"{KIND}: {policy_dir} controls {policy.topo.name!r}, not app {app!r}")
        return policy
    return shipped_policy(app)
