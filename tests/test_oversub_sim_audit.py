"""Audit of the oversubscription simulator, its metrics, settings, workload contract, loader, env and
shield spec: degenerate and invalid inputs are refused in one line (or handled) instead of crashing
later, acting on garbage or silently dropping data."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agents.oversubscription import data
from agents.oversubscription.data import load_azure_trace
from agents.oversubscription.metrics import pm_hot_r, summarise
from agents.oversubscription.settings import SETTINGS, Setting
from agents.oversubscription.shield import ShieldSpec
from agents.oversubscription.sim import OversubSim
from agents.oversubscription.workload import Workload

from oversub_toy import toy_workload
from test_oversub_data import LOADER_SETTING, START, _readings_rows, _vmtable_rows, _write


def _setting(**kw):
    base = dict(name="hand", n_subscribers=1, n_pms=2, pm_cores=10, pm_mem_gb=100, pm_net_gbps=10,
                episode_steps=4, delta_steps=2)
    base.update(kw)
    return Setting(**base)


def _workload(**kw):
    base = dict(n_subscribers=1, steps=4, sub=[0], arrive=[0], depart=[9], cores=[10], mem=[1], net=[1],
                usage=np.full((1, 4), 0.3, np.float32))
    base.update(kw)
    return Workload(**base)


# ----------------------------------------------------------------------------- metrics

def test_metrics_of_no_episodes_are_zero_not_a_crash():
    assert pm_hot_r([], 3) == 0.0
    m = summarise([], 3)
    assert m["pm_hot_r"] == 0.0 and m["episodes"] == 0 and all(m["satisfied"].values())


# ----------------------------------------------------------------------------- workload contract

@pytest.mark.parametrize("field,value,match", [
    ("cores", [math.nan], "cores"), ("cores", [math.inf], "cores"),
    ("mem", [-500.0], "mem"), ("mem", [math.nan], "mem"), ("net", [-1.0], "net"), ("net", [math.inf], "net")])
def test_workload_refuses_non_finite_or_negative_sizes(field, value, match):
    with pytest.raises(ValueError, match=match):
        _workload(**{field: value})


def test_zero_memory_and_network_requests_stay_valid():
    w = _workload(mem=[0.0], net=[0.0])
    sim = OversubSim(_setting(), w)
    sim.step([1.0])
    assert np.allclose(sim.cluster.free[0], [0.0, 100.0, 10.0])


# ----------------------------------------------------------------------------- settings

@pytest.mark.parametrize("field,value", [
    ("n_pms", 0), ("n_subscribers", 0), ("episode_steps", 0), ("delta_steps", 0), ("n_pms", 2.5),
    ("pm_cores", 0.0), ("pm_net_gbps", 0.0), ("pm_mem_gb", -1.0), ("beta", math.nan), ("pm_cores", math.inf),
    ("step_hours", 0.0)])
def test_setting_refuses_degenerate_fields_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        _setting(**{field: value})
    with pytest.raises(ValueError, match=field):
        SETTINGS["tiny"].scaled(**{field: value})


def test_one_pm_one_subscriber_setting_runs():
    sim = OversubSim(_setting(n_pms=1), _workload(cores=[11]))       # larger than the only PM
    view, res = sim.step([1.0])
    assert res.rejected == 1 and res.hot_pms == 0 and view.t == 1


# ----------------------------------------------------------------------------- simulator

def test_a_workload_without_steps_is_refused_up_front():
    empty = _workload(steps=0, sub=[], arrive=[], depart=[], cores=[], mem=[], net=[],
                      usage=np.zeros((0, 0), np.float32))
    with pytest.raises(ValueError, match="no steps"):
        OversubSim(_setting(), empty)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, 1.5])
def test_warm_rate_outside_zero_one_is_refused(rate):
    with pytest.raises(ValueError, match="warm_rate"):
        OversubSim(_setting(), _workload(arrive=[-1]), warm_start=True, warm_rate=rate)


# ----------------------------------------------------------------------------- environment

@pytest.fixture()
def env():
    from agents.oversubscription.env import OversubscriptionEnv

    e = OversubscriptionEnv("tiny", workload_fn=lambda rng: toy_workload())
    e.reset(seed=0)
    return e


@pytest.mark.parametrize("action", [[2.7, 0, 0], [math.nan, 0, 0], "abc", [0, 0], [0, 0, 6], [-1, 0, 0]])
def test_env_refuses_actions_that_are_not_whole_indices(env, action):
    with pytest.raises(ValueError, match="action must be 3 indices"):
        env.step(action)


def test_env_takes_whole_indices_in_any_numeric_form(env):
    _, r_int, *_ = env.step(np.array([2, 0, 5]))
    env.reset(seed=0)
    _, r_float, *_ = env.step([2.0, 0.0, 5.0])
    assert r_int == r_float


# ----------------------------------------------------------------------------- shield spec

@pytest.mark.parametrize("kw", [dict(headroom=math.nan), dict(headroom=math.inf), dict(n=math.nan),
                                dict(window=2.5)])
def test_shield_spec_refuses_nan_inf_and_fractional_windows(kw):
    with pytest.raises(ValueError, match="shield needs"):
        ShieldSpec(**kw)


# ----------------------------------------------------------------------------- Azure-schema loader

def _load(tmp_path, vm_rows=None, readings=None, **kw):
    vmt = _write(tmp_path / "vmtable.csv", vm_rows if vm_rows is not None else _vmtable_rows())
    rds = [_write(tmp_path / "readings.csv", readings)] if readings is not None else []
    return load_azure_trace(vmt, rds, setting=LOADER_SETTING, start_s=START, **kw)


def _with(column, value, row=0):
    rows = [list(r) for r in _vmtable_rows()]
    rows[row][column] = value
    return rows


@pytest.mark.parametrize("column,value,match", [
    (7, "", "p95 max cpu '' is not a number"), (7, "nan", "p95 max cpu 'nan' is not finite"),
    (3, "nan", "timestamp vm created 'nan' is not finite"), (4, "inf", "timestamp vm deleted 'inf' is not finite"),
    (9, "abc", "core count bucket 'abc'")])
def test_loader_names_the_bad_vmtable_field(tmp_path, column, value, match):
    with pytest.raises(ValueError, match=match) as err:
        _load(tmp_path, _with(column, value))
    assert "vmtable.csv" in str(err.value) and "vm1" in str(err.value)


def test_loader_ignores_bad_fields_of_subscriptions_it_does_not_load(tmp_path):
    w = _load(tmp_path, _with(7, "", row=5))           # vm6 belongs to C, not among the top two
    assert w.meta["vm_ids"] == ["vm1", "vm3", "vm2"]


@pytest.mark.parametrize("row,match", [([START + 3600, "vm1"], "row has 2 fields"),
                                       (["x", "vm1", 1, 5, 5], "timestamp 'x' is not a number"),
                                       ([START, "vm1", 1, "high", 5], "max cpu 'high' is not a number")])
def test_loader_names_the_bad_readings_row(tmp_path, row, match):
    with pytest.raises(ValueError, match=match) as err:
        _load(tmp_path, readings=_readings_rows() + [row])
    assert "readings.csv" in str(err.value)


def test_loader_keeps_treating_a_nan_reading_as_no_reading(tmp_path):
    plain = _load(tmp_path, readings=_readings_rows())
    with_nan = _load(tmp_path, readings=[[START, "vm3", 1, "nan", 1]] + _readings_rows())
    np.testing.assert_array_equal(plain.usage, with_nan.usage)


def test_loader_refuses_repeated_top_subscribers(tmp_path):
    with pytest.raises(ValueError, match="repeats an id"):
        _load(tmp_path, top_subscribers=["A", "A"])


def test_loader_short_row_in_the_counting_pass_is_named(tmp_path):
    rows = _vmtable_rows()
    rows[1] = rows[1][:1]          # was an IndexError on row[1] while counting VMs per subscription
    with pytest.raises(ValueError, match="vmtable row has 1 fields"):
        _load(tmp_path, rows)
    assert data.bucket_value(">24", "cores") == 30


@pytest.mark.parametrize("prior", [[[0.1, 0.2, 0.3, 0.9, 0.9, 0.9]] * 2, [[0.1, 0.2], [0.3]], [0.1, 0.2, 0.3]])
def test_shield_prior_of_the_wrong_width_is_refused_not_reshaped(prior):
    from agents.oversubscription.shield import Shield

    saved = Shield(ShieldSpec(), 3, np.full((4, 3), 0.3)).to_json()
    assert Shield.from_json(saved, 3).prior.shape == (4, 3)
    with pytest.raises(ValueError, match="every prior row must hold 3 usage rates"):
        Shield.from_json({**saved, "prior": prior}, 3)


def test_a_pm_used_exactly_at_the_threshold_is_not_hot():
    """§6.2: hot when use *exceeds* beta * B. Usage rates are float32: one 64-core VM at 0.6 on a
    64-core PM summed to 38.40000152 and the PM counted as hot."""
    from agents.oversubscription.cluster import hot

    at = np.float32(0.6) * np.float32(64.0)
    assert not hot(np.array([float(at)]), 64.0, 0.6)[0]
    assert hot(np.array([38.41]), 64.0, 0.6)[0]
