"""Per-session state of the Policy Evaluation Service: never shared between callers, dropped after
an idle TTL, the least recently used evicted past a cap, and started afresh when another policy
is hosted under a session (an upload or a rollback, even one that repeats the version string).

Entries are kept least recently used first (an OrderedDict), so both expiry and eviction take
from the front: each call costs O(1) amortised whatever the number of live sessions (measured at
10 and 10,000 sessions by `benchmarks/service_latency.py --sessions`). One implementation serves
the generic decide route and every problem's routes (`sessions_for(app)`)."""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, TypeVar

V = TypeVar("V")

#: defaults of `samm serve --max-sessions / --session-ttl` and of the `service:` config section
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_SESSION_TTL_S = 3600.0


class LruTtlCache(Generic[V]):
    """Values by key with an idle TTL and a size cap; thread-safe."""

    def __init__(self, max_items: int = DEFAULT_MAX_SESSIONS, ttl_s: float = DEFAULT_SESSION_TTL_S,
                 clock: Callable[[], float] = time.monotonic):
        if not (max_items >= 1 and ttl_s > 0):  # written so a NaN TTL (every state dropped at once) fails too
            raise ValueError(f"sessions: max_items must be ≥ 1 and ttl_s > 0, got {max_items} and {ttl_s}")
        self.max_items, self.ttl_s, self.clock = int(max_items), float(ttl_s), clock
        self._items: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The live value of `key` (not marking it used), or None."""
        with self._lock:
            self._expire(self.clock())
            item = self._items.get(key)
            return None if item is None else item[1]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            now = self.clock()
            self._expire(now)
            self._insert(key, value, now)

    def get_or_make(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value of `key`, made if absent, marked as just used."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            item = self._items.pop(key, None)
            value = make() if item is None else item[1]
            self._insert(key, value, now)
            return value

    def pop(self, key: Hashable) -> bool:
        with self._lock:
            return self._items.pop(key, None) is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def expire(self) -> None:
        """Drop the values idle past the TTL now (otherwise only the next get or put does)."""
        with self._lock:
            self._expire(self.clock())

    def _insert(self, key: Hashable, value: V, now: float) -> None:
        self._items.pop(key, None)
        self._items[key] = (now, value)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def _expire(self, now: float) -> None:
        items = self._items
        while items:
            seen, _ = items[next(iter(items))]
            if now - seen <= self.ttl_s:
                break
            items.popitem(last=False)


def _policy_tag(agent) -> Any:
    """What a session's state is tagged with: the policy object itself (weakly), not its version
    string, which an upload may repeat over other weights or another state shape."""
    try:
        return weakref.ref(agent)
    except TypeError:  # a class with __slots__ and no __weakref__: hold it
        return agent


def _tagged_by(tag: Any, agent) -> bool:
    return (tag() if isinstance(tag, weakref.ref) else tag) is agent


class SessionStore:
    """The generic decide route's recurrent state per (agent, session), tagged with the policy
    object it was computed under."""

    def __init__(self, ttl_s: float = DEFAULT_SESSION_TTL_S, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic):
        self._cache: LruTtlCache[tuple[Any, Any]] = LruTtlCache(max_sessions, ttl_s, clock)
        self.ttl_s, self.max_sessions = ttl_s, max_sessions

    def checkout(self, agent_name: str, session_id: str, agent) -> Any:
        item = self._cache.get((agent_name, session_id))
        if item is None or not _tagged_by(item[1], agent):
            return self.fresh(agent)
        return item[0]

    @staticmethod
    def fresh(agent) -> Any:
        """A new session's state (also a call that names no session). Autoscalers keep a batch of
        one; any other problem's policy its own state (a plug-in's may name an action mode too)."""
        from samm.plan.registry import _is_autoscaler

        return agent.initial_state(1) if _is_autoscaler(agent) else agent.initial_state()

    def store(self, agent_name: str, session_id: str, agent, state: Any) -> None:
        self._cache.put((agent_name, session_id), (state, _policy_tag(agent)))

    def reset(self, agent_name: str, session_id: str) -> bool:
        return self._cache.pop((agent_name, session_id))

    def __len__(self) -> int:
        """Live sessions only (/healthz reports it), not those idle past the TTL."""
        self._cache.expire()
        return len(self._cache)

    def cache(self) -> LruTtlCache:
        """A new cache with this store's cap and TTL, for a problem's own per-session state."""
        return LruTtlCache(self.max_sessions, self.ttl_s, self._cache.clock)


def sessions_for(app) -> LruTtlCache:
    """Per-session state for a problem's routes on `app`: the cap and TTL `samm serve` was given
    when the app is the Policy Evaluation Service, the defaults on a stand-alone app."""
    store = getattr(app.state, "sessions", None)
    return store.cache() if isinstance(store, SessionStore) else LruTtlCache()
