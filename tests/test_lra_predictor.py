"""Interference predictors, the Metis loader and the accuracy study (agents/lra_placement)."""
from __future__ import annotations

import numpy as np
import pytest

from agents.lra_placement import data as lra_data
from agents.lra_placement.data import APP_NAMES, MetisData, load_metis
from agents.lra_placement.predictor import (
    ForestParams,
    ForestPredictor,
    SyntheticInterference,
    all_compositions,
    default_predictor,
)
from agents.lra_placement.validation import accuracy_vs_sampling, per_app_accuracy, plot_accuracy

SMALL = ForestParams(n_estimators=10, max_depth=20, n_jobs=1)


def random_compositions(rng, k, n_apps=7, slots=8):
    """k random compositions with 1..slots containers."""
    out = np.zeros((k, n_apps), dtype=np.int64)
    for i in range(k):
        size = rng.integers(1, slots + 1)
        np.add.at(out[i], rng.integers(0, n_apps, size), 1)
    return out


def synthetic_data(n_rows=300, seed=0):
    """Training rows whose 'measurements' come from the synthetic model (NaN where absent, like Metis)."""
    rng = np.random.default_rng(seed)
    alloc = random_compositions(rng, n_rows)
    rps = SyntheticInterference(seed=1).throughput(alloc)
    return alloc, np.where(alloc > 0, rps, np.nan)


# --- SyntheticInterference -----------------------------------------------------------------------
def test_synthetic_is_monotone_under_any_added_container():
    model = SyntheticInterference(n_apps=7, seed=3)
    rng = np.random.default_rng(0)
    before = random_compositions(rng, 400, slots=7)  # room for one more container
    added = rng.integers(0, 7, len(before))
    after = before.copy()
    after[np.arange(len(before)), added] += 1
    tp_before, tp_after = model.throughput(before), model.throughput(after)
    resident = before > 0
    assert (tp_after[resident] <= tp_before[resident] + 1e-12).all()
    # ... and strictly lower somewhere: the model is not flat.
    assert (tp_after[resident] < tp_before[resident] - 1e-3).any()


def test_synthetic_absent_is_zero_solo_is_one_and_range():
    model = SyntheticInterference(n_apps=5, seed=0)
    comps = random_compositions(np.random.default_rng(1), 200, n_apps=5)
    tp = model.throughput(comps)
    assert tp.shape == comps.shape
    assert (tp[comps == 0] == 0).all()
    assert ((tp[comps > 0] > 0) & (tp[comps > 0] <= 1)).all()
    np.testing.assert_allclose(model.throughput(np.eye(5, dtype=int)), np.eye(5))
    assert model.app_names == ("app0", "app1", "app2", "app3", "app4")


def test_synthetic_is_seeded_and_mixes_strong_and_weak_pairs():
    a, b, c = SyntheticInterference(seed=4), SyntheticInterference(seed=4), SyntheticInterference(seed=5)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.array_equal(a.weights, c.weights)
    off = a.weights[~np.eye(7, dtype=bool)] * a.slots
    assert (a.weights >= 0).all() and (off > 1.5).any() and (off < 0.3).any()


# --- ForestPredictor -------------------------------------------------------------------------------
def test_all_compositions_covers_every_node_of_eight_slots():
    comps = all_compositions(7, 8)
    assert comps.shape == (6435, 7)
    assert comps.sum(axis=1).max() == 8 and comps.min() == 0
    assert len({tuple(r) for r in comps}) == 6435


def test_forest_table_lookup_equals_forest_and_masks_absent():
    alloc, rps = synthetic_data()
    model = ForestPredictor(app_names=tuple(f"app{i}" for i in range(7)), params=SMALL).fit(alloc, rps, seed=0)
    queries = random_compositions(np.random.default_rng(7), 50)
    via_table = model.throughput(queries)
    np.testing.assert_allclose(via_table, model.predict_forest(queries))
    assert (via_table[queries == 0] == 0).all() and (via_table[queries > 0] > 0).all()
    # Fit on the synthetic model, it should rank a heavy co-location below a solo run.
    assert model.throughput(np.eye(7, dtype=int)).trace() > 0.8 * 7
    # A 3-d batch of nodes keeps its shape.
    assert model.throughput(queries.reshape(5, 10, 7)).shape == (5, 10, 7)


def test_single_multi_output_forest_also_works():
    alloc, rps = synthetic_data(200)
    params = ForestParams(n_estimators=5, max_depth=20, n_jobs=1, per_app=False)
    model = ForestPredictor(app_names=tuple(f"app{i}" for i in range(7)), params=params).fit(alloc, rps)
    q = random_compositions(np.random.default_rng(2), 20)
    np.testing.assert_allclose(model.throughput(q), model.predict_forest(q))
    assert not isinstance(model.forest, list) and len(model.forest.estimators_) == 5


def test_forest_save_load_round_trip_and_overfull_nodes(tmp_path):
    alloc, rps = synthetic_data()
    model = ForestPredictor(app_names=tuple(f"app{i}" for i in range(7)), params=SMALL).fit(alloc, rps, seed=3)
    path = model.save(tmp_path / "table.npz")
    loaded = ForestPredictor.load(path)
    assert loaded.app_names == model.app_names and loaded.slots == 8 and loaded.forest is None
    assert path.stat().st_size < 400_000
    queries = random_compositions(np.random.default_rng(9), 100)
    np.testing.assert_array_equal(loaded.throughput(queries), model.throughput(queries))
    overfull = np.array([[5, 4, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0]])
    assert (loaded.throughput(overfull) == 0).all()  # outside the table, no forest: worthless
    np.testing.assert_allclose(model.throughput(overfull), model.predict_forest(overfull))  # forest fallback


# --- loader ------------------------------------------------------------------------------------------
def write_metis_like(path, alloc, rps):
    """A tiny .npz shaped like Metis's: 9 columns, rps and rt as object arrays of floats."""
    alloc9 = np.zeros((len(alloc), 9))
    alloc9[:, :7] = alloc
    rps9 = np.full((len(alloc), 9), np.nan)
    rps9[:, :7] = rps
    obj = rps9.astype(object)
    np.savez(path, alloc=alloc9, rps=obj, rt_50=obj, rt_99=obj)


def test_loader_drops_failed_and_empty_rows(tmp_path):
    nan = np.nan
    alloc = np.array(
        [
            [1, 0, 0, 0, 0, 0, 0],  # fine
            [1, 1, 0, 0, 0, 0, 0],  # failed: app 1 present with throughput 0
            [0, 0, 2, 0, 0, 0, 0],  # failed: app 2 present with NaN
            [0, 0, 0, 0, 0, 0, 0],  # empty machine
            [0, 0, 0, 3, 0, 0, 1],  # fine
        ]
    )
    rps = np.array(
        [
            [1.0, nan, nan, nan, nan, nan, nan],
            [0.9, 0.0, nan, nan, nan, nan, nan],
            [nan, nan, nan, nan, nan, nan, nan],
            [nan] * 7,
            [nan, nan, nan, 0.8, nan, nan, 0.7],
        ]
    )
    path = tmp_path / "tiny.npz"
    write_metis_like(path, alloc, rps)
    data = load_metis(path)
    assert data.n_rows == 2 and data.dropped_failed == 2 and data.dropped_empty == 1
    assert data.alloc.dtype == np.int64 and data.alloc.shape == (2, 7)
    np.testing.assert_array_equal(data.alloc, alloc[[0, 4]])
    assert np.isnan(data.rps[0, 1:]).all() and data.rps[1, 3] == 0.8
    np.testing.assert_allclose(data.targets()[1], [0, 0, 0, 0.8, 0, 0, 0.7])
    assert data.app_names == APP_NAMES


def test_missing_data_names_path_and_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMM_SHARED_DIR", str(tmp_path))
    assert lra_data.data_dir() == tmp_path / "data" / "metis-lra"
    with pytest.raises(FileNotFoundError, match="SAMM_SHARED_DIR") as err:
        load_metis()
    assert str(tmp_path) in str(err.value)


REAL = lra_data.default_path()
needs_real = pytest.mark.skipif(not REAL.is_file(), reason=f"Metis data not at {REAL}")


@needs_real
def test_real_files_load_and_failed_runs_drop():
    full = load_metis()
    assert full.n_rows == 6434 and full.dropped_failed == 0 and full.dropped_empty == 1
    assert full.alloc.sum(axis=1).max() == 8
    partial = load_metis(REAL.parent / "0905-2008results-median-normed.npz")
    assert partial.dropped_failed == 12
    present = partial.alloc > 0
    assert (partial.rps[present] > 0).all() and np.isnan(partial.rps[~present]).all()


@needs_real
def test_default_predictor_fits_once_then_loads_from_cache(tmp_path):
    first = default_predictor(cache_dir=tmp_path)
    files = list(tmp_path.glob("forest-*.npz"))
    assert len(files) == 1 and first.meta["source_sha256"].startswith(files[0].name.split("-")[1])
    mtime = files[0].stat().st_mtime_ns
    second = default_predictor(cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == mtime  # not refit
    comps = all_compositions(7, 8)[1:]
    np.testing.assert_array_equal(first.throughput(comps), second.throughput(comps))
    # Measured: Redis alone 1.0; eight Redis share a node at about 0.65 each (SOURCE.txt).
    redis = np.zeros((2, 7), dtype=int)
    redis[0, 0], redis[1, 0] = 1, 8
    tp = first.throughput(redis)[:, 0]
    assert abs(tp[0] - 1.0) < 0.05 and 0.5 < tp[1] < 0.8


# --- accuracy study --------------------------------------------------------------------------------
def test_accuracy_rows_improve_with_more_data_and_plot(tmp_path):
    alloc, rps = synthetic_data(600, seed=5)
    data = MetisData(alloc=alloc, rps=rps, app_names=tuple(f"app{i}" for i in range(7)))
    rows = accuracy_vs_sampling(data, ratios=(0.05, 0.8), seed=0, params=SMALL)
    assert [r["ratio"] for r in rows] == [0.05, 0.8]
    assert rows[0]["n_train"] == 30 and rows[0]["n_train"] + rows[0]["n_test"] == 600
    assert rows[1]["mse"] < rows[0]["mse"] and rows[1]["r2"] > rows[0]["r2"]
    assert all(r["mse_all_outputs"] <= r["mse"] for r in rows)  # absent apps are exact zeros
    per_app = per_app_accuracy(data, ratio=0.5, params=SMALL)
    assert [r["app"] for r in per_app] == list(data.app_names)
    assert all(r["n_test"] > 0 and r["mse"] >= 0 for r in per_app)
    out = tmp_path / "acc.png"
    plot_accuracy(rows, out)
    assert out.read_bytes()[:4] == b"\x89PNG"
