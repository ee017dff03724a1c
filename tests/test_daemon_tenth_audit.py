"""The daemon loop and the Analyze stage, tenth audit round (session 103). Real SQLite knowledge
store and a real moto server for the AWS executor, as the earlier daemon audits use."""
from __future__ import annotations

import pytest

from samm.analyze import FleetSpec
from samm.daemon.leadership import Leadership
from samm.daemon.loop import ControlLoop
from samm.knowledge.store import KnowledgeStore, LeaseLost
from test_execute_aws import GROUPS, _Monitor, _Planner, asg, make_executor, moto, moto_server  # noqa: F401

T0 = 2_000_000_000.0


def _loop(executor, store, deltas, clock):
    return ControlLoop(groups=GROUPS, fleet=FleetSpec.from_vm_types(GROUPS), monitor=_Monitor(T0),
                       planner=_Planner(deltas), executor=executor, store=store, agent_name="audit",
                       warmup_s=0, cooldown_s=300, clock=lambda: clock["now"])


@pytest.mark.parametrize("how", ["renewal finds the lease taken", "stepped down"])
def test_a_leader_that_knows_it_lost_the_lease_acts_on_nothing(moto, make_executor, tmp_path, how):
    """Losing the lease (a renewal finding another holder, or the runner's step-down) cleared the
    store's fence to None, and a store without a fence checks nothing: the iteration still running
    in the scheduler's worker recorded its decision and scaled the group beside the new leader."""
    clock = {"now": T0}
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url, clock=lambda: clock["now"]) as mine, \
            KnowledgeStore(url, clock=lambda: clock["now"]) as theirs:
        me = Leadership(mine, 10.0, ha=True, holder="a@host:1")
        other = Leadership(theirs, 10.0, ha=True, holder="b@host:2")
        assert me.try_acquire()
        before = asg(moto, "samm-m5a-large")["DesiredCapacity"]
        clock["now"] += 11  # a pause longer than the lease: the standby takes over
        assert other.try_acquire()
        if how == "stepped down":
            me.forget()
        else:
            assert not me.renew()
        with pytest.raises(LeaseLost):
            _loop(make_executor(), mine, {"S": 1}, clock).run_once()
        assert asg(moto, "samm-m5a-large")["DesiredCapacity"] == before
        assert mine.decisions() == [] and mine.actions() == []


def test_a_snapshot_without_vm_slots_gives_every_feature_not_a_numpy_error():
    """A fleet scaled to zero, given as no slot at all rather than one padding slot: the seven
    metrics came out (zeros), but largest_free_slot_ratio raised numpy's "zero-size array to
    reduction operation maximum", so an `extended` agent's loop recorded that as its reason."""
    import numpy as np

    from samm.analyze import RawSnapshot
    from samm.analyze.features import compute_features, feature_set

    fleet = FleetSpec.from_vm_types(GROUPS)
    none = np.zeros(0)
    snap = RawSnapshot(vm_type=np.zeros(0, int), vm_state=np.zeros(0, int), vm_cpu_busy=none, vm_ram_used_gb=none,
                       vm_running_for_s=none, jobs_submitted_total=np.array(4.0),
                       jobs_submitted_interval=np.array(1.0), jobs_waiting_now=np.array(2.0),
                       jobs_waiting_interval=np.array(1.0), jobs_running=np.array(0.0),
                       jobs_waiting_cores=np.array(4.0), jobs_running_cores=np.array(0.0),
                       head_job_cores=np.array(2.0), since_action_s=np.array(-1.0))
    names = feature_set("extended", fleet)
    feats = dict(zip(names, compute_features(snap, fleet, names).tolist()))
    assert feats["largest_free_slot_ratio"] == 0.0 and feats["allocated_cores_ratio"] == 0.0
    assert feats["waiting_ratio_total"] == 0.5 and all(np.isfinite(list(feats.values())))


def _head_job_monitor(cores: float, vm_types=(0, 1, 2)):
    import dataclasses

    import numpy as np

    monitor = _Monitor(T0)
    n = len(vm_types)
    monitor.raw = dataclasses.replace(monitor.raw, vm_type=np.array(vm_types), vm_state=np.ones(n, dtype=int),
                                      vm_cpu_busy=np.full(n, 0.9), vm_ram_used_gb=np.full(n, 2.0),
                                      vm_running_for_s=np.full(n, 600.0), head_job_cores=np.array(cores))
    return monitor


@pytest.mark.parametrize("vm_types, deltas, says", [
    ((0, 1, 2), {"L": -1}, "the guard keeps the last VM(s) able to host it"),   # L is the only host of an 8-core job
    ((0, 1), {}, "no VM of the fleet can host it"),                     # no L at all: one is added
])
def test_the_liveness_guards_recorded_reason_says_what_it_did(moto, make_executor, tmp_path, vm_types, deltas, says):
    """Cancelling the removal of the last L VM was recorded as "no VM of the fleet can host it",
    with the L VM there and hosting the job: an operator read a fleet that could not run the job."""
    clock = {"now": T0 + 90}
    with KnowledgeStore(f"sqlite:///{tmp_path}/k.db", clock=lambda: clock["now"]) as store:
        loop = _loop(make_executor(), store, deltas, clock)
        loop.monitor = _head_job_monitor(8.0, vm_types)
        rep = loop.run_once()
        reason = store.decision(rep.key).reason
        assert says in reason, reason
        assert ("no VM of the fleet can host it" in reason) == (says == "no VM of the fleet can host it")


def test_a_renewal_that_can_only_take_a_new_lease_gives_it_back_for_the_standby(tmp_path):
    """The leader paused past its lease, another daemon led and stopped; the paused one's renewal
    then took the free lease under a new token, rightly refused to lead on it (another leader
    acted between), but kept it in the store: every standby waited a whole ttl for nobody."""
    clock = {"now": T0}
    url = f"sqlite:///{tmp_path}/k.db"
    with KnowledgeStore(url, clock=lambda: clock["now"]) as mine, \
            KnowledgeStore(url, clock=lambda: clock["now"]) as theirs:
        paused = Leadership(mine, 10.0, ha=True, holder="a@host:1")
        other = Leadership(theirs, 10.0, ha=True, holder="b@host:2")
        standby = Leadership(theirs, 10.0, ha=True, holder="c@host:3")
        assert paused.try_acquire()
        clock["now"] += 11
        assert other.try_acquire()
        other.release()
        assert not paused.renew() and not paused.leading
        assert standby.try_acquire() and standby.current.token == 4  # at once, not a ttl later
