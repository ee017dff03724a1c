"""Checkpoint selection on the validation week (train.py `validate_every`, ours): the week is held
apart from training and test, the rule prefers a checkpoint that meets the level, and validating
changes nothing in the training itself."""
import numpy as np
import pytest

from agents.oversubscription import data
from agents.oversubscription.c2marl import C2MarlConfig
from agents.oversubscription.data import generate_trace
from agents.oversubscription.train import choose_checkpoint, train

HAVE_DATA = (data.data_dir() / "azure-v2-2019-summary-distributions" / "cpu.txt").exists() and \
    (data.data_dir() / "azure-v1-100vm-cpu" / "microsoft_max_100.csv.gz").exists()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason=f"Azure summary files not under {data.data_dir()}")


def _h(episode, pm_hot_r, s_cores):
    return {"episode": episode, "pm_hot_r": pm_hot_r, "s_cores": s_cores}


def test_the_rule_keeps_the_most_saving_checkpoint_that_meets_the_level():
    history = [_h(900, 0.10, 0.60), _h(1000, 0.05, 0.50), _h(1100, 0.025, 0.55), _h(1200, 0.0, 0.40)]
    assert choose_checkpoint(history, 0.95) == 2          # 0.05 and 0.025 meet 5 %; 0.55 saves more
    assert choose_checkpoint(history, 0.85) == 0          # all meet 15 %: the most saving one
    assert choose_checkpoint(history, 0.99) == 3          # only 0 meets 1 %


def test_with_no_checkpoint_at_the_level_the_fewest_breaks_win_then_the_saving_then_the_earliest():
    history = [_h(1, 0.30, 0.70), _h(2, 0.20, 0.40), _h(3, 0.20, 0.45), _h(4, 0.20, 0.45)]
    assert choose_checkpoint(history, 0.95) == 2
    with pytest.raises(ValueError, match="no checkpoint"):
        choose_checkpoint([], 0.95)


@needs_data
def test_the_validation_week_is_the_week_before_training_and_shares_no_day_with_test():
    trace = generate_trace("tiny", 7)
    T = trace.setting.episode_steps
    start = trace.validation_start()
    assert start == trace.train_start() - 7 * 24 and start >= 0
    days = lambda w: {(w.meta["start_abs_hour"] + t) // 24 for t in range(T)}   # noqa: E731
    v = trace.validation_workload(0, seed=5)
    assert v.meta["split"] == "validation" and days(v).isdisjoint(days(trace.train_workload()))
    for i in range(trace.n_test_blocks):
        assert days(v).isdisjoint(days(trace.test_workload(i, seed=5)))
    # seeded, and its own usage stream: not the training days' redraw with the same seed
    again = trace.validation_workload(0, seed=5)
    assert np.array_equal(v.usage, again.usage) and not np.array_equal(
        v.usage, trace.validation_workload(0, seed=6).usage)
    assert trace.episode("validation", 5).meta["split"] == "validation"


@needs_data
def test_validating_keeps_the_training_and_saves_the_chosen_and_the_last(tmp_path):
    from agents.oversubscription.policy import OversubPolicy

    cfg = C2MarlConfig(episodes=8, seed=2, updates_per_episode=3)
    plain, logs = train("tiny", cfg, trace_seed=7, progress=False)
    chosen, vlogs = train("tiny", cfg, trace_seed=7, progress=False, out=tmp_path / "p",
                          validate_every=2, validate_episodes=3, validate_from=3)
    assert [x.reward for x in vlogs] == [x.reward for x in logs] and [x.lam for x in vlogs] == [x.lam for x in logs]
    last = OversubPolicy.load(tmp_path / "p" / "last-policy")
    for a, b in zip(plain.net.state_dict().values(), last.net.state_dict().values()):
        assert np.array_equal(a.numpy(), b.numpy())
    v = chosen.training["validation"]
    assert [r["episode"] for r in v["history"]] == [3, 5, 7, 8]            # from 3, every 2, and the end
    assert chosen.training["checkpoint"] == "validation"
    assert chosen.training["checkpoint_episode"] == v["history"][choose_checkpoint(v["history"], cfg.alpha)]["episode"]
    assert last.training["checkpoint"] == "last" and last.training["checkpoint_episode"] == 8
    saved = OversubPolicy.load(tmp_path / "p")
    assert saved.training["checkpoint_episode"] == chosen.training["checkpoint_episode"]
    assert sorted(d.name for d in (tmp_path / "p" / "checkpoints").iterdir()) == [
        "episode-3", "episode-5", "episode-7", "episode-8"]
    kept = OversubPolicy.load(tmp_path / "p" / "checkpoints" / f"episode-{chosen.training['checkpoint_episode']}")
    for a, b in zip(chosen.net.state_dict().values(), kept.net.state_dict().values()):
        assert np.array_equal(a.numpy(), b.numpy())
    rows = (tmp_path / "p" / "validation.csv").read_text().splitlines()
    assert rows[0].startswith("episode,pm_hot_r") and len(rows) == 5
    with pytest.raises(ValueError, match="validate_every"):
        train("tiny", cfg, trace_seed=7, progress=False, validate_every=-1)


@needs_data
def test_the_cli_refuses_bad_validation_flags(capsys):
    from agents.oversubscription.train import main

    assert main(["--setting", "tiny", "--episodes", "2", "--validate-every", "-1"]) == 2
    assert "--validate-every" in capsys.readouterr().err


def _benchmark(name: str):
    """A script of benchmarks/ as a module."""
    from benchmark_script import load_benchmark

    return load_benchmark(name)


def _tiny_validated_run(run, capsys) -> None:
    """Six tiny episodes, validated on two episodes at 3, 5 and 6, checkpoints saved under run."""
    from agents.oversubscription.train import main

    assert main(["--setting", "tiny", "--episodes", "6", "--seed", "1", "--updates-per-episode", "2", "--quiet",
                 "--trace-seed", "0", "--validate-every", "2", "--validate-episodes", "2", "--out", str(run)]) == 0
    capsys.readouterr()


@needs_data
def test_the_per_seed_benchmark_tests_each_saved_checkpoint_beside_its_validation(tmp_path, capsys):
    import json

    mod = _benchmark("oversub_per_seed")
    _tiny_validated_run(tmp_path / "tiny-cold-a0.95-s1", capsys)
    assert mod.main(["--policies", str(tmp_path), "--case", "tiny-cold", "--seeds", "1", "--test-episodes", "2",
                     "--checkpoints"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["episode"] for r in rows[1:]] == [3, 5, 6] and rows[0]["kept"] and not any(r["kept"] for r in rows[1:])
    kept = next(r for r in rows[1:] if r["episode"] == rows[0]["episode"])
    assert (kept["pm_hot_r"], kept["s_cores"]) == (rows[0]["pm_hot_r"], rows[0]["s_cores"])   # the same weights
    assert all("validation" in r for r in rows)


@needs_data
def test_the_validation_size_benchmark_replays_the_trainings_choice_on_its_first_episodes(tmp_path, capsys):
    """The benchmark's first K validation episodes are the training's own, so with K = the training's
    count it reproduces the validation figures and the kept checkpoint; more episodes extend them."""
    import json

    from agents.oversubscription.policy import OversubPolicy

    mod = _benchmark("oversub_validation_size")
    run = tmp_path / "run"
    _tiny_validated_run(run, capsys)
    args = ["--runs", str(run), "--cache", str(tmp_path / "cache"), "--validation-episodes", "3",
            "--test-episodes", "2", "--sizes", "2,3"]
    assert mod.main(args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    rows = [x["checkpoint"] for x in lines if "checkpoint" in x]
    choices = {x["choice"]["validation_episodes"]: x["choice"] for x in lines if "choice" in x}
    kept = OversubPolicy.load(run).training
    history = {h["episode"]: h for h in kept["validation"]["history"]}
    assert [r["episode"] for r in rows] == [3, 5, 6]
    for r in rows:
        assert r["val2"] == pytest.approx([history[r["episode"]]["pm_hot_r"], history[r["episode"]]["s_cores"]])
    assert choices[2]["kept_episode"] == kept["checkpoint_episode"]
    assert set(choices) == {2, 3} and all(len(c["kept_test"]) == 2 for c in choices.values())
    # a second call only reads the cache; a cache of fewer episodes than asked for is refused
    assert mod.main(args + ["--report"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == lines
    more = ["--runs", str(run), "--cache", str(tmp_path / "cache"), "--validation-episodes", "4", "--sizes", "4"]
    assert mod.main(more + ["--report"]) == 2
    assert "fewer than 4" in capsys.readouterr().err
    assert mod.main(args[:-2] + ["--test-episodes", "3", "--sizes", "2", "--report"]) == 2
    assert "2 test episodes, fewer than 3" in capsys.readouterr().err
    other = tmp_path / "elsewhere" / "run"          # another run of the same folder name
    (other / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "episode-3").rename(other / "checkpoints" / "episode-3")
    assert mod.main(["--runs", str(other)] + args[2:] + ["--report"]) == 2
    assert "use another --cache" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mod.main(more[:-1] + ["5"])         # a size above --validation-episodes


def test_an_ensemble_votes_the_median_rate_or_maximises_the_mean_q_or_takes_the_safest_rate():
    import torch

    from agents.oversubscription.network import vote

    # three members, two agents, actions = indices of ascending rates
    q = torch.tensor([[[3.0, 2.9, 0.0], [0.0, 0.0, 1.0]],       # member 0 prefers 0 then 2
                      [[0.0, 1.0, 0.5], [5.0, 0.0, 0.0]],       # member 1 prefers 1 then 0
                      [[0.0, 0.0, 0.1], [0.0, 0.2, 0.0]]])      # member 2 prefers 2 then 1
    assert vote(q, "median").tolist() == [1, 1]
    assert vote(q, "max").tolist() == [2, 2]
    assert vote(q, "upper-quartile").tolist() == [2, 2]      # K = 3: ceil(0.75 * 2) = the highest
    assert vote(q[:2], "upper-quartile").tolist() == [1, 2]  # K = 2: the higher of two
    five = torch.eye(6)[[0, 4, 1, 3, 2]].unsqueeze(1)          # five members, one agent, rates 0, 4, 1, 3, 2
    assert [vote(five, how).item() for how in ("median", "p60", "upper-quartile", "max")] == [2, 3, 3, 4]
    nine = torch.eye(9)[[8, 0, 7, 1, 6, 2, 5, 3, 4]].unsqueeze(1)   # nine members, rates 0..8 shuffled
    assert [vote(nine, how).item() for how in ("median", "p60", "upper-quartile", "max")] == [4, 5, 6, 8]
    assert vote(q, "mean-q").tolist() == [1, 0]      # mean Q: 1.0/1.3/0.2 and 1.67/0.07/0.33
    assert vote(q[:2], "median").tolist() == [0, 0]   # even K: the lower median
    assert vote(q[:1], "mean-q").tolist() == vote(q[:1], "median").tolist() == vote(q[:1], "max").tolist() == [0, 2]
    with pytest.raises(ValueError, match="vote must be"):
        vote(q, "min")


@needs_data
def test_the_ensemble_benchmark_of_one_checkpoint_is_the_last_weights(tmp_path, capsys):
    import json

    mod = _benchmark("oversub_snapshot_ensemble")
    run = tmp_path / "run"
    _tiny_validated_run(run, capsys)
    assert mod.main(["--runs", str(run), "--last", "1", "--test-episodes", "2"]) == 0
    rows = {r["how"]: r for r in (json.loads(line) for line in capsys.readouterr().out.splitlines())}
    assert set(rows) == {"last", "mean-q", "median", "p60", "upper-quartile", "max"} and rows["mean-q"]["members"] == [6]
    for how in ("mean-q", "median", "p60", "upper-quartile", "max"):
        assert (rows[how]["pm_hot_r"], rows[how]["s_cores"]) == (rows["last"]["pm_hot_r"], rows["last"]["s_cores"])
        assert rows[how]["s_cores_vs_last"] == 1.0
    assert mod.main(["--runs", str(run), "--last", "3", "--how", "max", "--test-episodes", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["how"] for r in rows] == ["last", "max"] and rows[1]["members"] == [3, 5, 6]
    assert mod.main(["--runs", str(run), "--last", "4", "--test-episodes", "2"]) == 2
    assert "fewer than --last 4" in capsys.readouterr().err


@needs_data
def test_an_ensemble_run_keeps_its_last_snapshots_voting_and_trains_as_without(tmp_path, capsys):
    import torch

    from agents.oversubscription.network import C2MarlEnsemble
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import main

    tiny = ["--setting", "tiny", "--episodes", "6", "--seed", "1", "--updates-per-episode", "2", "--quiet",
            "--trace-seed", "0"]
    assert main(tiny + ["--out", str(tmp_path / "plain")]) == 0
    assert main(tiny + ["--ensemble", "3", "--ensemble-every", "2", "--ensemble-vote", "max",
                        "--out", str(tmp_path / "ens")]) == 0
    assert "episodes 2, 4, 6" in capsys.readouterr().out
    plain, last = OversubPolicy.load(tmp_path / "plain"), OversubPolicy.load(tmp_path / "ens" / "last-policy")
    ens = OversubPolicy.load(tmp_path / "ens")
    assert isinstance(ens.net, C2MarlEnsemble) and len(ens.net.members) == 3 and ens.net.how == "max"
    assert ens.training["checkpoint"] == "ensemble" and ens.training["ensemble"]["episodes"] == [2, 4, 6]
    weights = lambda net: torch.cat([p.flatten() for p in net.parameters()])  # noqa: E731
    assert torch.equal(weights(plain.net), weights(last.net))          # snapshots change nothing in training
    assert torch.equal(weights(ens.net.members[-1]), weights(last.net))
    assert not torch.equal(weights(ens.net.members[0]), weights(last.net))
    # the safest-rate vote never reserves less than the last weights alone, observation by observation
    obs = np.random.default_rng(0).uniform(0, 2, (64, ens.observation_space.shape[0])).astype(np.float32)
    for o in obs:
        assert (ens.action_indices(o) >= last.action_indices(o)).all()
        assert ens.decide(o)[0].action == [int(a) for a in ens.action_indices(o)]
    # a policy folder whose metadata disagrees with its weights is refused, naming the file
    import json

    meta_file = tmp_path / "ens" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    for ensemble, match in (({"members": 2, "vote": "median"}, "weights do not fit"),
                            ({"members": 3, "vote": "min"}, "vote must be"),
                            ({"members": 0, "vote": "median"}, "members 0 < 1")):
        meta_file.write_text(json.dumps({**meta, "ensemble": ensemble}))
        with pytest.raises(ValueError, match=match):
            OversubPolicy.load(tmp_path / "ens")
    assert main(tiny + ["--ensemble", "4", "--ensemble-every", "2"]) == 2       # a member before episode 1
    assert "needs more than 6 episodes" in capsys.readouterr().err


def test_an_ensemble_needs_its_snapshots_inside_the_run_and_excludes_validation(capsys):
    from agents.oversubscription.train import ensemble_episodes, main

    assert ensemble_episodes(1800, 5, 100) == {1400, 1500, 1600, 1700, 1800}
    assert ensemble_episodes(10, 0, 100) == set()
    with pytest.raises(ValueError, match="more than 300 episodes"):
        ensemble_episodes(300, 4, 100)
    with pytest.raises(ValueError, match="vote one of"):
        ensemble_episodes(300, 2, 100, "min")
    assert main(["--setting", "tiny", "--episodes", "2", "--ensemble", "2", "--validate-every", "1"]) == 2
    assert "exclusive" in capsys.readouterr().err
    assert main(["--setting", "tiny", "--episodes", "2", "--ensemble", "-1"]) == 2
    assert "--ensemble out of range" in capsys.readouterr().err


@needs_data
def test_a_saved_ensemble_is_tested_under_another_vote_without_training_again(tmp_path, capsys):
    import json

    from agents.oversubscription.network import vote
    from agents.oversubscription.policy import OversubPolicy
    from agents.oversubscription.train import main

    run = tmp_path / "tiny-cold-a0.95-s1"
    assert main(["--setting", "tiny", "--episodes", "6", "--seed", "1", "--updates-per-episode", "2", "--quiet",
                 "--trace-seed", "0", "--ensemble", "3", "--ensemble-every", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    ens = OversubPolicy.load(run)
    safest = ens.with_vote("max")
    assert safest.net.how == "max" and ens.net.how == "median"          # a copy: the saved policy keeps its vote
    assert safest.training["ensemble"]["vote"] == "max" and ens.training["ensemble"]["vote"] == "median"
    assert safest.metadata()["ensemble"] == {"members": 3, "vote": "max"}
    obs = np.random.default_rng(1).uniform(0, 2, (32, ens.observation_space.shape[0])).astype(np.float32)
    import torch

    q = torch.stack([m.agent_q(torch.as_tensor(obs)) for m in ens.net.members])
    for i, o in enumerate(obs):
        assert safest.action_indices(o).tolist() == vote(q[:, i:i + 1], "max")[0].tolist()
    with pytest.raises(ValueError, match="single net"):
        OversubPolicy.load(run / "last-policy").with_vote("max")
    with pytest.raises(ValueError, match="vote must be"):
        ens.with_vote("min")

    mod = _benchmark("oversub_per_seed")
    assert mod.main(["--policies", str(tmp_path), "--case", "tiny-cold", "--seeds", "1", "--test-episodes", "2",
                     "--votes", "median,max"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["vote"] for r in rows] == ["median", "max"] and all(r["kept"] for r in rows)
    assert rows[0]["s_cores"] >= rows[1]["s_cores"]       # the highest rates reserve the most
    assert mod.main(["--policies", str(tmp_path), "--case", "tiny-cold", "--seeds", "1", "--test-episodes", "2"]) == 0
    plain = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (plain["vote"], plain["pm_hot_r"], plain["s_cores"]) == ("median", rows[0]["pm_hot_r"], rows[0]["s_cores"])
    (tmp_path / "single").mkdir()
    (run / "last-policy").rename(tmp_path / "single" / "tiny-cold-a0.95-s1")
    with pytest.raises(SystemExit):
        mod.main(["--policies", str(tmp_path / "single"), "--case", "tiny-cold", "--seeds", "1",
                  "--test-episodes", "2", "--votes", "max"])
    assert "single net" in capsys.readouterr().err


@needs_data
def test_the_anchor_choice_keeps_by_the_validation_week_alone_and_tests_the_kept_one(tmp_path, capsys):
    """benchmarks/oversub_choose_anchor.py: per (alpha, seed) the rule of choose_checkpoint over the
    candidates' validation-week figures; only the kept one is tested held apart unless --test all."""
    import json

    from agents.oversubscription.train import main as train_main

    mod = _benchmark("oversub_choose_anchor")
    for name, anchor in (("loose", "2,24,1.0"), ("strict", "2,24,4.0")):
        assert train_main(["--setting", "tiny", "--episodes", "3", "--seed", "1", "--updates-per-episode", "2",
                           "--quiet", "--action", "headroom", "--anchor", anchor,
                           "--out", str(tmp_path / name / "tiny-cold-a0.95-s1")]) == 0
    capsys.readouterr()
    base = ["--case", "tiny-cold", "--alphas", "0.95", "--seeds", "1", "--validation-episodes", "2",
            "--test-episodes", "2", "--candidate", f"loose={tmp_path / 'loose'}",
            "--candidate", f"strict={tmp_path / 'strict'}"]
    assert mod.main(base) == 0
    row, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    history = [c["validation"] for c in row["candidates"]]
    assert row["kept"] == row["candidates"][choose_checkpoint(history, 0.95)]["candidate"]
    tested = [c["candidate"] for c in row["candidates"] if "held_apart" in c]
    assert tested == [row["kept"]]
    kept = next(c for c in row["candidates"] if c["candidate"] == row["kept"])
    assert summary["s_cores_pct"][0] == round(kept["held_apart"]["s_cores"] * 100, 1)
    assert summary["met"] == f"{int(kept['held_apart']['met'])} of 1"
    assert mod.main(base + ["--test", "all"]) == 0
    again = json.loads(capsys.readouterr().out.splitlines()[0])
    assert all("held_apart" in c for c in again["candidates"])
    assert [c["validation"] for c in again["candidates"]] == history          # seeded: the same figures
    with pytest.raises(SystemExit):
        mod.main(base + ["--seeds", "2"])                                      # no such policy: refused
    assert "no policy" in capsys.readouterr().err
