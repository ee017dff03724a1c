"""The guard's rules on hand-made inventories with a controllable clock (pure, no I/O)."""
from __future__ import annotations

import pytest

from samm.config import GroupConfig
from samm.execute.base import GroupStatus, Instance
from samm.execute.guard import (after_action, choose_victims, deltas_from_actions, plan_scaling,
                                warming_instances)

T0 = 1_000_000.0
GROUPS = [GroupConfig(name=n, cores=c, ram_gb=4.0 * c, price_per_hour=0.1 * c, min=lo, max=10)
          for n, c, lo in (("S", 2, 1), ("M", 4, 0), ("L", 8, 0))]


def group(name: str, desired: int, lo: int = 0, hi: int = 10, pending: int = 0, launched=None) -> GroupStatus:
    """`desired` instances, the last `pending` of them pending; launch times T0-1000, T0-900, ..."""
    launched = launched or [T0 - 1000 + 100 * k for k in range(desired)]
    insts = tuple(Instance(name, f"i-{name}{k}", "pending" if k >= desired - pending else "running", launched[k])
                  for k in range(desired))
    return GroupStatus(name, desired, lo, hi, insts)


def inv(**desired) -> dict[str, GroupStatus]:
    return {n: group(n, d) for n, d in desired.items()}


def plan(deltas, inventory, now=T0, cooldown=None, key="d1", **kw):
    return plan_scaling(deltas, inventory, GROUPS, cooldown or {}, now, key, **kw)


def test_scale_out_sets_absolute_target_and_key():
    p = plan({"S": 1, "M": 0, "L": -1}, inv(S=2, M=1, L=3))
    reqs = {r.group: r for r in p.requests}
    assert set(reqs) == {"S", "L"}
    assert reqs["S"].target == 3 and reqs["S"].idempotency_key == "d1:S" and reqs["S"].victim is None
    assert reqs["L"].target == 2 and reqs["L"].victim == "i-L2"  # the newest running
    assert (reqs["S"].basis, reqs["L"].basis) == (2, 3)  # what the decision saw: the request's direction
    assert [(s.group, s.reason) for s in p.skipped] == [("M", "no_change")]


def test_clamped_at_max_with_a_note():
    p = plan({"M": 3}, inv(M=9))
    (a,) = p.actions
    assert a.request.target == 10 and a.delta == 1 and a.requested_delta == 3
    assert "clamped +3 to +1 by max 10" in a.notes
    assert "clamped" in p.reasons()["M"]


def test_at_max_and_at_min_are_refused():
    p = plan({"M": 1, "S": -1}, {"M": group("M", 10), "S": group("S", 1)})
    assert not p.actions
    reasons = {s.group: s for s in p.skipped}
    assert reasons["M"].reason == "at_max" and "max 10" in reasons["M"].detail
    assert reasons["S"].reason == "at_min" and "min 1" in reasons["S"].detail  # S's configured min


def test_clamped_at_min():
    p = plan({"L": -3}, inv(L=2))
    (a,) = p.actions
    assert a.request.target == 0 and a.delta == -2 and a.notes == ("clamped -3 to -2 by min 0",)


def test_tighter_of_configured_and_group_bounds():
    # The ASG's own max 4 is tighter than the configured 10; the configured min 1 beats the ASG's 0.
    p = plan({"M": 2, "S": -1}, {"M": group("M", 3, hi=4), "S": group("S", 1, lo=0)})
    assert [r.target for r in p.requests] == [4]
    assert {s.group: s.reason for s in p.skipped} == {"S": "at_min"}


def test_out_of_range_group_may_move_towards_the_range_only():
    # The operator lowered max to 10 while the ASG (max 20) runs 12.
    inventory = {"M": group("M", 12, hi=20)}
    assert plan({"M": 1}, inventory).skipped[0].reason == "at_max"
    assert [r.target for r in plan({"M": -1}, inventory).requests] == [11]


def test_bounds_conflict():
    p = plan({"S": 1}, {"S": group("S", 0, hi=0)})  # configured min 1 > the ASG's max 0
    assert p.skipped[0].reason == "bounds_conflict"


def test_cooldown_blocks_until_exactly_T_then_allows():
    cd = after_action({}, "S", now=T0, cooldown_s=300)
    assert cd == {"S": T0 + 300}
    for now in (T0, T0 + 299.999):
        for d in (1, -1):  # both directions
            p = plan({"S": d}, inv(S=2), now=now, cooldown=cd)
            assert not p.actions
            assert p.skipped[0].reason == "cooldown" and p.skipped[0].until == T0 + 300
    assert [r.target for r in plan({"S": 1}, inv(S=2), now=T0 + 300, cooldown=cd).requests] == [3]
    # other groups are not affected
    assert [r.target for r in plan({"M": 1}, inv(M=2), now=T0, cooldown=cd).requests] == [3]


def test_after_action_is_pure_and_never_shortens():
    cd = {"S": T0 + 500}
    out = after_action(cd, "S", now=T0, cooldown_s=300)
    assert out == {"S": T0 + 500} and cd == {"S": T0 + 500} and out is not cd


def test_scale_in_stabilisation_is_separate():
    kw = dict(scale_in_stabilisation_s=600, last_action_at={"S": T0})
    assert plan({"S": -1}, inv(S=3), now=T0 + 599, **kw).skipped[0].until == T0 + 600
    assert plan({"S": 1}, inv(S=3), now=T0 + 599, **kw).requests  # scale-out unaffected
    assert plan({"S": -1}, inv(S=3), now=T0 + 600, **kw).requests


def test_one_request_per_group():
    p = plan({"S": 1, "M": -1, "L": 2}, inv(S=1, M=2, L=0))
    groups = [r.group for r in p.requests]
    assert sorted(groups) == ["L", "M", "S"] and len(set(groups)) == len(groups)
    assert {r.group: r.target for r in p.requests} == {"S": 2, "M": 1, "L": 2}


def test_replay_yields_the_same_requests():
    first = plan({"S": 1, "L": -1}, inv(S=2, L=2))
    again = plan({"S": 1, "L": -1}, inv(S=2, L=2))
    assert first.requests == again.requests
    # Replayed after the first run acted (inventory moved, cool-down set): the recorded
    # requests come back unchanged, so the executor finds the targets met.
    recorded = {r.idempotency_key: r for r in first.requests}
    cd = after_action(after_action({}, "S", T0, 300), "L", T0, 300)
    replay = plan({"S": 1, "L": -1}, inv(S=3, L=1), now=T0 + 5, cooldown=cd, recorded=recorded)
    assert replay.requests == first.requests
    assert all(a.delta == 0 for a in replay.actions)
    # A new decision key on the moved inventory is a new decision (blocked by cool-down here).
    assert not plan({"S": 1}, inv(S=3), now=T0 + 5, cooldown=cd, key="d2").requests


def test_dry_run_returns_requests_marked_not_to_execute():
    p = plan({"S": 1, "M": 1}, inv(S=2, M=10), dry_run=True)
    assert p.dry_run and p.requests == []
    (a,) = p.actions
    assert a.request.target == 3 and a.execute is False
    reasons = p.reasons()
    assert "dry_run" in reasons["S"] and reasons["M"].startswith("at_max")


def test_unknown_group():
    p = plan({"XL": 1, "S": 1}, {"S": group("S", 2)})
    skipped = {s.group: s for s in p.skipped}
    assert skipped["XL"].reason == "unknown_group" and "configuration" in skipped["XL"].detail
    # configured but missing from the back-end's inventory (ASG deleted)
    assert plan({"M": 1}, {"S": group("S", 2)}).skipped[0].detail.endswith("not in the inventory")


def test_inventory_in_flux_blocks():
    converging = GroupStatus("S", 3, 0, 10, group("S", 2).instances)  # desired 3, 2 live
    p = plan({"S": 1}, {"S": converging})
    assert p.skipped[0].reason == "in_flux" and "desired 3 but 2 live" in p.skipped[0].detail
    # terminating instances do not count as live
    leaving = GroupStatus("S", 2, 0, 10, group("S", 2).instances + (Instance("S", "i-x", "terminating"),))
    assert plan({"S": -1}, {"S": leaving}).requests
    # booting instances only hold scale-out when asked to
    booting = {"S": group("S", 3, pending=1)}
    assert plan({"S": 1}, booting).requests
    held = plan({"S": 1}, booting, hold_scale_out_while_pending=True)
    assert held.skipped[0].reason == "in_flux" and "pending" in held.skipped[0].detail
    assert plan({"S": -1}, booting, hold_scale_out_while_pending=True).requests


def test_victim_pending_newest_first_then_newest_running():
    insts = (Instance("M", "old", "running", T0 - 900), Instance("M", "new", "running", T0 - 100),
             Instance("M", "p-old", "pending", T0 - 50), Instance("M", "p-new", "pending", T0 - 10),
             Instance("M", "bye", "terminating", T0 - 5), Instance("M", "unknown", "running", None))
    st = GroupStatus("M", 5, 0, 10, insts)
    assert choose_victims(st, 6) == ["p-new", "p-old", "new", "old", "unknown"]
    assert plan({"M": -1}, {"M": st}).requests[0].victim == "p-new"
    running_only = GroupStatus("M", 3, 0, 10, insts[:2] + insts[-1:])
    assert plan({"M": -1}, {"M": running_only}).requests[0].victim == "new"


def test_warming_instances():
    st = GroupStatus("S", 3, 0, 10, (Instance("S", "a", "running", T0 - 200), Instance("S", "b", "running", T0 - 60),
                                     Instance("S", "c", "pending", None)))
    w = warming_instances({"S": st, "M": group("M", 1)}, now=T0, warmup_s=120)
    assert {k: [i.instance_id for i in v] for k, v in w.items()} == {"S": ["b", "c"]}
    assert "2 instance(s) still warming up" in plan({"S": 1}, {"S": st}, warmup_s=120).actions[0].notes


@pytest.mark.parametrize("mode, actions, expected", [
    ("paper", [3], {"S": 0, "M": 1, "L": 0}),       # 1 + 2i = add type i
    ("paper", [6], {"S": 0, "M": 0, "L": -1}),      # 2 + 2i = remove type i
    ("paper", [0], {"S": 0, "M": 0, "L": 0}),
    ("per-type", [[2, 0, 1]], {"S": 1, "M": -1, "L": 0}),
])
def test_deltas_from_actions_uses_the_simulator_mapping(mode, actions, expected):
    assert deltas_from_actions(mode, actions, ("S", "M", "L")) == expected


def test_deltas_from_actions_rejects_bad_input():
    with pytest.raises(ValueError, match="paper actions must be within"):
        deltas_from_actions("paper", [9], ("S", "M", "L"))
    with pytest.raises(ValueError, match="batch of 2"):
        deltas_from_actions("paper", [1, 2], ("S", "M", "L"))
