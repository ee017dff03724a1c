"""The head-of-line liveness guard on hand-made snapshots, and in the simulator: a fleet that
cannot host the head job gets a VM that can, whatever the policy says."""
import numpy as np
import pytest

from samm.analyze import FleetSpec, RawSnapshot
from samm.plan.liveness import guard_head_of_line
from sim_bridge.config import PAPER_VM_TYPES

FLEET = FleetSpec.from_vm_types(PAPER_VM_TYPES)  # S/M/L = 2/4/8 cores, max 10 each


def snap(types, head):
    types = np.array(types)[None, :]
    z = np.zeros(types.shape)
    one = np.zeros(1)
    return RawSnapshot(types, np.ones_like(types), z, z, z, one, one, one, one, one,
                       head_job_cores=None if head is None else np.array([float(head)]))


@pytest.mark.parametrize("types,head,deltas,expected,changed", [
    ([0, -1], 4, [0, 0, 0], [0, 1, 0], True),     # only an S: add the smallest type that fits (M)
    ([0, -1], 8, [0, 0, 0], [0, 0, 1], True),     # an 8-core job needs an L
    ([0, -1], 8, [1, 0, 1], [1, 0, 1], False),    # the policy adds an L anyway
    ([0, -1], 2, [0, 0, 0], [0, 0, 0], False),    # the S fits (busy or not): nothing to do
    ([0, 2], 8, [0, 0, -1], [0, 0, 0], True),     # never remove the last L while an 8-core job waits
    ([0, 2, 2], 8, [0, 0, -1], [0, 0, -1], False),  # one L stays
    ([0, 1], 4, [0, -1, -1], [0, 0, 0], True),    # the M is the only host of a 4-core head job
    ([0, -1], 0, [-1, 0, 0], [-1, 0, 0], False),   # empty queue
    ([0, -1], None, [0, 0, 0], [0, 0, 0], False),  # unknown head: no guess
])
def test_guard_cases(types, head, deltas, expected, changed):
    out, did = guard_head_of_line(np.array([deltas]), snap(types, head), FLEET)
    assert out.tolist() == [expected] and bool(did[0]) is changed


def test_guard_respects_the_maximum():
    out, did = guard_head_of_line(np.array([[0, 0, 0]]), snap([0] * 10, 4), FLEET.__class__(
        FLEET.names, FLEET.cores, FLEET.ram_gb, np.array([10, 0, 0]), FLEET.min_count, FLEET.price_per_hour))
    assert out.tolist() == [[0, 0, 0]] and not did[0]


@pytest.mark.jvm
def test_noop_policy_no_longer_starves_on_a_wide_job():
    from agents.builtin import make_builtin_policy
    from sim_bridge.config import SimConfig
    from sim_bridge.runner import run_episodes
    from sim_bridge.workloads import Workload

    w = Workload("wide", np.array([0.0, 10.0]), np.full(2, 600.0 * 4400), np.array([8, 1], np.int32), np.ones(2))
    noop = make_builtin_policy("noop", "per-type", ("S", "M", "L"))
    cfg = SimConfig(action_mode="per-type", max_steps=60).with_initial([1, 0, 0])
    guarded = run_episodes(cfg, w, noop, [1])[0]
    assert guarded["terminated"] and guarded["jobs_finished"] == 2
    starved = run_episodes(cfg.model_copy(update={"liveness_guard": False}), w, noop, [1])[0]
    assert starved["jobs_finished"] == 0 and not starved["terminated"]
