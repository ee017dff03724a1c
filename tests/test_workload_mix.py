"""Workload mixes (issue 11): every source deterministic for a seed, the load scale exact, the
train/test split enforced, the YAML strict, the test windows fixed, the trace cache keyed right."""
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim_bridge.config import SimConfig
from sim_bridge.workloads import SwfTransform, Workload, load_workload
from sim_bridge.workloads import generators as gen
from sim_bridge.workloads.mix import (
    TEST_TRACES,
    TEST_WINDOWS,
    TRAIN_TRACES,
    WindowSpec,
    WorkloadMix,
    build_window,
    load_mix,
    offered_load,
    pwa_dir,
    split_of,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pwa-swf"
needs_traces = pytest.mark.skipif(not (SHARED / "KTH-SP2-1996-2.1-cln.swf.gz").exists(),
                                  reason=f"PWA traces not found at {SHARED}")
SIM = SimConfig()
# Small training traces keep the window sources fast when the disk cache is cold.
SMALL = ["NASA-iPSC-1993-3.1-cln.swf.gz", "SDSC-Par-1996-3.1-cln.swf.gz"]
SOURCES = {
    "swf": {"kind": "swf", "traces": SMALL},
    "lublin": {"kind": "lublin"},
    "batch": {"kind": "batch"},
    "poisson": {"kind": "poisson"},
}


def one_source(kind: str, **rules) -> WorkloadMix:
    return WorkloadMix.model_validate({"sources": [SOURCES[kind]], **rules})


def target_of(w: Workload) -> float:
    """The target load a sample's name states (`.../L0.85`, rounded to 0.01)."""
    return float(w.name.split("/L")[1].split("/")[0])


# ---------------------------------------------------------------------------- determinism
@needs_traces
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_every_source_is_deterministic_for_a_seed(kind):
    mix = one_source(kind)
    a = [w.digest() for w in mix.sampler(SIM, 11).sample_many(4)]
    b = [w.digest() for w in mix.sampler(SIM, 11).sample_many(4)]
    c = [w.digest() for w in mix.sampler(SIM, 12).sample_many(4)]
    assert a == b
    assert a != c
    assert len(set(a)) == 4  # a stream, not one workload repeated


@needs_traces
def test_default_mix_stream_is_reproducible_and_names_its_origin():
    mix = load_mix()
    a = mix.sampler(SIM, 3).sample_many(30)
    b = mix.sampler(SIM, 3).sample_many(30)
    assert [w.name for w in a] == [w.name for w in b]
    assert [w.digest() for w in a] == [w.digest() for w in b]
    kinds = {w.name.split("@")[0] for w in a}
    assert {"batch", "poisson", "lublin_256"} <= kinds and len(kinds) >= 6  # several traces too


# ------------------------------------------------------------------------------ load scale
def test_offered_load_by_hand():
    # 10 jobs x 2 cores x 1 h arriving over the first hour: 20 core-hours / (140 cores x 1 h)
    w = Workload("h", np.linspace(0, 3600, 10), np.full(10, 3600 * SIM.host_mips), np.full(10, 2, np.int32),
                 np.ones(10))
    assert SIM.max_fleet_cores == 140
    assert offered_load(w, SIM) == pytest.approx(20 / 140)
    # a single instant (one batch at t=0) spans one step, not zero
    w0 = Workload("i", np.zeros(2), np.full(2, 60 * SIM.host_mips), np.ones(2, np.int32), np.ones(2))
    assert offered_load(w0, SIM) == pytest.approx(2 * 60 / (140 * 60))


def test_thinning_and_scaling_hit_the_target_exactly():
    rng = np.random.default_rng(0)
    n = 400
    w = Workload("x", np.sort(rng.uniform(0, 4 * 3600, n)), rng.uniform(60, 3600, n) * SIM.host_mips,
                 rng.choice([1, 2, 4, 8], n).astype(np.int32), np.ones(n))
    heavy = offered_load(w, SIM)
    for target in (0.2, heavy / 3, 1.2):
        out = gen.thin_and_scale(w, SIM, target, np.random.default_rng(1), max_jobs=3000, thin_min_jobs=50)
        # exact by construction (one multiplicative factor), so only float rounding is allowed
        assert offered_load(out, SIM) == pytest.approx(target, rel=1e-9)
    # heavier than the target: a random subset of the jobs, run times kept up to the final factor
    out = gen.thin_and_scale(w, SIM, heavy / 4, np.random.default_rng(1), max_jobs=3000, thin_min_jobs=50)
    assert 50 <= out.n_jobs < n
    # the job-count cap thins even a light window
    capped = gen.thin_and_scale(w, SIM, heavy, np.random.default_rng(1), max_jobs=100, thin_min_jobs=50)
    assert capped.n_jobs == 100  # a hard cap


@needs_traces
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_samples_are_at_their_drawn_load(kind):
    lo, hi = 0.2, 1.2
    for w in one_source(kind).sampler(SIM, 5).sample_many(5):
        # the name rounds the target to 0.01: that is the whole tolerance
        assert offered_load(w, SIM) == pytest.approx(target_of(w), abs=0.005 + 1e-9)
        assert lo - 1e-9 <= offered_load(w, SIM) <= hi + 1e-9


@needs_traces
def test_a_light_window_is_overlaid_with_the_following_windows():
    jobs = gen.load_trace("NASA-iPSC-1993-3.1-cln.swf.gz")  # ~0.08 of the fleet on a normal day
    base = gen.trace_window(jobs, 20 * 86400, 24, 6.0, SIM, "runtime", "b")
    own = offered_load(base, SIM)
    assert own < 0.3
    w = gen.window_at_load(jobs, 20 * 86400, 24, 6.0, SIM, "runtime", 4 * own, np.random.default_rng(0),
                           max_jobs=3000, thin_min_jobs=50, max_overlay=8, name="o")
    assert w.n_jobs > 2 * base.n_jobs  # more users, not longer jobs
    assert offered_load(w, SIM) == pytest.approx(4 * own)
    runs = w.length_mi / SIM.host_mips
    assert np.median(runs) < 3 * np.median(base.length_mi / SIM.host_mips)


# -------------------------------------------------------------------------------- the rules
@needs_traces
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_samples_are_winnable_and_obey_the_rules(kind):
    sim = SimConfig(max_job_cores=4)  # a smaller cap than the largest VM type
    mix = one_source(kind)
    for w in mix.sampler(sim, 9).sample_many(6):
        assert int(w.cores.max()) <= sim.job_core_cap == 4
        assert w.n_jobs >= mix.min_jobs
        span = gen.span_seconds(w, sim)
        assert span <= mix.span_h[1] * 3600 + 1e-6
        assert w.length_mi.max() / sim.host_mips <= mix.max_run_over_span * span


def test_batch_generator_shape():
    w = gen.batch_workload(np.random.default_rng(4), SIM, span_s=3 * 3600, load=0.5, batches=7, idle_start_s=900,
                           interval_jitter=0.2, run_s=360, run_sigma=0.0, size_sigma=0.5,
                           cores={1: 1.0}, min_jobs=20, max_jobs=3000, name="b")
    times = np.unique(w.arrival_s)
    assert len(times) == 7 and times[0] == pytest.approx(900) and times[-1] == pytest.approx(3 * 3600)
    # identical 1-core jobs (run_sigma 0), as many as fill half the fleet at 360 s each
    assert np.all(w.cores == 1) and np.ptp(w.length_mi) == pytest.approx(0, abs=1e-6)
    assert w.n_jobs == round(0.5 * 140 * 3 * 3600 / 360)
    assert offered_load(w, SIM) == pytest.approx(0.5)


def test_poisson_generator_follows_its_rate():
    # a burst of 8x the rate in the second hour of two: ~8/9 of the jobs arrive in it
    w = gen.poisson_workload(np.random.default_rng(2), SIM, span_s=7200, load=0.5, amplitude=0.0, period_s=3600,
                             phase=0.0, bursts=[(3600.0, 3600.0, 8.0)], run_median_s=120, run_sigma=0.5,
                             cores={1: 1.0}, min_jobs=20, max_jobs=3000, name="p")
    assert np.all((w.arrival_s >= 0) & (w.arrival_s <= 7200))
    share = np.mean(w.arrival_s >= 3600)
    assert share == pytest.approx(8 / 9, abs=0.03)


# ---------------------------------------------------------------------------------- the split
def test_split_constants():
    assert not set(TRAIN_TRACES) & set(TEST_TRACES)
    assert all(split_of(t) == "train" for t in TRAIN_TRACES)
    assert all(split_of(t) == "test" for t in TEST_TRACES)
    assert split_of("NASA-iPSC-1993-3.swf") == "excluded"


@needs_traces
def test_the_split_covers_every_real_trace():
    real = {p.name for p in pwa_dir().glob("*.swf.gz")}
    assert real == set(TRAIN_TRACES) | {Path(t).name for t in TEST_TRACES if t.endswith(".gz")}


@pytest.mark.parametrize("trace", ["KTH-SP2-1996-2.1-cln.swf.gz", "/elsewhere/SDSC-SP2-1998-4.2-cln.swf",
                                   "derived/KTH-SP2-1996-2.1-cln.first90days.swf", "NASA-iPSC-1993-3.swf"])
def test_a_mix_naming_a_test_trace_is_rejected(trace):
    with pytest.raises(ValueError, match=Path(trace).name.replace(".", r"\.")):
        WorkloadMix.model_validate({"sources": [{"kind": "swf", "traces": ["LCG.swf.gz", trace]}]})
    with pytest.raises(ValueError, match="test|excluded"):
        WorkloadMix.model_validate({"sources": [{"kind": "lublin", "trace": trace}]})


def test_load_mix_rejects_a_test_trace_in_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"sources": [{"kind": "swf", "traces": ["CTC-SP2-1996-3.1-cln.swf.gz"]}]}))
    with pytest.raises(ValueError, match="CTC-SP2-1996-3.1-cln.swf.gz"):
        load_mix(f)


@needs_traces
def test_training_never_samples_a_test_trace():
    s = load_mix().sampler(SIM, 2024)
    test_labels = ("KTH-SP2", "SDSC-SP2", "CTC-SP2", "LLNL-Thunder")
    windows = 0
    for _ in range(150):
        w = s.sample()
        assert not w.name.startswith(test_labels), w.name
        if s.last_spec is not None:
            windows += 1
            assert split_of(s.last_spec.trace) == "train", s.last_spec.trace
            assert s.last_spec.name == w.name
    assert windows > 50  # the swf and lublin sources are more than half the default mix


# ----------------------------------------------------------------------------------- YAML
def test_yaml_round_trip(tmp_path):
    mix = load_mix()
    f = tmp_path / "mix.yaml"
    f.write_text(mix.to_yaml())
    again = load_mix(f)
    assert again == mix
    assert [s.kind for s in again.sources] == ["swf", "lublin", "batch", "poisson"]
    assert again.load == (0.2, 1.2) and again.span_h == (1.5, 8.0)


@pytest.mark.parametrize("bad", [
    {"sources": [{"kind": "batch"}], "unknown": 1},
    {"sources": [{"kind": "batch", "batch_count": 3}]},
    {"sources": [{"kind": "swf", "hours": [48, 6]}]},
    {"sources": [{"kind": "gamma"}]},
    {"sources": []},
    {"sources": [{"kind": "poisson", "amplitude": [0.0, 1.5]}]},
])
def test_invalid_mixes_are_rejected(tmp_path, bad):
    f = tmp_path / "mix.yaml"
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError):
        load_mix(f)


# ---------------------------------------------------------------------------- test windows
@needs_traces
def test_test_windows_use_only_test_traces_and_build():
    assert 6 <= len(TEST_WINDOWS) <= 10 and len({s.name for s in TEST_WINDOWS}) == len(TEST_WINDOWS)
    assert {s.trace for s in TEST_WINDOWS} == set(TEST_TRACES[:4])
    mix = load_mix()
    for spec in TEST_WINDOWS:
        assert split_of(spec.trace) == "test"
        w = build_window(spec, SIM)
        assert w.name == spec.name and w.n_jobs >= 20 and int(w.cores.max()) <= SIM.job_core_cap
        assert build_window(spec, SIM).digest() == w.digest()
        if spec.load is not None:  # the scaled ones look like training windows
            span = gen.span_seconds(w, SIM)
            assert offered_load(w, SIM) == pytest.approx(spec.load)
            assert mix.span_h[0] * 3600 <= span <= mix.span_h[1] * 3600
            assert w.length_mi.max() / SIM.host_mips <= mix.max_run_over_span * span


@needs_traces
def test_as_is_windows_equal_the_reported_ones():
    # KTH-SP2 day 10 exactly as `samm experiment paper` has always loaded it
    spec = next(s for s in TEST_WINDOWS if s.name == "KTH-SP2 day 10")
    ref = load_workload(SHARED / spec.trace, SwfTransform(window_start_s=10 * 86400.0, window_end_s=11 * 86400.0),
                        core_cap=SIM.job_core_cap)
    assert build_window(spec, SIM).digest() == ref.digest()


def test_window_spec_is_strict():
    with pytest.raises(ValueError):
        WindowSpec(name="x", trace="t.swf", start_h=0, hours=1, extra=1)
    with pytest.raises(ValueError):
        WindowSpec(name="x", trace="t.swf", start_h=0, hours=0)


# ---------------------------------------------------------------------------- trace cache
SWF_LINES = "\n".join(
    ["; a hand-made trace"]
    + [f"{i} {600 * i} 0 {300 + 10 * i} {1 + i % 4} -1 -1 {1 + i % 4} -1 -1 1 1 1 1 1 -1 -1 -1" for i in range(1, 41)]
    + ["41 30000 0 -1 1 -1 -1 1 -1 -1 0 1 1 1 1 -1 -1 -1"]  # never ran: dropped
)


def test_trace_cache_in_memory_and_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    trace = tmp_path / "tiny.swf"
    trace.write_text(SWF_LINES)
    gen.clear_trace_cache()
    jobs = gen.load_trace(trace)
    assert jobs.n_jobs == 40 and jobs.offset_s[0] == 0 and jobs.span_s == 600 * 39
    files = list((tmp_path / "home" / ".cache" / "samm" / "swf").glob("tiny.swf-*.npz"))
    assert len(files) == 1
    assert gen.load_trace(trace) is jobs  # memory

    def no_parse(_):
        raise AssertionError("parsed again")

    monkeypatch.setattr(gen, "read_swf_table", no_parse)
    gen.clear_trace_cache()
    again = gen.load_trace(trace)  # disk
    np.testing.assert_array_equal(again.run_s, jobs.run_s)
    np.testing.assert_array_equal(again.cores, jobs.cores)
    # a damaged cache file is parsed again (and rewritten), not an error
    gen.clear_trace_cache()
    files[0].write_bytes(b"not an npz")
    with pytest.raises(AssertionError, match="parsed again"):
        gen.load_trace(trace)
    # a changed file (size and mtime) is a new key: parsed again
    trace.write_text(SWF_LINES + "\n42 30600 0 100 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1")
    with pytest.raises(AssertionError, match="parsed again"):
        gen.load_trace(trace)
    gen.clear_trace_cache()


def test_a_window_equals_load_swf(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    trace = tmp_path / "tiny.swf"
    trace.write_text(SWF_LINES)
    spec = WindowSpec(name="w", trace=str(trace), start_h=1.0, hours=4.0, time_compression=2.0)
    ref = load_workload(trace, SwfTransform(window_start_s=3600, window_end_s=5 * 3600, time_compression=2.0),
                        core_cap=2)
    assert build_window(spec, SimConfig(max_job_cores=2)).digest() == ref.digest()
    gen.clear_trace_cache()


def test_pwa_dir_override_and_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMM_PWA_DIR", str(tmp_path))
    assert pwa_dir() == tmp_path
    monkeypatch.setenv("SAMM_PWA_DIR", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="nope"):
        pwa_dir()
    with pytest.raises(FileNotFoundError, match="nope"):
        load_mix().sampler(SIM, 0)
