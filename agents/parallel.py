"""Independent training runs in parallel processes (one per core), with a progress bar: what
every problem's experiment does with its (method, seed) runs."""
from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Sequence


class WorkerDied(RuntimeError):
    """A worker process of `map_runs` died (killed, or out of memory): its runs are unfinished."""


def map_runs(fn: Callable, jobs: Sequence, workers: int = 2, progress: bool = True, desc: str = "runs") -> list:
    """[fn(job) for job in jobs], in order; `workers` > 1 runs them in that many processes.
    A run that raises ends the map at once (the runs not started are dropped) with its own
    exception, noted with the job; a worker process that dies is a WorkerDied naming the jobs
    left unfinished."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="run", file=sys.stderr, desc=desc)
    results = []
    try:
        if workers > 1:
            # at most one process per job (but still processes when asked): a fork-started pool
            # starts every worker at once, so --workers 1000 for two jobs forked 1000 processes
            _map_in_processes(fn, jobs, min(int(workers), max(len(jobs), 2)), results, bar, desc)
        else:
            for j in jobs:
                results.append(_run_named(fn, j, desc))
                bar and bar.update(1)
    finally:
        bar and bar.close()
    return results


def _short(job) -> str:
    text = repr(job)
    return text if len(text) <= 80 else text[:77] + "..."


def _run_named(fn: Callable, job, desc: str):
    try:
        return fn(job)
    except Exception as exc:
        exc.add_note(f"{desc}: in the run of job {_short(job)}")
        raise


def _map_in_processes(fn: Callable, jobs: Sequence, workers: int, results: list, bar, desc: str) -> None:
    pool = ProcessPoolExecutor(max_workers=workers)
    futures = [pool.submit(fn, j) for j in jobs]
    try:
        for job, future in zip(jobs, futures):
            try:
                results.append(future.result())
            except BrokenProcessPool as exc:
                left = [_short(j) for j, f in zip(jobs, futures)
                        if not f.done() or f.cancelled() or f.exception() is not None]
                raise WorkerDied(f"{desc}: a worker process died (killed, or out of memory) with {len(left)} of "
                                   f"{len(jobs)} runs unfinished, among them {', '.join(left[:3])}") from exc
            except Exception as exc:
                exc.add_note(f"{desc}: in the run of job {_short(job)}")
                raise
            bar and bar.update(1)
    finally:
        # after a failure, the runs not started yet are dropped instead of waited for (hours, in
        # an experiment); the running ones end before this returns, so no process is left behind
        pool.shutdown(wait=True, cancel_futures=True)


PROGRESS_FILE = "progress.json"


def write_progress(folder, done: int, total: int, **extra) -> None:
    """Say in folder/progress.json how far a run is ({"done", "total", ...}), replaced whole so a
    reader never sees half a file: how a parent follows runs in other processes (`watch_progress`),
    and how a user follows a quiet one."""
    path = Path(folder) / PROGRESS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"done": int(done), "total": int(total), **extra}))
    os.replace(tmp, path)


class watch_progress:
    """`with watch_progress(folders, desc=...)`: one progress bar over the runs writing progress.json
    in `folders` (`write_progress`), polled every `every` seconds on a thread until the block ends.
    A folder not written yet counts as nothing done."""

    def __init__(self, folders, desc: str = "runs", unit: str = "step", every: float = 2.0):
        self.files = [Path(f) / PROGRESS_FILE for f in folders]
        self.desc, self.unit, self.every = desc, unit, every

    def _read(self) -> tuple[int, int]:
        done = total = 0
        for f in self.files:
            try:
                p = json.loads(f.read_text())
                done, total = done + int(p["done"]), total + int(p["total"])
            except (OSError, ValueError, KeyError, TypeError):     # not written yet, or a run's own bug
                pass
        return done, total

    def _poll(self) -> None:
        while True:
            done, total = self._read()
            if total and self.bar.total != total:
                self.bar.total = total
            self.bar.n = done
            self.bar.refresh()
            if self._stop.wait(self.every):
                return

    def __enter__(self):
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit=self.unit, file=sys.stderr, desc=self.desc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        done, total = self._read()
        self.bar.total, self.bar.n = max(total, done), done
        self.bar.close()
