"""`samm place`: plan one batch of long-running containers and write what an orchestrator applies.

The paper (Deng et al. 2023, §4) plans a batch ("group") of containers over N nodes and hands the
plan to the cluster; it does not say in which form. Here a plan becomes three artefacts in one folder:

* `plan.csv` (`node,app,count`, non-zero rows) and `summary.json` (planner, predicted score, per-app
  score, planning seconds, constraint violations — always 0 — and the number of containers);
* `docker-compose.yml`: one Swarm service per (app, node) pair, pinned with `node.hostname == <node>`;
* `kubernetes/`: one Deployment per (app, node) pair, pinned with a required node affinity on
  `kubernetes.io/hostname`, plus a `kustomization.yaml` listing them (see `orchestrate.py`).

Inputs (both strict, errors name the file, key or line):

* the cluster file (YAML): `nodes:` (names) or `node_count:`, `slots:`, `apps:` ({name, image,
  optional labels}) and an optional `constraints:` CSV (the format of `Constraints.from_csv`),
  relative to the YAML file. `data/example-cluster.yaml` documents every key;
* the batch file: CSV `app,count` or a YAML mapping app -> count (`data/example-batch.csv`).

Apps map to the predictor's apps BY POSITION: the first app of the cluster file is the predictor's
first app (`predictor.app_names[0]`; for the Metis forest that is Redis), and so on. The names need
not match; `summary.json` records the mapping. A file with fewer apps than the predictor leaves the
predictor's remaining apps absent; a file with more apps gets a warning, and its extra apps are
modelled as interference-free (throughput 1.0, invisible to the others) because the predictor
knows nothing about them.

`run_place` is the whole verb; the CLI is a thin wrapper: bad input raises `ValueError` with a
message naming the problem, and the returned `PlaceResult` carries everything the CLI prints.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agents.lra_placement.cluster import (
    MAX_TABULATED_COMPOSITIONS,
    Batch,
    Cluster,
    Constraints,
    Predictor,
    check_plan,
    composition_count,
    max_tabulated_slots,
    per_app_score,
    score,
)
from agents.lra_placement.errors import Infeasible
from agents.lra_placement import orchestrate

log = logging.getLogger(__name__)

DEFAULT_PLANNER = "greedy-ls"

# Node names end up verbatim in `node.hostname == <node>` (Swarm) and as a `kubernetes.io/hostname`
# label value, so they must be valid Kubernetes label values: <= 63 characters, alphanumeric at both
# ends, `-_.` inside. App names follow the same character rule (they appear in CSV files and labels);
# their length is free because resource names are derived from them with `orchestrate.dns1123_label`.
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
# Every planner holds (nodes x apps) arrays and the node names: 10^6 nodes took 3.5 s and 356 MB
# (greedy, 2 apps); an extra zero or three in `node_count` must be an error, not an exhausted memory.
MAX_NODES = 1_000_000


# --- cluster file -------------------------------------------------------------------------------
class AppSpec(BaseModel):
    """One application: its name (position = its predictor app) and the image its containers run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    image: str
    # Extra labels put on every container of the app (Compose labels, pod template labels).
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                f"app name {v!r} must be letters, digits, '-', '_' or '.', starting and ending alphanumeric")
        return v

    @field_validator("image")
    @classmethod
    def _image_ok(cls, v: str) -> str:
        if not v or any(ch.isspace() for ch in v):
            raise ValueError(f"image {v!r} must be a non-empty image reference without spaces")
        return v

    @field_validator("labels")
    @classmethod
    def _labels_ok(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            problem = orchestrate.label_problem(key, value)
            if problem:
                raise ValueError(problem)
        return v


class ClusterSpec(BaseModel):
    """The cluster file. Unknown keys are rejected (a typo must not silently drop a setting)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    nodes: Optional[list[str]] = Field(default=None, max_length=MAX_NODES)
    node_count: Optional[int] = Field(default=None, ge=1, le=MAX_NODES)
    # 8 slots: the most containers per machine in the Metis data the predictor is fit on.
    slots: int = Field(default=8, ge=1)
    apps: list[AppSpec] = Field(min_length=1)
    constraints: Optional[str] = None

    @field_validator("nodes")
    @classmethod
    def _nodes_ok(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is None:
            return v
        if not v:
            raise ValueError("nodes must list at least one node")
        for name in v:
            if len(name) > 63 or not _NAME.match(name):
                raise ValueError(
                    f"node name {name!r} must be a Kubernetes label value: <= 63 letters, digits, '-', '_' or '.',"
                    " starting and ending alphanumeric"
                )
        dupes = sorted({n for n in v if v.count(n) > 1})
        if dupes:
            raise ValueError(f"node names appear more than once: {dupes}")
        return v

    @model_validator(mode="after")
    def _one_node_source(self) -> "ClusterSpec":
        if (self.nodes is None) == (self.node_count is None):
            raise ValueError("give exactly one of `nodes` (a list of names) or `node_count` (a number)")
        names = [a.name for a in self.apps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"app names appear more than once: {dupes}")
        return self


@dataclass(frozen=True)
class ClusterFile:
    """A loaded cluster file: the data model objects plus what the orchestrator files need."""

    path: Path
    cluster: Cluster
    apps: tuple[AppSpec, ...]
    constraints_path: Optional[Path]

    @property
    def app_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.apps)


def _pydantic_message(path: Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not allowed here)"
        lines.append(f"{where}: {msg}")
    return f"{path}: invalid cluster file: " + "; ".join(lines)


def _yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """One line, `FILE:LINE: not valid YAML: problem` (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"{path}: not valid YAML: " + " ".join(str(exc).split())
    return f"{path}:{mark.line + 1}: not valid YAML: {problem}"


def _not_text(path: Path, exc: UnicodeDecodeError) -> str:
    return f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})"


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in the cluster file that silently drops a setting
    (a second `apps:` list replaces the first, shifting every app's predictor mapping)."""

    def construct_mapping(self, node, deep=False):
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice (first at line {first_line[key]})", key_node.start_mark)
                first_line[key] = key_node.start_mark.line + 1
            except TypeError:  # an unhashable key: the base class reports it
                pass
        return super().construct_mapping(node, deep)


def load_cluster_file(path: str | Path) -> ClusterFile:
    """Parse and validate the cluster YAML; ValueError names the file and the offending key."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ValueError(f"{path}: cluster file not found") from None
    except UnicodeDecodeError as exc:
        raise ValueError(_not_text(path, exc)) from None
    except yaml.YAMLError as exc:
        raise ValueError(_yaml_error(path, exc)) from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the cluster file must be a YAML mapping (nodes/node_count, slots, apps, ...)")
    try:
        spec = ClusterSpec.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(_pydantic_message(path, exc)) from None
    n_nodes = len(spec.nodes) if spec.nodes is not None else spec.node_count
    cluster = Cluster(n_nodes=n_nodes, slots=spec.slots, node_names=tuple(spec.nodes or ()))
    constraints_path = None
    if spec.constraints:
        constraints_path = (path.parent / spec.constraints).resolve()
        if not constraints_path.is_file():
            raise ValueError(f"{path}: constraints: file {constraints_path} not found")
    return ClusterFile(path=path, cluster=cluster, apps=tuple(spec.apps), constraints_path=constraints_path)


# --- batch file ---------------------------------------------------------------------------------
def _count(value: Any, where: str) -> int:
    """A container count: a non-negative integer (YAML int, or a CSV cell of digits)."""
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError(f"{where}: count must be a non-negative integer, got {value!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: count must be a non-negative integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{where}: count must be a non-negative integer, got {value}")
    return value


def _batch_rows_csv(path: Path) -> list[tuple[int, Any, Any]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: spreadsheets write a BOM
            return _read_batch_rows(csv.reader(fh), path)
    except UnicodeDecodeError as exc:
        raise ValueError(_not_text(path, exc)) from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV file: {exc}") from None


def _read_batch_rows(reader, path: Path) -> list[tuple[int, Any, Any]]:
    header = next(reader, None)
    if header is None or [h.strip() for h in header] != ["app", "count"]:
        raise ValueError(f"{path}:1: header must be `app,count`, got {header}")
    rows = []
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != 2:
            raise ValueError(f"{path}:{reader.line_num}: expected 2 fields `app,count`, got {len(row)}: {row}")
        rows.append((reader.line_num, row[0].strip(), row[1]))
    return rows


def _batch_rows_yaml(path: Path) -> list[tuple[int, Any, Any]]:
    # Compose first (not safe_load) to keep each key's line number for the error messages.
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(_not_text(path, exc)) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None or not isinstance(node, yaml.MappingNode):
            raise ValueError(f"{path}: the batch file must be a YAML mapping app -> count")
        rows = []
        for key_node, value_node in node.value:
            # a key is an app name as written: `2048:` or `yes:` name apps, not a number or a bool
            if isinstance(key_node, yaml.ScalarNode):
                app = key_node.value
            else:
                app = loader.construct_object(key_node, deep=True)
            rows.append((key_node.start_mark.line + 1, app, loader.construct_object(value_node, deep=True)))
        return rows
    except yaml.YAMLError as exc:
        raise ValueError(_yaml_error(path, exc)) from None
    finally:
        loader.dispose()


def load_batch_file(path: str | Path, app_names: tuple[str, ...], capacity: int) -> Batch:
    """Parse `app,count` CSV or a YAML mapping into a Batch over `app_names` (apps not listed: 0).

    ValueError names the line for an unknown app, a repeated app, a bad count, and the line at
    which the running total passes the cluster's capacity."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: batch file not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _batch_rows_csv(path)
    elif suffix in (".yaml", ".yml"):
        rows = _batch_rows_yaml(path)
    else:
        raise ValueError(f"{path}: batch file must end in .csv (app,count) or .yaml/.yml (app: count)")
    index = {name: i for i, name in enumerate(app_names)}
    counts = np.zeros(len(app_names), dtype=np.int64)
    seen: dict[str, int] = {}
    total = 0
    for line, app, value in rows:
        where = f"{path}:{line}"
        if not isinstance(app, str) or app not in index:
            raise ValueError(f"{where}: app {app!r} is not in the cluster file's apps ({', '.join(app_names)})")
        if app in seen:
            raise ValueError(f"{where}: app {app!r} already listed at line {seen[app]}")
        seen[app] = line
        n = _count(value, where)
        total += n
        if total > capacity:  # checked before storing: a count past int64 must be this error, not a crash
            raise ValueError(
                f"{where}: the batch exceeds the cluster's capacity of {capacity} containers"
                f" (running total {total} at app {app!r})"
            )
        counts[index[app]] = n
    if total == 0:
        raise ValueError(f"{path}: the batch has no containers")
    return Batch(counts)


# --- predictor ----------------------------------------------------------------------------------
class PositionalPredictor:
    """Adapts a predictor to the cluster file's apps by position (see the module docstring).

    compositions (K, A_file) -> (K, A_file): the first min(A_file, A_pred) columns go to the
    predictor (its remaining apps are absent, 0); the file's extra apps get throughput 1.0 where
    present, as if they neither suffer nor cause interference."""

    def __init__(self, inner: Predictor, app_names: tuple[str, ...]):
        self.inner = inner
        self.app_names = tuple(app_names)
        self.n_shared = min(len(app_names), len(inner.app_names))

    def throughput(self, compositions: np.ndarray) -> np.ndarray:
        comps = np.asarray(compositions)
        k, n_file = comps.shape
        n_pred = len(self.inner.app_names)
        inner_comps = np.zeros((k, n_pred), dtype=comps.dtype)
        inner_comps[:, : self.n_shared] = comps[:, : self.n_shared]
        tp = np.where(comps > 0, 1.0, 0.0)
        tp[:, : self.n_shared] = np.asarray(self.inner.throughput(inner_comps), dtype=np.float64)[:, : self.n_shared]
        return np.where(comps > 0, tp, 0.0)


def model_problem(slots: int, exc: OSError) -> str:
    """One line: the interference model for `slots` could not be read (its data, say, unreadable);
    an unwritable cache is no problem (`default_predictor` keeps the table in memory)."""
    return f"cannot load the interference model for {slots} slots per node: {exc}"


def resolve_predictor(predictor: Predictor | str | None, app_names: tuple[str, ...], slots: int,
                      warnings: list[str]) -> tuple[Predictor, str, dict[str, Optional[str]]]:
    """The predictor to plan with (adapted to the file's apps), its description, and the mapping
    file app -> predictor app (None for an app the predictor does not model)."""
    if predictor is None:
        from agents.lra_placement.predictor import default_predictor  # fits the forest: lazy

        try:
            inner = default_predictor(slots=slots)  # tabulates every composition a node of `slots` can hold
        except FileNotFoundError:  # the Metis data: its own message says where to put it
            raise
        except OSError as exc:  # was a traceback
            raise ValueError(model_problem(slots, exc)) from None
    elif isinstance(predictor, str):
        if predictor != "synthetic":
            raise ValueError(
                f"predictor must be None (the default forest), 'synthetic' or a Predictor, got {predictor!r}")
        from agents.lra_placement.predictor import SyntheticInterference

        inner = SyntheticInterference(n_apps=len(app_names), slots=slots)
    else:
        inner = predictor
    pred_apps = tuple(inner.app_names)
    if len(app_names) > len(pred_apps):
        warnings.append(
            f"the cluster file has {len(app_names)} apps but the predictor models {len(pred_apps)}"
            f" ({', '.join(pred_apps)}); {', '.join(app_names[len(pred_apps):])} are scored as interference-free"
        )
    mapping = {name: (pred_apps[i] if i < len(pred_apps) else None) for i, name in enumerate(app_names)}
    described = type(inner).__name__
    if pred_apps == tuple(app_names):
        return inner, described, mapping
    return PositionalPredictor(inner, app_names), described, mapping


# Planners that look up every node composition in a table over their apps (the policy's 7).
_TABULATING_PLANNERS = ("lra-reinforce", "lra-reinforce-per-batch")


def _check_tabulation(spec: "ClusterFile", predictor: Predictor | str | None, planner: str | Callable) -> None:
    """Refuse, before fitting or planning anything, a slot count whose compositions the forest
    predictor or a learned planner would have to tabulate past its limit (`slots: 64` would
    otherwise run out of memory; a learned planner's own table stops at `network.MAX_COMPOSITIONS`,
    and 18 slots failed only after the forest was fit, with an error naming no file or key)."""
    from agents.lra_placement.data import APP_NAMES

    tabulated = []  # (apps, most compositions)
    if predictor is None:
        tabulated.append((len(APP_NAMES), MAX_TABULATED_COMPOSITIONS))  # the forest's apps, whatever the file's
    if isinstance(planner, str) and planner in _TABULATING_PLANNERS:
        from agents.lra_placement.network import MAX_COMPOSITIONS

        tabulated.append((len(spec.apps), MAX_COMPOSITIONS))
    slots = spec.cluster.slots
    for n_apps, limit in tabulated:
        n = composition_count(n_apps, slots)
        if n > limit:
            raise ValueError(
                f"{spec.path}: slots: {slots} slots per node make {n:,} compositions of {n_apps} apps to tabulate,"
                f" more than {limit:,}; use at most {max_tabulated_slots(n_apps, limit)} slots"
                " (or the synthetic predictor with a baseline planner)"
            )


def _check_planner_apps(spec: "ClusterFile", plan_fn: Callable, planner_name: str) -> None:
    """A learned policy places exactly its own apps: a cluster file with another number of apps
    failed only after the forest was fit, with "the batch has 2 apps, the policy 7" (and
    `lra-reinforce` is the CLI's default planner)."""
    policy = getattr(plan_fn, "__self__", None)
    if policy is None:
        return
    from agents.lra_placement.policy import PlacementPolicy

    if isinstance(policy, PlacementPolicy) and policy.n_apps != len(spec.apps):
        raise ValueError(
            f"{spec.path}: apps: planner {planner_name} is a policy for exactly {policy.n_apps} apps, the file lists"
            f" {len(spec.apps)}; list {policy.n_apps} apps (the batch may leave some at 0) or use a baseline planner"
            " such as greedy-ls"
        )


def resolve_planner(planner: str | Callable) -> tuple[Callable, str]:
    if callable(planner):
        return planner, getattr(planner, "__name__", "custom")
    from agents.lra_placement.evaluate import planner_function

    return planner_function(planner), planner


# --- the verb -----------------------------------------------------------------------------------
@dataclass
class PlaceResult:
    out_dir: Path
    planner: str
    seed: int
    placement: np.ndarray  # (N, A) containers per node and app
    node_names: tuple[str, ...]
    app_names: tuple[str, ...]
    score: float
    per_app_score: dict[str, Optional[float]]
    seconds: float
    constraint_violations: int
    n_containers: int
    plan_id: str
    predictor: str
    predictor_apps: dict[str, Optional[str]]
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """What summary.json holds (JSON-ready)."""
        return {
            "planner": self.planner,
            "seed": self.seed,
            "plan_id": self.plan_id,
            "score": self.score,
            "per_app_score": self.per_app_score,
            "seconds": self.seconds,
            "constraint_violations": self.constraint_violations,
            "n_containers": self.n_containers,
            "nodes": len(self.node_names),
            "nodes_used": int((self.placement.sum(axis=1) > 0).sum()),
            "predictor": self.predictor,
            "predictor_apps": self.predictor_apps,
            "warnings": self.warnings,
        }


def plan_csv_text(placement: np.ndarray, node_names, app_names) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["node", "app", "count"])
    for node, app, count in orchestrate.plan_entries(placement, node_names, app_names):
        w.writerow([node, app, count])
    return buf.getvalue()


def write_plan_csv(path: Path, placement: np.ndarray, node_names, app_names) -> None:
    orchestrate.write_files_atomically({Path(path): plan_csv_text(placement, node_names, app_names)})


def run_place(
    cluster_file: str | Path,
    batch_file: str | Path,
    out_dir: str | Path,
    planner: str | Callable = DEFAULT_PLANNER,
    seed: int = 0,
    predictor: Predictor | str | None = None,
    constraints: str | Path | None = None,
) -> PlaceResult:
    """Plan `batch_file` on `cluster_file` with `planner` and write plan.csv, summary.json,
    docker-compose.yml and kubernetes/ into `out_dir`.

    planner: a name of `baselines.PLANNERS` (or a callable with the planner signature).
    predictor: None -> `predictor.default_predictor(slots=slots)` (the forest); "synthetic" ->
    `SyntheticInterference(n_apps=len(apps), slots=slots)`; or any Predictor.
    constraints: a constraints CSV that replaces the cluster file's `constraints:` entry.
    Raises ValueError on bad input, including a batch that no placement can hold under the rules."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer (numpy's seeds), got {seed!r}")
    spec = load_cluster_file(cluster_file)
    cluster, app_names = spec.cluster, spec.app_names
    batch = load_batch_file(batch_file, app_names, cluster.capacity)
    _check_tabulation(spec, predictor, planner)
    constraints_path = Path(constraints) if constraints is not None else spec.constraints_path
    if constraints_path is not None and not constraints_path.is_file():
        raise ValueError(f"{constraints_path}: constraints file not found")
    rules = Constraints.from_csv(constraints_path, app_names) if constraints_path else Constraints.none(len(app_names))
    plan_fn, planner_name = resolve_planner(planner)
    _check_planner_apps(spec, plan_fn, planner_name)  # before the forest is fit
    warnings: list[str] = []
    model, model_name, mapping = resolve_predictor(predictor, app_names, cluster.slots, warnings)
    for w in warnings:
        log.warning(w)

    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    try:
        placement = np.asarray(plan_fn(cluster, batch, rules, model, rng), dtype=np.int64)
    except Infeasible as exc:
        raise ValueError(f"no placement of the batch satisfies the slots and rules: {exc}") from exc
    except TimeoutError as exc:  # the exact optimum's time limit: was a traceback, not the CLI's error line
        raise ValueError(f"planner {planner_name!r} gave up: {exc}; try greedy-ls") from None
    seconds = time.perf_counter() - start
    problems = check_plan(placement, batch, cluster, rules)
    if problems:  # a planner bug, not bad input
        raise RuntimeError(f"planner {planner_name!r} returned an invalid plan: {'; '.join(problems)}")

    per_app = per_app_score(placement, model)
    result = PlaceResult(
        out_dir=Path(out_dir),
        planner=planner_name,
        seed=seed,
        placement=placement,
        node_names=cluster.node_names,
        app_names=app_names,
        score=score(placement, model),
        per_app_score={a: (None if np.isnan(v) else float(v)) for a, v in zip(app_names, per_app)},
        seconds=seconds,
        constraint_violations=rules.violations(placement),
        n_containers=int(placement.sum()),
        plan_id=orchestrate.plan_id(placement, cluster.node_names, app_names),
        predictor=model_name,
        predictor_apps=mapping,
        warnings=warnings,
    )
    _write_outputs(result, spec)
    return result


def _write_outputs(result: PlaceResult, spec: ClusterFile) -> None:
    """Write the plan's files as one set (see `orchestrate.write_files_atomically`): a failure
    leaves the previous plan's files as they were, and is a ValueError naming the folder."""
    out = result.out_dir
    workloads = orchestrate.workloads(result.placement, result.node_names, spec.apps)
    plan_csv, summary_json, compose = out / "plan.csv", out / "summary.json", out / "docker-compose.yml"
    k8s = out / "kubernetes"
    manifests = orchestrate.kubernetes_texts(workloads, result.plan_id)
    files = {k8s / name: text for name, text in manifests.items()}
    files[compose] = orchestrate.compose_text(workloads, result.plan_id, result.planner)
    files[plan_csv] = plan_csv_text(result.placement, result.node_names, result.app_names)
    files[summary_json] = json.dumps(result.summary(), indent=2) + "\n"  # last: marks a complete set
    try:
        k8s.mkdir(parents=True, exist_ok=True)
        orchestrate.write_files_atomically(files)
        orchestrate.remove_stale_manifests(k8s, manifests)
    except OSError as exc:
        where = exc.filename or out
        raise ValueError(f"{where}: cannot write the plan files: {exc.strerror or exc}") from None
    result.files = [plan_csv, summary_json, compose, *(path for path in files if path.parent == k8s)]
