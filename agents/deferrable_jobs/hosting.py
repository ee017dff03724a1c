"""What `samm serve --agent NAME[=DIR]` hosts for the deferrable-jobs problem: the shipped OSDEC
policy (or a saved one), or one of the heuristics with its parameters tuned on the default
setting's training episodes (`--agent-param tetris:eps=16`)."""
from __future__ import annotations

import math

#: parameters the heuristics are hosted with when none are given (tuning.tune_all on 'default')
DEFAULT_PARAMS = {"tetris": {"eps": 16.0}}


def make_policy(agent: str, policy_dir=None, **params):
    from .baselines import RULES
    from .policy import KIND, OsdecPolicy, RulePolicy, shipped_policy

    if agent == KIND:
        if params:   # they would be dropped: a learned policy's settings are in its metadata.json
            raise ValueError(f"{KIND}: unknown parameter {sorted(params)[0]!r} (known: none)")
        return OsdecPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if agent in RULES:
        if policy_dir:
            raise ValueError(f"{agent} is a heuristic: it takes parameters (--agent-param), not a policy directory")
        setting = params.pop("setting", "default")
        merged = {**DEFAULT_PARAMS.get(agent, {}), **{k: _number(agent, k, v) for k, v in params.items()}}
        return RulePolicy(agent, setting, **merged)
    raise ValueError(f"deferrable-jobs hosts {KIND!r} or a heuristic {sorted(RULES)}, not {agent!r}")


def _number(agent: str, key: str, value) -> float:
    """A heuristic's parameter as a finite number, or a ValueError naming it (NaN or inf `eps` was
    hosted and scheduled on garbage)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{agent}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{agent}: {key} must be a finite number, got {value!r}")
    return x
