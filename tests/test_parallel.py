"""agents/parallel.py: runs in processes, and one progress bar over runs that write progress.json."""
from __future__ import annotations

import json
import threading

from agents.parallel import PROGRESS_FILE, map_runs, watch_progress, write_progress


def _square(x: int) -> int:
    return x * x


def test_map_runs_keeps_the_jobs_order_in_processes_and_in_one():
    assert map_runs(_square, [3, 1, 2], workers=2, progress=False) == [9, 1, 4]
    assert map_runs(_square, [3, 1, 2], workers=1, progress=False) == [9, 1, 4]


def test_the_bar_over_progress_files_sums_what_each_run_wrote(tmp_path, capsys):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    write_progress(a, 300, 1000, phase="sac")
    assert json.loads((a / PROGRESS_FILE).read_text()) == {"done": 300, "total": 1000, "phase": "sac"}
    assert not list(a.glob("*.tmp"))            # written through a temporary file, replaced whole
    (c / PROGRESS_FILE).write_text("{half a fi")   # a torn or foreign file counts as nothing done
    with watch_progress([a, b, c], desc="seeds", every=0.01) as w:
        assert w._read() == (300, 1000)
        write_progress(b, 500, 1000)
        for _ in range(500):                    # the thread's next poll, however busy the machine
            if w.bar.n == 800:
                break
            threading.Event().wait(0.01)
        assert w.bar.total == 2000 and w.bar.n == 800
        write_progress(a, 1000, 1000)
        write_progress(b, 1000, 1000)
    assert w.bar.n == w.bar.total == 2000
    assert "seeds" in capsys.readouterr().err
