"""Evaluate a deferrable-jobs agent (OSDEC, a saved policy, or a heuristic) on held-apart test
episodes: `samm evaluate --problem deferrable-jobs --agent osdec|tetris|... [--policy DIR]`.

Every agent is run through the same `policy.schedule(view, history)` the service and the live
loop use; heuristics are hosted with their tuned defaults unless `params` are given."""
from __future__ import annotations

from agents.report import stats

from .data import make_episode
from .features import SummaryHistory
from .sim import run_episode


def evaluate(agent: str, seeds, policy_dir=None, setting: str = "default", params: dict | None = None) -> dict:
    from .hosting import make_policy

    if params and "setting" in params:   # it failed as make_policy's "multiple values for keyword argument"
        raise ValueError(f"{agent}: 'setting' is not a parameter of the agent; the episodes' setting is "
                         f"evaluate's own argument (here {setting!r})")
    policy = make_policy(agent, policy_dir, **({"setting": setting} if agent != "osdec" else {}), **(params or {}))
    if agent == "osdec" and policy.setting.name != setting:
        raise ValueError(f"the policy was trained on setting {policy.setting.name!r}, not {setting!r}")
    episodes = []
    for seed in seeds:
        hist = SummaryHistory()
        res = run_episode(make_episode(setting, int(seed), "test"), lambda v: policy.schedule(v, hist))
        episodes.append({"seed": int(seed), **res.as_dict()})
    keys = ("total_reward", "utilisation", "delay_penalty", "violation_penalty", "missed")
    return {"agent": agent, "version": getattr(policy, "version", None), "setting": setting, "episodes": episodes,
            "summary": {k: stats(e[k] for e in episodes) for k in keys}}
