"""Audit of the workloads (mixes, generators, the paper's workload, the loaders): bad input fails
at load time with a one-line error naming the field, never deep inside a draw or as garbage."""
import os

import numpy as np
import pytest
import yaml

from sim_bridge.config import SimConfig
from sim_bridge.workloads import Workload, load_workload, seed_1551
from sim_bridge.workloads import generators as gen
from sim_bridge.workloads.mix import (
    WindowSpec,
    WorkloadMix,
    WorkloadWindows,
    load_mix,
)

SIM = SimConfig()
GENERATORS_ONLY = [{"kind": "batch"}, {"kind": "poisson"}]


def write_mix(tmp_path, text: str):
    path = tmp_path / "mix.yaml"
    path.write_text(text)
    return path


def one_job(**cols) -> Workload:
    base = dict(name="w", arrival_s=np.array([0.0]), length_mi=np.array([4400.0]),
                cores=np.array([1], dtype=np.int32), ram_gb=np.array([0.5]))
    return Workload(**{**base, **cols})


# ---------------------------------------------------------------- non-finite numbers in a mix
@pytest.mark.parametrize("line, field", [
    ("load: [.nan, 1.0]", "load.0"),
    ("span_h: [1.5, .inf]", "span_h.1"),
    ("max_length_factor: .nan", "max_length_factor"),
])
def test_a_non_finite_rule_is_rejected_at_load(tmp_path, line, field):
    # NaN passed `low <= high` (it compares false) and crashed the first draw with an OverflowError
    path = write_mix(tmp_path, f"{line}\nsources: [{{kind: batch}}, {{kind: poisson}}]\n")
    with pytest.raises(ValueError, match=f"mix.yaml: {field}: Input should be a finite number"):
        load_mix(path)


@pytest.mark.parametrize("source, field", [
    ("{kind: batch, weight: .inf}", "weight"),  # inf / inf: NaN probabilities in the source choice
    ("{kind: batch, cores: {1: .nan}}", "cores.1"),
    ("{kind: batch, size_sigma: .inf}", "size_sigma"),
    ("{kind: poisson, bursts_per_h: [0.0, .inf]}", "bursts_per_h.1"),
    ("{kind: lublin, hours: [6.0, .inf]}", "hours.1"),
])
def test_a_non_finite_source_setting_is_rejected_at_load(tmp_path, source, field):
    path = write_mix(tmp_path, f"sources: [{source}]\n")
    with pytest.raises(ValueError, match=f"sources.0.*{field}: Input should be a finite number"):
        load_mix(path)


def test_every_draw_of_a_mix_that_loads_is_finite():
    # the same mixes as above, validated directly: none may reach the sampler
    for bad in ({"load": [float("nan"), 1.0]}, {"span_h": [1.5, float("inf")]}):
        with pytest.raises(ValueError):
            WorkloadMix.model_validate({"sources": GENERATORS_ONLY, **bad})


# ---------------------------------------------------------------- ranges numpy cannot draw
@pytest.mark.parametrize("source, field", [
    ({"kind": "batch", "run_sigma": [-1.0, -0.5]}, "run_sigma"),  # numpy: "sigma < 0" at the first draw
    ({"kind": "poisson", "run_sigma": [-1.0, 0.5]}, "run_sigma"),
    ({"kind": "poisson", "bursts_per_h": [-2.0, -1.0]}, "bursts_per_h"),  # "lam < 0"
    ({"kind": "poisson", "burst_factor": [-3.0, -2.0]}, "burst_factor"),  # a negative rate
    ({"kind": "poisson", "burst_min": [-3.0, -2.0]}, "burst_min"),  # bursts named but never there
    ({"kind": "batch", "idle_start_s": [-100.0, -50.0]}, "idle_start_s"),  # negative arrivals
])
def test_a_negative_range_is_rejected_at_load(source, field):
    with pytest.raises(ValueError, match=f"(?s){field}.*must be >= 0"):
        WorkloadMix.model_validate({"sources": [source]})


def test_zero_bursts_and_zero_sigma_stay_valid():
    mix = WorkloadMix.model_validate({"sources": [{"kind": "poisson", "bursts_per_h": [0.0, 0.0]},
                                                  {"kind": "batch", "run_sigma": [0.0, 0.0]}]})
    assert all(w.n_jobs >= mix.min_jobs for w in mix.sampler(SIM, 3).sample_many(4))


# ---------------------------------------------------------------- counts
def test_more_batches_than_max_jobs_is_rejected():
    # each batch holds at least one job: 100 batches made 100 jobs under max_jobs = 40
    with pytest.raises(ValueError, match=r"sources\[0\] \(batch\): batches up to 100 exceed max_jobs \(40\)"):
        WorkloadMix.model_validate({"max_jobs": 40, "sources": [{"kind": "batch", "batches": [100, 100]}]})


def test_a_huge_job_count_is_rejected_at_load(tmp_path):
    # min_jobs 1e11 made the generators build 2e11-job columns in memory
    path = write_mix(tmp_path, "min_jobs: 100000000000\nmax_jobs: 1000000000000\nsources: [{kind: batch}]\n")
    with pytest.raises(ValueError, match="max_jobs: Input should be less than or equal to 1000000"):
        load_mix(path)


def test_a_huge_overlay_count_is_rejected_at_load(tmp_path):
    # load 1e4 with max_overlay 1e9 overlaid a window millions of times: a minute, then MemoryError
    path = write_mix(tmp_path, "max_overlay: 1000000000\nsources: [{kind: lublin}]\n")
    with pytest.raises(ValueError, match="max_overlay: Input should be less than or equal to 100"):
        load_mix(path)


def test_a_span_too_long_for_the_poisson_grid_is_rejected(tmp_path):
    # span_h 1e5 h: a 36-million-point grid and ~50,000 bursts: one draw ran for hours
    path = write_mix(tmp_path, "span_h: [1.5, 100000]\nsources: [{kind: poisson}]\n")
    with pytest.raises(ValueError, match="span_h: at most 1000 hours, got 100000"):
        load_mix(path)


def test_millions_of_expected_bursts_are_rejected():
    with pytest.raises(ValueError, match=r"sources\[0\] \(poisson\): bursts_per_h up to 1e\+06 .* bursts"):
        WorkloadMix.model_validate({"sources": [{"kind": "poisson", "bursts_per_h": [0.0, 1e6]}]})


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_overlapping_bursts_that_overflow_the_rate_are_a_value_error():
    # two overlapping bursts of x1e200 made the rate inf: an OverflowError deep inside numpy
    with pytest.raises(ValueError, match="the arrival rate overflows .*lower burst_factor"):
        gen.poisson_workload(np.random.default_rng(0), SIM, span_s=3600.0, load=0.5, amplitude=0.0,
                             period_s=3600.0, phase=0.0, bursts=[(0.0, 600.0, 1e200), (0.0, 600.0, 1e200)],
                             run_median_s=60.0, run_sigma=0.5, cores={1: 1.0}, min_jobs=20, max_jobs=100,
                             name="poisson")


# ---------------------------------------------------------------- the mix file
def test_a_key_given_twice_is_rejected(tmp_path):
    # plain YAML keeps the last value silently: this mix trained on loads of 5-6
    path = write_mix(tmp_path, "load: [0.2, 1.2]\nload: [5, 6]\nsources: [{kind: batch}]\n")
    with pytest.raises(ValueError, match="mix.yaml: not a valid YAML file .*duplicate key 'load'"):
        load_mix(path)
    nested = write_mix(tmp_path, "sources:\n  - kind: batch\n    cores: {1: 0.5, 1: 0.9}\n")
    with pytest.raises(ValueError, match="duplicate key 1"):
        load_mix(nested)


def test_merge_keys_and_the_shipped_mix_still_load(tmp_path):
    assert load_mix().name == "default"
    # a merge key (<<) with an override is no duplicate
    path = write_mix(tmp_path, "sources:\n  - &b {kind: batch, weight: 1.0}\n  - {<<: *b, weight: 2.0}\n")
    assert [s.weight for s in load_mix(path).sources] == [1.0, 2.0]


def test_an_unhashable_key_is_still_a_yaml_error(tmp_path):
    path = write_mix(tmp_path, "sources: [{kind: batch}]\n? [1, 2]\n: 3\n")
    with pytest.raises(ValueError, match="not a valid YAML file .*unhashable key"):
        load_mix(path)


def test_many_validation_errors_stay_one_short_line(tmp_path):
    path = write_mix(tmp_path, "sources: [" + ", ".join(["{kind: batch, weight: -1}"] * 40) + "]\n")
    with pytest.raises(ValueError, match=r"; \.\.\. and 35 more error\(s\)$") as info:
        load_mix(path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


def test_a_mix_path_that_is_not_a_regular_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="not a regular file"):
        load_mix(tmp_path)  # was a bare IsADirectoryError; /dev/zero or a FIFO was read without end
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.yaml"
        os.mkfifo(fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            load_mix(fifo)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_mix(tmp_path / "missing.yaml")


def test_an_oversized_mix_file_is_refused(tmp_path):
    path = write_mix(tmp_path, "sources: [{kind: batch}]\n" + "#" * (1 << 20) + "\n")
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        load_mix(path)


def test_a_validation_error_is_one_line_naming_each_field(tmp_path):
    path = write_mix(tmp_path, "min_jobs: 0\nsources: [{kind: batch, weight: -1}]\n")
    with pytest.raises(ValueError) as info:
        load_mix(path)
    text = str(info.value)
    assert "\n" not in text and "pydantic.dev" not in text
    assert "min_jobs: Input should be greater than or equal to 1" in text
    assert "sources.0.batch.weight: Input should be greater than or equal to 0" in text


def test_a_model_level_error_reads_without_pydantics_prefix(tmp_path):
    path = write_mix(tmp_path, "sources: [{kind: batch, weight: 0}]\n")
    with pytest.raises(ValueError, match=r"mix.yaml: mix: at least one source needs a positive weight$"):
        load_mix(path)


# ---------------------------------------------------------------- weights of 0
def test_a_zero_weight_trace_source_needs_no_traces(tmp_path, monkeypatch):
    # the sampler resolved every source's traces: a generators-only mix made by zeroing the trace
    # sources failed where the PWA traces are not installed
    monkeypatch.setenv("SAMM_PWA_DIR", str(tmp_path / "no-traces"))
    mix = WorkloadMix.model_validate({"sources": [{"kind": "swf", "weight": 0}, {"kind": "lublin", "weight": 0},
                                                  {"kind": "batch"}]})
    assert mix.sampler(SIM, 1).sample().name.startswith("batch@")
    live = WorkloadMix.model_validate({"sources": [{"kind": "swf", "weight": 1}, {"kind": "batch"}]})
    with pytest.raises(FileNotFoundError, match="SWF trace directory not found"):
        live.sampler(SIM, 1)


def test_a_zero_weight_source_does_not_change_the_stream():
    plain = WorkloadMix.model_validate({"sources": GENERATORS_ONLY}).sampler(SIM, 5).sample_many(3)
    padded = WorkloadMix.model_validate({"sources": [*GENERATORS_ONLY, {"kind": "poisson", "weight": 0}]})
    assert [w.digest() for w in padded.sampler(SIM, 5).sample_many(3)] == [w.digest() for w in plain]


# ---------------------------------------------------------------- a mix that cannot sample
def tiny_trace(tmp_path, n_jobs: int, every_s: float):
    path = tmp_path / "tiny.swf"
    path.write_text("".join(f"{i + 1} {i * every_s:.0f} 0 100 1 -1 -1 1 -1 -1 1 1 1 1 1 -1 -1 -1\n"
                            for i in range(n_jobs)))
    return path


def test_a_mix_that_cannot_sample_fails_as_a_value_error(tmp_path, monkeypatch):
    # was a RuntimeError: `samm train --workload-mix` printed a traceback instead of the message
    monkeypatch.setattr(gen, "cache_dir", lambda: tmp_path / "cache")
    mix = WorkloadMix.model_validate({"max_attempts": 5, "sources": [
        {"kind": "lublin", "trace": str(tiny_trace(tmp_path, 2, 60))}]})
    with pytest.raises(ValueError, match="no acceptable workload in 5 draws") as info:
        mix.sampler(SIM, 1).sample()
    assert isinstance(info.value, RuntimeError)  # what callers caught before still catches it


def test_windows_that_never_hold_enough_jobs_fail_as_a_value_error():
    sparse = Workload("sparse", np.arange(25) * 5 * 86400.0, np.full(25, 4400.0), np.ones(25, dtype=np.int32),
                      np.full(25, 0.5))
    with pytest.raises(ValueError, match="no window of"):
        WorkloadWindows(sparse, 1, max_attempts=10).sample()


def test_samm_train_reports_an_unsamplable_mix_in_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from samm.cli.main import cli

    monkeypatch.setattr(gen, "cache_dir", lambda: tmp_path / "cache")
    mix = write_mix(tmp_path, f"name: t\nmax_attempts: 5\nsources:\n  - kind: lublin\n"
                              f"    trace: {tiny_trace(tmp_path, 2, 60)}\n")
    res = CliRunner().invoke(cli, ["train", "--workload-mix", str(mix), "--timesteps", "64", "--out",
                                   str(tmp_path / "out"), "--quiet"])
    assert res.exit_code == 2, res.output
    assert "no acceptable workload in 5 draws" in res.output and "Traceback" not in res.output


# ---------------------------------------------------------------- Workload and its loaders
@pytest.mark.parametrize("cols, problem", [
    (dict(length_mi=np.array([np.inf])), "positive, finite length"),  # packed as inf for the JVM
    (dict(ram_gb=np.array([np.nan])), "RAM must be finite and >= 0"),
    (dict(ram_gb=np.array([-1.0])), "RAM must be finite and >= 0"),
    (dict(arrival_s=np.zeros((1, 1))), "arrival_s must be one-dimensional"),
])
def test_a_workload_with_garbage_columns_is_rejected(cols, problem):
    with pytest.raises(ValueError, match=problem):
        one_job(**cols)


def test_the_paper_workload_rejects_garbage_ram_and_keeps_its_shape():
    with pytest.raises(ValueError, match="RAM must be finite"):
        seed_1551(float("nan"))
    with pytest.raises(ValueError, match="RAM must be finite"):
        seed_1551(-0.5)
    w = seed_1551()
    assert w.n_jobs == 1551 and w.core_seconds(4400.0) == 1550 * 360 + 1
    assert gen.offered_load(w, SIM) == pytest.approx(0.29, abs=0.005)  # docs/workloads.md


@pytest.mark.parametrize("cap", [0, -3, 2.5, float("nan")])
def test_cap_cores_rejects_a_cap_that_is_not_a_positive_integer(cap):
    # 2.5 kept 2 cores but scaled the work by 16 / 2.5; NaN capped nothing; 0 divided by zero
    wide = one_job(cores=np.array([16], dtype=np.int32))
    with pytest.raises(ValueError, match="core cap must be an integer >= 1"):
        wide.cap_cores(cap)


def test_cap_cores_keeps_core_seconds_for_a_valid_cap():
    wide = one_job(cores=np.array([16], dtype=np.int32), ram_gb=np.array([8.0]))
    capped = wide.cap_cores(np.int64(8))
    assert capped.cores.tolist() == [8] and capped.core_seconds(4400.0) == wide.core_seconds(4400.0)
    assert capped.ram_gb.tolist() == [4.0]


@pytest.mark.parametrize("cap", [0, -1])
def test_load_workload_rejects_a_core_cap_below_one(cap):
    # 0 silently meant "no cap"; -1 failed as "every job needs a positive length"
    with pytest.raises(ValueError, match="core_cap must be an integer >= 1"):
        load_workload("seed-1551", core_cap=cap)
    assert load_workload("seed-1551", core_cap=1).n_jobs == 1551


@pytest.mark.parametrize("field, value", [("start_h", float("inf")), ("hours", float("inf")),
                                          ("time_compression", float("inf")), ("load", float("inf"))])
def test_a_window_spec_rejects_infinity(field, value):
    # load = inf crashed with an OverflowError; compression = inf made every length 0
    kw = {"name": "x", "trace": "LCG.swf.gz", "start_h": 0.0, "hours": 1.0, field: value}
    with pytest.raises(ValueError, match="finite number"):
        WindowSpec(**kw)


def test_workload_windows_reject_infinite_hours_and_zero_min_jobs():
    with pytest.raises(ValueError, match="window hours"):
        WorkloadWindows(seed_1551(), 1, hours=(1.0, float("inf")))  # OverflowError at the first sample
    with pytest.raises(ValueError, match="min_jobs >= 1"):
        WorkloadWindows(seed_1551(), 1, min_jobs=0)  # an empty window crashed as "has no jobs"
