"""Independent training runs in parallel processes (one per core), with a progress bar: what
every problem's experiment does with its (method, seed) runs."""
from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
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
