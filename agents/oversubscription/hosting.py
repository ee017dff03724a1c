"""What `samm serve --agent NAME[=DIR]` hosts for the oversubscription problem: the shipped C2MARL
policy (Azure-like setting, alpha = 0.95) or a saved one, or a production overcommit predictor
(`nsigma`, `percentile`, `max-predictor` = their max, `ma-des` = the paper's MA) with its parameters tuned on the Azure-like training days
(`--agent-param nsigma:headroom=3.5`; `setting=internal`, `prior=none`).

The shipped C2MARL policy is safe on its training week but breaks alpha = 0.95 on held-apart weeks
(docs/oversubscription.md): it is there to exercise the live path, not to admit real VMs; the tuned
`nsigma` rule held the bound on those weeks."""
from __future__ import annotations


def make_policy(agent: str, policy_dir=None, **params):
    from .policy import HOSTED_RULES, KIND, OversubPolicy, RulePolicy, shipped_policy

    if agent == KIND:
        return OversubPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if agent in HOSTED_RULES:
        if policy_dir:
            raise ValueError(f"{agent} is a rule: it takes parameters (--agent-param), not a policy directory")
        return RulePolicy(agent, **params)
    raise ValueError(f"oversubscription hosts {KIND!r} or a rule {sorted(HOSTED_RULES)}, not {agent!r}")
