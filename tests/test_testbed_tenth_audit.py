"""Tenth audit round of the testbed (not microservices): regressions for what it found."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest


def _open_files_under(root: Path) -> list[str]:
    """This process's open file descriptors on files under `root`."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (e.g. the listing's own descriptor)
            continue
        if target.startswith(str(root)):
            out.append(target)
    return out


@pytest.mark.parametrize("duty", [2.0, -0.1, math.nan])
def test_a_deferrable_run_refuses_a_duty_its_workers_cannot_use_before_starting_them(tmp_path, duty):
    # every worker exited at start-up on such a duty (said only in workers.log) and the run
    # replayed its slots with no job ever running, then reported a live run
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    out = tmp_path / "run"
    with pytest.raises(ValueError, match="duty"):
        run_deferrable(DeferrableRunOptions(slots=2, slot_seconds=0.2, warmup_s=0.2, duty=duty, out_dir=str(out)))
    assert not (out / "workers.log").exists()


@pytest.mark.parametrize("warmup", [math.nan, math.inf, -1.0])
def test_a_deferrable_run_refuses_a_warmup_naming_it(tmp_path, warmup):
    # a NaN warm-up failed on the queue's clock as "t0 must be a finite wall time"; a negative one
    # dated slot 0 in the past, and the run played the missed slots in a burst
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    out = tmp_path / "run"
    with pytest.raises(ValueError, match="warmup_s"):
        run_deferrable(DeferrableRunOptions(slots=2, slot_seconds=0.2, warmup_s=warmup, out_dir=str(out)))
    assert not (out / "workers.log").exists()


def test_a_deferrable_run_that_fails_to_start_closes_its_queue_and_knowledge_store(tmp_path):
    # a bad --graphite address failed after the queue and the Knowledge store were open, and both
    # connections stayed open for the rest of the caller's process
    from samm.testbed.deferrable.run import DeferrableRunOptions, run_deferrable

    out = tmp_path / "run"
    with pytest.raises(ValueError, match="IPV6"):
        run_deferrable(DeferrableRunOptions(slots=2, slot_seconds=0.2, warmup_s=0.2, graphite="[::1",
                                            out_dir=str(out)))
    assert (out / "queue.db").exists()  # it got that far
    assert _open_files_under(out) == []


# --- a workload the fleet cannot run ---------------------------------------------------------------
_WIDE_SWF = ("1 0 0 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1\n"
             "2 0 0 60 16 -1 -1 16 -1 -1 1 1 1 1 1 -1 -1 -1\n"
             "3 5 0 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1\n")


def test_samm_testbed_refuses_a_job_wider_than_the_largest_instance_before_starting(tmp_path):
    # no worker (at most 8 cores) could lease the 16-core job, and the head-of-line queue held every
    # later job behind it: the run sat out its whole timeout (20 min by default), then failed as
    # "N of N jobs unfinished"; the simulator refuses such a workload at once
    from click.testing import CliRunner

    from samm.cli.main import cli

    swf = tmp_path / "wide.swf"
    swf.write_text(_WIDE_SWF)
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["testbed", "--agent", "noop", "--workload", str(swf), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "16-core job" in res.output and "8 cores" in res.output and "--workload:" in res.output, res.output
    assert isinstance(res.exception, SystemExit) and not out.exists()


def test_a_testbed_started_on_a_too_wide_workload_starts_nothing(tmp_path):
    # the API path (no CLI check first): refused before Graphite, moto or any worker starts
    import numpy as np

    from samm.testbed.run import Testbed, TestbedOptions, TestbedOptionsError
    from sim_bridge.workloads import Workload

    wl = Workload("wide", np.zeros(2), np.full(2, 60 * 4400.0), np.array([1, 9], dtype=np.int32), np.full(2, 0.5))
    tb = Testbed(TestbedOptions(agent="noop", workload_obj=wl, out_dir=str(tmp_path / "tb")))
    try:
        with pytest.raises(TestbedOptionsError, match="9-core job") as err:
            tb.start()
        assert err.value.option == "workload"
        assert not (tmp_path / "tb" / "graphite").exists() and not hasattr(tb, "reconciler")
    finally:
        tb.close()
