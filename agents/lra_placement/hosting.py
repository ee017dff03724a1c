"""What `samm serve --agent lra-reinforce[=DIR]` hosts: the shipped (or a saved) placement policy,
bound to the cluster size the service answers for (`--agent-param lra-reinforce:nodes=81`; the
network is shared over nodes, so any size works), and the predictor its `/plan` uses."""
from __future__ import annotations

import threading

from agents.params import check_param_keys

#: what `--agent-param lra-reinforce:KEY=VALUE` may set
HOSTING_PARAMS = ("nodes",)


def make_policy(agent: str, policy_dir=None, **params):
    from .policy import PlacementPolicy, shipped_policy

    if agent != "lra-reinforce":
        raise ValueError(f"lra-placement hosts the agent 'lra-reinforce', not {agent!r}")
    # a misspelt key was Python's "unexpected keyword argument" without the keys it takes
    check_param_keys(agent, params, HOSTING_PARAMS)
    nodes = params.get("nodes")
    n_nodes = None if nodes is None else _node_count(nodes)  # checked before the policy loads
    policy = PlacementPolicy.load(policy_dir) if policy_dir else shipped_policy()
    if n_nodes is not None:
        policy = policy.for_nodes(n_nodes)
    return policy


def _node_count(nodes: int | str) -> int:
    """`nodes` from `--agent-param lra-reinforce:nodes=N`: a whole number >= 1, or a ValueError
    naming the parameter (not numpy's 'n (counts) have to be positive')."""
    text = str(nodes).strip()
    if isinstance(nodes, bool) or not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"nodes must be a whole number of nodes >= 1, got {nodes!r}")
    return int(text)


# /plan runs in the server's thread pool: without a lock, every request for a slot count not yet
# loaded fit its own forest at once (4 requests: 4 fits, 4x the time and memory; 1.2 GB each at
# 20 slots) and each got a different copy. One lock per slot count: other counts are not held up.
_FOREST_LOCKS: dict[int, threading.Lock] = {}
_FOREST_LOCKS_LOCK = threading.Lock()


def predictor_for(policy, slots: int):
    """The policy's own predictor when it has one for this slot count, else the default forest
    (fit once on Metis's measurements and cached, also when requests ask for it together)."""
    if getattr(policy, "predictor", None) is not None and getattr(policy, "slots", None) == slots:
        return policy.predictor
    from .predictor import predictor_by_name

    with _FOREST_LOCKS_LOCK:
        lock = _FOREST_LOCKS.setdefault(slots, threading.Lock())
    with lock:
        return predictor_by_name("forest", slots=slots)
