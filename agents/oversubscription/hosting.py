"""What `samm serve --agent c2marl[=DIR]` hosts: the shipped C2MARL policy (Azure-like setting,
alpha = 0.95) or a saved one.

The shipped policy is safe on its training week but breaks alpha = 0.95 on held-apart weeks
(docs/oversubscription.md): it is there to exercise the live path, not to admit real VMs."""
from __future__ import annotations


def make_policy(agent: str, policy_dir=None):
    from .policy import OversubPolicy, shipped_policy

    if agent != "c2marl":
        raise ValueError(f"oversubscription hosts the agent 'c2marl', not {agent!r}")
    return OversubPolicy.load(policy_dir) if policy_dir else shipped_policy()
