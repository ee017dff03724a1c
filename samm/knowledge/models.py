"""The Knowledge schema: what the daemon saw, decided and did, and the state a restart needs.

One SQLAlchemy 2 declarative model per table, with portable types only, so the same schema
runs on SQLite (the default, one file) and PostgreSQL:

- every time is a float of epoch seconds (`Double`), the unit the rest of SAMM uses
  (`time.time()`, instance launch times, cool-downs); no time-zone conversion can happen;
- structured values are `JSON` (numbers, strings, lists, maps; NaN is never stored, see
  `samm.knowledge.store.to_json`);
- statuses are short strings guarded by CHECK constraints.

Constraint and index names come from `NAMING_CONVENTION` so that they are the same on every
back-end: SQLite's batch migrations must name a constraint to drop or alter it.

The migrations in `samm/knowledge/migrations/` must create exactly this schema; a test
compares the migrated database with `Base.metadata`.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import (JSON, Boolean, CheckConstraint, Double, ForeignKey, Integer, MetaData, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SNAPSHOT_STATUSES = ("ok", "partial", "stale")
DECISION_SOURCES = ("agent", "fallback", "none")
# planned: recorded, not started; in_flight: the executor may have been called (a crash leaves
# it so: recovery must look at the back-end); the others are final.
ACTION_STATUSES = ("planned", "in_flight", "succeeded", "failed", "skipped", "dry_run", "blocked")
OPEN_ACTION_STATUSES = ("planned", "in_flight")
FINAL_ACTION_STATUSES = tuple(s for s in ACTION_STATUSES if s not in OPEN_ACTION_STATUSES)


# Python None in a nullable JSON column is SQL NULL (`IS NULL` finds it), not the JSON text 'null'
NullableJSON = JSON(none_as_null=True)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Snapshot(Base):
    """What the Monitor stage gathered for one interval."""

    __tablename__ = "snapshots"
    __table_args__ = (CheckConstraint(_one_of("status", SNAPSHOT_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    window_start: Mapped[float] = mapped_column(Double)
    window_end: Mapped[float] = mapped_column(Double, index=True)
    status: Mapped[str] = mapped_column(String(16))
    reasons: Mapped[list[str]] = mapped_column(JSON)
    # compact per-instance and queue data: enough to recompute the observation
    raw: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)


class Observation(Base):
    """The named features the Analyze stage derived from a snapshot."""

    __tablename__ = "observations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    snapshot_id: Mapped[int] = mapped_column(ForeignKey("snapshots.id"), index=True)
    features: Mapped[dict[str, float | None]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Double)


DEFAULT_LOOP = "default"
DEFAULT_PROBLEM = "autoscaling"


class Decision(Base):
    """The Plan stage's choice for one iteration of one control loop, of any problem.
    (`loop`, `iteration_key`) is unique: a replayed or restarted iteration finds its decision
    instead of deciding twice, and two loops deciding in the same minute do not collide."""

    __tablename__ = "decisions"
    __table_args__ = (CheckConstraint(_one_of("source", DECISION_SOURCES), name="source"),
                      UniqueConstraint("loop", "iteration_key"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    loop: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_LOOP, index=True)
    problem: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_PROBLEM)
    iteration_key: Mapped[str] = mapped_column(String(128))
    agent: Mapped[str] = mapped_column(String(128))
    policy_version: Mapped[str | None] = mapped_column(String(128), nullable=True)
    observation_id: Mapped[int | None] = mapped_column(ForeignKey("observations.id"), nullable=True, index=True)
    # the observation as the policy saw it, for problems without a snapshot/feature row
    observation: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    action: Mapped[Any] = mapped_column(JSON)  # an element of the policy's action space, as JSON
    action_name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    probabilities: Mapped[Any | None] = mapped_column(NullableJSON, nullable=True)
    value: Mapped[float | None] = mapped_column(Double, nullable=True)
    source: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Double, index=True)


class Action(Base):
    """One request to one executor about one target (a group, a node, a service: `group_name`
    keeps its historical name). `idempotency_key` is unique: whoever inserts it owns the call
    to the back-end, everyone else finds the row. Loops other than `default` prefix their keys
    with the loop's name."""

    __tablename__ = "actions"
    __table_args__ = (CheckConstraint(_one_of("status", ACTION_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    decision_id: Mapped[int] = mapped_column(ForeignKey("decisions.id"), index=True)
    loop: Mapped[str] = mapped_column(String(64), server_default=DEFAULT_LOOP)
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    executor: Mapped[str] = mapped_column(String(32))
    group_name: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double, nullable=True)


class GroupState(Base):
    """Per-target state of each loop that must survive a restart: a restarted daemon honours
    cool-downs (the VPA's checkpoints: state a restart needs, one row per object)."""

    __tablename__ = "group_state"

    loop: Mapped[str] = mapped_column(String(64), primary_key=True, server_default=DEFAULT_LOOP)
    group_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    cooldown_until: Mapped[float] = mapped_column(Double)
    last_action_at: Mapped[float | None] = mapped_column(Double, nullable=True)
    last_action_key: Mapped[str | None] = mapped_column(String(128), nullable=True)


class PolicyVersion(Base):
    """A trained policy the daemon loaded; at most one `active` row per agent (kept so by
    `KnowledgeStore.register_policy_version`)."""

    __tablename__ = "policy_versions"
    __table_args__ = (UniqueConstraint("agent", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent: Mapped[str] = mapped_column(String(128))
    version: Mapped[str] = mapped_column(String(128))
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[float] = mapped_column(Double)
    active: Mapped[bool] = mapped_column(Boolean, default=False)


TABLES = tuple(Base.metadata.tables)
__all__ = ["DEFAULT_LOOP", "DEFAULT_PROBLEM", "Base", "Snapshot", "Observation", "Decision", "Action", "GroupState", "PolicyVersion",
           "NAMING_CONVENTION", "SNAPSHOT_STATUSES", "DECISION_SOURCES", "ACTION_STATUSES",
           "OPEN_ACTION_STATUSES", "FINAL_ACTION_STATUSES", "TABLES"]


class Lease(Base):
    """A leader lease: `holder` may act until `expires_at`; `token` (the fencing token) grows by
    one whenever another holder takes the lease, so a write fenced with an older token is
    refused even if its holder still believes it leads."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    token: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[float] = mapped_column(Double)
    renewed_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)
