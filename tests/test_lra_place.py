"""`samm place` (agents/lra_placement/place.py, orchestrate.py): inputs, plan files, and the
orchestrator files checked by real validators (docker-compose's schema, the kubernetes client's
OpenAPI models)."""
import csv
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from agents.lra_placement import orchestrate
from agents.lra_placement.orchestrate import (
    dns1123_label,
    is_dns1123_label,
    unique_dns1123_labels,
    validate_k8s_manifest,
)
from agents.lra_placement.place import load_cluster_file, run_place
from agents.lra_placement.predictor import SyntheticInterference

DATA = Path(__file__).resolve().parents[1] / "agents" / "lra_placement" / "data"
EXAMPLE_CLUSTER = DATA / "example-cluster.yaml"
EXAMPLE_BATCH = DATA / "example-batch.csv"


def write_cluster(tmp_path: Path, **overrides) -> Path:
    spec = {
        "nodes": ["n1", "n2", "n3"],
        "slots": 4,
        "apps": [{"name": "web", "image": "nginx:1.25"}, {"name": "db", "image": "redis:7.2"},
                 {"name": "batch", "image": "busybox:1.36"}],
    }
    spec.update(overrides)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_batch(tmp_path: Path, text: str, name: str = "batch.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def read_plan(out: Path) -> list[tuple[str, str, int]]:
    with open(out / "plan.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [(r["node"], r["app"], int(r["count"])) for r in rows]


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("place") / "out"
    result = run_place(EXAMPLE_CLUSTER, EXAMPLE_BATCH, out, planner="greedy-ls", seed=0, predictor="synthetic")
    return result, out


# --- the plan files -------------------------------------------------------------------------------
def test_plan_csv_sums_equal_the_batch_and_summary_is_consistent(example_run):
    result, out = example_run
    with open(EXAMPLE_BATCH, newline="") as fh:
        batch = {r["app"]: int(r["count"]) for r in csv.DictReader(fh)}
    rows = read_plan(out)
    per_app: dict[str, int] = {}
    per_node: dict[str, int] = {}
    for node, app, count in rows:
        assert count > 0  # only non-zero rows
        per_app[app] = per_app.get(app, 0) + count
        per_node[node] = per_node.get(node, 0) + count
    assert per_app == batch
    assert max(per_node.values()) <= load_cluster_file(EXAMPLE_CLUSTER).cluster.slots

    summary = json.loads((out / "summary.json").read_text())
    assert summary["planner"] == "greedy-ls"
    assert summary["constraint_violations"] == 0
    assert summary["n_containers"] == sum(batch.values()) == result.n_containers
    assert 0 < summary["score"] <= 1.0  # the synthetic model never exceeds a solo run
    assert set(summary["per_app_score"]) == set(batch)
    assert summary["seconds"] >= 0
    assert summary["predictor_apps"]["Redis"] == "app0"  # mapped by position


def test_same_seed_same_plan(example_run, tmp_path):
    result, _ = example_run
    again = run_place(EXAMPLE_CLUSTER, EXAMPLE_BATCH, tmp_path / "again", planner="greedy-ls", seed=0,
                      predictor="synthetic")
    assert np.array_equal(again.placement, result.placement)
    assert again.plan_id == result.plan_id


# --- Compose ----------------------------------------------------------------------------------------
def _compose_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["docker-compose", "-f", str(path), "config", "-q"], capture_output=True, text=True,
                          timeout=60, cwd=path.parent)


needs_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose (Debian package docker-compose, v1.29) is not on PATH; scripts/bootstrap.sh installs it",
)


@needs_compose
def test_compose_file_passes_docker_compose_schema(example_run):
    result, out = example_run
    proc = _compose_config(out / "docker-compose.yml")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load((out / "docker-compose.yml").read_text())
    assert doc["version"] == "3.8"
    pinned = {}
    for service in doc["services"].values():
        (constraint,) = service["deploy"]["placement"]["constraints"]
        node = constraint.removeprefix("node.hostname == ")
        app = service["labels"]["samm.app"]
        pinned[(node, app)] = service["deploy"]["replicas"]
        assert service["deploy"]["labels"]["samm.plan"] == result.plan_id
    assert pinned == {(n, a): c for n, a, c in read_plan(out)}


@needs_compose
def test_docker_compose_rejects_a_broken_file(tmp_path):
    # The validator really checks the schema: a misspelt deploy key must fail.
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(yaml.safe_dump({"version": "3.8", "services": {"web": {
        "image": "nginx", "deploy": {"replicas": 2, "placment": {"constraints": ["node.hostname == n1"]}}}}}))
    proc = _compose_config(bad)
    assert proc.returncode != 0
    assert "placment" in proc.stderr


@needs_compose
def test_compose_accepts_names_that_need_sanitising(tmp_path):
    cluster = write_cluster(tmp_path, nodes=["Worker_1.example.com", "worker-2"],
                            apps=[{"name": "My_App.v2", "image": "nginx:1.25"},
                                  {"name": "my-app-v2", "image": "redis:7.2"}])
    batch = write_batch(tmp_path, "app,count\nMy_App.v2,3\nmy-app-v2,3\n")
    run_place(cluster, batch, tmp_path / "out", predictor="synthetic")
    proc = _compose_config(tmp_path / "out" / "docker-compose.yml")
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load((tmp_path / "out" / "docker-compose.yml").read_text())["services"]
    assert all(is_dns1123_label(name) for name in services)
    nodes = {s["deploy"]["placement"]["constraints"][0] for s in services.values()}
    assert "node.hostname == Worker_1.example.com" in nodes  # the real hostname, unsanitised


# --- Kubernetes -------------------------------------------------------------------------------------
def test_kubernetes_manifests_validate_and_match_the_plan(example_run):
    pytest.importorskip("kubernetes", reason="the kubernetes client (dev extra, ==31.0.0) validates the manifests")
    result, out = example_run
    folder = out / "kubernetes"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    files = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization" and kustomization["resources"] == files
    pinned = {}
    selectors = set()
    for name in files:
        doc = yaml.safe_load((folder / name).read_text())
        assert validate_k8s_manifest(doc) == [], name
        meta, spec = doc["metadata"], doc["spec"]
        assert is_dns1123_label(meta["name"]) and name == f"{meta['name']}.yaml"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "samm"
        assert meta["labels"]["samm.io/plan"] == result.plan_id
        pod_labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
        selectors.add(tuple(sorted(spec["selector"]["matchLabels"].items())))
        term = spec["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (expr,) = term["nodeSelectorTerms"][0]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/hostname" and expr["operator"] == "In"
        (node,) = expr["values"]
        pinned[(node, meta["annotations"]["samm.io/app"])] = spec["replicas"]
    assert pinned == {(n, a): c for n, a, c in read_plan(out)}
    assert len(selectors) == len(files)  # no two Deployments fight over the same pods


def test_validator_reports_unknown_fields_wrong_types_and_missing_required():
    pytest.importorskip("kubernetes", reason="the kubernetes client (dev extra, ==31.0.0) validates the manifests")
    good = orchestrate.deployment_manifest(
        orchestrate.Workload(name="web-n1", app="web", app_label="web", node="n1", count=2, image="nginx"), "abc")
    assert validate_k8s_manifest(good) == []

    bad = yaml.safe_load(yaml.safe_dump(good))
    bad["spec"]["replica"] = 2  # unknown field (typo)
    bad["spec"]["replicas"] = "2"  # wrong primitive type
    bad["spec"]["template"]["spec"]["containers"][0].pop("name")  # V1Container requires a name
    bad["spec"]["template"]["spec"]["containers"][0]["ports"] = {"containerPort": 80}  # a list expected
    bad["metadata"]["labels"]["n"] = 3  # dict(str, str) value of the wrong type
    problems = validate_k8s_manifest(bad)
    text = "\n".join(problems)
    assert "spec.replica: unknown field" in text
    assert "spec.replicas: expected int" in text
    assert "spec.template.spec.containers[0].name: required field of V1Container is missing" in text
    assert "spec.template.spec.containers[0].ports: expected a list" in text
    assert "metadata.labels.n: expected str" in text
    assert len(problems) == 5

    assert validate_k8s_manifest({"kind": "Deployment"}) == ["apiVersion: missing or not a string"]
    assert "no model" in validate_k8s_manifest({"apiVersion": "apps/v1", "kind": "Deploymnt"})[0]
    # Required fields of a nested model: a selector requirement needs key and operator.
    sel = yaml.safe_load(yaml.safe_dump(good))
    sel["spec"]["selector"] = {"matchExpressions": [{"values": ["x"]}]}
    assert {p.split(":")[0] for p in validate_k8s_manifest(sel)} == {
        "spec.selector.matchExpressions[0].key", "spec.selector.matchExpressions[0].operator"}


def test_rerun_removes_manifests_of_the_previous_plan(tmp_path):
    cluster = write_cluster(tmp_path)
    out = tmp_path / "out"
    run_place(cluster, write_batch(tmp_path, "app,count\nweb,5\ndb,2\n"), out, predictor="synthetic")
    mine = out / "kubernetes" / "notes.yaml"
    mine.write_text("someone: else\n")  # not ours: must survive
    run_place(cluster, write_batch(tmp_path, "app,count\nbatch,1\n", "b2.csv"), out, predictor="synthetic")
    names = sorted(p.name for p in (out / "kubernetes").glob("*.yaml"))
    assert len(names) == 3 and names[0].startswith("batch-") and names[1:] == ["kustomization.yaml", "notes.yaml"]
    assert mine.read_text() == "someone: else\n"


# --- names ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    ("Redis", "redis"),
    ("My_App.v2", "my-app-v2"),
    ("--edge--", "edge"),
    ("worker-1", "worker-1"),
    ("ÜBER app", "ber-app"),
])
def test_dns1123_label_sanitises(raw, expected):
    assert dns1123_label(raw) == expected


def test_dns1123_label_long_and_empty_names_stay_valid_and_distinct():
    a, b = "x" * 80 + "A", "x" * 80 + "B"
    la, lb = dns1123_label(a), dns1123_label(b)
    assert la != lb and len(la) <= 63 and is_dns1123_label(la) and is_dns1123_label(lb)
    assert is_dns1123_label(dns1123_label("___")) and is_dns1123_label(dns1123_label(""))
    assert not is_dns1123_label("Redis") and not is_dns1123_label("a_b") and not is_dns1123_label("-a")
    assert not is_dns1123_label("a" * 64)


def test_colliding_names_become_unique_and_stable():
    items = [("a_b\0n1", "a_b-n1"), ("a.b\0n1", "a.b-n1"), ("c\0n1", "c-n1")]
    names = unique_dns1123_labels(items)
    assert len(set(names)) == 3 and all(is_dns1123_label(n) for n in names)
    assert names[2] == "c-n1"  # no collision: readable name kept
    assert unique_dns1123_labels(list(reversed(items))) == list(reversed(names))  # order-independent


def test_workload_names_unique_when_app_and_node_names_blur(tmp_path):
    # ("a-b", "c") and ("a", "b-c") both read "a-b-c": names must still differ.
    apps = [type("A", (), {"name": n, "image": "busybox", "labels": {}})() for n in ("a-b", "a")]
    placement = np.array([[1, 0], [0, 1]])
    items = orchestrate.workloads(placement, ["c", "b-c"], apps)
    assert len({w.name for w in items}) == 2 and all(is_dns1123_label(w.name) for w in items)


# --- bad inputs -------------------------------------------------------------------------------------
def test_unknown_key_in_cluster_file_is_named(tmp_path):
    path = write_cluster(tmp_path, slot=8)
    with pytest.raises(ValueError, match=r"slot: unknown key"):
        load_cluster_file(path)
    path = write_cluster(tmp_path, apps=[{"name": "web", "image": "nginx", "imag": "x"}])
    with pytest.raises(ValueError, match=r"apps\.0\.imag: unknown key"):
        load_cluster_file(path)


@pytest.mark.parametrize("overrides, fragment", [
    ({"node_count": 3}, "exactly one of `nodes`"),
    ({"nodes": ["n1", "n1"]}, "more than once"),
    ({"nodes": ["bad name"]}, "Kubernetes label value"),
    ({"slots": "8"}, "slots"),
    ({"apps": [{"name": "web", "image": "a"}, {"name": "web", "image": "b"}]}, "app names appear more than once"),
    ({"apps": [{"name": "web", "image": "nginx", "labels": {"tier": "not valid!"}}]}, "label 'tier'"),
    ({"constraints": "missing.csv"}, "missing.csv not found"),
])
def test_bad_cluster_files_name_the_problem(tmp_path, overrides, fragment):
    with pytest.raises(ValueError, match=None) as info:
        load_cluster_file(write_cluster(tmp_path, **overrides))
    assert fragment in str(info.value)


def test_node_count_generates_names(tmp_path):
    spec = {"node_count": 2, "apps": [{"name": "web", "image": "nginx"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_cluster_file(tmp_path / "c.yaml")
    assert loaded.cluster.node_names == ("node-0", "node-1") and loaded.cluster.slots == 8


@pytest.mark.parametrize("text, fragment", [
    ("app,count\nweb,2\ncache,1\n", "batch.csv:3: app 'cache' is not in the cluster file's apps"),
    ("app,count\nweb,-1\n", "batch.csv:2: count must be a non-negative integer, got -1"),
    ("app,count\nweb,2.5\n", "batch.csv:2: count must be a non-negative integer, got '2.5'"),
    ("app,count\nweb,2\nweb,1\n", "batch.csv:3: app 'web' already listed at line 2"),
    ("app,count\nweb,6\ndb,6\nbatch,1\n", "batch.csv:4: the batch exceeds the cluster's capacity of 12"),
    ("application,count\nweb,1\n", "batch.csv:1: header must be `app,count`"),
    ("app,count\nweb,0\n", "the batch has no containers"),
])
def test_bad_batch_csv_names_the_line(tmp_path, text, fragment):
    with pytest.raises(ValueError) as info:
        run_place(write_cluster(tmp_path), write_batch(tmp_path, text), tmp_path / "out", predictor="synthetic")
    assert fragment in str(info.value)
    assert not (tmp_path / "out").exists()  # nothing written for bad input


def test_yaml_batch_and_its_errors(tmp_path):
    ok = write_batch(tmp_path, "web: 2\ndb: 1\n", "batch.yaml")
    result = run_place(write_cluster(tmp_path), ok, tmp_path / "out", predictor="synthetic")
    assert result.placement.sum(axis=0).tolist() == [2, 1, 0]
    bad = write_batch(tmp_path, "web: 2\ndb: true\n", "bad.yaml")
    with pytest.raises(ValueError, match=r"bad\.yaml:2: count must be a non-negative integer, got True"):
        run_place(write_cluster(tmp_path), bad, tmp_path / "out2", predictor="synthetic")
    unknown = write_batch(tmp_path, "web: 2\n\nqueue: 1\n", "unknown.yaml")
    with pytest.raises(ValueError, match=r"unknown\.yaml:3: app 'queue'"):
        run_place(write_cluster(tmp_path), unknown, tmp_path / "out3", predictor="synthetic")


def test_csv_batch_from_a_spreadsheet_with_bom_and_blank_lines(tmp_path):
    batch = tmp_path / "batch.csv"
    batch.write_bytes("\ufeffapp,count\r\nweb, 2\r\n\r\nbatch,1\r\n".encode())
    result = run_place(write_cluster(tmp_path), batch, tmp_path / "out", predictor="synthetic")
    assert result.placement.sum(axis=0).tolist() == [2, 0, 1]


def test_unknown_planner_lists_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"unknown planner 'magic'.*greedy-ls"):
        run_place(write_cluster(tmp_path), write_batch(tmp_path, "app,count\nweb,1\n"), tmp_path / "o",
                  planner="magic", predictor="synthetic")


# --- constraints and predictor mapping ------------------------------------------------------------
def test_constraints_file_is_obeyed_and_infeasible_batches_are_value_errors(tmp_path):
    (tmp_path / "rules.csv").write_text("app_a,app_b,rule,limit\ndb,db,anti-affinity,0\nweb,db,anti-affinity,0\n")
    cluster = write_cluster(tmp_path, constraints="rules.csv")
    result = run_place(cluster, write_batch(tmp_path, "app,count\nweb,3\ndb,2\nbatch,2\n"), tmp_path / "out",
                       predictor="synthetic")
    p = result.placement
    assert (p[:, 1] <= 1).all() and not ((p[:, 0] > 0) & (p[:, 1] > 0)).any()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["constraint_violations"] == 0
    with pytest.raises(ValueError, match="no placement of the batch satisfies"):
        run_place(cluster, write_batch(tmp_path, "app,count\ndb,4\n", "b2.csv"), tmp_path / "out2",
                  predictor="synthetic")


def test_more_apps_than_the_predictor_warns_and_still_plans(tmp_path):
    result = run_place(write_cluster(tmp_path), write_batch(tmp_path, "app,count\nweb,2\ndb,2\nbatch,2\n"),
                       tmp_path / "out", predictor=SyntheticInterference(n_apps=2, slots=4))
    assert result.warnings and "batch" in result.warnings[0]
    assert result.predictor_apps == {"web": "app0", "db": "app1", "batch": None}
    assert result.per_app_score["batch"] == pytest.approx(1.0)  # modelled as interference-free
    assert result.placement.sum(axis=0).tolist() == [2, 2, 2]


@pytest.mark.slow
def test_default_predictor_is_the_forest_mapped_by_position(tmp_path, monkeypatch):
    from agents.lra_placement.data import default_path

    if not default_path().is_file():
        pytest.skip(f"Metis data not found at {default_path()} (see agents/lra_placement/data.py)")
    monkeypatch.setenv("HOME", str(tmp_path))  # the forest's table cache goes under ~/.cache
    result = run_place(EXAMPLE_CLUSTER, EXAMPLE_BATCH, tmp_path / "out")
    assert result.predictor == "ForestPredictor" and result.planner == "greedy-ls"
    assert result.predictor_apps["Redis"] == "Redis" and result.predictor_apps["ISR"] == "ISR"
    assert result.constraint_violations == 0 and result.n_containers == 36
