"""The catalogue of problems: each problem package registers one `ProblemSpec`.

Like Gymnasium's env registry, a spec is a plain dataclass whose entry points are strings
(`"module:attr"`), imported only when used, so listing the problems imports no simulator, no
torch and no scikit-learn. The registry imports no problem: `agents.problems` lists them (one
line per package, like Telegraf's `plugins/inputs/all`) and finds those of installed
distributions by their `samm.problems` entry points. Adding a problem = one package with
`PROBLEM = register_problem(ProblemSpec(...))`, and either one line in `agents/problems.py` (a
problem of this repository) or one entry point in its own distribution (docs/adding-a-problem.md).
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class ProblemSpec:
    name: str
    title: str
    paper: str
    #: Gymnasium id and entry point of the problem's environment
    env_id: str | None = None
    env_entry_point: str | None = None
    #: agent kind -> "module:attr" of a factory `(**params) -> Policy` or the Agent class
    agents: dict[str, Any] = field(default_factory=dict)
    default_agent: str | None = None
    #: "module:attr" of `load(directory) -> Policy` for saved policies of this problem
    policy_loader: str | None = None
    #: "module:attr" of `make(agent_name, policy_dir=None) -> Policy`: what `samm serve --agent` hosts
    make_policy: str | None = None
    #: "module:attr" of the CLI-facing experiment `run(out_dir, quick, seeds, ...) -> summary dict`
    experiment: str | None = None
    #: "module:attr" of `train(...)`, if the problem has a trainer, and the agent it trains
    train: str | None = None
    learner: str | None = None
    #: "module:attr" of `add_routes(app, name, policy)`: extra REST operations (e.g. a batch plan)
    routes: str | None = None
    #: "module:attr" of the pydantic model of a daemon loop entry `{problem: NAME, ...}` in
    #: `samm run`'s `loops:` (unknown keys rejected), and of `build_loop(cfg, loop_config, store,
    #: closers) -> loop` (an object with name, config, run_once() -> IterationReport, recover(),
    #: last_progress), so a problem brings its own MAPE-K loop without editing the daemon
    loop_config: str | None = None
    build_loop: str | None = None
    #: "module:attr" of `evaluate(agent, seeds, policy_dir=None, params=None) -> dict` (JSON-able,
    #: its `summary` shown) and of `tune(agent, seeds, out=None, progress=True) -> dict` (its
    #: `best_params` shown; it saves the tuned agent to `out` when given): what `samm evaluate` and
    #: `samm tune --problem NAME` run for a problem whose options the CLI does not know itself
    evaluate: str | None = None
    tune: str | None = None

    def agent_names(self) -> list[str]:
        return sorted(self.agents)


_PROBLEMS: dict[str, ProblemSpec] = {}


def register_problem(spec: ProblemSpec) -> ProblemSpec:
    """Add `spec` to the catalogue (again: a no-op). Everything is checked before anything is
    registered, so a refused spec (a plug-in's) leaves the catalogue and Gymnasium as they were."""
    if not isinstance(spec, ProblemSpec):
        raise TypeError(f"register_problem takes a ProblemSpec, got {type(spec).__name__}")
    if not (isinstance(spec.name, str) and spec.name.strip() == spec.name and spec.name):
        raise ValueError(f"a problem's name must be a non-empty string without surrounding spaces, got {spec.name!r}")
    if _PROBLEMS.get(spec.name) == spec:
        return _PROBLEMS[spec.name]
    if spec.name in _PROBLEMS:
        raise ValueError(f"problem {spec.name!r} is already registered (another package defines it)")
    _check_agents_free(spec)
    env_registered = _check_env_free(spec)
    _PROBLEMS[spec.name] = spec
    if spec.env_id and spec.env_entry_point and not env_registered:
        import gymnasium

        gymnasium.register(id=spec.env_id, entry_point=spec.env_entry_point)
    return spec


def _check_agents_free(spec: ProblemSpec) -> None:
    """Agent names are global (`samm serve --agent NAME`, `problem_of_agent`): a second problem
    listing `lstm-ppo` would take over whichever of the two sorted first."""
    for other in _PROBLEMS.values():
        taken = sorted(set(spec.agents) & set(other.agents))
        if taken:
            raise ValueError(f"problem {spec.name!r}: agent {taken[0]!r} is already an agent of problem "
                             f"{other.name!r} (agent names are unique across problems)")


def _check_env_free(spec: ProblemSpec) -> bool:
    """Whether `spec.env_id` is already registered with `spec.env_entry_point`; an id registered
    with another entry point is refused: gym.make would have built the other problem's env."""
    if not (spec.env_id and spec.env_entry_point):
        return False
    import gymnasium

    held = gymnasium.registry.get(spec.env_id)
    if held is None:
        return False
    if held.entry_point != spec.env_entry_point:
        raise ValueError(f"problem {spec.name!r}: env id {spec.env_id!r} is already registered for "
                         f"{held.entry_point!r}")
    return True


def load_entry_point(ref: str | Callable) -> Any:
    """"module:attr" -> the object (a callable passes through, for problems defined in one file)."""
    if callable(ref):
        return ref
    if not isinstance(ref, str):
        raise ValueError(f"entry point {ref!r}: not a \"module:attr\" string nor a callable")
    module, _, attr = ref.partition(":")
    # ValueError naming the reference: a plug-in's typo or missing dependency was an ImportError
    # traceback out of `samm serve`, `samm run`'s config check and the CLI verbs
    try:
        obj = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"entry point {ref!r}: cannot import {module!r} ({exc})") from None
    for part in attr.split(".") if attr else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"entry point {ref!r}: {module!r} has no {attr!r}") from None
    return obj


def _ensure_listed() -> None:
    from . import problems

    problems.load_all()


def problem_names() -> list[str]:
    _ensure_listed()
    return sorted(_PROBLEMS)


def get_problem(name: str) -> ProblemSpec:
    _ensure_listed()
    if name not in _PROBLEMS:
        from .problems import plugin_errors

        if name in plugin_errors():  # installed, but it failed to load: say why, not "unknown"
            raise ValueError(plugin_errors()[name])
        close = difflib.get_close_matches(name, list(_PROBLEMS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown problem {name!r}{hint} (known: {', '.join(sorted(_PROBLEMS))})")
    return _PROBLEMS[name]


def entry(spec: ProblemSpec, what: str) -> Callable:
    ref = getattr(spec, what)
    if not ref:
        raise ValueError(f"problem {spec.name!r} has no {what}")
    return load_entry_point(ref)


def read_metadata(directory, required: tuple[str, ...] = ()) -> dict:
    """A saved policy's `metadata.json` as a dict, or a clear error naming the file."""
    import json

    meta_path = Path(directory) / "metadata.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{directory}: no metadata.json; not a saved SAMM policy")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_path}: invalid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: must hold a JSON object")
    missing = [k for k in required if k not in meta]
    if missing:
        raise ValueError(f"{meta_path}: missing {missing[0]!r}")
    version = meta.get("version")
    # served in every decision's answer and in /v1/agents: a list or a number there broke them
    if version is not None and not isinstance(version, str):
        raise ValueError(f"{meta_path}: version must be a string, got {version!r:.80}")
    return meta


def read_policy_metadata(directory, kind: str, problem: str, fmt: int) -> dict:
    """A saved policy's metadata, checked to be of this kind, problem and format (ValueError
    naming what differs)."""
    try:
        meta = read_metadata(directory)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if meta.get("kind") != kind or meta.get("problem") != problem:
        raise ValueError(f"{directory}: kind/problem {meta.get('kind')}/{meta.get('problem')} is not {kind}/{problem}")
    recorded = meta.get("format", 0)
    # bool is an int to Python; a saved "format": true is as wrong as "format": "2"
    if type(recorded) is not int or recorded != fmt:
        raise ValueError(f"{Path(directory) / 'metadata.json'}: format {meta.get('format')} is not {fmt}")
    return meta


def load_policy(directory) -> Any:
    """Load any saved policy: `metadata.json` names its problem (autoscaling when absent, as in
    policies saved before the platform), whose loader checks the recorded spaces."""
    meta = read_metadata(directory)
    try:
        spec = get_problem(meta.get("problem", "autoscaling"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{Path(directory) / 'metadata.json'}: {exc}") from None
    return entry(spec, "policy_loader")(directory)


def learner_names() -> list[str]:
    """The learning agents (what `samm train --agent` accepts)."""
    return sorted({s.learner for s in (_PROBLEMS[n] for n in problem_names()) if s.learner})


def problem_of_agent(agent: str) -> ProblemSpec:
    """The problem whose catalogue lists `agent` (autoscaling's `static:S,M,L` included)."""
    for name in problem_names():
        spec = _PROBLEMS[name]
        if agent in spec.agents or (name == "autoscaling" and agent.startswith("static:")):
            return spec
    known = sorted(a for p in _PROBLEMS.values() for a in p.agents)
    close = difflib.get_close_matches(agent, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown agent {agent!r}{hint} (known: {', '.join(known)})")


def make_policy(agent: str, policy_dir=None, **params) -> Any:
    """A hostable policy by agent name (a saved policy directory and problem-specific
    parameters, e.g. a placement policy's `nodes`, if given)."""
    spec = problem_of_agent(agent)
    return entry(spec, "make_policy")(agent, policy_dir, **params)
