"""Which daemon may act: a leader lease in the knowledge store, with a fencing token.

Every `samm run` takes the lease `daemon` before it recovers or decides anything, and renews it
every ttl/3. Two modes:

* **single** (the default, and the only one on SQLite): a second daemon against the same store
  finds the lease held and exits with a message naming the holder. A holder on this host whose
  process is gone (a crash, `kill -9`) is taken over at once, so a restart never waits.
* **ha** (`ha.enabled`, PostgreSQL): a daemon that finds the lease held waits as a standby and
  polls every ttl/3; when the leader stops renewing (killed, host lost) the lease expires after
  ttl and a standby takes it, with the token one higher. With ttl = 0.75 × the shortest loop
  interval (the default, never under MIN_DEFAULT_TTL_S), the standby leads within one interval
  of the last renewal and decides the next window: within two intervals of the leader's death.

Holder names are per process: `host:pid`, or `NAME@host:pid` with `ha.holder: NAME` (one name
in a config file copied to two hosts must not make them one holder), and a daemon that does
not lead yet never renews a lease found under its own name: it takes it only as another
holder's (expired, or a dead local process's), with a new token (`fresh`).

Fencing: from the first lease taken, the store carries the `Fence` (lease, holder, token), and
keeps the last one once the lease is lost or released. Recording a decision and claiming an
action check it in the same transaction, so a deposed leader, whether it still believes it
leads (a long pause, a partition) or has just stepped down with an iteration under way, writes
nothing and acts on nothing; the new leader honours the cool-downs, decisions and idempotency
keys already written, and `recover()` resolves actions the old leader left in flight. A leader
that fails to renew for a whole ttl steps down: the process exits with `LOST_LEADERSHIP`
(systemd restarts it as a standby); a lease its renewal could only take anew (another daemon
led meanwhile) is given back at once, not held a ttl against the standbys.

Lease times are the daemons' own clocks (epoch seconds, like every time in the store), so the
hosts must be NTP-synchronised: a skew of d seconds lets a standby take over d seconds early or
late. Fencing keeps an early takeover safe; it only costs the old leader its last window.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from samm.knowledge.store import Fence, KnowledgeStore, LeaseRecord

log = logging.getLogger(__name__)

LEASE_NAME = "daemon"
#: exit status of a daemon that another daemon holds the lease against (single mode)
ANOTHER_LEADER = 2
#: exit status of a leader that lost its lease
LOST_LEADERSHIP = 3
#: the shortest default lease. A lease of a fraction of a second (0.75 × a 0.2 s test interval)
#: lapses whenever a loaded host delays the renewal thread for a moment (the first iteration
#: loading a policy, a SQLite write lock), deposing a healthy leader. 1.5 s leaves the HA
#: testbed's 2 s interval at its 0.75 × interval, so its takeover time is unchanged.
MIN_DEFAULT_TTL_S = 1.5


def default_lease_ttl(shortest_interval_s: float) -> float:
    """The lease length when the config gives none: 0.75 × the shortest loop interval, at least
    MIN_DEFAULT_TTL_S."""
    return max(MIN_DEFAULT_TTL_S, 0.75 * shortest_interval_s)


#: holder names whose lease a Leadership of this process holds now (tests run several daemons in one)
_HELD_HERE: set[str] = set()


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_name(configured: str | None = None) -> str:
    """This process's name in the lease: `host:pid`, or `NAME@host:pid` with `ha.holder` NAME.
    A configured name alone would be shared by every daemon given the same config file: each
    would renew the others' lease as its own and all would act under one fencing token."""
    ident = default_holder()
    if not configured:
        return ident
    return f"{configured[:max(1, 200 - len(ident) - 1)]}@{ident}"  # the column holds 200 characters


def _dead_local_holder(holder: str) -> bool:
    """True when `holder` (`host:pid` or `NAME@host:pid`) names a process of this host that no
    longer runs. Our own pid there is a predecessor's (this process does not hold the lease):
    a container restarted with the same hostname and pid 1."""
    host, _, pid = holder.rpartition(":")
    host = host.rpartition("@")[2]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return holder not in _HELD_HERE
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass
class Leadership:
    store: KnowledgeStore
    ttl_s: float
    ha: bool = False
    holder: str = ""
    name: str = LEASE_NAME

    def __post_init__(self) -> None:
        self.holder = self.holder or default_holder()
        self.current: LeaseRecord | None = None
        # renew (the keeper thread) against release/forget (shutdown, step-down): a renewal whose
        # store call outlasts a release must not lead again on the lease it re-extended
        self._lock = threading.RLock()

    @property
    def leading(self) -> bool:
        return self.current is not None

    def try_acquire(self) -> bool:
        """Take the lease if it is free (or a dead local process's in single mode). A lease
        under our holder name that we do not hold is another process's (`fresh`)."""
        rec = self.store.acquire_lease(self.name, self.holder, self.ttl_s, fresh=self.current is None)
        if rec is None and not self.ha:
            other = self.store.lease(self.name)
            if other is not None and _dead_local_holder(other.holder):
                log.warning("lease %r: holder %s is a process of this host that no longer runs; taking over",
                            self.name, other.holder)
                rec = self.store.acquire_lease(self.name, self.holder, self.ttl_s, take_over=True)
        self._set(rec)
        return rec is not None

    def renew(self) -> bool:
        """Extend the lease; False (and no longer leading) once another holder has it, or once
        this daemon stepped down (another thread may renew at that moment: not leading again)."""
        if self.current is None:
            return False
        rec = self.store.acquire_lease(self.name, self.holder, self.ttl_s)
        with self._lock:
            if self.current is None:
                # released or stepped down while the call was under way: it may have extended the
                # lease after the release ended it, and a standby would wait a whole ttl for it
                if rec is not None:
                    self._release_in_store()
                return False
            if rec is not None and rec.token != self.current.token:
                # our lease lapsed and we took a new one: another leader may have acted between, so
                # we do not lead on it; and it is given back (under the lock, as every release
                # here), since held until it expired it kept a standby, and our own restart, out
                # for a whole ttl
                rec = None
                self._release_in_store()
            self._set(rec)
            return rec is not None

    def release(self) -> None:
        with self._lock:
            held = self.current is not None
            self._set(None)
        if held:
            self._release_in_store()

    def _release_in_store(self) -> None:
        try:
            self.store.release_lease(self.name, self.holder)
        except Exception as exc:  # noqa: BLE001 - the lease expires anyway
            log.warning("releasing lease %r failed: %s", self.name, exc)

    def forget(self) -> None:
        """Stop leading without touching the store (another daemon holds the lease now)."""
        with self._lock:
            self._set(None)

    def holder_now(self) -> str:
        rec = self.store.lease(self.name)
        return "nobody" if rec is None else f"{rec.holder} (token {rec.token})"

    def _set(self, rec: LeaseRecord | None) -> None:
        self.current = rec
        if rec is None:
            # the last fence stays: a store without one checks nothing, and an iteration still
            # under way when the lease was lost or given up (the scheduler lets it finish) would
            # record its decision and act beside the new leader; the old fence refuses it
            _HELD_HERE.discard(self.holder)
            return
        _HELD_HERE.add(self.holder)
        self.store.fence = Fence(rec.name, rec.holder, rec.token)
