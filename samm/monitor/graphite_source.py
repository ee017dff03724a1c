"""The Monitor stage's reader: the last complete interval of the fleet, from Graphite.

Window alignment. With interval I and lateness L, a read at time `now` covers
``[E − I, E)`` where ``E = floor((now − L) / I) · I``: the last epoch-aligned interval that
ended at least L seconds ago (so the collectors' last points have arrived). Graphite's
`from`/`until` are exclusive/inclusive one slot later than they look (platform notes): the
query for ``[a, b)`` is ``from=a−1&until=b−1``; points are also filtered by timestamp here.
Schedule the daemon's iteration a little more than L after each boundary, else it reads
the interval before.

Render calls (raw points, never `maxDataPoints`; aggregation in Python):

1. ``P.groups.{G}.instances.*.{cpu_percent,ram_used_gb}`` over the window: per-instance means
   and `last_seen`;
2. ``P.queue.*`` over ``history_s`` before E: the queue counters, including the last value
   before the window (the baseline of the `submitted_total` delta);
   The first read of a fresh reader (or after a gap between reads) also takes
   ``P.groups.{G}.instances.*.up`` over the history: who reported recently but is silent now;
3. only for instances that are new to this reader: their ``up`` heartbeats over
   ``first_seen_lookback_s``, named one by one (`first_seen` then stays cached). A long list of
   names goes as one POST.

Graphite's cost is per series (a whisper read and a carbon-cache query each, measured in
docs/benchmarks.md), not per point, so the per-interval reads touch two series per instance;
the heartbeats are read only when an instance is new (the warm-up reads the whole fleet's).
SAMM's collectors send `up` with every CPU and RAM point, so the window's CPU and RAM
timestamps are the heartbeats of the window.

Status rules (each adds a line to `reasons`; the worst wins):

* ``stale``: Graphite unreachable or answering an error (a 5xx is retried once, 0.2 s later); no data at all in the window; any of
  the queue series `submitted_total`, `waiting`, `waiting_submitted_this_minute` without a
  valid point in the window (metrics 6 and 7 would be invented).
* ``partial``: points dropped as invalid (non-finite, negative, `cpu_percent` above
  100 + `cpu_slack`, `ram_used_gb` above `ram_factor` × the group's RAM when known); an
  instance reporting some of its series but not both CPU and RAM; `running` or
  `completed_total` missing; a cumulative counter going backwards into or within the window
  (the delta then assumes a reset to 0; an older drop in the history is left alone); no
  `submitted_total` before the window (the delta is then a lower bound: last − first point of
  the window), or none in the interval before it (the delta would span more than
  one interval); `waiting` above `submitted_total`, or `waiting_submitted_this_minute` above the
  interval's arrivals (each counts some of the other's jobs); the first-seen lookback failing.
  `queue.*` series other than those named here are ignored.
* A read that finds a series or a point missing (the stale and partial rules above that say
  "missing", "without", "no data", "has no valid") is made once more, ``reread_delay_s`` (0.5 s)
  later, from the same reader state, and the second answer stands: graphite-web reads a
  series' whisper file before it asks carbon's cache, so a flush between the two hides that
  series' newest points from one render (seen in CI as a queue series missing from a window
  that a poll a moment earlier showed whole). A second miss adds a reason saying so.
* ``ok`` otherwise. Instances that fell silent are listed (no CPU/RAM) but do not change the
  status here: only the inventory knows whether they were terminated (`assemble`).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Literal, Mapping

from .graphite_client import GraphiteError, RenderClient, Series, sanitize

Status = Literal["ok", "partial", "stale"]
_RANK = {"ok": 0, "partial": 1, "stale": 2}
REQUIRED_QUEUE = ("submitted_total", "waiting", "waiting_submitted_this_minute")
OPTIONAL_QUEUE = ("running", "completed_total")
COUNTERS = ("submitted_total", "completed_total")
# Core counts for the `extended` features: absent from older exporters, so not even `partial`
# when missing (a policy that reads them sees NaN and the loop does nothing).
CORE_QUEUE = ("waiting_cores", "running_cores", "head_job_cores")
QUEUE_SERIES = REQUIRED_QUEUE + OPTIONAL_QUEUE + CORE_QUEUE


@dataclass(frozen=True)
class InstanceReading:
    group: str
    instance: str
    cpu_percent: float | None  # mean of the window's valid points; None: no valid point
    ram_used_gb: float | None
    first_seen: float | None  # earliest heartbeat known (epoch s)
    last_seen: float | None  # latest point of any of its series

    @property
    def reported(self) -> bool:
        """Complete CPU and RAM in the window: the instance counts as running and measured."""
        return self.cpu_percent is not None and self.ram_used_gb is not None


@dataclass(frozen=True)
class QueueReading:
    submitted_total: float | None = None
    submitted_interval: float | None = None
    waiting: float | None = None
    running: float | None = None
    completed_total: float | None = None
    waiting_interval: float | None = None  # waiting_submitted_this_minute at the window's end
    waiting_cores: float | None = None
    running_cores: float | None = None
    head_job_cores: float | None = None


@dataclass(frozen=True)
class MonitorReading:
    window_start: float
    window_end: float
    instances: dict[tuple[str, str], InstanceReading] = field(default_factory=dict)  # (group, instance)
    queue: QueueReading = QueueReading()
    status: Status = "ok"
    reasons: tuple[str, ...] = ()


def worst(*statuses: Status) -> Status:
    return max(statuses, key=_RANK.__getitem__)


def _brace(names: Iterable[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else "{" + ",".join(names) + "}"


class _Issues:
    def __init__(self) -> None:
        self.status: Status = "ok"
        self.reasons: list[str] = []
        self.missing = False  # a series or a point the window should hold was absent
        self._dropped: dict[str, list[str]] = defaultdict(list)

    def add(self, status: Status, reason: str, missing: bool = False) -> None:
        self.status = worst(self.status, status)
        self.reasons.append(reason)
        self.missing = self.missing or missing

    def drop(self, rule: str, where: str) -> None:
        self._dropped[rule].append(where)

    def finish(self) -> None:
        for rule, where in self._dropped.items():
            shown = ", ".join(sorted(set(where))[:5]) + (" ..." if len(set(where)) > 5 else "")
            self.add("partial", f"dropped {len(where)} point(s) ({rule}): {shown}")


class GraphiteSource:
    """Reads `MonitorReading`s; `read()` never raises (failures become a stale reading).

    `ram_gb` maps group names to the RAM of their instance type, for the plausibility check.
    `now` is injectable (tests, replays).
    """

    def __init__(self, render: RenderClient, prefix: str, groups: Iterable[str], interval_s: float = 60.0,
                 lateness_s: float = 5.0, now: Callable[[], float] = time.time, history_s: float | None = None,
                 first_seen_lookback_s: float = 900.0, ram_gb: Mapping[str, float] | None = None,
                 cpu_slack: float = 1.0, ram_factor: float = 4.0, reread_delay_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep):
        self.render = render
        self.prefix = prefix
        self.groups = [sanitize(g) for g in groups]
        if not self.groups:
            raise ValueError("GraphiteSource needs at least one group")
        if not interval_s > 0 or lateness_s < 0:
            raise ValueError(f"interval_s must be > 0 and lateness_s >= 0, got {interval_s}, {lateness_s}")
        self.interval_s = float(interval_s)
        self.lateness_s = float(lateness_s)
        self.now = now
        self.history_s = float(history_s) if history_s else 3 * self.interval_s
        if self.history_s < 2 * self.interval_s:
            raise ValueError("history_s must cover at least two intervals (the window and the one before)")
        self.first_seen_lookback_s = max(float(first_seen_lookback_s), self.history_s)
        self.ram_gb = {sanitize(k): float(v) for k, v in (ram_gb or {}).items()}
        self.cpu_slack = float(cpu_slack)
        self.ram_factor = float(ram_factor)
        if reread_delay_s < 0:
            raise ValueError(f"reread_delay_s must be >= 0, got {reread_delay_s}")
        self.reread_delay_s = float(reread_delay_s)
        self._sleep = sleep
        self._first_seen: dict[tuple[str, str], float] = {}
        self._last_seen: dict[tuple[str, str], float] = {}
        self._covered: tuple[float, float] | None = None  # (heard completely since, until)

    # --- public ----------------------------------------------------------------------------
    def window(self, window_end: float | None = None) -> tuple[float, float]:
        if window_end is None:
            window_end = math.floor((self.now() - self.lateness_s) / self.interval_s) * self.interval_s
        return window_end - self.interval_s, float(window_end)

    def read(self, window_end: float | None = None) -> MonitorReading:
        try:
            start, end = self.window(window_end)
        except Exception as exc:  # noqa: BLE001 - a broken clock must not crash the loop
            return MonitorReading(math.nan, math.nan, status="stale", reasons=(f"cannot compute the window: {exc}",))
        try:
            state = (dict(self._first_seen), dict(self._last_seen), self._covered)
            reading, missing = self._read(start, end)
            if missing and self.reread_delay_s > 0:
                # graphite-web reads a series' whisper file, then asks carbon's cache: a flush in
                # between hides the points being flushed from that one render. Read once more,
                # from the same state, before calling a past window incomplete.
                self._first_seen, self._last_seen, self._covered = dict(state[0]), dict(state[1]), state[2]
                self._sleep(self.reread_delay_s)
                reading, missing = self._read(start, end)
                if missing:
                    reading = replace(reading, reasons=reading.reasons + (
                        f"read twice, {self.reread_delay_s:g} s apart: the data is missing, not in flight",))
            return reading
        except GraphiteError as exc:
            return MonitorReading(start, end, status="stale", reasons=(f"Graphite unavailable: {exc}",))
        except Exception as exc:  # noqa: BLE001 - unexpected payloads: report, never raise
            return MonitorReading(start, end, status="stale", reasons=(f"Graphite reading failed: {type(exc).__name__}: {exc}",))

    # --- internals -------------------------------------------------------------------------
    def _instances_glob(self, metrics: str, instances: str = "*") -> str:
        return f"{self.prefix}.groups.{_brace(self.groups)}.instances.{instances}.{metrics}"

    def _split(self, s: Series) -> tuple[str, ...] | None:
        if not s.target.startswith(self.prefix + "."):
            return None
        return tuple(s.target[len(self.prefix) + 1:].split("."))

    def _valid(self, kind: str, group: str | None, v: float) -> str | None:
        """The rule a value breaks, or None."""
        if not math.isfinite(v):
            return "non-finite"
        if v < 0:
            return "negative"
        if kind == "cpu_percent" and v > 100.0 + self.cpu_slack:
            return f"cpu_percent above {100 + self.cpu_slack:g}"
        if kind == "ram_used_gb" and group in self.ram_gb and v > self.ram_factor * self.ram_gb[group]:
            return f"ram_used_gb above {self.ram_factor:g}x the type's RAM"
        return None

    def _read(self, start: float, end: float) -> tuple[MonitorReading, bool]:
        """The window's reading, and whether some series or point it should hold was absent."""
        issues = _Issues()
        a, b = int(math.floor(start)), int(math.floor(end))
        window_series = self.render.render(self._instances_glob("{cpu_percent,ram_used_gb}"), a - 1, b - 1)
        hist_from = int(math.floor(end - self.history_s))
        hist_targets = [f"{self.prefix}.queue.*"]
        # what this reader has heard is complete from `covered_from` on while its reads follow one
        # another; a fresh reader, or one after a gap, reads the history's heartbeats again
        contiguous = self._covered is not None and self._covered[0] <= start <= self._covered[1]
        covered_from = self._covered[0] if contiguous else float(hist_from)
        if not contiguous:
            hist_targets.append(self._instances_glob("up"))
        hist_series = self.render.render(hist_targets, hist_from - 1, b - 1)

        values: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        seen_ts: dict[tuple[str, str], list[int]] = defaultdict(list)
        queue_pts: dict[str, list[tuple[int, float]]] = {}
        for s in window_series + hist_series:
            parts = self._split(s)
            if parts is None:
                continue
            if len(parts) == 5 and parts[0] == "groups" and parts[2] == "instances":
                _, group, _, inst, metric = parts
                key = (group, inst)
                for v, ts in s.values():
                    # heartbeats before the window tell first/last seen; none at or after its end
                    # may (a server that overshoots `until` would hide an instance gone silent)
                    if ts >= end or (ts < start and metric != "up"):
                        continue
                    rule = self._valid(metric, group, v)
                    if rule:
                        issues.drop(rule, f"{group}/{inst}.{metric}")
                        continue
                    seen_ts[key].append(ts)
                    if start <= ts < end:
                        values[key][metric].append(v)
            elif len(parts) == 2 and parts[0] == "queue" and parts[1] in QUEUE_SERIES:
                # another exporter's `queue.*` series is none of ours: its values must not make
                # every window partial
                pts = []
                for v, ts in s.values():
                    if ts >= end:
                        continue
                    rule = self._valid("queue", None, v)
                    if rule:
                        issues.drop(rule, f"queue.{parts[1]}")
                        continue
                    pts.append((ts, v))
                queue_pts[parts[1]] = sorted(pts)

        instances = self._instances(values, seen_ts, covered_from, end, issues)
        queue = self._queue(queue_pts, start, end, issues)
        issues.finish()
        if not any(i.reported for i in instances.values()) and all(
                not any(start <= ts < end for ts, _ in pts) for pts in queue_pts.values()):
            issues.add("stale", f"no data in the window [{a}, {b}) under {self.prefix!r}", missing=True)
        self._covered = (covered_from, max(end, self._covered[1]) if contiguous else end)
        return MonitorReading(start, end, instances, queue, issues.status, tuple(issues.reasons)), issues.missing

    def _instances(self, values, seen_ts, covered_from: float, end: float, issues: _Issues) -> dict:
        need_lookback = []
        for key, ts in seen_ts.items():
            earliest = min(ts)
            self._last_seen[key] = max(max(ts), self._last_seen.get(key, -math.inf))
            if key in self._first_seen:
                self._first_seen[key] = min(self._first_seen[key], earliest)
            elif earliest < covered_from + self.interval_s:
                need_lookback.append(key)  # heard from the start of what we know: may be older
            else:
                self._first_seen[key] = earliest
        if need_lookback:
            self._lookback(need_lookback, seen_ts, end, issues)

        # instances heard within the history but silent in this window stay listed (no CPU/RAM),
        # so that the snapshot can tell a silent collector from a VM still booting
        heard = [k for k, t in self._last_seen.items() if t >= end - self.history_s and k not in seen_ts]
        out = {}
        for key in list(seen_ts) + heard:
            group, inst = key
            v = values.get(key, {})
            cpu = v.get("cpu_percent")
            ram = v.get("ram_used_gb")
            if any(v.values()) and not (cpu and ram):
                missing = " and ".join(m for m, x in (("cpu_percent", cpu), ("ram_used_gb", ram)) if not x)
                issues.add("partial", f"instance {group}/{inst} reported but has no valid {missing} in the window",
                           missing=True)
            out[key] = InstanceReading(group, inst, sum(cpu) / len(cpu) if cpu else None,
                                       sum(ram) / len(ram) if ram else None,
                                       self._first_seen.get(key), self._last_seen.get(key))
        # forget instances silent for longer than the lookback (terminated long ago)
        for key in [k for k, t in self._last_seen.items() if t < end - self.first_seen_lookback_s]:
            self._last_seen.pop(key, None)
            self._first_seen.pop(key, None)
        return out

    def _lookback(self, keys, seen_ts, end: float, issues: _Issues) -> None:
        by_group: dict[str, list[str]] = defaultdict(list)
        for g, i in keys:
            by_group[g].append(i)
        targets = [f"{self.prefix}.groups.{g}.instances.{_brace(sorted(insts))}.up" for g, insts in sorted(by_group.items())]
        b = int(math.floor(end))
        try:
            series = self.render.render(targets, b - int(self.first_seen_lookback_s) - 1, b - 1)
        except GraphiteError as exc:
            issues.add("partial", f"first-seen lookback failed ({exc}); using the history's earliest heartbeat")
            series = []
        found = {}
        for s in series:
            parts = self._split(s)
            if parts and len(parts) == 5:
                pts = [ts for v, ts in s.values() if math.isfinite(v) and ts < end]
                if pts:
                    found[(parts[1], parts[3])] = min(pts)
        for key in keys:
            self._first_seen[key] = min(found.get(key, math.inf), min(seen_ts[key]))

    def _queue(self, pts: dict[str, list[tuple[int, float]]], start: float, end: float, issues: _Issues) -> QueueReading:
        def last_in_window(name):
            inside = [v for ts, v in pts.get(name, []) if start <= ts < end]
            return inside[-1] if inside else None

        missing = [m for m in REQUIRED_QUEUE if last_in_window(m) is None]
        if missing:
            issues.add("stale", f"queue series {', '.join(missing)} missing in the window", missing=True)
        missing_opt = [m for m in OPTIONAL_QUEUE if last_in_window(m) is None]
        if missing_opt:
            issues.add("partial", f"queue series {', '.join(missing_opt)} missing in the window", missing=True)
        for name in COUNTERS:
            series = pts.get(name, [])
            for (t0, v0), (t1, v1) in zip(series, series[1:]):
                # only a drop into or within the window touches its delta: an older reset, still in
                # the history, must not hold back the windows after it
                if v1 < v0 and t1 >= start:
                    issues.add("partial", f"queue.{name} went backwards ({v0:g} at {t0} -> {v1:g} at {t1}): counter reset?")
                    break

        submitted = pts.get("submitted_total", [])
        last = last_in_window("submitted_total")
        waiting, waiting_interval = last_in_window("waiting"), last_in_window("waiting_submitted_this_minute")
        interval = None
        if last is not None:
            before = [(ts, v) for ts, v in submitted if ts < start]
            inside = [v for ts, v in submitted if start <= ts < end]
            if before:
                base_ts, base = before[-1]
                interval = last - base
                if interval < 0:
                    interval = last  # a reset: the counter restarted from 0 within the window
                elif base_ts < start - self.interval_s:
                    # the interval before the window lost its points: the delta also counts that
                    # interval's arrivals, and metric 7 would be understated without a word
                    issues.add("partial", f"the last queue.submitted_total before the window is from {base_ts}, "
                                          f"{start - base_ts:g} s before it: interval arrivals counted over more "
                                          "than one interval")
                elif waiting_interval is not None and waiting_interval > interval:
                    issues.add("partial", f"queue.waiting_submitted_this_minute ({waiting_interval:g}) exceeds the "
                                          f"interval's arrivals ({interval:g}): the queue's counters disagree")
            else:
                interval = last - inside[0]
                issues.add("partial", f"no queue.submitted_total in the {self.history_s:g} s before the window: "
                                      "interval arrivals estimated from the window alone (a lower bound)")
            # a share of what was submitted cannot exceed it: metric 6 would be clipped to 1, not measured
            if waiting is not None and waiting > last:
                issues.add("partial", f"queue.waiting ({waiting:g}) exceeds queue.submitted_total ({last:g}): "
                                      "the queue's counters disagree")
        return QueueReading(submitted_total=last, submitted_interval=interval, waiting=waiting,
                            running=last_in_window("running"), completed_total=last_in_window("completed_total"),
                            waiting_interval=waiting_interval, **{m: last_in_window(m) for m in CORE_QUEUE})
