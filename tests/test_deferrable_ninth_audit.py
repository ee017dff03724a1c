"""Ninth audit of the deferrable-jobs offline side (episode, sim, env, tuning, evaluate, experiment):
bad input that was truncated, cut or failed late and obscurely, each now refused by name; episodes a
decide function could write into; `--settings` without Table 1's setting training Table 1 anyway."""
from __future__ import annotations

import numpy as np
import pytest

from agents.deferrable_jobs import experiment, tuning
from agents.deferrable_jobs.env import DeferrableJobsEnv
from agents.deferrable_jobs.episode import Episode
from agents.deferrable_jobs.evaluate import evaluate


# ----------------------------------------------------------------------------- episode

@pytest.mark.parametrize("capacity", [[10.7, 4], [4, -0.5]])
def test_from_rows_refuses_a_fractional_capacity_instead_of_truncating_it(capacity):
    """10.7 cores became 10 and -0.5 became 0 (passing the >= 0 check), though the rows' own
    fields were refused when fractional."""
    with pytest.raises(ValueError, match="capacity must hold finite whole numbers"):
        Episode.from_rows([(1, 1, 0, 0, 0)], capacity)
    assert Episode.from_rows([(1, 1, 0, 0, 0)], [10.0, 4]).capacity.tolist() == [10, 4]   # whole floats still load


def test_a_decide_function_cannot_write_into_the_episode_or_the_start_slots():
    """View.start was documented read-only but was the simulator's own array, and the episode's
    arrays were writable: a decide function that wrote into them changed the job calendar (one
    episode is replayed by every tuning candidate) or marked a job started that never ran."""
    from agents.deferrable_jobs.baselines import make_rule
    from agents.deferrable_jobs.sim import DeferrableSim, run_episode

    ep = Episode.from_rows([(1, 1, 0, 1, 0), (2, 1, 0, 1, 0)], [4, 4])
    want = run_episode(ep, make_rule("fifo")).as_dict()

    def meddling(view):
        for write in (lambda: view.start.__setitem__(0, view.t), lambda: view.episode.capacity.__setitem__(0, 99),
                      lambda: view.episode.cores.__setitem__(1, 8)):
            with pytest.raises(ValueError, match="read-only"):
                write()
        return make_rule("fifo")(view)

    sim = DeferrableSim(ep)
    while not sim.done:
        sim.step(meddling(sim.view()))
    assert sim.result.as_dict() == want and ep.capacity.tolist() == [4, 4] and ep.cores.tolist() == [1, 2]
    caller = np.array([4, 4])
    own = Episode(cores=np.array([1]), duration=np.array([1]), earliest=np.array([0]), latest=np.array([0]),
                  submit=np.array([0]), capacity=caller)
    caller[0] = 5                                     # the caller's own array stays theirs, writable,
    assert own.capacity.tolist() == [4, 4]            # and no longer the episode's


# ----------------------------------------------------------------------------- env

def _env() -> DeferrableJobsEnv:
    env = DeferrableJobsEnv("tiny", episode=Episode.from_rows([(1, 1, 0, 0, 0), (2, 1, 0, 0, 0)], [4, 4]))
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("action", [np.zeros(17), np.zeros((2, 16)), np.zeros((16, 2))])
def test_env_refuses_an_action_with_more_scores_than_the_space_and_consumes_no_slot(action):
    """A long or 2-D action (a batch of actions, scores paired with something) was flattened and its
    first scores used in silence: a [16, 2] array scored job 0 with row 0's first and job 1 with its
    second value."""
    env = _env()
    with pytest.raises(ValueError, match=f"action must hold 16 scores .*got {action.size}"):
        env.step(action)
    assert env.sim.t == 0 and (env.sim.start == -1).all()
    _, _, _, _, info = env.step(np.zeros((1, 16)))     # one action with a batch axis of 1 still works
    assert info["started"] == 2


@pytest.mark.parametrize("action", [["a"] * 16, {"scores": 1}])
def test_env_refuses_an_action_that_is_not_numbers_naming_the_action(action):
    env = _env()
    with pytest.raises(ValueError, match="action must be 16 numbers"):
        env.step(action)
    assert env.sim.t == 0


def test_env_refuses_an_unknown_split_when_built():
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        DeferrableJobsEnv("tiny", split="validation")


def test_env_refuses_an_episode_that_is_not_an_episode_when_given():
    """It failed at reset (or at the first step) with "'str' object has no attribute 'slots'"."""
    with pytest.raises(ValueError, match=r"episode must be an Episode .*got list"):
        DeferrableJobsEnv("tiny", episode=[(1, 1, 0, 0, 0)])
    env = DeferrableJobsEnv("tiny")
    with pytest.raises(ValueError, match=r"options\['episode'\] must be an Episode .*got str"):
        env.reset(options={"episode": "tiny"})
    obs, _ = env.reset(seed=0, options={"episode": None})       # None still draws one
    assert env.observation_space.contains(obs)


# ----------------------------------------------------------------------------- tuning and evaluate

def test_a_list_grid_of_bare_values_is_refused_naming_the_value():
    with pytest.raises(ValueError, match=r"list grid holds parameter dicts .*got 0.1"):
        tuning.tune_rule("fifo", "tiny", 1, grid=[0.1, 0.2])
    assert tuning.tune_rule("fifo", "tiny", 1, grid=[{"margin": 0.1}])[0] == {"margin": 0.1}


@pytest.mark.parametrize("agent", ["fifo", "osdec"])
def test_evaluate_names_a_setting_given_among_the_agents_parameters(agent):
    """`samm evaluate --params '{"setting": "tiny"}'` failed with make_policy's "got multiple
    values for keyword argument 'setting'" (or, for osdec, an unknown-parameter error)."""
    with pytest.raises(ValueError, match="'setting' is not a parameter of the agent.*'tiny'"):
        evaluate(agent, [1], setting="tiny", params={"setting": "default"})
    assert evaluate("fifo", [1], setting="tiny")["summary"]["total_reward"]["n"] == 1


# ----------------------------------------------------------------------------- experiment

@pytest.mark.parametrize("kw, says", [({"mapping": "skipp"}, "unknown action mapping 'skipp'"),
                                      ({"seeds": [-1]}, r"seed -1 is outside 0..2\*\*64-1"),
                                      # an empty list ran the default one (5 seeds, 8 settings, 7 variants)
                                      ({"seeds": []}, "seeds names nothing"),
                                      ({"settings": ()}, "settings names nothing"),
                                      ({"variants": []}, "variants names nothing")])
def test_experiment_refuses_a_bad_mapping_or_seed_before_tuning_or_touching_out(tmp_path, kw, says):
    """Through the Python API a bad mapping or seed was refused only in each training worker, after
    every setting's heuristics were tuned and --out was made, and an empty list ran the default one."""
    out = tmp_path / "osdec"
    with pytest.raises(ValueError, match=says):
        experiment.run(out, quick=True, progress=False, workers=1, **kw)
    assert not out.exists()


def test_settings_without_table1s_setting_train_only_osdec_on_them(tmp_path):
    """`--settings tiny` (no 'default') trained all seven Table 1 variants on 'default' as well,
    35 runs at the full budget, and reported them in a Table 1 with no heuristic beside them."""
    import json

    out = tmp_path / "osdec"
    summary = experiment.run(out, settings=["tiny"], seeds=[1], steps=1, test_episodes=2, workers=1, progress=False)
    runs = json.loads((out / "runs.json").read_text())
    assert [(r["setting"], r["variant"]) for r in runs] == [("tiny", "osdec")]
    assert not any(m.startswith("default/") for m in summary["methods"])
    assert summary["figures"] == [] and not (out / "training-curves.png").exists()


def test_table1_variants_asked_for_without_table1s_setting_are_refused(tmp_path):
    out = tmp_path / "osdec"
    with pytest.raises(ValueError, match=r"variants \['ppo'\] are Table 1's rows, trained on the 'default'"):
        experiment.run(out, settings=["tiny"], variants=["ppo", "osdec"], seeds=[1], steps=1, test_episodes=2,
                       workers=1, progress=False)
    assert not out.exists()
