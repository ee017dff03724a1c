"""Independent training runs in parallel processes (one per core), with a progress bar: what
every problem's experiment does with its (method, seed) runs."""
from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Sequence


def map_runs(fn: Callable, jobs: Sequence, workers: int = 2, progress: bool = True, desc: str = "runs") -> list:
    """[fn(job) for job in jobs], in order; `workers` > 1 runs them in that many processes."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="run", file=sys.stderr, desc=desc)
    results = []
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for r in pool.map(fn, jobs):
                results.append(r)
                bar and bar.update(1)
    else:
        for j in jobs:
            results.append(fn(j))
            bar and bar.update(1)
    bar and bar.close()
    return results


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
