"""benchmarks/microservice_testbed_pool.py: the recorded real-container runs pooled per method and load."""
from __future__ import annotations

import json
import statistics

import pytest


@pytest.fixture(scope="module")
def pool_mod():
    from benchmark_script import load_benchmark

    return load_benchmark("microservice_testbed_pool")


def _intel_runs(runs):
    """(method, users) -> the recorded runs of that method and load on the Intel machine (the burst runs'
    machine)."""
    return lambda method, users: [r for r in runs if r.method == method and r.users == users
                                  and r.machine == "intel"]


def _run(mod, method, users, seed, cores, viol, session="s", seconds=600):
    return mod.Run(session=session, method=method, users=users, seed=seed, seconds=seconds,
                   mean_cores=cores, violating_seconds=viol)


def test_pool_takes_the_runs_mean_population_std_and_total_rate(pool_mod):
    runs = [_run(pool_mod, "a", 6, 0, 0.6, 3), _run(pool_mod, "a", 6, 1, 0.8, 1),
            _run(pool_mod, "b", 6, 0, 1.0, 0)]
    p = pool_mod.pool(runs)
    a = p[("a", 6)]
    assert (a.runs, a.violating_seconds, a.seconds) == (2, 4, 1200)
    assert a.cores_mean == pytest.approx(0.7) and a.cores_std == pytest.approx(0.1)
    assert a.rate == pytest.approx(4 / 1200)
    assert p[("b", 6)].cores_std == 0.0


def test_the_rate_test_is_the_exact_conditional_binomial(pool_mod):
    # 3 against 1 in equal times: Binomial(4, 1/2); the outcomes as unlikely as 3 are 0, 1, 3, 4: 10/16
    assert pool_mod.rate_test(3, 600, 1, 600) == pytest.approx(10 / 16)
    assert pool_mod.rate_test(0, 600, 0, 600) == 1.0
    # far apart: significant
    assert pool_mod.rate_test(30, 3600, 2, 3600) < 0.001


def test_compare_needs_fewer_cores_and_no_higher_rate(pool_mod):
    cheap_safe = [_run(pool_mod, "m", 6, s, 0.5 + 0.01 * s, 1) for s in range(3)]
    base = [_run(pool_mod, "b", 6, s, 0.7 + 0.01 * s, 5) for s in range(3)]
    c = pool_mod.compare(cheap_safe, base)
    assert c["met_pooled"] and c["cores_ratio"] < 1 and c["rate_ratio"] == pytest.approx(0.2)
    assert c["cores_p_welch"] < 0.01
    cheap_unsafe = [_run(pool_mod, "m", 6, s, 0.5 + 0.01 * s, 9) for s in range(3)]
    assert not pool_mod.compare(cheap_unsafe, base)["met_pooled"]


def test_same_session_pairs_match_session_and_seed(pool_mod):
    runs = [_run(pool_mod, "m", 6, 0, 0.5, 1, session="1"), _run(pool_mod, "b", 6, 0, 0.6, 1, session="1"),
            _run(pool_mod, "m", 6, 1, 0.5, 2, session="1"), _run(pool_mod, "b", 6, 1, 0.6, 1, session="1"),
            _run(pool_mod, "m", 6, 0, 0.5, 0, session="2"),              # no partner in its session
            _run(pool_mod, "b", 14, 0, 0.4, 0, session="1")]             # another load
    assert pool_mod.same_session_pairs(runs, "m", "b", 6) == (1, 2)


@pytest.mark.parametrize("method, baselines, six_users, fourteen_users", [
    # docs/microservice-cores.md: five of eleven pairs against AutoScale (session 76 added a failed
    # 14-user pair), one of five against the live Sinan
    ("reclaimer+window5", ("autoscale", "sinan-live"), [(3, 5), (0, 3)], [(2, 6), (1, 2)]),
    # docs/microservice-testbed.md, "More pairs with the burst (session 79)": with a CFS burst on every
    # container, five of seven against AutoScale and two of six against the live-fitted Sinan-style model
    ("reclaimer+window5+burst1", ("autoscale+burst1", "sinan-live+burst1"), [(4, 5), (1, 4)], [(1, 2), (1, 2)]),
])
def test_the_recorded_runs_give_the_documented_pair_counts(pool_mod, method, baselines, six_users, fourteen_users):
    runs = pool_mod.load_runs()
    assert [pool_mod.same_session_pairs(runs, method, b, 6) for b in baselines] == six_users
    assert [pool_mod.same_session_pairs(runs, method, b, 14) for b in baselines] == fourteen_users


def test_the_policy_retrained_with_the_burst_is_not_ahead_pooled(pool_mod):
    """docs/microservice-testbed.md, "The policy retrained with the burst, on real containers (session
    80)": fewer cores than the live-fitted Sinan-style model at 6 users, at 3.6 times its violation
    rate, and more cores at 14 users; so, pre-declared, not shipped."""
    runs = pool_mod.load_runs()
    method, sinan = "reclaimer-burst+window5+burst1", "sinan-live+burst1"
    assert [pool_mod.same_session_pairs(runs, method, sinan, u) for u in (6, 14)] == [(0, 1), (0, 1)]
    assert [pool_mod.same_session_pairs(runs, method, "autoscale+burst1", u) for u in (6, 14)] == [(1, 1), (1, 1)]
    of = _intel_runs(runs)

    def cores(m: str, users: int) -> float:
        return statistics.mean(r.mean_cores for r in of(m, users))

    def rate(m: str, users: int) -> float:
        return sum(r.violating_seconds for r in of(m, users)) / sum(r.seconds for r in of(m, users))

    assert cores(method, 6) < cores(sinan, 6) and rate(method, 6) > 3 * rate(sinan, 6)
    assert cores(method, 14) > cores(sinan, 14) and cores(method, 14) > cores("reclaimer+window5+burst1", 14)


def test_the_three_second_window_meets_the_real_container_target_pooled(pool_mod):
    """docs/microservice-testbed.md, "A 3-s window with the burst (session 81)": by the pre-declared rule,
    pooled over every burst run on the Intel machine, the shipped policy behind a 3-s window holds fewer
    mean cores than AutoScale and than the live-fitted Sinan-style model at a violation rate no higher,
    at 6 and at 14 users; at 6 users its lead over the model is under 2 % of cores, within the noise.
    Session 87 added two pre-declared pairs at 6 users ("Two more pairs at 6 users"), both met."""
    runs = pool_mod.load_runs()
    method = "reclaimer+window3+burst1"
    of = _intel_runs(runs)

    assert [len(of(method, u)) for u in (6, 14)] == [9, 4]
    for users in (6, 14):
        for baseline in ("autoscale+burst1", "sinan-live+burst1"):
            c = pool_mod.compare(of(method, users), of(baseline, users))
            assert c["met_pooled"], (users, baseline, c)
    close = pool_mod.compare(of(method, 6), of("sinan-live+burst1", 6))
    assert 0.98 < close["cores_ratio"] < 1 and close["cores_p_welch"] > 0.05
    assert sum(r.violating_seconds for r in of(method, 14)) == 0
    # the same session's pairs against the model at 6 users: session 81's seed 13 met, seed 14 not (1.5 % more
    # cores); session 87's seeds 19 and 20 met
    assert pool_mod.same_session_pairs(runs, method, "sinan-live+burst1", 6) == (3, 4)


def test_the_two_second_window_is_not_ahead_of_the_three_second_one_pooled(pool_mod):
    """docs/microservice-testbed.md, "A 2-s window with the burst (session 82)": pre-declared, not met; at
    6 users no fewer cores than the model or the 3-s window, at a higher violation rate than both, and at
    14 users slow seconds where both baselines have none."""
    runs = pool_mod.load_runs()
    method, sinan, w3 = "reclaimer+window2+burst1", "sinan-live+burst1", "reclaimer+window3+burst1"
    of = _intel_runs(runs)

    assert [len(of(method, u)) for u in (6, 14)] == [4, 2]
    for users in (6, 14):
        assert not pool_mod.compare(of(method, users), of(sinan, users))["met_pooled"], users
    six = pool_mod.compare(of(method, 6), of(w3, 6))
    assert six["cores_ratio"] > 1 and not six["met_pooled"]
    assert sum(r.violating_seconds for r in of(method, 14)) > 0
    assert sum(r.violating_seconds for r in of(sinan, 14)) == 0


def test_a_bad_row_is_named(pool_mod, tmp_path):
    f = tmp_path / "runs.csv"
    f.write_text("# comment\nsession,method,users,seed,seconds,mean_cores,violating_seconds,machine\n"
                 "1,a,6,0,600,0.7,3,amd\n1,a,6,1,600,0.7,700,amd\n")
    with pytest.raises(ValueError, match="data row 2"):
        pool_mod.load_runs(f)
    f.write_text("session,method,users,seed,seconds,mean_cores,violating_seconds\n1,a,six,0,600,0.7,3\n")
    with pytest.raises(ValueError, match="data row 1"):
        pool_mod.load_runs(f)


def test_a_testbed_summary_joins_under_its_label(pool_mod, tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"users": 6, "seed": 9, "known_latency_seconds": 598, "violation_seconds": 2,
         "total_cores": {"mean": 0.61, "max": 1.5}}))
    r = pool_mod.run_from_summary("mine", tmp_path)
    assert (r.method, r.users, r.seconds, r.violating_seconds, r.mean_cores) == ("mine", 6, 598, 2, 0.61)
    out = tmp_path / "pool.json"
    assert pool_mod.main(["--summary", f"mine={tmp_path}", "--method", "mine", "--baselines", "autoscale",
                          "--users", "6", "--json", str(out)]) == 0
    got = json.loads(out.read_text())["comparisons"]
    assert len(got) == 1 and got[0]["baseline"] == "autoscale" and got[0]["pairs"] == 0
    assert "| mine | 6 | 1 | 0.610 ± 0.000 | 2 / 598 |" in capsys.readouterr().out
