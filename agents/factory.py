"""Build agents by name for a simulated (or live) fleet."""
from __future__ import annotations

from pathlib import Path

from sim_bridge.config import SimConfig

from .base import Agent, agent_class, load_agent

BASELINE_KINDS = ("threshold", "target-tracking", "queue")


def make_agent(kind: str, sim: SimConfig, params: dict | None = None, policy_dir: str | Path | None = None,
               action_mode: str | None = None) -> Agent:
    """`kind` is an agent name (`noop`, `random`, `static`, `threshold`, `target-tracking`,
    `queue`, `lstm-ppo`) or `static:S,M,L`. Learned agents load from `policy_dir`; baselines
    may also load their tuned parameters from a `policy_dir` written by `samm tune`."""
    type_names = tuple(t.name for t in sim.vm_types)
    _refuse_unused_params(kind, params, policy_dir)
    if kind.startswith("static:"):
        from .builtin import make_builtin_policy

        if policy_dir is not None:  # was ignored: the run said nothing of the policy it did not use
            raise ValueError(f"{kind} takes its counts from its name, not a saved policy ({policy_dir})")

        return make_builtin_policy(kind, action_mode or "per-type", type_names)
    if policy_dir is not None:
        agent = load_agent(policy_dir)
        if agent.kind != kind:
            raise ValueError(f"{policy_dir} holds a {agent.kind!r} policy, not {kind!r}")
        if agent.type_names != type_names:
            raise ValueError(f"{policy_dir} was made for VM types {agent.type_names}, this fleet has {type_names}")
        return agent
    cls = agent_class(kind)   # an install without torch: a one-line ValueError naming the extra
    if kind == "lstm-ppo":
        from .shipped import shipped_policy_dir

        return load_agent(shipped_policy_dir()) if shipped_policy_dir() else cls(type_names=type_names)
    params = dict(params or {})
    if kind == "queue":
        params.setdefault("cores", [t.cores for t in sim.vm_types])
    mode = action_mode or ("paper" if kind in ("noop", "random") and sim.action_mode == "paper" else "per-type")
    return cls(action_mode=mode, type_names=type_names, params=params or None)


def _refuse_unused_params(kind: str, params: dict | None, policy_dir) -> None:
    """Parameters these agents would not read are an error, not silently dropped: a saved policy
    and a learned agent take theirs from metadata.json, `static:S,M,L` from its name."""
    if not params:
        return
    if policy_dir is not None:
        raise ValueError(f"{kind}: parameters {sorted(params)} cannot be given with a saved policy ({policy_dir}): "
                         f"it runs with those in its metadata.json")
    if kind == "lstm-ppo" or kind.startswith("static:"):
        from .params import check_param_keys

        check_param_keys(kind, params, ())


def make_hosted_agent(kind: str, policy_dir: str | Path | None = None, **params) -> Agent:
    """What `samm serve --agent KIND[=DIR]` hosts: the paper's fleet (S/M/L); `params` are a
    baseline's parameters (`--agent-param threshold:upper=0.8`, numbers parsed)."""
    import yaml

    parsed = {k: yaml.safe_load(v) if isinstance(v, str) else v for k, v in params.items()}
    return make_agent(kind, SimConfig(), params=parsed or None, policy_dir=policy_dir or None)
