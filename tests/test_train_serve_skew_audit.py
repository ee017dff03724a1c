"""Train/serve skew: the same situation built on the simulator's path and on the live path must
give the policy the same observation and the executor the same action."""
import numpy as np
import pytest

from samm.analyze import FleetSpec, RawSnapshot
from samm.analyze.features import SINCE_CAP, compute_features, feature_set
from sim_bridge.actions import to_deltas
from sim_bridge.config import PAPER_VM_TYPES

FLEET = FleetSpec.from_vm_types(PAPER_VM_TYPES)
EXTENDED = feature_set("extended", FLEET)


@pytest.mark.parametrize("action", [[0, 2], [[0, 1], [2, 1]], 1, np.zeros((2, 3, 1), dtype=int)])
def test_a_per_type_action_of_the_wrong_length_is_named(action):
    with pytest.raises(ValueError, match=r"per-type action must hold one value per VM type \(3\), got .* of shape"):
        to_deltas("per-type", action, 3)


def test_a_per_type_batch_of_the_wrong_width_is_not_reshaped_into_other_actions():
    # three env rows of two values each have six values, as two rows of three do: acting on the
    # reshape would give each type another's action
    with pytest.raises(ValueError, match=r"shape \[3, 2\]"):
        to_deltas("per-type", np.array([[0, 2], [1, 1], [2, 0]]), 3)
    assert to_deltas("per-type", [[0, 1, 2]], 3).tolist() == [[-1, 0, 1]]


# --- autoscaling: the daemon's steps_since_action against the simulator's -----------------------

def _snapshot(since_action_s=None) -> RawSnapshot:
    return RawSnapshot(vm_type=np.array([0, 1, 2]), vm_state=np.ones(3, dtype=int),
                       vm_cpu_busy=np.full(3, 0.5), vm_ram_used_gb=np.full(3, 1.0),
                       vm_running_for_s=np.full(3, 600.0), jobs_submitted_total=np.array(10.0),
                       jobs_submitted_interval=np.array(2.0), jobs_waiting_now=np.array(1.0),
                       jobs_waiting_interval=np.array(1.0), jobs_running=np.array(3.0),
                       jobs_waiting_cores=np.array(4.0), jobs_running_cores=np.array(6.0),
                       head_job_cores=np.array(2.0),
                       since_action_s=None if since_action_s is None else np.array(float(since_action_s)))


class _LiveMonitor:
    """Graphite's view: one complete minute per read, no action counter (the store knows it)."""

    def __init__(self, end: float):
        self.end = end

    def read(self):
        from samm.daemon.monitoring import MonitorOutcome

        self.end += 60.0
        return MonitorOutcome(self.end - 60.0, self.end, "ok", raw=_snapshot())


class _ExtendedKeep:
    """Reads the extended features and keeps the fleet as it is."""

    feature_names = EXTENDED

    def decide(self, features):
        from samm.plan.client import PlanOutcome

        return PlanOutcome({}, action=0, action_name="nothing")


def test_daemon_counts_intervals_since_an_action_as_the_simulator_does(tmp_path):
    from samm.daemon.loop import ControlLoop
    from samm.knowledge import KnowledgeStore

    window_end = 1_000_020.0  # the window the daemon read when it acted
    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        # the daemon acted 5 s after that window ended (lateness + the iteration's own time);
        # the simulator applies the same action at the start of the interval, `window_end`
        store.set_cooldown("M", window_end + 300, "k/M", now=window_end + 5.0)
        loop = ControlLoop(groups=[], fleet=FLEET, monitor=_LiveMonitor(window_end), planner=_ExtendedKeep(),
                           executor=None, store=store, agent_name="test", warmup_s=0, cooldown_s=300,
                           clock=lambda: window_end + 65.0)
        for intervals_later in (1, 2):
            live = loop.run_once().features
            sim = compute_features(_snapshot(since_action_s=60.0 * intervals_later), FLEET, EXTENDED)
            assert live["steps_since_action"] == pytest.approx(intervals_later / SINCE_CAP)
            np.testing.assert_allclose([live[n] for n in EXTENDED], sim, rtol=1e-6)
    finally:
        store.close()


# --- the data plane: a named observation given as an object ----------------------------------

@pytest.mark.parametrize("value, says", [({"a": 0.5}, r"missing \['b'\], unknown \[\]"),
                                         ({"a": 0.5, "b": 0.2, "c": 0.9}, r"missing \[\], unknown \['c'\]"),
                                         ({"a": 0.5, "b": "x"}, r"must be numbers for \['a', 'b'\]"),
                                         (["x", 0.1], r"must be numbers")])
def test_dataplane_names_a_named_observation_it_cannot_read(value, says):
    from agents.spaces import NamedBox
    from samm.plan.dataplane import InvalidInput, to_space

    space = NamedBox(["a", "b"], 0.0, 1.0)
    with pytest.raises(InvalidInput, match=r"^observation: " + says):
        to_space(space, value, "observation")
    assert to_space(space, {"b": 0.25, "a": 0.5}, "observation").tolist() == [0.5, 0.25]


# --- autoscaling: a live fleet outside the simulator's ranges, in-process and over HTTP ---------

def _over_max_snapshot() -> RawSnapshot:
    """12 S VMs running under a max of 10 (the operator lowered it) and a 16-core job at the head
    of the queue, wider than the largest type: states the simulator never reaches."""
    return RawSnapshot(vm_type=np.zeros(12, dtype=int), vm_state=np.ones(12, dtype=int),
                       vm_cpu_busy=np.full(12, 0.5), vm_ram_used_gb=np.ones(12), vm_running_for_s=np.full(12, 600.0),
                       jobs_submitted_total=np.array(10.0), jobs_submitted_interval=np.array(2.0),
                       jobs_waiting_now=np.array(1.0), jobs_waiting_interval=np.array(1.0),
                       jobs_running=np.array(3.0), jobs_waiting_cores=np.array(16.0),
                       jobs_running_cores=np.array(24.0), head_job_cores=np.array(16.0),
                       since_action_s=np.array(-1.0))


def test_features_stay_in_the_bounds_the_policy_declares():
    from samm.analyze.features import feature_bounds

    f = compute_features(_over_max_snapshot(), FLEET, EXTENDED)
    named = dict(zip(EXTENDED, f.tolist()))
    assert named["vm_running_frac:S"] == 1.0 and named["head_job_cores_ratio"] == 1.0
    for name, v in named.items():
        low, high = feature_bounds(name)
        assert low <= v <= high, name


def test_a_fleet_above_its_max_gets_the_same_decision_in_process_and_over_http(tmp_path):
    from agents.factory import make_agent
    from samm.localproc import AppInThread
    from samm.plan.client import HttpPlanner, InProcessPlanner
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app
    from sim_bridge.config import SimConfig

    sim = SimConfig()
    fleet = FleetSpec.from_vm_types(sim.vm_types)
    agent = make_agent("lstm-ppo", sim)  # the shipped policy: the extended features
    x = compute_features(_over_max_snapshot(), fleet, agent.feature_names)
    reg = PolicyRegistry(tmp_path / "store")
    reg.host("lstm-ppo", make_agent("lstm-ppo", sim))
    with AppInThread(create_app(reg)) as server:
        remote = HttpPlanner(server.url, "lstm-ppo", session_id="daemon-a", timeout_s=10.0).decide(x)
    local = InProcessPlanner(agent).decide(x)
    assert remote.source == "agent", remote.reason  # was a 422: vm_running_frac:S out of bounds
    assert (remote.action, remote.deltas) == (local.action, local.deltas)


class _ReadsUnknownFeature(_ExtendedKeep):
    """A service's policy of a newer version, reading a feature this daemon does not compute."""

    feature_names = ("allocated_cores_ratio", "gpu_mean")


def test_a_feature_the_daemon_cannot_compute_is_a_recorded_no_op(tmp_path):
    from samm.daemon.loop import ControlLoop
    from samm.knowledge import KnowledgeStore

    store = KnowledgeStore(f"sqlite:///{tmp_path}/k.db")
    try:
        loop = ControlLoop(groups=[], fleet=FLEET, monitor=_LiveMonitor(1_000_020.0), planner=_ReadsUnknownFeature(),
                           executor=None, store=store, agent_name="test", warmup_s=0, cooldown_s=300,
                           clock=lambda: 1_000_085.0)
        rep = loop.run_once()  # raised ValueError: no record, no progress for the watchdog
        assert rep.decided and rep.plan is None
        d = store.decision(rep.key)
        assert d.action is None and d.source == "none" and "gpu_mean" in d.reason
    finally:
        store.close()
