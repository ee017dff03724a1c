"""Audit of LRA placement's live path (`samm place`, the orchestrator files, the service's /plan,
the guard step): bad input is a one-line error naming the file/field, never a crash or a hang;
the plan's files are written as one set; generated YAML reads the same in Go's parsers."""
import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from fastapi import HTTPException
from fastapi.testclient import TestClient

from agents.lra_placement import orchestrate
from agents.lra_placement.cluster import Cluster, Constraints, Rule
from agents.lra_placement.guard import fits_node
from agents.lra_placement.network import NodeScorer
from agents.lra_placement.place import run_place
from agents.lra_placement.policy import PlacementPolicy
from agents.lra_placement.predictor import SyntheticInterference
from agents.lra_placement.reinforce import ReinforceConfig
from agents.lra_placement.service import check_slots
from samm.cli.main import cli
from samm.execute.chain import GuardContext, Wish, run_chain
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app


def write_cluster(tmp_path: Path, **overrides) -> Path:
    spec = {"nodes": ["n1", "n2", "n3"], "slots": 4,
            "apps": [{"name": "web", "image": "nginx:1.25"}, {"name": "db", "image": "redis:7.2"}]}
    spec.update(overrides)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_file(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def place(tmp_path, batch, out="out", **kw):
    return run_place(kw.pop("cluster", None) or write_cluster(tmp_path), batch, tmp_path / out,
                     predictor="synthetic", **kw)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- input files --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text", [
    ("batch.csv", "app,count\nweb,99999999999999999999999\n"),
    ("batch.yaml", "web: 99999999999999999999999\n"),
])
def test_a_count_past_int64_is_the_capacity_error_not_an_overflow(tmp_path, name, text):
    with pytest.raises(ValueError, match=rf"{re.escape(name)}:\d: the batch exceeds the cluster's capacity of 12"):
        place(tmp_path, write_file(tmp_path, name, text))


def test_binary_input_files_are_errors_naming_the_file(tmp_path):
    junk = b"\xff\xfe\x00\x81binary"
    batch = write_file(tmp_path, "batch.csv", "app,count\nweb,1\n")
    for name in ("batch.bin.csv", "batch.bin.yaml"):
        with pytest.raises(ValueError, match=rf"{re.escape(name)}: not a UTF-8 text file"):
            place(tmp_path, write_file(tmp_path, name, junk))
    with pytest.raises(ValueError, match=r"cluster\.bin\.yaml: not a UTF-8 text file"):
        place(tmp_path, batch, cluster=write_file(tmp_path, "cluster.bin.yaml", junk))
    write_file(tmp_path, "rules.csv", junk)
    with pytest.raises(ValueError, match=r"rules\.csv: not a UTF-8 text file"):
        place(tmp_path, batch, cluster=write_cluster(tmp_path, constraints="rules.csv"))


def test_a_csv_field_past_the_csv_limit_names_the_file(tmp_path):
    huge = "w" * 200_000
    with pytest.raises(ValueError, match=r"batch\.csv: not a readable CSV file: field larger"):
        place(tmp_path, write_file(tmp_path, "batch.csv", f"app,count\n{huge},1\n"))
    write_file(tmp_path, "rules.csv", f"app_a,app_b,rule,limit\n{huge},db,anti-affinity,0\n")
    with pytest.raises(ValueError, match=r"rules\.csv: not a readable CSV file"):
        Constraints.from_csv(tmp_path / "rules.csv", ("web", "db"))


def test_a_short_constraints_row_names_the_line(tmp_path):
    write_file(tmp_path, "rules.csv", "app_a,app_b,rule,limit\nweb,db,anti-affinity,0\n\nweb,db\n")
    with pytest.raises(ValueError, match=r"rules\.csv:4: expected 4 fields app_a,app_b,rule,limit"):
        Constraints.from_csv(tmp_path / "rules.csv", ("web", "db"))


def test_a_constraints_csv_saved_by_a_spreadsheet_loads(tmp_path):
    # Excel writes a BOM and CRLF; the batch CSV already accepts them, the rules file must too.
    write_file(tmp_path, "rules.csv", "\ufeffapp_a,app_b,rule,limit\r\nweb,db,anti-affinity,0\r\n".encode())
    assert Constraints.from_csv(tmp_path / "rules.csv", ("web", "db")).rules == (Rule(0, 1, "anti-affinity", 0),)


def test_a_key_given_twice_in_the_cluster_file_is_an_error_not_a_silent_override(tmp_path):
    path = write_file(tmp_path, "cluster.yaml", "nodes: [n1, n2]\nslots: 4\napps:\n  - {name: web, image: nginx}\n"
                                                "slots: 2\napps:\n  - {name: db, image: redis}\n")
    with pytest.raises(ValueError) as info:
        place(tmp_path, write_file(tmp_path, "b.csv", "app,count\nweb,1\n"), cluster=path)
    assert str(info.value) == f"{path}:5: not valid YAML: key 'slots' appears twice (first at line 2)"


def test_yaml_batch_keys_are_app_names_as_written(tmp_path):
    # `2048` and `yes` are valid app names; as YAML keys they must not turn into 2048 and True
    cluster = write_cluster(tmp_path, apps=[{"name": "2048", "image": "game"}, {"name": "yes", "image": "y"}])
    result = place(tmp_path, write_file(tmp_path, "b.yaml", "2048: 2\nyes: 1\n"), cluster=cluster)
    assert result.placement.sum(axis=0).tolist() == [2, 1]


@pytest.mark.parametrize("nodes", ["0", "-3", "abc", "1.5"])
def test_serve_node_count_errors_name_the_parameter(nodes):
    res = CliRunner().invoke(cli, ["serve", "--agent", "lra-reinforce",
                                   "--agent-param", f"lra-reinforce:nodes={nodes}"])
    assert res.exit_code == 2, res.output
    assert f"nodes must be a whole number of nodes >= 1, got '{nodes}'" in res.output


def test_a_node_count_past_a_million_is_refused_before_planning(tmp_path):
    # 10^6 nodes cost 3.5 s and 356 MB; 10^9 (a typo's extra zeros) would exhaust the memory
    cluster = write_cluster(tmp_path, nodes=None, node_count=1_000_001)
    with pytest.raises(ValueError, match=r"invalid cluster file: node_count: Input should be less than or equal"):
        place(tmp_path, write_file(tmp_path, "b.csv", "app,count\nweb,1\n"), cluster=cluster, planner="greedy")
    assert not (tmp_path / "out").exists()


def test_negative_seed_is_an_error_naming_the_seed(tmp_path):
    batch = write_file(tmp_path, "batch.csv", "app,count\nweb,1\n")
    with pytest.raises(ValueError, match=r"^seed must be a non-negative integer"):
        place(tmp_path, batch, seed=-1)
    res = CliRunner().invoke(cli, ["place", "--cluster", str(write_cluster(tmp_path)), "--batch", str(batch),
                                   "--out", str(tmp_path / "o"), "--predictor", "synthetic", "--seed", "-1"])
    assert res.exit_code == 2 and "error: seed must be a non-negative integer" in res.output


def test_slots_past_what_can_be_tabulated_are_refused_before_fitting(tmp_path):
    # The forest and the learned planners tabulate every node composition: C(slots + 7, 7) rows,
    # 1.3e9 at 64 slots. Refused at once, naming the key, instead of running out of memory.
    batch = write_file(tmp_path, "batch.csv", "app,count\nweb,1\n")
    cluster = write_cluster(tmp_path, slots=21)
    with pytest.raises(ValueError, match=r"cluster\.yaml: slots: 21 slots per node .* at most 20 slots"):
        run_place(cluster, batch, tmp_path / "out", planner="greedy")  # the default (forest) predictor
    seven = write_cluster(tmp_path, slots=21, apps=[{"name": n, "image": "busybox"}
                                                    for n in ("web", "db", "c", "d", "e", "f", "g")])
    with pytest.raises(ValueError, match=r"slots: 21"):  # the policy tabulates its 7 apps
        run_place(seven, batch, tmp_path / "out", planner="lra-reinforce", predictor="synthetic")
    assert not (tmp_path / "out").exists()
    # a baseline with the data-free model tabulates nothing: many slots are fine there
    result = run_place(write_cluster(tmp_path, slots=64), batch, tmp_path / "ok", planner="greedy",
                       predictor="synthetic")
    assert result.n_containers == 1


# --- writing the plan -----------------------------------------------------------------------------
def test_out_that_cannot_be_a_folder_is_a_one_line_error(tmp_path):
    blocker = write_file(tmp_path, "a-file", "x")
    res = CliRunner().invoke(cli, ["place", "--cluster", str(write_cluster(tmp_path)),
                                   "--batch", str(write_file(tmp_path, "batch.csv", "app,count\nweb,1\n")),
                                   "--out", str(blocker / "plan"), "--planner", "greedy", "--predictor", "synthetic"])
    assert res.exit_code == 2, res.output
    assert "error: " in res.output and "a-file/plan" in res.output and "cannot write the plan files" in res.output
    assert not isinstance(res.exception, OSError)


def test_a_failed_write_leaves_the_previous_plan_whole(tmp_path):
    out = tmp_path / "out"
    place(tmp_path, write_file(tmp_path, "a.csv", "app,count\nweb,5\ndb,2\n"))
    (out / "docker-compose.yml").unlink()
    (out / "docker-compose.yml").mkdir()  # a target that cannot be written
    before = snapshot(out)
    with pytest.raises(ValueError, match=r"docker-compose\.yml: cannot write the plan files"):
        place(tmp_path, write_file(tmp_path, "b.csv", "app,count\ndb,1\n"))
    assert snapshot(out) == before  # plan.csv, summary.json and the manifests still the first plan's
    assert not [p for p in out.rglob(".*.tmp")]  # no staged file left behind


def test_rerun_keeps_foreign_binary_and_folder_entries_and_a_consistent_kustomization(tmp_path):
    out = tmp_path / "out"
    place(tmp_path, write_file(tmp_path, "a.csv", "app,count\nweb,5\ndb,2\n"))
    k8s = out / "kubernetes"
    (k8s / "aa-folder.yaml").mkdir()
    (k8s / "zz-blob.yaml").write_bytes(b"\xff\xfe\x00binary")
    result = place(tmp_path, write_file(tmp_path, "b.csv", "app,count\ndb,1\n"))
    names = sorted(p.name for p in k8s.iterdir())
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    ours = sorted(kustomization["resources"])
    assert names == sorted(["aa-folder.yaml", "zz-blob.yaml", "kustomization.yaml", *ours])  # stale ones gone
    assert len(ours) == 1 and ours[0].startswith("db-")
    assert (k8s / "zz-blob.yaml").read_bytes() == b"\xff\xfe\x00binary"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plan_id"] == result.plan_id and f"plan {result.plan_id}" in (k8s / ours[0]).read_text()
    with open(out / "plan.csv", newline="") as fh:
        assert [r["app"] for r in csv.DictReader(fh)] == ["db"]


# --- YAML that Go's parsers read the same -----------------------------------------------------------
class _Yaml12Loader(yaml.SafeLoader):
    """Resolves plain scalars as YAML 1.2 (and Go's yaml) do: `1e3` is a float, `0o17` an int."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"))
_Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7]+$"), list("-+0"))


def _strings(doc) -> list:
    if isinstance(doc, dict):
        return [v for k, val in doc.items() for v in [k, *_strings(val)]]
    if isinstance(doc, list):
        return [v for item in doc for v in _strings(item)]
    return [doc]


@pytest.fixture
def numeric_looking_plan(tmp_path):
    cluster = write_cluster(tmp_path, nodes=["123e4", "0o17", "n3"],
                            apps=[{"name": "web", "image": "nginx:1.25", "labels": {"build": "5e5"}}])
    run_place(cluster, write_file(tmp_path, "b.csv", "app,count\nweb,6\n"), tmp_path / "out", planner="round-robin",
              predictor="synthetic")
    return tmp_path / "out"


def test_numeric_looking_names_stay_strings_for_a_yaml_1_2_reader(numeric_looking_plan):
    out = numeric_looking_plan
    files = [out / "docker-compose.yml", *sorted((out / "kubernetes").glob("*.yaml"))]
    for path in files:
        values = _strings(yaml.load(path.read_text(), Loader=_Yaml12Loader))
        numbers = [v for v in values if isinstance(v, float) or (isinstance(v, int) and v in (123e4, 15, 5e5))]
        assert not numbers, f"{path.name}: {numbers} would not be strings in Go's YAML"
    # a plan id shaped like a number (0.4 % of 12-hex ids are digits, one 'e', digits) too
    item = orchestrate.Workload(name="web-n1", app="web", app_label="web", node="n1", count=1, image="nginx")
    text = orchestrate.kubernetes_texts([item], "1234567e8901")["web-n1.yaml"]
    doc = yaml.load(text, Loader=_Yaml12Loader)
    assert doc["metadata"]["labels"]["samm.io/plan"] == "1234567e8901"


def _kubectl_ok() -> bool:
    return shutil.which("kubectl") is not None


@pytest.mark.skipif(not _kubectl_ok(), reason="kubectl is not on PATH")
def test_kubectl_decodes_manifests_with_numeric_looking_node_names(numeric_looking_plan, tmp_path):
    # kubectl decodes a manifest before it needs a cluster: a label/annotation/affinity value that
    # Go's YAML reads as a number fails right there ("cannot unmarshal number ... of type string").
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    for path in sorted((numeric_looking_plan / "kubernetes").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        proc = subprocess.run([shutil.which("kubectl"), "create", "--dry-run=client", "--validate=false", "-o", "json",
                               "-f", str(path)], capture_output=True, text=True, timeout=60, env=env)
        assert "unable to decode" not in proc.stderr and "cannot unmarshal" not in proc.stderr, proc.stderr


def _docker_stack_config_ok() -> bool:
    if shutil.which("docker") is None:
        return False
    proc = subprocess.run(["docker", "stack", "config", "--help"], capture_output=True, text=True, timeout=60)
    return proc.returncode == 0


@pytest.mark.skipif(not _docker_stack_config_ok(), reason="the docker CLI with `docker stack config` is not on PATH")
def test_docker_stack_keeps_numeric_looking_labels_verbatim(numeric_looking_plan):
    proc = subprocess.run(["docker", "stack", "config", "-c", str(numeric_looking_plan / "docker-compose.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    nodes = {s["labels"]["samm.node"] for s in services.values()}
    assert nodes == {"123e4", "0o17", "n3"}  # not "1.23e+06" / 15
    assert {s["labels"]["build"] for s in services.values()} == {"5e5"}


# --- the service's /plan ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    torch.manual_seed(0)
    names = tuple(f"app{i}" for i in range(7))
    policy = PlacementPolicy(NodeScorer(ReinforceConfig().scorer_config(7)), names, 9, 8,
                             SyntheticInterference(n_apps=7, slots=8), version="audit-1")
    reg = PolicyRegistry()
    reg.host("lra", policy)
    return TestClient(create_app(reg, token="tok"))


def test_plan_refuses_slots_that_cannot_be_tabulated(client):
    # 21 slots: 1.2e6 compositions of 7 apps (without the check, ~30 s and 1.5 GB to fit and tabulate a
    # forest); 64 slots (the model's old bound): 1.3e9, measured to take the service past 22 GB, OOM-killed.
    r = client.post("/v1/agents/lra/plan", json={"nodes": ["a", "b"], "slots": 21, "batch": {"app0": 2},
                                                 "planner": "greedy"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("slots: 21 slots per node") and "at most 20 slots" in r.text
    with pytest.raises(HTTPException) as info:
        check_slots(64, 7)
    assert info.value.status_code == 422 and "1,329,890,705 compositions" in info.value.detail


def test_plan_for_another_slot_count_without_the_forest_data_names_slots(client, monkeypatch, tmp_path):
    # The policy's own model covers 8 slots; other counts need the forest, fit on the Metis data.
    monkeypatch.setenv("SAMM_SHARED_DIR", str(tmp_path / "no-shared"))
    r = client.post("/v1/agents/lra/plan", json={"nodes": ["a", "b"], "slots": 17, "batch": {"app0": 2}})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("slots: this service has no interference model for 17 slots")


@pytest.mark.parametrize("count", [True, "2", 2.5])
def test_plan_counts_must_be_json_integers(client, count):
    r = client.post("/v1/agents/lra/plan", json={"nodes": ["a", "b"], "batch": {"app0": count}})
    assert r.status_code == 422, r.text
    assert "batch.app0" in r.text


def test_plan_at_the_slot_limit_still_plans(client):
    r = client.post("/v1/agents/lra/plan", json={"nodes": ["a"], "slots": 8, "batch": {"app0": 2}, "seed": 3})
    assert r.status_code == 200, r.text


# --- the guard step -----------------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    {"web": 1}, {0: 1.7}, {0.5: 1}, {0: float("nan")}, {0: -1}, {True: 1}, [1, 2], None, 3,
])
def test_guard_skips_a_malformed_wish_and_keeps_deciding(change):
    cluster = Cluster(2, 3, ("n0", "n1"))
    rules = Constraints(2, (Rule(0, 1, "anti-affinity"),))
    step = fits_node(cluster, rules, np.array([[1, 0], [0, 0]]))
    res = run_chain([Wish("n0", change), Wish("n1", {1: 2})], [step], GuardContext(0.0, "k"))
    assert [(s.target, s.reason) for s in res.skipped] == [("n0", "invalid")]
    assert [(w.target, w.data["composition"]) for w in res.kept] == [("n1", [0, 2])]


def test_guard_refuses_a_huge_count_as_node_full_not_an_overflow():
    step = fits_node(Cluster(2, 3, ("n0", "n1")), Constraints.none(2), np.zeros((2, 2), dtype=np.int64))
    res = run_chain([Wish("n0", {0: 2**70}), Wish("n1", {0: 1})], [step], GuardContext(0.0, "k"))
    assert [(s.target, s.reason) for s in res.skipped] == [("n0", "node_full")]
    assert [w.target for w in res.kept] == ["n1"]


def test_guard_accepts_whole_float_counts():
    step = fits_node(Cluster(1, 3, ("n0",)), Constraints.none(2), np.zeros((1, 2), dtype=np.int64))
    res = run_chain([Wish("n0", {np.int64(1): np.float64(2.0)})], [step], GuardContext(0.0, "k"))
    assert res.kept[0].data["composition"] == [0, 2]


def _decide_body(counts, app):
    return {"observation": {"app": app, "counts": counts, "remaining": [1.0] * 7}}


def test_decide_on_a_full_cluster_is_a_422_naming_the_counts(client):
    # every node at its 8 slots and no mask: there is no node to name, and it is the caller's input
    full = [[8.0, 0, 0, 0, 0, 0, 0]] * 9
    r = client.post("/v1/agents/lra/decide", json=_decide_body(full, np.eye(7)[1].tolist()))
    assert r.status_code == 422, r.text
    assert "observation.counts" in r.json()["detail"]


@pytest.mark.parametrize("app", [[0.0] * 7, [1.0, 1.0, 0, 0, 0, 0, 0]])
def test_decide_refuses_an_app_vector_that_is_not_one_hot(client, app):
    r = client.post("/v1/agents/lra/decide", json=_decide_body([[0.0] * 7] * 9, app))
    assert r.status_code == 422, r.text
    assert "observation.app" in r.json()["detail"]


def test_decide_with_a_one_hot_app_still_places(client):
    r = client.post("/v1/agents/lra/decide", json=_decide_body([[0.0] * 7] * 9, np.eye(7)[2].tolist()))
    assert r.status_code == 200, r.text
    assert 0 <= r.json()["action"] < 9
