"""What `samm serve --agent NAME[=DIR]` hosts for the oversubscription problem: the shipped C2MARL
policy (Azure-like setting, alpha = 0.95) or a saved one, or a production overcommit predictor
(`nsigma`, `percentile`, `max-predictor` = their max, `ma-des` = the paper's MA) with its parameters tuned on the Azure-like training days
(`--agent-param nsigma:headroom=3.5`; `setting=internal`, `prior=none`).

The shipped C2MARL policy is safe on its training week but breaks alpha = 0.95 on held-apart weeks
(docs/oversubscription.md): it is there to exercise the live path, not to admit real VMs; the tuned
`nsigma` rule held the bound on those weeks."""
from __future__ import annotations

import math


def make_policy(agent: str, policy_dir=None, **params):
    from .policy import HOSTED_RULES, KIND, OversubPolicy, RulePolicy, shipped_policy

    if agent == KIND:
        return OversubPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if agent in HOSTED_RULES:
        if policy_dir:
            raise ValueError(f"{agent} is a rule: it takes parameters (--agent-param), not a policy directory")
        _check_rule_params(agent, params)
        return RulePolicy(agent, **params)
    raise ValueError(f"oversubscription hosts {KIND!r} or a rule {sorted(HOSTED_RULES)}, not {agent!r}")


def _check_rule_params(agent: str, params: dict) -> None:
    """A rule's numbers must be finite and its window a whole number of past steps >= 1: at
    start-up, naming the parameter. Before, `headroom=nan` made every admit a 500, and
    `headroom=inf`, `n=nan` or `window=0` answered rate 1.0 to every request in silence."""
    for key, value in params.items():
        if key in ("setting", "prior", "trace_seed"):
            continue
        try:
            x = float(value)
        except (TypeError, ValueError):
            continue  # RulePolicy names a value that is not a number
        if not math.isfinite(x):
            raise ValueError(f"{agent}: {key} must be a finite number, got {value!r}")
        if key == "window" and (x < 1 or x != int(x)):
            raise ValueError(f"{agent}: window must be a whole number of past steps >= 1, got {value!r}")
