"""What `samm serve --agent NAME[=DIR]` hosts for the deferrable-jobs problem: the shipped OSDEC
policy (or a saved one), or one of the heuristics with its parameters tuned on the default
setting's training episodes (`--agent-param tetris:eps=16`)."""
from __future__ import annotations

from agents.params import number_param

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
        merged = {**DEFAULT_PARAMS.get(agent, {}), **{k: number_param(agent, k, v) for k, v in params.items()}}
        return RulePolicy(agent, setting, **merged)
    raise ValueError(f"deferrable-jobs hosts {KIND!r} or a heuristic {sorted(RULES)}, not {agent!r}")


