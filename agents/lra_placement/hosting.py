"""What `samm serve --agent lra-reinforce[=DIR]` hosts: the shipped (or a saved) placement policy,
bound to the cluster size the service answers for (`--agent-param lra-reinforce:nodes=81`; the
network is shared over nodes, so any size works), and the predictor its `/plan` uses."""
from __future__ import annotations


def make_policy(agent: str, policy_dir=None, nodes: int | str | None = None):
    from .policy import PlacementPolicy, shipped_policy

    if agent != "lra-reinforce":
        raise ValueError(f"lra-placement hosts the agent 'lra-reinforce', not {agent!r}")
    policy = PlacementPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if nodes is not None:
        policy = policy.for_nodes(int(nodes))
    return policy


def predictor_for(policy, slots: int):
    """The policy's own predictor when it has one for this slot count, else the default forest
    (fit once on Metis's measurements and cached)."""
    if getattr(policy, "predictor", None) is not None and getattr(policy, "slots", None) == slots:
        return policy.predictor
    from .predictor import predictor_by_name

    return predictor_by_name("forest", slots=slots)
