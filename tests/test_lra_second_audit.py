"""Second audit of LRA placement's live path: the guard's view of the cluster, /plan's planners at
the edges of what they can tabulate or solve, `samm place` with the learned planner (slots, apps),
concurrent /plan requests that need a forest not yet loaded, a HOME where the forest cannot be
cached, and the accuracy study's command line."""
import functools
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fastapi.testclient import TestClient

from agents.lra_placement import hosting, predictor as predictor_module
from agents.lra_placement.cluster import Cluster, Constraints, Rule
from agents.lra_placement.guard import fits_node
from agents.lra_placement.network import NodeScorer
from agents.lra_placement.optimum import plan_optimum
from agents.lra_placement.place import run_place
from agents.lra_placement.policy import PlacementPolicy
from agents.lra_placement.predictor import SyntheticInterference
from agents.lra_placement.reinforce import ReinforceConfig
from samm.execute.chain import GuardContext, Wish, run_chain
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app

APPS = tuple(f"app{i}" for i in range(7))


# --- the guard step's snapshot ------------------------------------------------------------------
@pytest.mark.parametrize("count", [np.nan, -5, 2.5, np.inf])
def test_guard_refuses_a_snapshot_that_is_not_container_counts(count):
    # NaN was cast to int64's minimum and -5 freed slots: either way the 3-slot node took 5 more
    cluster = Cluster(2, 3, ("n0", "n1"))
    snapshot = np.array([[count, 0], [0, 0]], dtype=np.float64)
    with pytest.raises(ValueError, match=r"^placement\[0, 0\]: .* is not a whole number of containers >= 0$"):
        fits_node(cluster, Constraints.none(2), snapshot)


@pytest.mark.parametrize("shape, rules, match", [
    ((1, 2), (), r"^placement: shape \(1, 2\) is not the cluster's nodes x the rules' apps \(2, 2\)$"),
    ((2, 3), (), r"^placement: shape \(2, 3\)"),
    ((2, 2), (Rule(0, 2, "anti-affinity"),), r"^constraints: rule .* names an app outside 0\.\.1$"),
])
def test_guard_refuses_a_snapshot_of_another_cluster(shape, rules, match):
    # these failed with an IndexError on the first wish for the missing node or app
    with pytest.raises(ValueError, match=match):
        fits_node(Cluster(2, 3, ("n0", "n1")), Constraints(2, rules), np.zeros(shape, dtype=np.int64))


def test_guard_with_a_valid_float_snapshot_still_decides():
    step = fits_node(Cluster(2, 3, ("n0", "n1")), Constraints.none(2), np.array([[2.0, 0.0], [0.0, 0.0]]))
    res = run_chain([Wish("n0", {1: 2}), Wish("n0", {1: 1})], [step], GuardContext(0.0, "k"))
    assert [(s.target, s.reason) for s in res.skipped] == [("n0", "node_full")]
    assert [w.data["composition"] for w in res.kept] == [[2, 1]]


# --- /plan at the edges of its planners -----------------------------------------------------------
@pytest.fixture(scope="module")
def client20():
    """A policy hosted for 20 slots with its own (data-free) model: /plan needs no forest."""
    torch.manual_seed(0)
    policy = PlacementPolicy(NodeScorer(ReinforceConfig().scorer_config(7)), APPS, 9, 20,
                             SyntheticInterference(n_apps=7, slots=20), version="audit-2")
    reg = PolicyRegistry()
    reg.host("lra", policy)
    return TestClient(create_app(reg, token="tok"), raise_server_exceptions=False)


def _big_batch(planner):
    return {"nodes": [f"n{i}" for i in range(9)], "slots": 20, "batch": {a: 20 for a in APPS}, "planner": planner}


def test_plan_optimum_past_its_compositions_is_a_422_naming_the_planner(client20):
    # 20 of each of 7 apps on 20 slots: 888,030 compositions, past the integer program's 500,000;
    # the planner's ValueError was a bare 500 "Internal Server Error"
    r = client20.post("/v1/agents/lra/plan", json=_big_batch("optimum"))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("planner: optimum would solve over 888,030 node compositions") and "\n" not in detail
    assert client20.post("/v1/agents/lra/plan", json=_big_batch("greedy-ls")).status_code == 200  # as suggested


def test_plan_with_the_policy_past_its_table_is_a_422_naming_slots(client20):
    # the policy tabulates at most 400,000 compositions (17 slots for 7 apps); 18-20 slots passed
    # the service's check and failed in the network with a bare 500
    r = client20.post("/v1/agents/lra/plan", json=_big_batch("policy"))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("slots: 20 slots per node make 888,030 compositions of 7 apps") and "\n" not in detail
    assert "at most 17 slots" in detail


# --- samm place with the learned planner ----------------------------------------------------------
def test_place_with_the_policy_past_its_table_names_the_cluster_file(tmp_path):
    spec = {"nodes": ["n1", "n2", "n3"], "slots": 18, "apps": [{"name": a, "image": "busybox"} for a in APPS]}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    batch = tmp_path / "batch.csv"
    batch.write_text("app,count\napp0,3\n")
    # was "480700 compositions of 7 apps in 18 slots is too many to tabulate", after fitting
    with pytest.raises(ValueError, match=r"cluster\.yaml: slots: 18 slots per node make 480,700 compositions .* "
                                         r"at most 17 slots"):
        run_place(cluster, batch, tmp_path / "out", planner="lra-reinforce", predictor="synthetic")
    assert not (tmp_path / "out").exists()


def test_place_with_the_policy_and_another_number_of_apps_names_the_cluster_file(tmp_path):
    # `lra-reinforce` (the CLI's default) places exactly its policy's 7 apps: a 2-app file failed after
    # the forest was fit with "the batch has 2 apps, the policy 7", naming neither file nor key
    spec = {"nodes": ["n1", "n2"], "slots": 4, "apps": [{"name": "web", "image": "nginx"},
                                                        {"name": "db", "image": "redis"}]}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    batch = tmp_path / "batch.csv"
    batch.write_text("app,count\nweb,3\n")
    with pytest.raises(ValueError, match=r"cluster\.yaml: apps: planner lra-reinforce is a policy for exactly 7 apps, "
                                         r"the file lists 2; .* greedy-ls$"):
        run_place(cluster, batch, tmp_path / "out", planner="lra-reinforce", predictor="synthetic")
    assert not (tmp_path / "out").exists()


def test_place_when_the_optimum_runs_out_of_time_is_a_one_line_error(tmp_path):
    # HiGHS stopped by its time limit without a plan (120 s by default; 0 here) raised a TimeoutError,
    # which `samm place` printed as a traceback
    spec = {"nodes": ["n1", "n2", "n3"], "slots": 8, "apps": [{"name": a, "image": "busybox"} for a in APPS]}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    batch = tmp_path / "batch.csv"
    batch.write_text("app,count\napp0,5\napp1,4\n")
    planner = functools.partial(plan_optimum, time_limit_s=0.0)
    planner.__name__ = "optimum"
    with pytest.raises(ValueError, match=r"^planner 'optimum' gave up: HiGHS found no placement within 0\.0 s .*"
                                         r"; try greedy-ls$"):
        run_place(cluster, batch, tmp_path / "out", planner=planner, predictor="synthetic")
    assert not (tmp_path / "out").exists()


# --- concurrent /plan requests and the forest -----------------------------------------------------
def test_concurrent_requests_for_a_new_slot_count_fit_one_forest(tmp_path, monkeypatch):
    # /plan runs in the server's thread pool: each request for a slot count not yet loaded fit its own
    # forest at the same time (4 requests: 16 s and 4 copies instead of 7 s and one)
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty table cache: every request must fit
    monkeypatch.setattr(predictor_module, "_FOREST_BY_SLOTS", {})
    assert not (Path.home() / ".cache").exists()

    class NoModel:  # a hosted policy without its own model for this slot count
        predictor, slots = None, 8

    got, errors = [], []

    def ask():
        try:
            got.append(hosting.predictor_for(NoModel(), 1))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == 3 and all(p is got[0] for p in got)


# --- the accuracy study's command line -------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--trees", "0"], "--trees must be >= 1, got 0"),
    (["--per-app-ratio", "nan"], "--per-app-ratio must be a training fraction between 0 and 1, got nan"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--out", "/nonexistent/folder/fig.png"], "--out: folder /nonexistent/folder does not exist"),
    (["--data", "/nonexistent/metis.npz"], "--data: FileNotFoundError: Metis co-location data not found"),
    (["--data", str(Path(__file__).parents[1] / "README.md")], "--data: UnpicklingError: Failed to interpret file"),
])
def test_validation_cli_bad_arguments_are_one_line_usage_errors(args, message, capsys):
    # each was a traceback; --per-app-ratio nan, --seed -1 and --out only after the whole study had run
    from agents.lra_placement.validation import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in err and message in err


# --- a HOME where the forest's table cannot be cached ------------------------------------------------
@pytest.fixture
def home_not_a_folder(tmp_path, monkeypatch):
    """HOME is a file (a service user's HOME=/dev/null or a read-only one): the fitted table cannot be saved."""
    home = tmp_path / "home-file"
    home.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(predictor_module, "_FOREST_BY_SLOTS", {})
    return home


def test_place_with_an_uncachable_forest_plans_with_the_table_in_memory(tmp_path, home_not_a_folder, caplog):
    spec = {"nodes": ["n1", "n2"], "slots": 1, "apps": [{"name": a, "image": "busybox"} for a in APPS]}
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(spec))
    batch = tmp_path / "batch.csv"
    batch.write_text("app,count\napp0,1\n")
    # was a NotADirectoryError traceback from the CLI
    with caplog.at_level("WARNING"):
        run_place(cluster, batch, tmp_path / "out", planner="greedy")
    assert (tmp_path / "out").exists()
    assert "cannot cache the interference model in" in caplog.text and "kept in memory only" in caplog.text


def test_plan_with_an_uncachable_forest_still_plans(client20, home_not_a_folder):
    # was a bare "Internal Server Error" (text/plain) for every /plan on another slot count
    r = client20.post("/v1/agents/lra/plan", json={"nodes": ["a", "b"], "slots": 1, "batch": {"Redis": 1}})
    assert r.status_code == 200, r.text
    assert not (home_not_a_folder.is_dir())


def test_counting_compositions_on_a_huge_node_is_bounded_by_the_caps():
    """A node of 10^12 slots (a typo in a cluster file) allocated an object array of that size."""
    from agents.lra_placement.optimum import count_compositions, enumerate_compositions

    caps = np.array([3, 2, 4])
    assert count_compositions(10**12, caps) == count_compositions(9, caps) == len(enumerate_compositions(3, 9, caps))
    assert count_compositions(10**12, np.array([0, 0])) == 1  # only the empty composition


@pytest.mark.parametrize("nodes", [["a", ""], ["a", "  "]])
def test_plan_refuses_a_blank_node_name(client20, nodes):
    """A placement onto "" names no node a caller can act on."""
    r = client20.post("/v1/agents/lra/plan", json={"nodes": nodes, "slots": 8, "batch": {"Redis": 1}})
    assert r.status_code == 422 and r.json()["detail"] == "nodes: a node name may not be empty or blank", r.text
