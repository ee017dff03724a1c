"""`samm run`: the daemon in the foreground under APScheduler, systemd-aware.

One iteration per interval (`coalesce`, `max_instances=1`, misfire grace: a stalled loop runs
once to catch up, never in parallel with itself). SIGTERM/SIGINT let the current iteration
finish, then the process exits 0. Under systemd (Type=notify): READY=1 once configuration,
knowledge store and scheduler are up; WATCHDOG=1 only while iterations keep completing;
STOPPING=1 on shutdown.
"""
from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from datetime import datetime, timezone

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from samm.config import SammConfig

from . import sdnotify
from .build import Daemon, build_daemon
from .loop import IterationReport

log = logging.getLogger(__name__)


class DaemonRunner:
    def __init__(self, daemon: Daemon, max_iterations: int | None = None, on_iteration=None):
        self.daemon = daemon
        self.cfg: SammConfig = daemon.cfg
        self.loops = daemon.loops
        first = getattr(self.loops[0].config, "simulation", None)
        self.max_iterations = max_iterations or getattr(first, "max_iterations", None)
        self.on_iteration = on_iteration
        self.stop_event = threading.Event()
        self.reports: list[IterationReport] = []
        self.errors = 0
        self.finished: set[str] = set()
        for loop in self.loops:
            loop.lock = threading.Lock()

    # runs in the scheduler's worker thread
    def _iterate(self, loop=None) -> None:
        loop = loop or self.loops[0]
        if self.stop_event.is_set() or loop.name in self.finished:
            return
        with loop.lock:  # one iteration of a loop at a time; loops run side by side
            rep = loop.run_once()
        rep.loop = loop.name
        self.reports.append(rep)
        if self.on_iteration is not None:
            self.on_iteration(rep)
        sdnotify.status(f"loop {loop.name} iteration {rep.key}: {rep.status}, "
                        f"{rep.plan.action_name if rep.plan else 'no decision'}")
        done = [r for r in self.reports if r.loop == loop.name]
        if rep.finished or (self.max_iterations and len(done) >= self.max_iterations):
            self.finished.add(loop.name)
        if self.finished >= {lp.name for lp in self.loops}:
            self.stop_event.set()

    def _watchdog(self, every_s: float) -> None:
        # progress = an iteration completed within two intervals (plus slack for a slow one)
        while not self.stop_event.wait(every_s):
            stuck = [(lp.name, time.monotonic() - lp.last_progress) for lp in self.loops
                     if lp.name not in self.finished
                     and time.monotonic() - lp.last_progress >= 2 * lp.config.timing.interval_s + 30.0]
            if not stuck:
                sdnotify.watchdog()
            else:
                log.error("watchdog: no iteration completed by %s; not pinging systemd",
                          ", ".join(f"loop {n} for {s:.0f} s" for n, s in stuck))

    def _on_event(self, event) -> None:
        if event.code == EVENT_JOB_ERROR:
            self.errors += 1
            log.error("iteration raised: %r", event.exception, exc_info=event.exception)
        elif event.code == EVENT_JOB_MISSED:
            log.warning("iteration missed its run time (the previous one overran)")

    def _first_run(self, lp) -> datetime:
        """Live sources read the last complete interval once `lateness_s` has passed after its
        end, so iterations are phased just after that point (firing earlier would read the
        interval before, already decided). A simulation advances on demand: start now."""
        now = time.time()
        if lp.executor.kind == "sim":
            return datetime.fromtimestamp(now, timezone.utc)
        every = lp.timing.interval_s
        phase = self.cfg.graphite.lateness_s + min(0.1 * every, 2.0)
        first = (now - phase) // every * every + every + phase
        return datetime.fromtimestamp(first, timezone.utc)

    def run(self, install_signals: bool = True) -> int:
        faulthandler.enable()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop_event.set())
        for loop in self.loops:
            for note in loop.recover():
                log.warning("loop %s recovered: %s", loop.name, note)
        sched = BackgroundScheduler(timezone=timezone.utc, executors={
            "default": {"type": "threadpool", "max_workers": max(2, len(self.loops))}},
            job_defaults={"coalesce": True, "max_instances": 1})
        sched.add_listener(self._on_event, EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        for loop in self.loops:  # one scheduler job per loop
            t = loop.config.timing
            sched.add_job(self._iterate, IntervalTrigger(seconds=t.interval_s, timezone=timezone.utc),
                          args=(loop,), id=f"mape-k-{loop.name}", next_run_time=self._first_run(loop.config),
                          misfire_grace_time=max(1, int(t.misfire_grace_s)))
        sched.start()
        wd = sdnotify.watchdog_interval_s()
        if wd:
            threading.Thread(target=self._watchdog, args=(wd,), name="samm-watchdog", daemon=True).start()
        sdnotify.ready()
        for loop in self.loops:
            lp = loop.config
            log.info("samm loop %s running: problem %s, executor %s, agent %s, every %.3g s", loop.name,
                     lp.problem, lp.executor.kind, lp.agent.name, lp.timing.interval_s)  # every loop config has these
        try:
            while not self.stop_event.wait(0.5):
                pass
        finally:
            sdnotify.stopping()
            sched.shutdown(wait=True)  # lets a running iteration finish
            self.daemon.close()
        log.info("samm daemon stopped after %d iterations", len(self.reports))
        return 0 if self.errors == 0 else 1


def run_daemon(cfg: SammConfig, max_iterations: int | None = None, on_iteration=None) -> tuple[int, DaemonRunner]:
    daemon = build_daemon(cfg)
    runner = DaemonRunner(daemon, max_iterations=max_iterations, on_iteration=on_iteration)
    return runner.run(), runner
