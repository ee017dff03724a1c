"""Agent construction and policy loading: a misspelt or out-of-range parameter, and a saved policy
with a bad metadata field or corrupt weights, fail at start-up in one line naming the parameter or
the file; before, each was dropped (the agent ran on its default), accepted (a policy that loaded
and then decided garbage) or ended in a bare torch/Python error."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from agents.base import load_agent
from agents.factory import make_agent, make_hosted_agent
from agents.ppo.agent import LstmPpoAgent
from agents.registry import load_policy, make_policy
from samm.cli.main import cli
from samm.localproc import free_port
from sim_bridge.config import SimConfig

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {
    "oversubscription": REPO / "agents/oversubscription/policies/c2marl-azure-0.95",
    "deferrable-jobs": REPO / "agents/deferrable_jobs/policies/osdec-default",
    "microservice-cores": REPO / "agents/microservice_cores/policies/reclaimer-hotel",
}


def one_line_error(excinfo) -> str:
    text = str(excinfo.value)
    assert len(text.splitlines()) == 1, text
    return text


def edit_metadata(d: Path, change) -> None:
    meta = json.loads((d / "metadata.json").read_text())
    change(meta)
    (d / "metadata.json").write_text(json.dumps(meta))


# -- autoscaling: make_agent's parameters -------------------------------------------------------------
@pytest.mark.parametrize("kind, params, key", [
    ("threshold", {"uper": 0.8}, "uper"),                      # ran with upper 0.75 in silence
    ("target-tracking", {"targt": 0.5}, "targt"),
    ("queue", {"jobs_per_cor": 2}, "jobs_per_cor"),
    ("random", {"sed": 3}, "sed"),
    ("noop", {"x": 1}, "x"),
    ("static", {"targets": [1, 1, 1], "target": [2, 2, 2]}, "target"),
    ("lstm-ppo", {"foo": 1}, "foo"),                            # dropped: the shipped policy ran
    ("static:1,1,1", {"x": 1}, "x"),
])
def test_a_misspelt_parameter_is_refused_naming_it_and_the_known_ones(kind, params, key):
    with pytest.raises(ValueError, match=f"unknown parameter '{key}' \\(known: ") as e:
        make_agent(kind, SimConfig(), params)
    one_line_error(e)


def test_a_hosted_agents_misspelt_parameter_is_refused():
    """`samm serve --agent threshold --agent-param threshold:uper=0.8` (values arrive as strings)."""
    with pytest.raises(ValueError, match="unknown parameter 'uper' .*cooldown_steps, lower, upper"):
        make_hosted_agent("threshold", uper="0.8")
    with pytest.raises(ValueError, match="lstm-ppo: unknown parameter 'foo'"):
        make_hosted_agent("lstm-ppo", foo="1")
    assert make_hosted_agent("threshold", upper="0.8").params["upper"] == 0.8


@pytest.mark.parametrize("kind, params, key", [
    ("threshold", {"upper": "high"}, "upper"),                # was a TypeError from a comparison
    ("threshold", {"lower": -0.1}, "lower"),
    ("threshold", {"upper": float("nan")}, "upper"),
    ("threshold", {"cooldown_steps": -1}, "cooldown_steps"),  # accepted: no cool-down at all
    ("threshold", {"cooldown_steps": 1.5}, "cooldown_steps"),
    ("threshold", {"cooldown_steps": float("nan")}, "cooldown_steps"),
    ("target-tracking", {"target": "x"}, "target"),
    ("target-tracking", {"tolerance": -1}, "tolerance"),      # accepted: never inside the tolerance
    ("target-tracking", {"tolerance": float("nan")}, "tolerance"),
    ("target-tracking", {"stabilization_steps": 0}, "stabilization_steps"),
    ("target-tracking", {"stabilization_steps": -3}, "stabilization_steps"),
    ("target-tracking", {"floor": -1}, "floor"),
    ("queue", {"jobs_per_core": float("nan")}, "jobs_per_core"),  # NaN desired VMs: never scaled
    ("queue", {"shares": [-1, 1, 1]}, "shares"),
    ("queue", {"shares": "abc"}, "shares"),
    ("queue", {"shares": [0, 0, 0]}, "shares"),
    ("queue", {"cores": [0, 4, 8]}, "cores"),                 # divides: inf VMs wanted
    ("queue", {"stabilization_steps": 0}, "stabilization_steps"),
    ("random", {"seed": "x"}, "seed"),
    ("static", {"targets": [1.5, 1, 1]}, "targets"),          # held 1 VM where 1.5 was asked
])
def test_baseline_parameters_out_of_range_or_of_the_wrong_type_are_refused_by_name(kind, params, key):
    with pytest.raises(ValueError, match=f"{kind}: {key}") as e:
        make_agent(kind, SimConfig(), params)
    one_line_error(e)


def test_an_unknown_action_mode_is_refused():
    with pytest.raises(ValueError, match="action_mode must be one of"):
        make_agent("threshold", SimConfig(), action_mode="zzz")


def test_parameters_with_a_saved_policy_are_refused_not_dropped(tmp_path):
    make_agent("threshold", SimConfig(), {"upper": 0.8, "lower": 0.3}).save(tmp_path / "t")
    with pytest.raises(ValueError, match=r"parameters \['upper'\] cannot be given with a saved policy"):
        make_agent("threshold", SimConfig(), {"upper": 0.9}, policy_dir=tmp_path / "t")
    assert make_agent("threshold", SimConfig(), policy_dir=tmp_path / "t").params["upper"] == 0.8


def test_every_caller_in_the_repo_passes_only_known_parameters():
    """The tuning grids, the training's reference rule, the paper's threshold and the shipped tuned
    rules still build (they would fail at once if they passed a key the agents do not read)."""
    from agents.generalisation import rules_from_json
    from agents.training import REFERENCE_RULE
    from agents.tune import candidates, default_grid
    from samm.cli.main import PAPER_THRESHOLD

    sim = SimConfig()
    for kind in ("threshold", "target-tracking", "queue"):
        for params in candidates(kind, default_grid(kind)):
            make_agent(kind, sim, params)
    make_agent(REFERENCE_RULE[0], sim, REFERENCE_RULE[1])
    make_agent("threshold", sim, PAPER_THRESHOLD)
    rules = rules_from_json(REPO / "agents/policies/generalisation-rules.json", sim, check_config=False)
    assert set(rules) == {"threshold", "target-tracking", "queue"}


# -- autoscaling: the saved-policy loader ---------------------------------------------------------------
@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(action_mode="zzz"), "action_mode"),          # loaded; acted in paper mode
    (lambda m: m["params"].update(lstm_hidden=-1), "lstm_hidden"),   # torch's bare "hidden_size must be..."
    (lambda m: m["params"].update(lstm_hidden="x"), "lstm_hidden"),
    (lambda m: m["params"].update(sample_seed="x"), "sample_seed"),
    (lambda m: m["params"].update(hiden=64), "hiden"),
    (lambda m: m.update(params=[1]), "parameters must be a mapping"),  # a TypeError
    (lambda m: m.update(type_names=5), "not iterable"),                # a TypeError
])
def test_a_saved_lstm_policy_with_a_bad_metadata_field_fails_in_one_line_naming_the_file(tmp_path, change, field):
    LstmPpoAgent(action_mode="per-type").save(tmp_path / "p")
    edit_metadata(tmp_path / "p", change)
    with pytest.raises(ValueError, match=field) as e:
        load_agent(tmp_path / "p")
    assert one_line_error(e).startswith(str(tmp_path / "p" / "metadata.json"))


@pytest.mark.parametrize("kind, params", [("threshold", {}), ("queue", {}), ("target-tracking", {}), ("noop", {}),
                                          ("random", {}), ("static", {"targets": [1, 1, 1]})])
def test_a_saved_baseline_with_an_unknown_action_mode_is_refused(tmp_path, kind, params):
    make_agent(kind, SimConfig(), params or None).save(tmp_path / "b")
    load_agent(tmp_path / "b")   # as saved: loads
    edit_metadata(tmp_path / "b", lambda m: m.update(action_mode="zzz"))
    with pytest.raises(ValueError, match=f"{tmp_path / 'b' / 'metadata.json'}: {kind}: action_mode"):
        load_agent(tmp_path / "b")


def test_an_lstm_policys_mismatched_weights_are_named_in_one_line(tmp_path):
    LstmPpoAgent(action_mode="paper").save(tmp_path / "p")
    edit_metadata(tmp_path / "p", lambda m: m.update(action_mode="per-type"))
    with pytest.raises(ValueError, match="policy.pt: does not match .*size mismatch") as e:
        load_agent(tmp_path / "p")
    one_line_error(e)


# -- the other problems' loaders (load_torch_weights) --------------------------------------------------
def _nan_weights(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    key = next(k for k, v in state.items() if v.is_floating_point())
    state[key] = state[key].clone()
    state[key].view(-1)[0] = float("nan")
    torch.save(state, path)


CORRUPTIONS = {
    "garbage": (lambda w: w.write_bytes(b"hello world"), "not a readable PyTorch state dict"),    # KeyError 101
    "empty": (lambda w: w.write_bytes(b""), "not a readable PyTorch state dict"),                # EOFError
    "a directory": (lambda w: (w.unlink(), w.mkdir()), "missing"),                              # IsADirectoryError
    "missing": (lambda w: w.unlink(), "missing"),
    "NaN": (_nan_weights, "holds NaN or inf values"),                                           # loaded, decided garbage
}


@pytest.mark.parametrize("problem", sorted(SHIPPED))
def test_each_problems_loader_refuses_corrupt_weights_in_one_line_naming_the_file(tmp_path, problem):
    for name, (corrupt, message) in CORRUPTIONS.items():
        d = tmp_path / name
        shutil.copytree(SHIPPED[problem], d)
        corrupt(d / "weights.pt")
        with pytest.raises(ValueError, match=message) as e:
            load_policy(d)
        assert one_line_error(e).startswith(str(d / "weights.pt")), (name, str(e.value))


@pytest.mark.parametrize("change, field", [
    (lambda m: m.update(hidden=-1), "hidden -1"),     # a RuntimeError deep in torch
    (lambda m: m.update(hidden=0), "hidden 0"),       # a ZeroDivisionError
    (lambda m: m.update(features="zzz"), "features must be one of"),
])
def test_an_oversubscription_policy_with_a_bad_metadata_field_names_the_file(tmp_path, change, field):
    d = tmp_path / "p"
    shutil.copytree(SHIPPED["oversubscription"], d)
    edit_metadata(d, change)
    with pytest.raises(ValueError, match=field) as e:
        load_policy(d)
    assert one_line_error(e).startswith(str(d / "metadata.json"))


@pytest.mark.parametrize("problem, change, message", [
    ("deferrable-jobs", lambda m: m.update(config=[1]), "missing or malformed field"),      # an AttributeError
    ("deferrable-jobs", lambda m: m["config"].update(d_model=-1), "network cannot be built"),  # torch's RuntimeError
    ("deferrable-jobs", lambda m: m["config"].update(d_model="x"), "network cannot be built"),  # torch's TypeError
    ("microservice-cores", lambda m: m["config"].update(hidden=-1), r"hidden must be a whole number in \[1, 4096\]"),
    ("microservice-cores", lambda m: m.update(app=5), "missing or malformed field"),        # pydantic's many lines
])
def test_a_policy_whose_metadata_describes_no_buildable_network_names_the_file(tmp_path, problem, change, message):
    d = tmp_path / "p"
    shutil.copytree(SHIPPED[problem], d)
    edit_metadata(d, change)
    with pytest.raises(ValueError, match=message) as e:
        load_policy(d)
    assert one_line_error(e).startswith(str(d / "metadata.json"))


# -- the other problems' make_policy / make_controller parameters -------------------------------------
@pytest.mark.parametrize("agent, params, message", [
    ("c2marl", {"foo": "1"}, "c2marl: unknown parameter 'foo'"),                  # dropped
    ("nsigma", {"headrom": "3"}, "nsigma: unknown parameter 'headrom' .*headroom"),  # a constructor's TypeError
    ("ma-des", {"window": "3"}, "ma-des: unknown parameter 'window'"),
    ("nsigma", {"n": "-3"}, "nsigma: n must be >= 0"),                            # overcommitted in silence
    ("nsigma", {"trace_seed": "abc"}, "nsigma: trace_seed must be"),             # "invalid literal for int()"
    ("osdec", {"foo": "1"}, "osdec: unknown parameter 'foo'"),                   # dropped
    ("tetris", {"eps": "nan"}, "tetris: eps must be a finite number"),            # hosted, scheduled on NaN
    ("tetris", {"eps": "inf"}, "tetris: eps must be a finite number"),
    ("tetris", {"eps": "abc"}, "tetris: eps must be a number"),                   # "could not convert string"
    ("reclaimer", {"ap": "social"}, "reclaimer: unknown parameter 'ap' \\(known: app\\)"),  # hotel ran instead
    ("reclaimer", {"app": 5}, "reclaimer: app must be"),
])
def test_a_hosted_policys_bad_parameter_is_refused_by_name(agent, params, message):
    kw = {"setting": "tiny", "prior": "none"} if agent in ("nsigma", "ma-des") else {}
    with pytest.raises(ValueError, match=message) as e:
        make_policy(agent, None, **kw, **params)
    one_line_error(e)


def test_a_heuristic_given_a_policy_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fifo is a heuristic"):
        make_policy("fifo", str(tmp_path), margin="0.1")


def test_a_reclaimer_policy_dir_of_another_app_is_refused(tmp_path):
    with pytest.raises(ValueError, match="controls 'hotel', not app 'social'"):
        make_policy("reclaimer", str(SHIPPED["microservice-cores"]), app="social")
    assert make_policy("reclaimer", str(SHIPPED["microservice-cores"]), app="hotel").topo.name == "hotel"


@pytest.mark.parametrize("name, params, message", [
    ("static-max", {"foo": 1}, "static-max: unknown parameter 'foo'"),
    ("reclaimer", {"ceiling": 2}, "reclaimer: unknown parameter 'ceiling'"),
    ("static", {"cores": 2, "foo": 1}, "static: unknown parameter 'foo'"),
    ("static", {"cores": 2, "fraction": 0.5}, "static: give cores or fraction, not both"),  # the fraction won
])
def test_a_controller_refuses_the_parameters_it_would_drop(name, params, message):
    from agents.microservice_cores.hosting import make_controller

    with pytest.raises(ValueError, match=message):
        make_controller(name, "hotel", **params)


# -- the CLI --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, names", [
    (["--agent", "threshold", "--agent-param", "threshold:uper=0.8"], "unknown parameter 'uper'"),
    (["--agent", "threshold", "--agent-param", "threshold:upper=abc"], "upper must be a number"),
    (["--agent", "lstm-ppo", "--agent-param", "lstm-ppo:foo=1"], "lstm-ppo: unknown parameter 'foo'"),
    (["--agent", "osdec", "--agent-param", "osdec:foo=1"], "osdec: unknown parameter 'foo'"),
])
def test_serve_refuses_a_bad_agent_param_in_one_line(no_uvicorn, args, names):
    res = CliRunner().invoke(cli, ["serve", "--port", str(free_port()), *args])
    assert not no_uvicorn, "served anyway"
    assert res.exit_code == 2 and names in res.output and "Traceback" not in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_evaluate_refuses_a_misspelt_param():
    res = CliRunner().invoke(cli, ["evaluate", "--agent", "threshold", "--params", '{"uper": 0.8}', "--seeds", "1"])
    assert res.exit_code == 2 and "unknown parameter 'uper'" in res.output, res.output
