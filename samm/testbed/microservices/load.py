"""The load generator, host side: Locust headless in its own process, read back per second.

Locust runs `locustfile.py` (closed-loop users, exponential think time of mean 1/rate_per_user,
request types by the topology's weights) as a separate process, because it monkey-patches the
standard library with gevent. The interface to the controller is a file of JSON lines, one per
wall-clock second (its fields are in locustfile.py's docstring): the process appends, this side
tails it. A file rather than a socket because it is also the run's record of the load (load.jsonl
beside steps.csv) and needs no listener that could itself stall.

`stall()` / `resume()` freeze and thaw the Locust process (SIGSTOP / SIGCONT): the stall fault.
While frozen, no line is written, so the controller sees stale load data.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agents.microservice_cores.observation import PERCENTILES
from samm.localproc import popen_tied

log = logging.getLogger(__name__)

LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


#: a load record's t_end this far ahead of the reader's clock is not of this run (a bogus line,
#: or another clock): it would otherwise stay "the newest second" and never turn stale
MAX_AHEAD_S = 60.0


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def record_problem(rec) -> str | None:
    """Why `rec` (a parsed line) is not a load record of locustfile.py's format, or None: a JSON
    object with a whole `second`, its `t_end` = second + 1 (epoch s, not far in the future), numeric
    `requests_per_s` / `failures_per_s` and `latency_ms` null or the PERCENTILES as numbers >= 0."""
    if not isinstance(rec, dict):
        return f"not a JSON object but {type(rec).__name__}"
    if not _number(rec.get("second")) or rec["second"] != int(rec["second"]):
        return f"second {rec.get('second')!r} is not a whole number"
    if not _number(rec.get("t_end")):
        return f"t_end {rec.get('t_end')!r} is not a number"
    if rec["t_end"] > time.time() + MAX_AHEAD_S:
        return f"t_end {rec['t_end']!r} is more than {MAX_AHEAD_S:g} s in the future"
    # `second` orders the records (`latest` takes the largest): one not ending at its t_end would
    # stay "the newest second" past every real line, and the load would look stale for good
    if abs(rec["t_end"] - rec["second"] - 1) > 1e-6:
        return f"t_end {rec['t_end']!r} is not second {rec['second']!r} + 1"
    for k in ("requests_per_s", "failures_per_s"):
        if not _number(rec.get(k)) or rec[k] < 0:
            return f"{k} {rec.get(k)!r} is not a number >= 0"
    lat = rec.get("latency_ms")
    if lat is not None and lat != [] and (not isinstance(lat, list) or len(lat) != len(PERCENTILES)
                                          or not all(_number(x) and x >= 0 for x in lat)):
        return f"latency_ms is not null nor {len(PERCENTILES)} numbers >= 0"
    return None


class LoadGenerator:
    def __init__(self, topology_json: str | os.PathLike, base_port: int, users: int, out_dir: str | os.PathLike, *,
                 run_time_s: float = 3600.0, seed: int | None = None):
        if users < 1:
            raise ValueError("users must be >= 1")
        self.topology_json = Path(topology_json)
        self.base_port = int(base_port)
        self.users = int(users)
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / "load.jsonl"
        self.log_path = self.out_dir / "locust.log"
        self.run_time_s = run_time_s
        self.seed = seed
        self.proc: subprocess.Popen | None = None
        self.records: dict[int, dict] = {}   # second -> record
        self._offset = 0
        self._partial = b""
        self.stalled = False
        self.rejected = 0                    # lines skipped as not load records (record_problem)
        self.last_rejected: str | None = None

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start Locust and wait for its first per-second line."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--users", str(self.users),
               "--spawn-rate", str(self.users), "--run-time", f"{int(self.run_time_s)}s", "--stop-timeout", "1",
               "--host", f"http://127.0.0.1:{self.base_port}", "--only-summary", "--loglevel", "WARNING",
               "--ms-topology", str(self.topology_json), "--ms-base-port", str(self.base_port),
               "--ms-out", str(self.path)]
        if self.seed is not None:
            cmd += ["--ms-seed", str(self.seed)]
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH"))
                                                         if p)}
        logf = open(self.log_path, "ab")
        try:
            self.proc = popen_tied(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=str(REPO_ROOT), env=env)
        finally:
            logf.close()
        deadline = time.monotonic() + ready_timeout_s
        while not self.poll():
            if self.proc.poll() is not None:
                raise RuntimeError(f"locust exited with {self.proc.returncode} at start-up: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"locust wrote no load line within {ready_timeout_s:g} s: {self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self, n: int = 10) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return "(no log)"

    def poll(self) -> list[dict]:
        """New complete lines since the last call (also kept in `records`)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an unterminated last line waits for its end
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                self._reject(line, "not JSON")
                continue
            problem = record_problem(rec)
            if problem:
                self._reject(line, problem)
                continue
            self.records[int(rec["second"])] = rec
            new.append(rec)
        return new

    def _reject(self, line: bytes, why: str) -> None:
        """A line that is not a load record is skipped (counted, the newest reason kept): one bad
        line must not stop the reader, nor stand for the load of a second."""
        self.rejected += 1
        self.last_rejected = f"{why}: {line[:120]!r}"
        log.warning("load line skipped (%s): %r", why, line[:200])

    def latest(self) -> dict | None:
        """The newest complete second, after reading what is new."""
        self.poll()
        return self.records[max(self.records)] if self.records else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stall(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.stalled = True

    def resume(self) -> None:
        if self.proc is not None and self.stalled:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stalled = False

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        self.resume()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.poll()
