"""microservice-cores: the headroom ceiling over a trained Reclaimer policy (ours, ceiling.py): the
action map's cap, the policy carrying it on every path, the rule that chooses it, the experiment's
row without it and the CLI verb."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from agents.microservice_cores.action_map import Ceiling, check_ceiling, cores_of
from agents.microservice_cores.control import MIN_CORES, AppLimits
from agents.microservice_cores.features import ROW, mean_used
from agents.microservice_cores.sac import Sac
from agents.microservice_cores.sim import MicroserviceSim
from agents.microservice_cores.topology import load_topology


def _policy(app="chain3", ceiling=None):
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.train import scaled_schedule, sim_config

    topo = load_topology(app)
    cfg = scaled_schedule(sim_config(n_envs=2, hidden=16), 1200)
    torch.manual_seed(0)
    sac = Sac(cfg.k * ROW + topo.n_services, cfg.k * ROW, topo.n_services, cfg)
    return ReclaimerPolicy(sac, topo, cfg, version="test-1", ceiling=ceiling)


def test_a_ceiling_caps_either_spaces_cores_at_its_multiple_of_the_base_use():
    caps = np.array([4.0, 2.0, 0.5])
    used = np.array([0.1, 1.0, 0.0])
    a = np.array([0.5, 0.5, 0.5])
    assert cores_of(a, used, caps, "cap", None) == pytest.approx([2.0, 1.0, 0.25])
    # 2 x use where that is lower; an idle service's base is the floor's, so 2 x MIN_CORES
    assert cores_of(a, used, caps, "cap", 2.0) == pytest.approx([0.2, 1.0, 2 * MIN_CORES])
    usage = cores_of(a, used, caps, "usage", None)
    assert cores_of(a, used, caps, "usage", 1.5) == pytest.approx(np.minimum(usage, 1.5 * np.maximum(used, MIN_CORES)))
    # a throttled service uses its whole limit: the ceiling still lets it grow
    assert cores_of([1.0], [0.4], [4.0], "cap", 2.0) == pytest.approx([0.8])
    # a controller that could not decide gets the cap, ceiling or not (the safe side)
    assert cores_of([np.nan, 0.5, 0.5], used, caps, "cap", 2.0)[0] == 4.0
    assert cores_of([0.0, 0.0, 0.0], used, caps, "cap", 1.0).min() >= MIN_CORES


def test_a_policy_keeps_its_ceiling_through_save_load_fork_and_decide(tmp_path):
    from agents.microservice_cores.policy import METADATA_FILE, ReclaimerPolicy

    pol = _policy(ceiling=1.5)
    pol.save(tmp_path / "p")
    again = ReclaimerPolicy.load(tmp_path / "p")
    assert again.ceiling == Ceiling(1.5) and again.fork().ceiling == Ceiling(1.5) and again.with_ceiling(None).ceiling is None
    topo = pol.topo
    lim = AppLimits(topo.service_names, topo.caps, topo.qos_ms)
    raw = pol.with_ceiling(None)
    for p in (pol, again, raw):
        p.reset(lim)
    sim = MicroserviceSim(topo, n_envs=1, seed=3)
    sim.reset(80)
    cores = topo.caps.copy()
    lowered = 0
    for _ in range(30):
        m = sim.step(cores[None]).measurement(0, topo.service_names)
        obs = pol.observe(m)
        got, want = again.act(m), raw.act(m)
        base = np.maximum(mean_used(obs[0], pol.cfg.k, topo.caps), MIN_CORES)
        assert np.all(got <= 1.5 * base + 1e-9) and np.all(got <= want + 1e-9)
        lowered += int(np.any(got < want - 1e-9))
        cores = got
    assert lowered > 0                      # the untrained actor asks for more than 1.5 x use
    decision, _ = again.decide(obs[0])
    assert decision.info["headroom_ceiling"] == 1.5
    assert decision.info["total_cores"] == pytest.approx(float(np.sum(again.cores(decision.action, obs[0]))), abs=1e-3)
    # a bad ceiling is refused by name, in code and in a saved file
    for bad in (0.5, True, "2", float("nan")):
        with pytest.raises(ValueError, match="headroom_ceiling"):
            pol.with_ceiling(bad)
    meta = json.loads((tmp_path / "p" / METADATA_FILE).read_text())
    meta["headroom_ceiling"] = 0.2
    (tmp_path / "p" / METADATA_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="malformed.*headroom_ceiling"):
        ReclaimerPolicy.load(tmp_path / "p")


def test_the_ceiling_is_the_smallest_h_that_is_clean_and_has_only_clean_larger_ones():
    from agents.microservice_cores.ceiling import choose_ceiling

    rates = {None: 0.0, 3.0: 0.0, 2.5: 0.0, 2.0: 0.001, 1.5: 0.0, 1.2: 0.3}   # 1.5 clean, 2.0 not
    seen = []

    def fake_eval(policy, topo, seeds):
        h = None if policy.ceiling is None else policy.ceiling.multiple
        seen.append(h)
        return {"mean_cores": 10.0 if h is None else h, "violation_rate": rates[h], "levels": {}}

    pol = _policy(ceiling=9.0)          # its own ceiling plays no part
    got = choose_ceiling(pol, pol.topo, seeds=[101], grid=[1.2, 3.0, 2.0, 2.5, 1.5, 2.0], evaluate_fn=fake_eval)
    assert got["ceiling"] == 2.5 and [r["ceiling"] for r in got["rows"]] == [3.0, 2.5, 2.0]
    assert seen == [None, 3.0, 2.5, 2.0]                                   # stops at the first that breaks QoS
    assert choose_ceiling(pol, pol.topo, [101], [1.5, 1.2], max_violation=0.5, evaluate_fn=fake_eval)["ceiling"] == 1.2
    # a margin raises the rule's H (every larger H of the grid was clean), never past the grid
    wide = choose_ceiling(pol, pol.topo, [101], [3.0, 2.5, 2.0], evaluate_fn=fake_eval, margin=0.3)
    assert (wide["rule_ceiling"], wide["ceiling"]) == (2.5, 2.8)
    assert choose_ceiling(pol, pol.topo, [101], [3.0, 2.5, 2.0], evaluate_fn=fake_eval, margin=1.0)["ceiling"] == 3.0
    with pytest.raises(ValueError, match="margin"):
        choose_ceiling(pol, pol.topo, [101], [3.0], evaluate_fn=fake_eval, margin=-0.1)
    rates[3.0] = 0.01
    assert choose_ceiling(pol, pol.topo, [101], [3.0, 2.5], evaluate_fn=fake_eval)["ceiling"] is None
    # a policy that breaks rare seconds itself: a value no worse than it counts as clean when asked
    rates.update({None: 0.001, 3.0: 0.0005, 2.5: 0.001, 2.0: 0.002})
    got = choose_ceiling(pol, pol.topo, [101], [3.0, 2.5, 2.0], evaluate_fn=fake_eval, no_worse_than_policy=True)
    assert got["ceiling"] == 2.5 and got["no_worse_than_policy"]
    assert choose_ceiling(pol, pol.topo, [101], [3.0, 2.5], evaluate_fn=fake_eval)["ceiling"] is None
    with pytest.raises(ValueError, match=">= 1"):
        choose_ceiling(pol, pol.topo, [101], [2.0, 0.5], evaluate_fn=fake_eval)


def test_the_cli_verb_chooses_a_ceiling_on_real_episodes_and_saves_the_policy_with_it(tmp_path):
    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.cli.main import cli

    _policy().save(tmp_path / "p")
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "q"),
                                 "--eval-seeds", "101-102", "--grid", "3,2,1.5", "--max-violations", "1"])
    assert r.exit_code == 0, r.output
    q = ReclaimerPolicy.load(tmp_path / "q")
    rec = q.training["ceiling"]
    assert q.ceiling == Ceiling(1.5) and q.version == "test-1+ceiling1.5"          # every H allowed: the smallest
    assert [row["ceiling"] for row in rec["rows"]] == [3.0, 2.0, 1.5] and rec["seeds"] == [101, 102]
    # the ceiling only lowers limits, so no row holds more cores than the policy without it
    assert all(row["mean_cores"] <= rec["without"]["mean_cores"] + 1e-9 for row in rec["rows"])
    assert [row["mean_cores"] for row in rec["rows"]] == sorted(row["mean_cores"] for row in rec["rows"])[::-1]
    bad = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "x"),
                                   "--grid", "2,0.5"])
    assert bad.exit_code == 2 and ">= 1" in bad.output and not (tmp_path / "x").exists()


def test_a_square_root_ceiling_caps_at_the_use_plus_beta_times_its_square_root(tmp_path):
    """u + β√u (square-root staffing): more relative headroom for a light service than for a busy one;
    saved as {"multiple", "sqrt"} (a plain multiple stays a number, the older form), reported by decide."""
    from agents.microservice_cores.policy import METADATA_FILE, ReclaimerPolicy

    caps = np.array([4.0, 4.0, 0.5])
    used = np.array([0.04, 1.0, 0.0])
    srs = check_ceiling({"sqrt": 0.1})
    assert srs == Ceiling(1.0, 0.1) and srs.to_json() == {"multiple": 1.0, "sqrt": 0.1} and srs.label() == "sqrt0.1"
    assert check_ceiling(srs.to_json()) == srs and check_ceiling(1.9).to_json() == 1.9 and check_ceiling(1.9).label() == "1.9"
    got = cores_of(np.ones(3), used, caps, "cap", srs)
    assert got == pytest.approx([0.04 + 0.1 * 0.2, 1.1, MIN_CORES + 0.1 * np.sqrt(MIN_CORES)])
    assert got[0] / used[0] > got[1] / used[1]                  # 1.5 x a light service's use, 1.1 x a busy one's
    for bad in ({"sqrt": -0.1}, {"sqrt": float("nan")}, {"multiple": 0.5}, {"beta": 0.1}, {}, "0.1"):
        with pytest.raises(ValueError, match="headroom_ceiling"):
            check_ceiling(bad)
    pol = _policy(ceiling={"sqrt": 0.2})
    pol.save(tmp_path / "p")
    assert json.loads((tmp_path / "p" / METADATA_FILE).read_text())["headroom_ceiling"] == {"multiple": 1.0, "sqrt": 0.2}
    again = ReclaimerPolicy.load(tmp_path / "p")
    assert again.ceiling == Ceiling(sqrt=0.2) and again.fork().ceiling == again.ceiling
    obs = np.zeros(pol.observation_space.shape, dtype=np.float32)
    decision, _ = again.decide(obs)
    assert decision.info["headroom_ceiling"] == {"multiple": 1.0, "sqrt": 0.2}


def test_the_square_root_rule_is_chosen_like_the_multiple_and_names_the_policy(tmp_path):
    from agents.microservice_cores.ceiling import SQRT_GRID, calibrated, choose_ceiling
    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.cli.main import cli

    rates = {None: 0.0, 0.3: 0.0, 0.2: 0.0, 0.1: 0.001, 0.05: 0.0}

    def fake_eval(policy, topo, seeds):
        b = None if policy.ceiling is None else policy.ceiling.sqrt
        assert policy.ceiling is None or policy.ceiling.multiple == 1.0
        return {"mean_cores": 1.0 + (b or 1.0), "violation_rate": rates[b], "levels": {}}

    pol = _policy(ceiling=1.5)
    got = choose_ceiling(pol, pol.topo, [101], [0.3, 0.2, 0.1, 0.05], evaluate_fn=fake_eval, rule="sqrt", margin=0.05)
    assert (got["rule"], got["rule_ceiling"], got["ceiling"]) == ("sqrt", 0.2, 0.25)
    out = calibrated(pol, got)
    assert out.ceiling == Ceiling(sqrt=0.25) and out.version == "test-1+ceilingsqrt0.25"
    assert out.training["ceiling"]["rule"] == "sqrt"
    assert SQRT_GRID[0] == 0.3 and min(SQRT_GRID) == 0.05 and len(set(SQRT_GRID)) == len(SQRT_GRID)
    with pytest.raises(ValueError, match="rule"):
        choose_ceiling(pol, pol.topo, [101], rule="cube", evaluate_fn=fake_eval)
    with pytest.raises(ValueError, match=">= 0"):
        choose_ceiling(pol, pol.topo, [101], [0.1, -0.1], rule="sqrt", evaluate_fn=fake_eval)
    # on real episodes, from the CLI: the policy is saved under the chosen β
    _policy().save(tmp_path / "p")
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "q"),
                                 "--rule", "sqrt", "--eval-seeds", "101", "--grid", "0.5,0.1", "--max-violations", "1"])
    assert r.exit_code == 0, r.output
    q = ReclaimerPolicy.load(tmp_path / "q")
    assert q.ceiling == Ceiling(sqrt=0.1) and q.version == "test-1+ceilingsqrt0.1"
    rows = q.training["ceiling"]["rows"]
    assert [row["ceiling"] for row in rows] == [0.5, 0.1] and rows[1]["mean_cores"] <= rows[0]["mean_cores"] + 1e-9


def test_the_experiment_reports_a_ceilinged_policy_beside_itself_without_the_ceiling(tmp_path):
    from agents.microservice_cores.experiment import run

    _policy(ceiling=1.5).save(tmp_path / "p")
    summary = run(tmp_path / "e", quick=True, progress=False, policy_dirs={"chain3": tmp_path / "p"},
                  methods=["autoscale", "reclaimer-no-ceiling", "reclaimer"])
    app = summary["apps"]["chain3"]
    assert list(app["overall"]) == ["reclaimer", "reclaimer-no-ceiling", "autoscale"]
    assert app["log"]["reclaimer_policy"]["headroom_ceiling"] == 1.5
    for row in app["levels"].values():
        assert row["reclaimer"]["mean_cores"] <= row["reclaimer-no-ceiling"]["mean_cores"] + 1e-9
    _policy().save(tmp_path / "p0")         # no ceiling: no second row
    plain = run(tmp_path / "e0", quick=True, progress=False, policy_dirs={"chain3": tmp_path / "p0"},
                methods=["reclaimer", "reclaimer-no-ceiling"])
    assert list(plain["apps"]["chain3"]["overall"]) == ["reclaimer"]


def test_training_under_a_ceiling_holds_the_fill_under_it_and_saves_it_with_the_policy(tmp_path):
    from dataclasses import replace

    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.sac import SacConfig
    from agents.microservice_cores.train import sim_config, train

    cfg = sim_config(n_envs=2, hidden=16, classifier_updates=5, replay=5_000, updates_per_step=1,
                     autoscale_steps=600, classifier_steps=0, total_steps=600)
    free = train("chain3", cfg, seed=0, progress=False)
    held = train("chain3", replace(cfg, headroom_ceiling=1.2), seed=0, out=tmp_path / "run", progress=False)
    # AutoScale's fill keeps 3.3-10 times the use; under the ceiling every limit is at most 1.2 times it
    assert held.log[0]["mean_cores"] < 0.6 * free.log[0]["mean_cores"]
    assert held.ceiling == Ceiling(1.2) and free.ceiling is None
    assert ReclaimerPolicy.load(tmp_path / "run" / "policy").ceiling == Ceiling(1.2)
    with pytest.raises(ValueError, match="headroom_ceiling"):
        SacConfig(headroom_ceiling=0.9)


def test_the_env_takes_a_ceiling_and_still_passes_gymnasium_check():
    from gymnasium.utils.env_checker import check_env

    from agents.microservice_cores.env import MicroserviceCoresEnv

    env = MicroserviceCoresEnv("chain3", episode_steps=20, warmup=3, headroom_ceiling=1.5)
    check_env(env, skip_render_check=True)
    env.reset(seed=0, options={"users": 60})
    obs, *_ = env.step(np.ones(env.M, dtype=np.float32))        # the caps asked, 1.5 x use given
    base = np.maximum(mean_used(obs, env.k, env.topo.caps), MIN_CORES)
    assert np.all(env.cores_of(np.ones(env.M)) <= 1.5 * base + 1e-9)
    with pytest.raises(ValueError, match="headroom_ceiling"):
        MicroserviceCoresEnv("chain3", headroom_ceiling=0.5)


def test_the_ceiling_probe_gives_a_per_service_ceiling_and_each_levels_floor(tmp_path, capsys):
    """benchmarks/reclaimer_ceiling_probe.py: a ceiling per service equal everywhere is the uniform
    ceiling; the descent only lowers a service's H while the validation stays clean and its cores fall;
    each level's floor is a clean H at or under the policy's."""
    from benchmark_script import load_benchmark

    from agents.microservice_cores.validation import evaluate

    bench = load_benchmark("reclaimer_ceiling_probe")
    # H 1.5, three grid steps above the floor (was 2.5): each level's scan is at most 4 evaluations,
    # not 14, in this call and in main's; the untrained actor breaks some levels at once and scans
    # others down, so both endings of a scan are still met (measured at seed 1)
    pol = _policy(ceiling=1.5)
    start = evaluate(pol, pol.topo, [1])
    assert evaluate(bench.per_service(pol, [1.5] * pol.topo.n_services), pol.topo, [1]) == start
    got = bench.descent(pol, [1], 1.5)
    assert set(got["ceilings"]) == set(pol.topo.service_names)
    assert all(bench.FLOOR <= h <= 1.5 for h in got["ceilings"].values())
    assert got["mean_cores"] <= start["mean_cores"]
    # the descent keeps only clean trials: unchanged, or clean where it lowered something (the untrained
    # actor here breaks a level at any H, so a check only under a clean start never ran)
    final = evaluate(bench.per_service(pol, list(got["ceilings"].values())), pol.topo, [1])
    if all(h == 1.5 for h in got["ceilings"].values()):
        assert final == start and got["mean_cores"] == start["mean_cores"]
    else:
        assert final["violation_rate"] == 0 and final["mean_cores"] == got["mean_cores"]
    floors = bench.level_floors(pol, [1], 1.5)
    assert len(floors) == 3 and all(f is None or bench.FLOOR <= f["ceiling"] <= 1.5 for f in floors.values())
    pol.save(tmp_path / "p")
    out = tmp_path / "probe.json"
    assert bench.main(["--app", "chain3", "--policy", str(tmp_path / "p"), "--seeds", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["users"] for r in report["where"]] and report["ceiling"] == 1.5 and "descent" not in report
    assert "| users | mean cores |" in capsys.readouterr().out
    assert bench.main(["--app", "chain3", "--policy", str(tmp_path / "missing")]) == 2


def test_a_ceiling_with_a_window_keeps_the_larger_mean_and_a_slow_second_lifts_it_for_its_hold():
    """A stateful ceiling (session 88): the base is the larger of the 5-s mean and the window's mean,
    and every service's ceiling is lifted for `hold` seconds after a second whose p99 reached
    `release` times the QoS target (that second's decision included)."""
    from agents.microservice_cores.action_map import CeilingMemory

    c = check_ceiling({"sqrt": 0.1, "window": 4, "release": 0.8, "hold": 2})
    assert c.stateful and not check_ceiling({"sqrt": 0.1}).stateful and c.label() == "sqrt0.1-w4-r0.8-h2"
    assert check_ceiling(c.to_json()) == c and c.to_json()["window"] == 4
    for bad in ({"window": 2.5}, {"window": -1}, {"release": -0.1}, {"hold": 1.5}, {"release": float("nan")}):
        with pytest.raises(ValueError, match="headroom_ceiling"):
            check_ceiling(bad)
    mem = CeilingMemory(c, n_envs=2, n_services=1)
    lifted = []
    for used, p99 in ((1.0, 0.5), (3.0, 0.5), (1.0, 0.9), (1.0, 0.5), (1.0, 0.5), (1.0, 0.5), (1.0, 0.5)):
        mem.push(np.array([[used], [used]]), np.array([p99, 0.0]))
        lifted.append(mem.lifted()[:, 0].tolist())
    assert lifted == [[False, False], [False, False], [True, False], [True, False], [True, False],
                      [False, False], [False, False]]
    # the window holds the last 4 seconds: mean 1.0 now, so a higher 5-s mean wins and a lower one does not
    assert mem.base(np.array([[2.0], [0.5]])).ravel() == pytest.approx([2.0, 1.0])
    # an unknown p99 is a slow second (lifting is the safe side)
    mem.push(np.ones((2, 1)), np.array([0.0, np.nan]))
    assert mem.lifted()[:, 0].tolist() == [False, True]
    # pinned: one service at its limit lifts its own ceiling for the hold, not its neighbour's
    pin = CeilingMemory(check_ceiling({"sqrt": 0.1, "window": 4, "pinned": 0.98, "hold": 1}), 1, 2)
    assert pin.ceiling.stateful and pin.ceiling.label() == "sqrt0.1-w4-p0.98-h1"
    states = []
    for used, limit in (([0.5, 1.0], [1.0, 1.0]), ([0.5, 0.5], [1.0, 1.0]), ([0.5, 0.5], [1.0, 1.0])):
        pin.push(np.array([used]), np.array([0.0]), np.array([limit]))
        states.append(pin.lifted()[0].tolist())
    assert states == [[False, True], [False, True], [False, False]]
    with pytest.raises(ValueError, match="headroom_ceiling"):
        check_ceiling({"pinned": 1.5})
    # cores_of: the memory's base, and no ceiling where it is lifted
    a, used, caps = np.ones((2, 1)), np.full((2, 1), 0.25), np.full((2, 1), 4.0)
    got = cores_of(a, used, caps, "cap", c, ceiling_base=np.full((2, 1), 1.0), lifted=np.array([[False], [True]]))
    assert got.ravel() == pytest.approx([1.1, 4.0])


def test_a_panic_puts_every_service_at_its_cap_for_its_seconds_after_a_violating_second():
    """`panic` P (session 92): after a second whose p99 reached the QoS target, the next P decisions
    give every service its cap; a second under the target (or of unknown latency, read as 0 in
    the observation) starts none, and a panic alone makes a ceiling stateful."""
    from agents.microservice_cores.action_map import CeilingMemory, check_memoryless
    from agents.microservice_cores.episode import run_episodes

    c = check_ceiling({"sqrt": 0.1, "window": 4, "release": 0.8, "hold": 2, "panic": 2})
    assert c.label() == "sqrt0.1-w4-r0.8-h2-panic2" and c.to_json()["panic"] == 2 and check_ceiling(c.to_json()) == c
    assert check_ceiling({"multiple": 1.5, "panic": 1}).stateful and "panic" not in check_ceiling({"sqrt": 0.1, "window": 4}).to_json()
    for bad in ({"panic": 1.5}, {"panic": -1}, {"panic": float("nan")}, {"panic": True}):
        with pytest.raises(ValueError, match="headroom_ceiling"):
            check_ceiling(bad)
    with pytest.raises(ValueError, match="a panic"):
        check_memoryless({"multiple": 1.5, "panic": 1}, "the env")
    mem = CeilingMemory(c, n_envs=2, n_services=1)
    states = []
    for p99 in (0.9, 1.0, 0.5, 0.5, 1.3, 0.99):
        mem.push(np.ones((2, 1)), np.array([p99, 0.0]))
        states.append(mem.panicking().tolist())
    assert states == [[False, False], [True, False], [True, False], [False, False], [True, False], [True, False]]
    a, used, caps = np.zeros((2, 2)), np.full((2, 2), 0.25), np.array([[4.0, 2.0], [4.0, 2.0]])
    got = cores_of(a, used, caps, "usage", c, panic=np.array([True, False]))
    assert got[0].tolist() == [4.0, 2.0] and (got[1] < 1.0).all()
    # in an episode: a jump of the load breaks seconds, and each next decision is every cap
    pol = _policy(ceiling={"multiple": 3.0, "panic": 1})
    topo = pol.topo
    lo, hi = topo.users
    ep = run_episodes(topo, None, lo, [3], steps=80, batch=pol.batch(), load_step=(40, hi))[0]
    slow = np.flatnonzero(ep.p99_ms >= topo.qos_ms)
    assert slow.size and slow.min() >= 40 and slow.max() < 79
    for t in slow:
        assert np.allclose(ep.cores[t + 1], topo.caps)
    after = [t for t in range(41, 80) if t - 1 not in set(slow)]
    assert not any(np.allclose(ep.cores[t], topo.caps) for t in after)
    same = run_episodes(topo, None, lo, [3], steps=80, batch=pol.with_ceiling({"multiple": 3.0}).batch(),
                        load_step=(40, hi))[0]
    first = slow.min()
    assert np.array_equal(ep.cores[:first + 1], same.cores[:first + 1])     # nothing changes before it
    assert not np.allclose(same.cores[first + 1], topo.caps)


def test_a_stateful_ceiling_is_the_same_on_the_batch_a_controller_and_a_rest_session(tmp_path):
    """One implementation on every path: E copies in one batch, a fork per copy acting second by
    second, and decide() carrying the memory as its state; the env and the trainer refuse it."""
    from agents.microservice_cores.env import MicroserviceCoresEnv
    from agents.microservice_cores.episode import run_episodes
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.sac import SacConfig

    shape = {"multiple": 1.2, "window": 10, "release": 0.5, "hold": 3, "pinned": 0.98, "panic": 1}
    pol = _policy(ceiling=shape)
    assert pol.stateful and not _policy(ceiling=1.5).stateful
    pol.save(tmp_path / "p")
    again = ReclaimerPolicy.load(tmp_path / "p")
    assert again.ceiling == check_ceiling(shape) and again.stateful
    topo = pol.topo
    batch = run_episodes(topo, None, 120, [5, 6], steps=40, batch=again.batch())
    forks = run_episodes(topo, lambda i: again.fork(), 120, [5, 6], steps=40)
    for b, f in zip(batch, forks):
        assert np.allclose(b.cores, f.cores, atol=1e-6)
    raw = run_episodes(topo, None, 120, [5, 6], steps=40, batch=again.with_ceiling(None).batch())
    assert sum(b.mean_cores for b in batch) < sum(r.mean_cores for r in raw)      # the ceiling binds
    # decide: the memory is the state, the same cores as a controller fed the same observations
    lim = AppLimits(topo.service_names, topo.caps, topo.qos_ms)
    ctl = again.fork()
    ctl.reset(lim)
    sim = MicroserviceSim(topo, n_envs=1, seed=9)
    sim.reset(120)
    cores, state = topo.caps.copy(), None
    for _ in range(15):
        m = sim.step(cores[None]).measurement(0, topo.service_names)
        cores = ctl.act(m)
        decision, state = again.decide(ctl._stack.observation()[0], state)
        assert decision.info["cores"] == pytest.approx(np.round(cores, 4), abs=2e-4)
    assert state is not None and state.seen == 10
    with pytest.raises(ValueError, match="a window, a release or a panic"):
        MicroserviceCoresEnv("chain3", headroom_ceiling=shape)
    with pytest.raises(ValueError, match="a window, a release or a panic"):
        SacConfig(headroom_ceiling=shape)


def test_the_fewest_cores_pick_and_a_shape_choose_a_ceiling_that_yields(tmp_path):
    from agents.microservice_cores.ceiling import calibrated, choose_ceiling
    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.cli.main import cli

    cores = {None: 5.0, 0.3: 4.0, 0.2: 3.5, 0.1: 3.7, 0.05: 3.9}
    shape = {"window": 60, "release": 0.8, "hold": 60}

    def fake_eval(policy, topo, seeds):
        c = policy.ceiling
        assert c is None or (c.window, c.release, c.hold) == (60, 0.8, 60)
        b = None if c is None else c.sqrt
        return {"mean_cores": cores[b], "violation_rate": 0.01 if b == 0.05 else 0.0, "levels": {}}

    pol = _policy()
    got = choose_ceiling(pol, pol.topo, [101], [0.3, 0.2, 0.1, 0.05], evaluate_fn=fake_eval, rule="sqrt",
                         shape=shape, pick="fewest", margin=0.01)
    assert (got["rule_ceiling"], got["ceiling"], got["pick"]) == (0.2, 0.21, "fewest")
    smallest = choose_ceiling(pol, pol.topo, [101], [0.3, 0.2, 0.1, 0.05], evaluate_fn=fake_eval, rule="sqrt",
                              shape=shape)
    assert smallest["rule_ceiling"] == 0.1
    out = calibrated(pol, got)
    assert out.ceiling == Ceiling(sqrt=0.21, window=60, release=0.8, hold=60)
    assert out.version == "test-1+ceilingsqrt0.21-w60-r0.8-h60" and out.training["ceiling"]["shape"] == shape
    assert "previous" not in out.training["ceiling"]
    # a ceiling replacing another keeps the old choice in the record, one level deep
    again = calibrated(calibrated(out, smallest), got)
    prev = again.training["ceiling"]["previous"]
    assert prev["version"] == "test-1+ceilingsqrt0.1-w60-r0.8-h60" and prev["rule_ceiling"] == 0.1
    assert prev["headroom_ceiling"]["sqrt"] == 0.1 and "previous" not in prev
    for bad in ({"window": -5}, {"beta": 1}):
        with pytest.raises(ValueError):
            choose_ceiling(pol, pol.topo, [101], [0.3], evaluate_fn=fake_eval, rule="sqrt", shape=bad)
    with pytest.raises(ValueError, match="pick"):
        choose_ceiling(pol, pol.topo, [101], [0.3], evaluate_fn=fake_eval, pick="cheapest")
    pol.save(tmp_path / "p")
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "q"),
                                 "--rule", "sqrt", "--eval-seeds", "101", "--grid", "0.5,0.2", "--max-violations", "1",
                                 "--pick", "fewest", "--window", "30", "--release", "0.9", "--hold", "20"])
    assert r.exit_code == 0, r.output
    q = ReclaimerPolicy.load(tmp_path / "q")
    assert (q.ceiling.window, q.ceiling.release, q.ceiling.hold) == (30, 0.9, 20) and q.stateful


def test_the_shipped_recipe_fills_what_the_command_line_leaves_out(tmp_path):
    from agents.microservice_cores.ceiling import DEFAULTS, RECIPES, resolve_options
    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.cli.main import cli

    assert resolve_options({}) == DEFAULTS and resolve_options({"rule": None}, "shipped") == RECIPES["shipped"]
    assert resolve_options({"release": 0.0, "window": 30}, "shipped") | {"release": 0.8, "window": 60} \
        == RECIPES["shipped"]                                          # a given option wins, even a 0
    with pytest.raises(ValueError, match="recipe"):
        resolve_options({}, "newest")
    _policy().save(tmp_path / "p")
    run = lambda out, *extra: CliRunner().invoke(cli, [                # noqa: E731
        "reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / out), "--recipe", "shipped",
        "--eval-seeds", "101", "--grid", "0.5,0.2", "--max-violations", "1", *extra])
    r = run("q")
    assert r.exit_code == 0, r.output
    q = ReclaimerPolicy.load(tmp_path / "q")
    rec = q.training["ceiling"]
    assert (q.ceiling.window, q.ceiling.release, q.ceiling.hold, q.ceiling.pinned, q.ceiling.panic) == (60, 0.8, 60, 0.0, 2)
    assert rec["rule"] == "sqrt" and rec["pick"] == "fewest" and rec["margin"] == 0.01
    assert q.ceiling.sqrt == pytest.approx(min(rec["rule_ceiling"] + 0.01, 0.5)) and "warning" not in r.output
    assert rec["no_worse_than_policy"] is False
    # one grid value from here on (the last --grid wins): these runs check the shape, not the pick
    r = run("x", "--release", "0", "--pinned", "0", "--no-worse-than-policy", "--grid", "0.5")   # without its release
    assert r.exit_code == 0 and "warning: without --release" in r.output
    x = ReclaimerPolicy.load(tmp_path / "x")
    assert x.ceiling.release == 0.0 and x.training["ceiling"]["no_worse_than_policy"] is True
    r = run("z", "--panic", "0", "--grid", "0.5")                     # the recipe without its panic
    assert r.exit_code == 0, r.output
    z = ReclaimerPolicy.load(tmp_path / "z")
    assert z.ceiling.panic == 0 and "panic" not in z.version and "panic" not in z.training["ceiling"]["shape"]
    assert q.version.endswith("-panic2") and rec["shape"]["panic"] == 2
    assert CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "w"),
                                    "--panic", "-1"]).exit_code == 2
    assert CliRunner().invoke(cli, ["reclaimer-ceiling", "--help"]).output.count("shipped") >= 1


def test_a_load_step_changes_the_users_mid_episode_and_the_benchmark_reports_each_jump():
    from agents.microservice_cores.autoscale import AutoScale
    from agents.microservice_cores.episode import run_episodes
    from benchmarks.reclaimer_load_steps import jumps_of, methods_of, run

    topo = load_topology("chain3")
    lo, hi = topo.users
    ep = run_episodes(topo, lambda i: AutoScale(), lo, [1], steps=60, load_step=(30, hi))[0]
    assert ep.requests[35:].mean() > 2 * ep.requests[:30].mean()
    # a ramp spreads the change: halfway through it the load is about halfway
    ramp = run_episodes(topo, lambda i: AutoScale(), lo, [1], steps=100, load_step=(20, hi, 60))[0]
    before, middle, after = ramp.requests[:20].mean(), ramp.requests[45:55].mean(), ramp.requests[85:].mean()
    assert before < middle < after and abs(middle - (before + after) / 2) < 0.2 * (after - before)
    pol = _policy(ceiling={"multiple": 1.5, "window": 20, "release": 0.8, "hold": 20})
    methods = methods_of({"p": pol})
    assert list(methods) == ["p", "p-no-ceiling", "autoscale"]
    twin = pol.with_ceiling(Ceiling(multiple=2.0))                    # the same weights under another ceiling
    assert list(methods_of({"p": pol, "q": twin})) == ["p", "p-no-ceiling", "q", "autoscale"]
    other = _policy(ceiling={"multiple": 1.5})                       # other weights under the same version
    with torch.no_grad():
        next(other.agent.parameters()).add_(0.01)
    assert other.version == pol.version
    assert list(methods_of({"p": pol, "o": other})) == ["p", "p-no-ceiling", "o", "o-no-ceiling", "autoscale"]
    rows = run(topo, methods, [3], at=100, jumps=jumps_of(topo)[1:2])
    assert [r["method"] for r in rows] == ["p", "p-no-ceiling", "autoscale"]
    rows += run(topo, methods, [3], at=100, jumps=jumps_of(topo)[1:2], ramp=60)
    assert [r["ramp_s"] for r in rows] == [0, 0, 0, 60, 60, 60]
    for r in rows:
        assert (r["from"], r["to"]) == (lo, hi) and r["seconds"] == 300
        assert 0 <= r["violating_s_after_jump"] <= r["violating_s"] <= r["seconds"] and r["mean_cores"] > 0
        assert len(r["violating_s_by_second"]) == 5 and sum(r["violating_s_by_second"]) <= r["violating_s_after_jump"]
    # the reaction floor: the policy's own cores until the jump, every cap from the second after it
    floor = methods_of({"p": pol}, floor_at=100)
    assert list(floor) == ["p", "p+caps-after", "p-no-ceiling", "autoscale"]
    eps = {name: run_episodes(topo, None, lo, [3], batch=floor[name][0](), load_step=(100, hi))[0]
           for name in ("p", "p+caps-after")}
    own, capped = eps["p"].cores, eps["p+caps-after"].cores
    assert np.array_equal(own[:101], capped[:101])                   # the same policy until the jump's second
    assert np.allclose(capped[101:], topo.caps) and not np.allclose(own[101:], topo.caps)


def test_the_decide_route_keeps_a_stateful_ceilings_memory_per_session():
    """Over REST: a session's slow second lifts the ceiling for its hold on that session's next
    decision, while a call without a session starts from no memory (the ceiling applies)."""
    from fastapi.testclient import TestClient

    from agents.microservice_cores.features import LATENCY_COLUMN, USED_COLUMN
    from agents.microservice_cores.observation import P99_INDEX
    from samm.plan.registry import PolicyRegistry
    from samm.plan.service import create_app

    pol = _policy(ceiling={"multiple": 1.0, "release": 0.8, "hold": 2})
    reg = PolicyRegistry()
    reg.host("reclaimer", pol)
    client = TestClient(create_app(reg))
    k = pol.cfg.k
    obs = np.zeros(pol.observation_space.shape, dtype=np.float32)
    obs[:, [f * ROW + USED_COLUMN for f in range(k)]] = 0.05          # each service used 5 % of its cap
    slow = obs.copy()
    slow[:, (k - 1) * ROW + LATENCY_COLUMN + P99_INDEX] = 0.9          # the latest p99 at 0.9 x QoS

    def decide(o, session=None):
        body = {"observation": o.tolist(), **({"session_id": session} if session else {})}
        r = client.post("/v1/agents/reclaimer/decide", json=body)
        assert r.status_code == 200, r.text
        return np.array(r.json()["info"]["cores"])

    capped = decide(obs)
    assert capped == pytest.approx(0.05 * pol.topo.caps, abs=1e-3)    # at most 1 x the use
    lifted = decide(slow, "a")
    assert lifted.sum() > capped.sum() + 1e-3
    raw = np.array(pol.with_ceiling(None).decide(obs)[0].info["cores"])
    assert raw.sum() > capped.sum() + 1e-3                            # so "held" differs from "capped"
    assert decide(obs, "a") == pytest.approx(raw, abs=1e-3)           # held: the memory of session "a"
    assert decide(obs) == pytest.approx(capped, abs=1e-3)             # no session, no memory
    assert decide(obs, "b") == pytest.approx(capped, abs=1e-3)        # another session's own memory
    said = [client.post("/v1/agents/reclaimer/decide", json={"observation": obs.tolist(), **extra}).json()["memory"]
            for extra in ({}, {"session_id": "c"})]
    assert said == ["not kept", "session"]                            # the caller is told which it got
    # a panic over REST: a session's violating second gives its next decision every cap, and only its own
    reg.host("reclaimer", pol.with_ceiling({"multiple": 1.0, "panic": 1}))
    broke = obs.copy()
    broke[:, (k - 1) * ROW + LATENCY_COLUMN + P99_INDEX] = 1.2         # the latest p99 at 1.2 x QoS
    assert decide(broke, "p") == pytest.approx(pol.topo.caps, abs=1e-3)
    assert decide(obs, "p") == pytest.approx(capped, abs=1e-3)         # one second, then the ceiling again
    assert decide(obs, "q") == pytest.approx(capped, abs=1e-3)


def test_a_bound_on_the_relative_headroom_caps_only_the_lightly_used_services(tmp_path):
    """max_multiple H (ours, session 93): at most the smaller of u + β√u and H u, so the square root's
    relative headroom β/√u is bounded at H − 1 for the services below (β/(H − 1))² cores and no other
    limit moves; validated, saved, named, and chosen like the other rules as a second stage."""
    from agents.microservice_cores.ceiling import MAX_MULTIPLE_GRID, calibrated, choose_ceiling, make_ceiling
    from agents.microservice_cores.policy import ReclaimerPolicy
    from samm.cli.main import cli

    caps = np.array([4.0, 4.0, 4.0])
    used = np.array([0.01, (0.26 / 1.0) ** 2, 1.0])                  # light, at the edge, busy
    plain, bound = Ceiling(sqrt=0.26), Ceiling(sqrt=0.26, max_multiple=2.0)
    got = cores_of(np.ones(3), used, caps, "cap", bound)
    assert got == pytest.approx([0.02, 2 * used[1], 1.26])           # 2 x use, the edge (both equal), u + β√u
    assert got[2] == pytest.approx(cores_of(np.ones(3), used, caps, "cap", plain)[2])
    assert cores_of(np.ones(3), used, caps, "cap", plain)[0] == pytest.approx(0.01 + 0.026)
    assert bound.label() == "sqrt0.26-x2" and bound.to_json() == {"multiple": 1.0, "sqrt": 0.26, "max_multiple": 2.0}
    assert check_ceiling(bound.to_json()) == bound
    assert check_ceiling({"multiple": 1.5, "max_multiple": 0}) == Ceiling(1.5)
    for bad in ({"sqrt": 0.2, "max_multiple": 0.5}, {"sqrt": 0.2, "max_multiple": -1},
                {"sqrt": 0.2, "max_multiple": True}, {"sqrt": 0.2, "max_multiple": float("inf")}):
        with pytest.raises(ValueError, match="max_multiple"):
            check_ceiling(bad)
    shaped = check_ceiling({"sqrt": 0.26, "max_multiple": 2, "window": 60, "release": 0.8, "hold": 60,
                            "pinned": 0.98, "panic": 2})
    assert shaped.label() == "sqrt0.26-x2-w60-p0.98-r0.8-h60-panic2"
    # chosen on validation episodes as the other rules: β fixed in the shape, H scanned from the top
    with pytest.raises(ValueError, match="--sqrt"):
        make_ceiling("max-multiple", 2.0, {"window": 60})
    with pytest.raises(ValueError, match="scans"):
        make_ceiling("sqrt", 0.2, {"sqrt": 0.3})
    cores = {None: 5.0, 3.0: 4.0, 2.0: 3.6, 1.5: 3.5, 1.25: 3.7}

    def fake_eval(policy, topo, seeds):
        c = policy.ceiling
        assert c is None or c.sqrt == 0.26
        h = None if c is None else c.max_multiple
        return {"mean_cores": cores[h], "violation_rate": 0.01 if h == 1.25 else 0.0, "levels": {}}

    pol = _policy()
    got = choose_ceiling(pol, pol.topo, [101], [3.0, 2.0, 1.5, 1.25], evaluate_fn=fake_eval, rule="max-multiple",
                         shape={"sqrt": 0.26}, pick="fewest", margin=0.5)
    assert (got["rule_ceiling"], got["ceiling"]) == (1.5, 2.0)
    out = calibrated(pol, got)
    assert out.ceiling == Ceiling(sqrt=0.26, max_multiple=2.0) and out.version == "test-1+ceilingsqrt0.26-x2"
    assert MAX_MULTIPLE_GRID[0] == 3.0 and min(MAX_MULTIPLE_GRID) >= 1.0
    # from the CLI, on real episodes, over a policy that already has a ceiling: the record keeps it
    ReclaimerPolicy(pol.agent, pol.topo, pol.cfg, version="test-1", ceiling={"sqrt": 0.3}).save(tmp_path / "p")
    r = CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "q"),
                                 "--rule", "max-multiple", "--sqrt", "0.3", "--eval-seeds", "101", "--grid", "3,2",
                                 "--max-violations", "1", "--margin", "0"])
    assert r.exit_code == 0, r.output
    q = ReclaimerPolicy.load(tmp_path / "q")
    assert q.ceiling.sqrt == 0.3 and q.ceiling.max_multiple == 2.0 and q.version == "test-1+ceilingsqrt0.3-x2"
    assert CliRunner().invoke(cli, ["reclaimer-ceiling", "--policy", str(tmp_path / "p"), "--out", str(tmp_path / "w"),
                                    "--rule", "max-multiple", "--eval-seeds", "101"]).exit_code == 2
