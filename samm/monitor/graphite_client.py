"""Talking to Graphite: batched plaintext sends to carbon, events and /render reads.

`GraphiteSender` never raises on a dead or slow carbon: monitoring must not take the thing it
monitors down. It logs once per failure streak and counts the points it dropped. Reads
(`RenderClient`) do raise, with the URL and the status, because the Monitor stage must know
that it could not see the fleet (`GraphiteSource` turns that into a stale reading).
"""
from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import graphyte
import requests

from samm.httpio import fetch_bounded, one_line_page

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def sanitize(name: str) -> str:
    """One dotted-path component per docs/metric-naming.md: anything outside
    `[A-Za-z0-9_-]` becomes `_` (so a name can never add a level or break the line protocol)."""
    return _UNSAFE.sub("_", str(name)) or "_"


class GraphiteSender:
    """Buffers points and sends each flush as one payload over one TCP connection.

    `send()` buffers (and flushes when `batch_size` points are waiting); `flush()` sends.
    Non-finite values are skipped (carbon drops NaN; it stores inf, which a reader would take
    for a measurement) and counted in `skipped`; points that
    could not be delivered are counted in `dropped`. Thread-safe.
    """

    def __init__(self, host: str, port: int = 2003, timeout_s: float = 2.0, batch_size: int = 1000):
        self.host, self.port, self.timeout_s, self.batch_size = host, int(port), float(timeout_s), int(batch_size)
        self._builder = graphyte.Sender(host, port, raise_send_errors=True)
        self._buf: list[bytes] = []
        self._lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.skipped = 0
        self._failing = False

    def send(self, metric: str, value: float, ts: float) -> None:
        """Buffer one point; `ts` in epoch seconds (floored: a point must never land in the
        next slot, which could be the next interval)."""
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):  # an int beyond float's range overflows
            log.warning("graphite: %s has a non-numeric value %r; skipped", metric, value)
            self.skipped += 1
            return
        if not math.isfinite(value):  # carbon stores inf, and a reader then takes it for a measurement
            self.skipped += 1
            return
        try:
            msg = self._builder.build_message(metric, value, int(math.floor(ts)))
        except (ValueError, TypeError, OverflowError) as exc:  # an infinite timestamp overflows int()
            log.warning("graphite: cannot send %r: %s", metric, exc)
            self.skipped += 1
            return
        with self._lock:
            self._buf.append(msg)
            full = len(self._buf) >= self.batch_size
        if full:
            self.flush()

    def send_many(self, points: Iterable[tuple[str, float, float]]) -> None:
        for metric, value, ts in points:
            self.send(metric, value, ts)

    @property
    def pending(self) -> int:
        return len(self._buf)

    def flush(self) -> int:
        """Send everything buffered over one connection; returns the points delivered (0 when
        carbon is unreachable: the points are dropped, logged and counted, never retried, as
        a late resend would land after the reader has closed the interval)."""
        with self._lock:
            batch, self._buf = self._buf, []
        if not batch:
            return 0
        try:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as sock:
                sock.sendall(b"".join(batch))
        except OSError as exc:
            self.dropped += len(batch)
            if not self._failing:
                log.warning("graphite: carbon %s:%d unreachable (%s); dropping points until it is back",
                            self.host, self.port, exc)
            self._failing = True
            return 0
        if self._failing:
            log.info("graphite: carbon %s:%d reachable again (%d points dropped so far)", self.host, self.port, self.dropped)
        self._failing = False
        self.sent += len(batch)
        return len(batch)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> "GraphiteSender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class GraphiteError(RuntimeError):
    """A Graphite HTTP call failed; the message names the URL and the status or error."""


def post_event(render_url: str, what: str, tags: Sequence[str] | str, data: str = "",
               when: float | None = None, timeout_s: float = 5.0) -> bool:
    """Post a Graphite event (Grafana annotations read them by tag). Returns False (and logs)
    instead of raising: an event is a courtesy, never a reason to fail an action."""
    body: dict = {"what": what, "tags": list(tags.split()) if isinstance(tags, str) else list(tags), "data": data}
    if when is not None:
        body["when"] = float(when)
    url = render_url.rstrip("/") + "/events/"
    try:
        status, answer, _ = fetch_bounded(requests.post, url, timeout_s, data=json.dumps(body),
                                           headers={"Content-Type": "application/json"})
    except requests.RequestException as exc:
        log.warning("graphite: event %r not posted to %s: %s", what, url, exc)
        return False
    if status >= 300:
        log.warning("graphite: event %r not posted to %s: HTTP %d %s", what, url, status, one_line_page(answer, 200))
        return False
    return True


@dataclass
class Series:
    target: str
    points: list[tuple[float | None, int]] = field(default_factory=list)  # (value, ts)

    def values(self) -> list[tuple[float, int]]:
        return [(v, t) for v, t in self.points if v is not None]


class RenderClient:
    """`GET /render?format=json` with a timeout (`timeout_s` for the headers, and as long again for
    the body: an answer that trickles in is cut). Raw points only (no maxDataPoints: it would
    consolidate); `from`/`until` are passed as given (epoch seconds or Graphite offsets)."""

    MAX_GET_CHARS = 2000  # longer target lists go as a form POST (URLs have length limits)

    def __init__(self, render_url: str, timeout_s: float = 5.0, session: requests.Session | None = None):
        self.base = render_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.session = session or requests.Session()

    def render(self, targets: str | Sequence[str], from_: int | str, until: int | str) -> list[Series]:
        targets = [targets] if isinstance(targets, str) else list(targets)
        url = f"{self.base}/render"
        params = [("target", t) for t in targets] + [("from", str(from_)), ("until", str(until)), ("format", "json")]
        # graphite-web reads the same parameters from a form body: long target lists (a look-back
        # over thousands of named instances) go as POST, where no URL length limit applies
        method = "POST" if sum(len(t) for t in targets) > self.MAX_GET_CHARS else "GET"
        where = f"{url} ({len(targets)} target(s), {sum(map(len, targets))} characters)"
        for attempt in range(2):
            try:
                status, body, sent_url = self._fetch(method, url, params)
            except requests.RequestException as exc:
                raise GraphiteError(f"{method} {url} failed: {exc}") from exc
            # one retry on a server error: graphite-web answers 500 when it reads a whisper file
            # that carbon is still creating (a new instance's first points); a moment later it is whole
            if status < 500 or attempt:
                break
            time.sleep(0.2)
        if method == "GET":
            where = sent_url
        if status != 200:
            raise GraphiteError(f"{method} {where} answered HTTP {status}: {one_line_page(body)}")
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise GraphiteError(f"{method} {where} returned invalid JSON: {exc}") from exc
        # a proxy's error page or another API can answer 200 with JSON of another shape: name it
        # as such instead of letting an AttributeError deep in the reader stand for the reason
        shape = "a list of {target, datapoints: [[value, timestamp], ...]}"
        if not isinstance(data, list):
            raise GraphiteError(f"{method} {where} returned JSON that is not {shape}: {str(data)[:200]}")
        out = []
        try:
            for s in data:
                pts = []
                for v, t in s.get("datapoints", []):
                    pts.append((None if v is None else float(v), int(t)))
                out.append(Series(str(s.get("target", "")), pts))
        except (AttributeError, TypeError, ValueError, OverflowError) as exc:  # int(inf): a timestamp 1e999
            raise GraphiteError(f"{method} {where} returned JSON that is not {shape}: "
                                f"{type(exc).__name__}: {exc}") from exc
        return out

    def _fetch(self, method: str, url: str, params: list[tuple[str, str]]) -> tuple[int, bytes, str]:
        if method == "GET":
            return fetch_bounded(self.session.get, url, self.timeout_s, params=params)
        return fetch_bounded(self.session.post, url, self.timeout_s, data=params)

    def close(self) -> None:
        self.session.close()
