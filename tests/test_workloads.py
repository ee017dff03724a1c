"""Workloads: the paper's seed-1551 exactly, and SWF traces with their transforms."""
import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from sim_bridge.workloads import SwfTransform, load_swf, load_workload, read_swf_table, seed_1551

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pwa-swf"
KTH = SHARED / "KTH-SP2-1996-2.1-cln.swf.gz"
NASA = SHARED / "NASA-iPSC-1993-3.swf"
needs_traces = pytest.mark.skipif(not KTH.exists(), reason=f"PWA traces not found at {SHARED}")


def test_seed_1551_exactly():
    w = seed_1551()
    assert w.n_jobs == 1551
    batches, counts = np.unique(w.arrival_s[:-1], return_counts=True)
    np.testing.assert_array_equal(batches, 1800 + 480 * np.arange(21))
    assert counts.tolist() == [100] * 10 + [50] * 11
    assert np.all(w.length_mi[:-1] == 360 * 4400) and np.all(w.cores == 1)
    assert w.arrival_s[-1] == 13680 and w.length_mi[-1] == 4400  # the 1-second sentinel
    assert w.core_seconds(4400) / 3600 == pytest.approx(155.0, abs=0.001)


def test_pack_layout():
    w = seed_1551()
    b = w.pack()
    n = struct.unpack_from("<i", b)[0]
    assert n == 1551 and len(b) == 4 + n * (8 + 8 + 4 + 8)
    arr = np.frombuffer(b, dtype="<f8", count=n, offset=4)
    np.testing.assert_array_equal(arr, w.arrival_s)


def test_swf_transforms_on_a_small_file(tmp_path):
    # id submit wait run alloc cpu usedmem reqprocs reqtime reqmem status ...
    lines = ["; header line", "",
             "1 100 5 600 4 -1 -1 4 -1 -1 1 1 1 1 1 -1 -1 -1",
             "2 160 5 -1 2 -1 -1 2 -1 -1 5 1 1 1 1 -1 -1 -1",  # unknown run time: dropped
             "3 400 5 1200 32 -1 1048576 32 -1 -1 1 1 1 1 1 -1 -1 -1",  # 32 cores, 1 GB per proc
             "4 5000 5 60 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1"]
    p = tmp_path / "t.swf.gz"
    p.write_bytes(gzip.compress("\n".join(lines).encode()))
    w = load_swf(p, SwfTransform(window_end_s=1000, time_compression=2.0), default_core_cap=8)
    assert w.n_jobs == 2
    np.testing.assert_allclose(w.arrival_s, [0.0, 150.0])
    assert w.cores.tolist() == [4, 8]
    # run 1200 s / 2 = 600 s on 32 cores -> 8 cores keeping the work: 2400 s
    np.testing.assert_allclose(w.length_mi / 4400, [300.0, 2400.0])
    np.testing.assert_allclose(w.ram_gb, [2.0, 8.0])  # default 0.5 GB/core; 1 GB/proc kept per core
    w2 = load_swf(p, SwfTransform(core_cap_keep="runtime", max_cores=8))
    np.testing.assert_allclose(w2.length_mi / 4400, [600.0, 1200.0, 60.0])


def test_bad_inputs_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a built-in"):
        load_workload("no-such-workload")
    empty = tmp_path / "e.swf"
    empty.write_text("; only a header\n")
    with pytest.raises(ValueError, match="no job records"):
        load_swf(empty)
    with pytest.raises(ValueError):
        SwfTransform(window_start_s=10, window_end_s=5)


@needs_traces
def test_real_traces_parse():
    t = read_swf_table(NASA)
    assert t.shape[1] == 18 and len(t) > 100
    w = load_workload(KTH, SwfTransform(window_start_s=86400, window_end_s=86400 * 8), core_cap=8)
    assert w.n_jobs > 100
    assert w.arrival_s[0] >= 0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.cores.max() <= 8 and np.all(w.length_mi > 0)
    lublin = load_workload(SHARED / "synthetic" / "lublin_256.swf", SwfTransform(max_jobs=500), core_cap=8)
    assert lublin.n_jobs == 500
