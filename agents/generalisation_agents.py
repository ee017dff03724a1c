"""Who takes part in the generalisation suite: the learned policy (the shipped one or a given
directory) and the three rules tuned on the TRAINING split, read from a tuned-rules file (the
shipped `agents/policies/generalisation-rules.json` by default) or tuned now.

Tuning takes minutes (hundreds of candidates over a dozen training workloads), so the suite
reuses the shipped file unless asked to re-tune; the file records the workloads, seeds and the
simulation config it was tuned for, and a file tuned for another config is refused.
"""
from __future__ import annotations

from pathlib import Path

from sim_bridge.config import SimConfig

from .base import Agent, load_agent
from .generalisation import TUNE_WORKLOADS, rules_from_json, training_workloads, tune_rules, write_rules_json

SHIPPED_RULES = Path(__file__).resolve().parent / "policies" / "generalisation-rules.json"


def tuned_rules(sim: SimConfig, rules_path: str | Path | None = None, retune: bool = False,
                write_to: str | Path | None = None, n_workloads: int = TUNE_WORKLOADS,
                progress: bool = True) -> tuple[dict[str, Agent], str]:
    """({rule kind: tuned agent}, where the parameters came from)."""
    if retune and rules_path:  # before minutes of tuning: the file given was read by nothing
        raise ValueError(f"re-tuning ignores the tuned-rules file {rules_path}: give one or the other (--rules, --retune)")
    path = Path(rules_path) if rules_path else SHIPPED_RULES
    if not retune and path.is_file():
        return rules_from_json(path, sim), str(path)
    if not retune and rules_path:
        raise FileNotFoundError(f"tuned-rules file {path} not found")
    workloads = training_workloads(sim, n=n_workloads)
    tuned = tune_rules(sim, workloads, progress=progress)
    agents = {kind: _agent(sim, kind, r["params"]) for kind, r in tuned.items()}
    if not write_to:
        return agents, "tuned now on the training split"
    out = write_rules_json(write_to, tuned, sim, workloads, n_workloads=n_workloads)
    return agents, f"tuned now on the training split (written to {out})"


def _agent(sim: SimConfig, kind: str, params: dict) -> Agent:
    from .factory import make_agent

    return make_agent(kind, sim, params)


def suite_agents(sim: SimConfig, policy_dir: str | Path | None = None, **rules_kw) -> tuple[dict[str, Agent], dict]:
    """The learned policy under the name `lstm-ppo`, then the rules by kind; plus provenance."""
    from .factory import make_agent

    policy = load_agent(policy_dir) if policy_dir else make_agent("lstm-ppo", sim)
    rules, source = tuned_rules(sim, **rules_kw)
    return {"lstm-ppo": policy, **rules}, {"policy": str(policy_dir or "shipped"), "policy_version": policy.version,
                                           "rules": source}
