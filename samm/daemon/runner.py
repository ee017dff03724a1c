"""`samm run`: the daemon in the foreground under APScheduler, systemd-aware.

One iteration per interval (`coalesce`, `max_instances=1`, misfire grace: a stalled loop runs
once to catch up, never in parallel with itself). SIGTERM/SIGINT let the current iteration
finish, then the process exits 0; SIGHUP (no config reload) is logged and ignored. Under
systemd (Type=notify): READY=1 once configuration,
knowledge store and scheduler are up (a standby: once it waits); WATCHDOG=1 only while the
daemon makes progress: a standby's polls and each loop's start-up recovery, then iterations
completing; STOPPING=1 on shutdown.

Before anything else the daemon takes the knowledge store's leader lease
(samm/daemon/leadership.py): a second daemon on an SQLite store exits naming the holder; with
`ha.enabled` (PostgreSQL) it waits as a standby and takes over when the leader stops renewing.
"""
from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from collections import deque
from datetime import datetime, timezone

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from samm.config import SammConfig
from samm.knowledge.store import KnowledgeError, LeaseLost

from . import sdnotify
from .build import Daemon, build_daemon
from .leadership import ANOTHER_LEADER, LOST_LEADERSHIP, Leadership, default_lease_ttl, holder_name
from .loop import IterationReport

log = logging.getLogger(__name__)

#: exit status when the knowledge store fails at start (after opening): a restart may find it back
STORE_FAILED = 1
#: the longest pause between two attempts to open an unreachable store under systemd
STORE_RETRY_MAX_S = 15.0
#: a change of the wall clock against the monotonic one by more than this reschedules the loops
CLOCK_JUMP_S = 2.0
#: the newest iteration reports kept in memory (`DaemonRunner.reports`): the knowledge store keeps
#: every decision; a daemon that kept every report grew without bound (a 1 s loop: 86,400 a day)
REPORTS_KEPT = 10_000
#: how often the leader deletes history older than knowledge.retention_days
PRUNE_EVERY_S = 3600


class DaemonRunner:
    def __init__(self, daemon: Daemon, max_iterations: int | None = None, on_iteration=None):
        self.daemon = daemon
        self.cfg: SammConfig = daemon.cfg
        self.loops = daemon.loops
        first = getattr(self.loops[0].config, "simulation", None)
        self.max_iterations = max_iterations or getattr(first, "max_iterations", None)
        self.on_iteration = on_iteration
        self.stop_event = threading.Event()
        self.reports: deque[IterationReport] = deque(maxlen=REPORTS_KEPT)
        self.iterations: dict[str, int] = {lp.name: 0 for lp in self.loops}  # completed, per loop
        self.errors = 0
        self.stop_requested = False  # SIGTERM/SIGINT: a stop asked for exits 0, whatever went before
        self.finished: set[str] = set()
        for loop in self.loops:
            loop.lock = threading.Lock()
        ha = self.cfg.ha
        ttl = ha.lease_ttl_s or default_lease_ttl(min(lp.config.timing.interval_s for lp in self.loops))
        self.leadership = Leadership(daemon.store, ttl, ha=ha.enabled, holder=holder_name(ha.holder))
        self.lost_leadership = False
        # set once no iteration can run any more: a stop request lets the iteration under way
        # finish (and write), so the lease is kept until then, not until the request
        self.lease_done = threading.Event()
        # the watchdog's view of the start-up (the standby wait, then recovery) until the loops run
        self._starting = True
        self._startup_progress = time.monotonic()
        self._standby_every = self.leadership.ttl_s / 3

    # runs in the scheduler's worker thread
    def _iterate(self, loop=None) -> None:
        loop = loop or self.loops[0]
        if self.stop_event.is_set() or loop.name in self.finished:
            return
        with loop.lock:  # one iteration of a loop at a time; loops run side by side
            try:
                rep = loop.run_once()
            except LeaseLost as exc:  # fenced: nothing of this iteration was acted on
                if self._lease_lapsed_only():
                    log.warning("loop %s: iteration cut short at a refused write, nothing after it done: the "
                                "lease had lapsed (a store lock, a pause or a clock jump outlasting it: %s); "
                                "renewed with the same token, nobody led meanwhile: leading on", loop.name, exc)
                    return
                self._step_down(f"loop {loop.name}: {exc}")
                return
        rep.loop = loop.name
        self.reports.append(rep)
        self.iterations[loop.name] += 1
        if self.on_iteration is not None:
            self.on_iteration(rep)
        sdnotify.status(f"loop {loop.name} iteration {rep.key}: {rep.status}, "
                        f"{rep.plan.action_name if rep.plan else 'no decision'}")
        if rep.finished or (self.max_iterations and self.iterations[loop.name] >= self.max_iterations):
            self.finished.add(loop.name)
        if self.finished >= {lp.name for lp in self.loops}:
            self.stop_event.set()

    def _watchdog(self, every_s: float) -> None:
        # runs from the start of `run`: a standby's wait and the start-up recovery take as long
        # as they take (a whole lease, an executor's retries), and systemd's WatchdogSec runs
        # through them; pinging only once the loops were scheduled got a healthy standby killed
        while not self.stop_event.wait(every_s):
            stuck = self._stuck()
            if not stuck:
                sdnotify.watchdog()
            else:
                log.error("watchdog: no progress by %s; not pinging systemd",
                          ", ".join(f"{n} for {s:.0f} s" for n, s in stuck))

    def _stuck(self) -> list[tuple[str, float]]:
        """What made no progress for too long: the start-up (each standby poll and each loop's
        recovery is progress) while it lasts, then each loop (an iteration completed)."""
        now = time.monotonic()
        if self._starting:
            slack = _stuck_after(max(self._standby_every, *(lp.config.timing.interval_s for lp in self.loops)))
            age = now - self._startup_progress
            return [("the start-up (standby wait or recovery)", age)] if age >= slack else []
        return [(f"loop {lp.name}", now - lp.last_progress) for lp in self.loops
                if lp.name not in self.finished
                and now - lp.last_progress >= _stuck_after(lp.config.timing.interval_s)]

    def _started_up(self, step: str) -> None:
        """A start-up step began or ended: the watchdog counts the start-up's progress from here."""
        self._startup_progress = time.monotonic()
        log.debug("start-up: %s", step)

    # --- leadership -----------------------------------------------------------------------------
    def _step_down(self, why: str) -> None:
        log.error("lost the leader lease, stepping down: %s", why)
        self.lost_leadership = True
        self.leadership.forget()
        self.lease_done.set()
        self.stop_event.set()

    def _lease_lapsed_only(self) -> bool:
        """After a fenced write was refused: True when the lease had only lapsed (a store lock or
        a pause outlasting it) and is renewed now under the same token, so no other daemon led
        in between (as `_keep_lease` does after a late renewal); False when it is gone."""
        try:
            return self.leadership.leading and self.leadership.renew()
        except Exception as exc:  # noqa: BLE001 - the store is failing: step down as before
            log.warning("renewing the leader lease after a refused write failed: %s", exc)
            return False

    def _keep_lease(self) -> None:
        lead = self.leadership
        last_ok = time.monotonic()
        while not self.lease_done.wait(lead.ttl_s / 3):
            try:
                if lead.renew():
                    last_ok = time.monotonic()
                    continue
                return self._step_down(f"lease now held by {lead.holder_now()}")
            except Exception as exc:  # noqa: BLE001 - the store may come back before the lease ends
                log.warning("renewing the leader lease failed: %s", exc)
                if time.monotonic() - last_ok > lead.ttl_s:
                    return self._step_down(f"no renewal for {lead.ttl_s:.3g} s")

    def _lead(self) -> bool:
        """Take the lease (single mode: now or never; ha: wait as a standby). False: do not run."""
        lead = self.leadership
        if lead.try_acquire():
            return True
        if not lead.ha:
            log.error("another samm daemon leads on knowledge store %s: %s. An SQLite store is single-daemon; "
                      "for a standby use PostgreSQL with ha.enabled", self.daemon.store.url, lead.holder_now())
            return False
        sdnotify.ready()
        # the watchdog thread pings while the standby waits, as often as systemd wants (a lease
        # longer than 3 × WatchdogSec once had it killed); each poll here is its progress
        every = self._standby_every
        log.info("standby: %s leads; polling every %.3g s", lead.holder_now(), every)
        sdnotify.status(f"standby ({lead.holder})")
        while not self.stop_event.wait(every):
            try:
                if lead.try_acquire():
                    return True
            except Exception as exc:  # noqa: BLE001 - keep waiting for the store
                log.warning("standby: reading the leader lease failed: %s", exc)
            self._started_up("standby poll")
        return False

    def _clock_jumped(self, sched, jump: float) -> None:
        """The scheduler waits for wall-clock run times: after the clock stepped back by an hour
        (NTP at boot, a VM resumed) it would run nothing for that hour. Schedule every loop
        again from the new time."""
        log.warning("the wall clock jumped %+.1f s: iterations rescheduled from now", jump)
        for loop in self.loops:
            try:
                sched.modify_job(f"mape-k-{loop.name}", next_run_time=self._run_after_jump(loop.config, jump))
            except Exception as exc:  # noqa: BLE001 - a job gone at shutdown
                log.warning("rescheduling loop %s failed: %s", loop.name, exc)

    def _run_after_jump(self, lp, jump: float) -> datetime:
        """The next run time from the new time; but a run time the clock jumped forward over
        (a VM paused for seconds, an NTP step) that is still within the misfire grace runs now,
        as the scheduler itself would: moved to the next one, its interval went undecided (a
        deferrable slot: its due jobs dropped without the deadline guard)."""
        upcoming = self._first_run(lp)
        skipped = upcoming.timestamp() - lp.timing.interval_s
        now = time.time()
        if (jump > 0 and lp.executor.kind != "sim" and now - jump < skipped
                and now - skipped <= _grace_s(lp.timing)):
            return datetime.fromtimestamp(skipped, timezone.utc)
        return upcoming

    def _prune(self) -> None:
        days = self.cfg.knowledge.retention_days
        try:
            self.daemon.store.prune(days * 86_400.0)
        except KnowledgeError as exc:  # history kept a while longer is no reason to stop acting
            log.warning("pruning the knowledge store failed, tried again in %d s: %s", PRUNE_EVERY_S, exc)

    @staticmethod
    def _on_sighup(*_) -> None:
        log.warning("SIGHUP ignored: samm run does not reload its configuration; restart it to apply "
                    "a new one (SIGTERM stops it after the iteration under way)")

    def _on_event(self, event) -> None:
        if event.code == EVENT_JOB_ERROR:
            self.errors += 1
            log.error("iteration raised: %r", event.exception, exc_info=event.exception)
        elif event.code == EVENT_JOB_MISSED:  # run later than the grace: the process or host stalled
            log.warning("%s: iteration due at %s missed by more than its misfire grace (the process or host "
                        "was stalled); the next one runs at the next interval", event.job_id,
                        event.scheduled_run_time)
        elif event.code == EVENT_JOB_MAX_INSTANCES:  # an overrun: never two iterations of a loop at once
            log.warning("%s: iteration due at %s skipped: the previous one still runs (it overran its interval)",
                        event.job_id, ", ".join(str(t) for t in event.scheduled_run_times))

    def _first_run(self, lp) -> datetime:
        """Live sources read the last complete interval once `lateness_s` has passed after its
        end, so iterations are phased just after that point (firing earlier would read the
        interval before, already decided). A simulation advances on demand: start now.
        Intervals count from the epoch, or from `timing.slot_zero_unix` where the loop has one
        (deferrable jobs): phased from the epoch instead, a slot was decided part-way through,
        or at its very end, where a late start put two iterations in one slot and none in the
        next."""
        now = time.time()
        if lp.executor.kind == "sim":
            return datetime.fromtimestamp(now, timezone.utc)
        every = lp.timing.interval_s
        phase = self.cfg.graphite.lateness_s + min(0.1 * every, 2.0)
        # the boundaries' offset within an interval: a remainder, exact however far slot zero is from now
        offset = (getattr(lp.timing, "slot_zero_unix", 0.0) + phase) % every
        first = (now - offset) // every * every + every + offset
        return datetime.fromtimestamp(first, timezone.utc)

    def run(self, install_signals: bool = True) -> int:
        wd = sdnotify.watchdog_interval_s()
        if wd:
            threading.Thread(target=self._watchdog, args=(wd,), name="samm-watchdog", daemon=True).start()
        try:
            return self._run(install_signals)
        finally:
            self.stop_event.set()  # ends the watchdog thread on every way out (another leader, a store failing)

    def request_stop(self) -> None:
        """What SIGTERM and SIGINT do: finish the iteration under way, release, exit 0."""
        self.stop_requested = True
        self.stop_event.set()

    def _run(self, install_signals: bool) -> int:
        faulthandler.enable()
        self._started_up("taking the leader lease")
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.request_stop())
            # SIGHUP's default action kills the process on the spot: mid-iteration, lease held,
            # and under systemd (a "clean" signal for Restart=on-failure) never restarted
            signal.signal(signal.SIGHUP, self._on_sighup)
        # a store failing from here to the first iteration exits STORE_FAILED (1), which systemd
        # restarts; raised, it would reach the CLI as exit 2, which the unit never restarts
        try:
            led = self._lead()
        except KnowledgeError as exc:
            log.error("cannot take the leader lease, not running: %s", exc)
            self.daemon.close()
            return STORE_FAILED
        if not led:
            self.daemon.close()
            return 0 if self.leadership.ha else ANOTHER_LEADER
        log.info("leading as %s (lease token %d, ttl %.3g s)", self.leadership.holder,
                 self.leadership.current.token, self.leadership.ttl_s)
        # a standby's "standby (...)" stayed in `systemctl status` until the first iteration: a
        # slot away for a slot loop, so the new leader showed as a standby meanwhile
        sdnotify.status(f"leading ({self.leadership.holder}, lease token {self.leadership.current.token})")
        keeper = threading.Thread(target=self._keep_lease, name="samm-lease", daemon=True)
        keeper.start()
        try:
            for loop in self.loops:
                self._started_up(f"recovering loop {loop.name}")
                for note in loop.recover():
                    log.warning("loop %s recovered: %s", loop.name, note)
        except KnowledgeError as exc:  # actions left in flight stay so: the next start resolves them
            log.error("resolving actions left in flight failed, not running: %s", exc)
            self.lease_done.set()
            keeper.join(self.leadership.ttl_s)
            self.leadership.release()
            self.daemon.close()
            return STORE_FAILED
        sched = BackgroundScheduler(timezone=timezone.utc, executors={  # a worker for the prune job too
            "default": {"type": "threadpool", "max_workers": len(self.loops) + 1}},
            job_defaults={"coalesce": True, "max_instances": 1})
        sched.add_listener(self._on_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        for loop in self.loops:  # one scheduler job per loop
            # the watchdog counts progress from here: time spent as a standby or in recovery is
            # no stuck loop (counted from the build, a standby taking over stopped the pings)
            loop.last_progress = time.monotonic()
            t = loop.config.timing
            sched.add_job(self._iterate, IntervalTrigger(seconds=t.interval_s, timezone=timezone.utc),
                          args=(loop,), id=f"mape-k-{loop.name}", next_run_time=self._first_run(loop.config),
                          misfire_grace_time=_grace_s(t))
        self._starting = False  # from here the watchdog follows each loop's iterations
        if self.cfg.knowledge.retention_days is not None:  # the leader alone prunes: first now, then hourly
            sched.add_job(self._prune, IntervalTrigger(seconds=PRUNE_EVERY_S, timezone=timezone.utc),
                          id="knowledge-prune", next_run_time=datetime.now(timezone.utc),
                          misfire_grace_time=PRUNE_EVERY_S)
        sched.start()
        sdnotify.ready()
        for loop in self.loops:
            lp = loop.config
            log.info("samm loop %s running: problem %s, executor %s, agent %s, every %.3g s", loop.name,
                     lp.problem, lp.executor.kind, lp.agent.name, lp.timing.interval_s)  # every loop config has these
        offset = time.time() - time.monotonic()
        try:
            while not self.stop_event.wait(0.5):
                jump, offset = time.time() - time.monotonic() - offset, time.time() - time.monotonic()
                if abs(jump) > CLOCK_JUMP_S:
                    self._clock_jumped(sched, jump)
        finally:
            sdnotify.stopping()
            sched.shutdown(wait=True)  # lets a running iteration finish
            self.lease_done.set()
            keeper.join(self.leadership.ttl_s)  # a renewal under way must not re-extend a released lease
            if not self.lost_leadership:
                self.leadership.release()  # a standby takes over at once
            self.daemon.close()
        log.info("samm daemon stopped after %d iterations", sum(self.iterations.values()))
        if self.lost_leadership:
            return LOST_LEADERSHIP
        if self.errors:
            log.warning("%d iteration(s) raised during this run (logged above)", self.errors)
        # a stop asked for is 0 (exit 1 made `systemctl stop` mark the unit failed for an error
        # weeks old); a bounded run (--max-iterations) that met errors still says so
        return 0 if self.errors == 0 or self.stop_requested else 1


def _stuck_after(interval_s: float) -> float:
    """No progress for this long is a stuck loop (or start-up): two intervals, plus slack for a
    slow one."""
    return 2 * interval_s + 30.0


def _grace_s(timing) -> int:
    """A loop's misfire grace as the scheduler takes it: whole seconds, at least 1."""
    return max(1, int(timing.misfire_grace_s))


def _store_unreachable(exc: KnowledgeError, url: str) -> bool:
    """A PostgreSQL server that did not answer (down, restarting, not up yet at boot): unlike a
    bad URL, a missing file or a corrupt database, it may come back by itself."""
    from sqlalchemy.exc import OperationalError

    return url.startswith("postgres") and isinstance(exc.__cause__, OperationalError)


def build_daemon_waiting_for_store(cfg: SammConfig, sleep=time.sleep) -> Daemon:
    """`build_daemon`; under systemd, a knowledge store that does not answer yet is retried
    (with STATUS= saying so) until it does: failing, `samm run` would exit 2, which the unit's
    RestartPreventExitStatus=2 (meant for a bad config) never restarts, so a daemon started
    while its PostgreSQL is down would stay down. systemd's start timeout bounds the wait (and
    restarts the unit). Outside systemd the error is raised at once."""
    delay = 1.0
    while True:
        try:
            return build_daemon(cfg)
        except KnowledgeError as exc:
            if not (sdnotify.notify_socket() and _store_unreachable(exc, cfg.knowledge.url)):
                raise
            log.warning("knowledge store unreachable, retrying in %.0f s: %s", delay, exc)
            sdnotify.status(f"waiting for the knowledge store: {exc}")
            sleep(delay)
            delay = min(2 * delay, STORE_RETRY_MAX_S)


def run_daemon(cfg: SammConfig, max_iterations: int | None = None, on_iteration=None) -> tuple[int, DaemonRunner]:
    daemon = build_daemon_waiting_for_store(cfg)
    runner = DaemonRunner(daemon, max_iterations=max_iterations, on_iteration=on_iteration)
    return runner.run(), runner
