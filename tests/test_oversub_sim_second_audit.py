"""Second audit of the oversubscription offline side (simulator, loader, baselines' tuning): bad input
is refused in one line naming the problem, before minutes of work or a silently wrong table."""
from __future__ import annotations

import numpy as np
import pytest

from agents.oversubscription import tuning
from agents.oversubscription.data import generate_trace
from agents.oversubscription.settings import SETTINGS

from test_oversub_data import _readings_rows, _vmtable_rows
from test_oversub_sim_audit import _load, _with


# ----------------------------------------------------------------------------- Azure-schema loader

@pytest.mark.parametrize("column,value", [(9, "0"), (9, "nan"), (9, "inf"), (10, "-4"), (10, "nan")])
def test_loader_names_the_row_of_an_impossible_size_bucket(tmp_path, column, value):
    """Was the Workload's "requested cores must be finite and positive" (or the memory one) for the
    whole table, without the file or the row."""
    with pytest.raises(ValueError, match="is not a size a VM can request") as err:
        _load(tmp_path, _with(column, value))
    assert "vmtable.csv" in str(err.value) and "vm1" in str(err.value)


def test_loader_keeps_a_zero_memory_bucket(tmp_path):
    w = _load(tmp_path, _with(10, "0"))           # the Workload allows zero memory: so does the loader
    assert w.mem[w.meta["vm_ids"].index("vm1")] == 0


def test_loader_refuses_a_vm_deleted_before_it_was_created(tmp_path):
    """Was kept as a one-hour VM, as if real."""
    rows = _with(4, _vmtable_rows()[2][3] - 300, row=2)     # vm3 deleted 5 minutes before its creation
    with pytest.raises(ValueError, match="precedes timestamp vm created") as err:
        _load(tmp_path, rows)
    assert "vm3" in str(err.value)


def test_loader_still_takes_a_vm_deleted_when_it_was_created(tmp_path):
    rows = _with(4, _vmtable_rows()[2][3], row=2)           # zero lifetime: one step, as documented
    w = _load(tmp_path, rows)
    i = w.meta["vm_ids"].index("vm3")
    assert w.depart[i] == w.arrive[i] + 1


def test_loader_refuses_a_vm_id_on_two_rows(tmp_path):
    """The readings of the repeated id all went to one row; the other silently ran on its p95."""
    rows = _vmtable_rows()
    rows[2] = ["vm1"] + rows[2][1:]              # vm3's row now claims vm1's id
    with pytest.raises(ValueError, match="vm id 'vm1' appears on more than one row"):
        _load(tmp_path, rows, readings=_readings_rows())


# ----------------------------------------------------------------------------- baselines' tuning

@pytest.mark.parametrize("flags,match", [
    (["--rules", "Foo"], "--rules: unknown baseline 'Foo'"),
    (["--episodes", "0"], "--episodes must be >= 1"),
    (["--alpha", "1.5"], "--alpha must be a safety level"),
    (["--alpha", "nan"], "--alpha must be a safety level"),
    (["--test-episodes", "0"], "--test-episodes must be >= 1"),
    (["--trace-seed", "-1"], "--trace-seed must be >= 0"),
    (["--setting", "nope"], "unknown oversubscription setting 'nope'")])
def test_tuning_cli_refuses_bad_flags_in_one_line(capsys, flags, match):
    """Were a traceback after the prior was replayed (unknown rule or setting, --episodes 0), every rule
    tuned to "unsafe" (--alpha 1.5) or "yes" printed for every rule from no test episode."""
    assert tuning.main(["--setting", "tiny", *flags] if "--setting" not in flags else flags) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("error: ") and match in out.err and out.err.count("\n") == 1


def test_tune_refuses_no_training_episode():
    setting = SETTINGS["tiny"]
    trace = generate_trace(setting, 0)
    with pytest.raises(ValueError, match="at least one training episode"):
        tuning.tune("Grid-0.6", setting, trace, 0.95, episodes=0)
    # one episode still tunes
    assert tuning.tune("Grid-0.6", setting, trace, 0.95, episodes=1).params == {"rho": 0.6}


# ----------------------------------------------------------------------------- simulator

def test_warm_start_counts_the_running_vms_no_pm_could_take():
    """A VM running before step 0 that fits no PM (here one larger than any PM) vanished: counted
    neither rejected nor placed. It is counted apart, so `rejected` keeps meaning the episode's requests."""
    from agents.oversubscription.metrics import summarise
    from agents.oversubscription.sim import OversubSim, run_episode
    from test_oversub_sim_audit import _setting, _workload

    w = _workload(sub=[0, 0], arrive=[-1, 0], depart=[9, 2], cores=[20, 5], mem=[1, 1], net=[1, 1],
                  usage=np.full((2, 4), 0.3, np.float32))
    rec = run_episode(OversubSim(_setting(), w, warm_start=True), lambda view: np.ones(1))
    assert (rec.warm_rejected, rec.rejected, rec.placed) == (1, 0, 1)
    assert summarise([rec, rec], 2)["warm_rejected"] == 2
    cold = run_episode(OversubSim(_setting(), w), lambda view: np.ones(1))
    assert cold.warm_rejected == 0            # a cold start places no running VM: none to reject


# ----------------------------------------------------------------------------- baselines

@pytest.mark.parametrize("rule", ["NSigma", "Max"])
@pytest.mark.parametrize("n", [float("nan"), float("inf"), -1.0])
def test_sigma_rules_refuse_a_meaningless_n(rule, n):
    """n = NaN or inf made every forecast non-finite, so every rate 1.0 (no saving) under a name that
    looked tuned, e.g. in a custom tuning grid; a negative n forecast below the mean."""
    from agents.oversubscription.baselines import RuleContext, make_rule

    with pytest.raises(ValueError, match="n must be a finite number of standard deviations >= 0"):
        make_rule(rule, RuleContext(SETTINGS["tiny"]), n=n, window=24, headroom=2.0)
    assert make_rule(rule, RuleContext(SETTINGS["tiny"]), n=0, window=24, headroom=2.0).n_sigma == 0.0


# ----------------------------------------------------------------------------- trainer

@pytest.mark.parametrize("window", ["0", "-3"])
def test_train_cli_refuses_a_dual_window_below_one(capsys, tmp_path, window):
    """--dual-window 0 kept every episode in the pm-max estimate (a [-0:] slice) in silence; -3 dropped
    the first three, so the first episodes' estimate was the mean of nothing: a NaN lambda, reported as
    divergence ("lower --lr")."""
    from agents.oversubscription import train

    rc = train.main(["--setting", "tiny", "--episodes", "2", "--dual-estimate", "pm-max", "--dual-window", window,
                     "--quiet", "--out", str(tmp_path / "run")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"--dual-window out of range: {window}" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
