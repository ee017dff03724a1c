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
        if params:   # they would be dropped: a learned policy's settings are in its metadata.json
            raise ValueError(f"{KIND}: unknown parameter {sorted(params)[0]!r} (known: none)")
        return OversubPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if agent in HOSTED_RULES:
        if policy_dir:
            raise ValueError(f"{agent} is a rule: it takes parameters (--agent-param), not a policy directory")
        _check_rule_keys(agent, params)
        _check_rule_params(agent, params)
        return RulePolicy(agent, **_whole_window(params))
    raise ValueError(f"oversubscription hosts {KIND!r} or a rule {sorted(HOSTED_RULES)}, not {agent!r}")


#: what every hosted rule takes besides its own numbers (HOSTED_RULES): where its prior comes from
HOSTING_PARAMS = ("setting", "prior", "trace_seed")
#: parameters a rule reads besides those it was tuned on: the lowest rate it may give
EXTRA_RULE_PARAMS = ("lo",)


def _check_rule_keys(agent: str, params: dict) -> None:
    """A misspelt key is named with the ones this rule takes, not a constructor's TypeError."""
    from .policy import HOSTED_RULES

    known = sorted({*HOSTED_RULES[agent][1], *EXTRA_RULE_PARAMS, *HOSTING_PARAMS})
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{agent}: unknown parameter {unknown[0]!r} (known: {', '.join(known)})")


def _check_rule_params(agent: str, params: dict) -> None:
    """A rule's numbers must be finite and its window a whole number of past steps >= 1: at
    start-up, naming the parameter. Before, `headroom=nan` made every admit a 500, and
    `headroom=inf`, `n=nan` or `window=0` answered rate 1.0 to every request in silence."""
    if "trace_seed" in params:
        try:
            seed = float(params["trace_seed"])
        except (TypeError, ValueError):
            seed = math.nan
        if not math.isfinite(seed) or seed != int(seed) or seed < 0:
            raise ValueError(f"{agent}: trace_seed must be a whole number >= 0, got {params['trace_seed']!r}")
    for key, value in params.items():
        if key in HOSTING_PARAMS:
            continue
        try:
            x = float(value)
        except (TypeError, ValueError):
            continue  # RulePolicy names a value that is not a number
        if not math.isfinite(x):
            raise ValueError(f"{agent}: {key} must be a finite number, got {value!r}")
        if key == "window" and (x < 1 or x != int(x)):
            raise ValueError(f"{agent}: window must be a whole number of past steps >= 1, got {value!r}")
        if key == "n" and x < 0:   # fewer than 0 sigmas forecasts below the mean: overcommits in silence
            raise ValueError(f"{agent}: n must be >= 0 (standard deviations above the mean), got {value!r}")


def _whole_window(params: dict) -> dict:
    """A window checked whole (`_check_rule_params`) as an int: RulePolicy's int() refused "24.0"
    or "1e2" as "parameters must be numbers". A value that is no number is left for it to name."""
    try:
        return {**params, "window": int(float(params["window"]))}
    except (KeyError, TypeError, ValueError):
        return params
