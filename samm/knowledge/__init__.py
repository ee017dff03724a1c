"""Knowledge: the daemon's database of snapshots, observations, decisions, actions, cool-downs
and policy versions (SQLite by default, PostgreSQL by URL). See `store.KnowledgeStore`."""
from .engine import KnowledgeError, normalize_url
from .schema import head_revision, migrate
from .store import (ActionRecord, DecisionRecord, GroupStateRecord, KnowledgeStore, ObservationRecord,
                    PolicyVersionRecord, SnapshotRecord, to_json)

__all__ = ["KnowledgeStore", "KnowledgeError", "migrate", "head_revision", "normalize_url", "to_json",
           "ActionRecord", "DecisionRecord", "GroupStateRecord", "ObservationRecord", "PolicyVersionRecord",
           "SnapshotRecord"]
