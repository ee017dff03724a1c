"""Simulation config validation and the action-space translations."""
import numpy as np
import pytest
from gymnasium import spaces
from pydantic import ValidationError

from sim_bridge.actions import action_masks, action_names, action_space, to_deltas
from sim_bridge.config import SimConfig, load_sim_config


def test_defaults_are_the_papers():
    c = SimConfig()
    assert [(t.name, t.cores, t.ram_gb, t.price_per_hour, t.min, t.max, t.initial) for t in c.vm_types] == [
        ("S", 2, 8, 0.2, 1, 10, 1), ("M", 4, 16, 0.4, 0, 10, 1), ("L", 8, 32, 0.8, 0, 10, 1)]
    assert c.host_mips == 4400 and c.step_seconds == 60 and c.penalty_per_job_second == 1e-5
    assert (c.boot_delay_min_s, c.boot_delay_max_s, c.cooldown_s) == (45, 97, 0)
    assert c.max_fleet_cores == 140 and c.vm_slots == 30 and c.job_core_cap == 8


def test_unknown_keys_are_rejected_with_their_name():
    with pytest.raises(ValidationError, match="penalty_per_job_secnd"):
        SimConfig.model_validate({"penalty_per_job_secnd": 1})
    with pytest.raises(ValidationError, match="colour"):
        SimConfig.model_validate({"vm_types": [{"name": "X", "cores": 1, "ram_gb": 1, "price_per_hour": 1,
                                                "min": 0, "max": 1, "initial": 0, "colour": "red"}]})


@pytest.mark.parametrize("bad", [
    {"boot_delay_min_s": 100, "boot_delay_max_s": 50},
    {"step_seconds": 0},
    {"vm_types": []},
    {"max_job_cores": 16},
    {"vm_types": [{"name": "X", "cores": 1, "ram_gb": 1, "price_per_hour": 1, "min": 2, "max": 1, "initial": 1}]},
])
def test_invalid_values_are_rejected(bad):
    with pytest.raises(ValidationError):
        SimConfig.model_validate(bad)


def test_yaml_file_and_preset(tmp_path):
    p = tmp_path / "sim.yaml"
    p.write_text("cooldown_s: 120\nmax_steps: 300\n")
    c = load_sim_config(p, preset="realistic")
    assert c.cooldown_s == 120 and c.warmup_s == 120 and c.max_steps == 300
    p.write_text("cooldwn_s: 1\n")
    with pytest.raises(ValidationError, match="cooldwn_s"):
        load_sim_config(p)


def test_config_hash_changes_with_dynamics():
    assert SimConfig().config_hash() == SimConfig().config_hash()
    assert SimConfig().config_hash() != SimConfig(penalty_per_job_second=2e-5).config_hash()


def test_paper_mapping_is_pinned():
    assert action_space("paper", 3) == spaces.Discrete(7)
    assert action_names("paper", ("S", "M", "L")) == [
        "nothing", "add S", "remove S", "add M", "remove M", "add L", "remove L"]
    d = to_deltas("paper", np.arange(7), 3)
    np.testing.assert_array_equal(d, [[0, 0, 0], [1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])


def test_paper_mode_generalises_to_n_types():
    assert action_space("paper", 5) == spaces.Discrete(11)
    np.testing.assert_array_equal(to_deltas("paper", [10], 5), [[0, 0, 0, 0, -1]])


def test_per_type_mode():
    assert action_space("per-type", 3) == spaces.MultiDiscrete([3, 3, 3])
    np.testing.assert_array_equal(to_deltas("per-type", [[0, 1, 2]], 3), [[-1, 0, 1]])
    with pytest.raises(ValueError):
        to_deltas("per-type", [[0, 3, 1]], 3)
    with pytest.raises(ValueError):
        to_deltas("paper", [7], 3)


def test_masks_follow_bounds_and_cooldown():
    can_add = np.array([[True, True, False]])
    can_remove = np.array([[False, True, True]])
    m = action_masks("paper", can_add, can_remove, np.array([False]))
    np.testing.assert_array_equal(m, [[True, True, False, True, True, False, True]])
    m = action_masks("paper", can_add, can_remove, np.array([True]))
    np.testing.assert_array_equal(m, [[True, False, False, False, False, False, False]])
    m = action_masks("per-type", can_add, can_remove, np.array([False]))
    np.testing.assert_array_equal(m[0], [[False, True, True], [True, True, True], [True, True, False]])


def test_shipped_example_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "deploy" / "configs"
    files = sorted(root.glob("sim-*.yaml"))
    assert files
    for f in files:
        load_sim_config(f)


def test_a_broken_yaml_file_is_a_value_error_naming_it(tmp_path):
    """The CLI turns ValueError into a one-line error; a YAML error used to escape as a traceback."""
    p = tmp_path / "sim.yaml"
    p.write_text("cooldown_s: [\n")
    with pytest.raises(ValueError, match=f"{p}: not a valid YAML/JSON file"):
        load_sim_config(p)
    p.write_bytes(b"cooldown_s: \xff\n")
    with pytest.raises(ValueError, match=f"{p}: not a valid YAML/JSON file"):
        load_sim_config(p)
