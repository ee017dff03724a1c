"""Interference predictors: what each container's throughput is on a node with a given composition.

Two implementations of the `Predictor` protocol of `cluster.py`:

* `SyntheticInterference`: a data-free, seeded model for fast tests and synthetic experiments.
  Its throughput is monotone (a co-runner never helps) and solo containers run at 1.0, the same
  normalisation as the measured data.
* `ForestPredictor`: the paper's interference model (§6.1: a random forest of 100 trees, depth 20)
  fit on measured co-location data (Metis's per-container throughput normalised to the solo run).
  A node has few slots, so every composition it can hold is tabulated once after fitting and
  `throughput` becomes a vectorised table lookup; the forest is only asked about compositions
  outside the table.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


class SyntheticInterference:
    """Per-container throughput of app a on a node with composition c:

        tp[a] = 1 / (1 + sum_b W[a, b] * (c[b] - [a == b]))      (0 where c[a] == 0)

    with a seeded non-negative matrix W (row a: how much each co-runner slows a down). Every term
    is non-negative, so tp lies in (0, 1], a container alone runs at 1.0, and adding any container
    never raises a resident's throughput (monotone). W is asymmetric, like real interference.

    How W is drawn (our choice, the paper has no synthetic model): the diagonal (self-interference,
    e.g. two Redis sharing memory bandwidth) is uniform in [0.3, 0.6] / slots, so a full node of one app
    keeps ~1 / (1 + 0.45 * (slots - 1) / slots) ≈ 0.7 per container (the measured Redis x8 is 0.65);
    each off-diagonal pair is a "strong" interferer with probability `p_strong`, drawn uniform in
    [1.5, 4] / slots (a full node shared half-half then drops to ~0.3–0.6), otherwise "weak",
    uniform in [0, 0.3] / slots. Scaling by 1 / slots keeps a full node's slowdown similar
    whatever the slot count.
    """

    def __init__(self, n_apps: int = 7, seed: int = 0, slots: int = 8, p_strong: float = 0.3):
        if n_apps < 1 or slots < 1:
            raise ValueError(f"need n_apps >= 1 and slots >= 1, got {n_apps}, {slots}")
        rng = np.random.default_rng(seed)
        strong = rng.random((n_apps, n_apps)) < p_strong
        w = np.where(strong, rng.uniform(1.5, 4.0, (n_apps, n_apps)), rng.uniform(0.0, 0.3, (n_apps, n_apps)))
        np.fill_diagonal(w, rng.uniform(0.3, 0.6, n_apps))
        self.weights = w / slots
        self.app_names = tuple(f"app{i}" for i in range(n_apps))
        self.slots = slots

    def throughput(self, compositions: np.ndarray) -> np.ndarray:
        comps = np.asarray(compositions, dtype=np.float64)
        # load[k, a] = sum_b W[a, b] * c[k, b], minus the container's own self-term.
        load = comps @ self.weights.T - np.diag(self.weights)
        tp = 1.0 / (1.0 + np.maximum(load, 0.0))
        return np.where(comps > 0, tp, 0.0)


@dataclass(frozen=True)
class ForestParams:
    """The interference forest's hyperparameters."""

    n_estimators: int = 100  # paper §6.1: 100 trees
    max_depth: int = 20  # paper §6.1: depth 20
    n_jobs: int = 2  # not given by the paper; our choice (the machines here have 2 cores)
    # One forest per app, each fit on the compositions where that app is present (absent apps are 0 by
    # definition). Not given by the paper; our choice, as in Metis's MultiOutputRegressor: on the
    # complete Metis file it halves the held-out MSE of a single multi-output forest at a 10% sample
    # (0.0033 vs 0.0072 over present apps) and cuts it by a third at 50% (0.0023 vs 0.0035).
    # False: one multi-output RandomForestRegressor over all outputs.
    per_app: bool = True


def all_compositions(n_apps: int, slots: int) -> np.ndarray:
    """Every node composition of at most `slots` containers over `n_apps` apps, (C(slots + n_apps, n_apps), n_apps),
    in lexicographic order (which is also the order of their mixed-radix keys)."""
    rows = [()]
    for _ in range(n_apps):
        rows = [r + (v,) for r in rows for v in range(slots + 1 - sum(r))]
    return np.asarray(sorted(rows), dtype=np.int64).reshape(-1, n_apps)


class ForestPredictor:
    """The paper's interference model: random forests (§6.1: 100 trees, depth 20) from a node's
    composition (containers per app) to each app's per-container normalised throughput (0 where
    absent); one forest per app by default, or one multi-output forest (`ForestParams.per_app`).

    After `fit`, every composition of <= `slots` containers is predicted once and kept in a table;
    `throughput` looks compositions up by their mixed-radix key (base slots + 1) with one vectorised
    `searchsorted`. A composition outside the table (more than `slots` containers, i.e. an over-full
    node) goes to the forest when this object has one; a predictor restored by `load` keeps only the
    table and gives such compositions throughput 0 (a planner that scores over-full nodes before
    masking them then sees them as worthless instead of crashing).
    """

    def __init__(self, app_names: tuple[str, ...] | None = None, slots: int = 8, params: ForestParams = ForestParams()):
        from .data import APP_NAMES  # local import: data.py has no dependency on this module

        self.app_names = tuple(app_names) if app_names is not None else APP_NAMES
        self.slots = slots
        self.params = params
        self.forest = None
        self.table_keys: np.ndarray | None = None  # (T,) sorted mixed-radix keys
        self.table: np.ndarray | None = None  # (T, A) throughput of each tabulated composition
        self.meta: dict = {}

    @property
    def n_apps(self) -> int:
        return len(self.app_names)

    # --- fitting ------------------------------------------------------------------------------
    def fit(self, alloc: np.ndarray, rps: np.ndarray, seed: int = 0, tabulate: bool = True) -> "ForestPredictor":
        """alloc (R, A) counts, rps (R, A) per-container throughput (NaN or anything where absent)."""
        from sklearn.ensemble import RandomForestRegressor

        raw = np.asarray(alloc, dtype=np.float64)
        # a NaN count cast to int64 became -2**63 and was blamed on "negative counts"
        if not np.isfinite(raw).all() or not np.array_equal(raw, np.round(raw)):
            raise ValueError("alloc must hold whole, finite container counts (it holds NaN, inf or fractions)")
        alloc = raw.astype(np.int64)
        if alloc.ndim != 2 or alloc.shape[1] != self.n_apps:
            raise ValueError(f"alloc must be (R, {self.n_apps}), got {alloc.shape}")
        target = self._targets(alloc, rps)
        p = self.params

        def new_forest():
            return RandomForestRegressor(
                n_estimators=p.n_estimators, max_depth=p.max_depth, n_jobs=p.n_jobs, random_state=seed
            )

        if p.per_app:
            # An app never seen present in the training rows gets no forest (predicted 0).
            self.forest = [
                new_forest().fit(alloc[alloc[:, a] > 0], target[alloc[:, a] > 0, a]) if (alloc[:, a] > 0).any() else None
                for a in range(self.n_apps)
            ]
        else:
            self.forest = new_forest().fit(alloc, target)
        self.meta = {"seed": seed, "n_rows": len(alloc), "n_estimators": p.n_estimators, "max_depth": p.max_depth,
                     "per_app": p.per_app}
        if tabulate:
            comps = all_compositions(self.n_apps, self.slots)
            self.table_keys = self._keys(comps)
            self.table = self.predict_forest(comps)
        return self

    @staticmethod
    def _targets(alloc: np.ndarray, rps) -> np.ndarray:
        """Training targets: rps where the app is present, 0 elsewhere. An (R, 1) rps broadcast
        silently over every app, and a NaN or inf measurement of a present app trained as 0 or
        as inf; each is refused instead."""
        rps = np.asarray(rps, dtype=np.float64)
        if rps.shape != alloc.shape:
            raise ValueError(f"rps must have alloc's shape {alloc.shape}, got {rps.shape}")
        if (alloc < 0).any():
            raise ValueError(f"alloc holds {int((alloc < 0).sum())} negative counts")
        present = alloc > 0
        bad = present & ~np.isfinite(rps)
        if bad.any():
            raise ValueError(f"rps holds {int(bad.sum())} non-finite throughputs of present apps "
                             f"(first at row {int(np.argwhere(bad)[0][0])}); drop those rows")
        return np.where(present, rps, 0.0)

    def predict_forest(self, compositions: np.ndarray) -> np.ndarray:
        """The forest's own prediction (masked to 0 where an app is absent), bypassing the table."""
        if self.forest is None:
            raise RuntimeError("this predictor has no forest (fit it, or it was restored from a table)")
        comps = np.asarray(compositions, dtype=np.int64).reshape(-1, self.n_apps)
        if isinstance(self.forest, list):
            pred = np.zeros(comps.shape, dtype=np.float64)
            for a, forest in enumerate(self.forest):
                rows = comps[:, a] > 0
                if forest is not None and rows.any():
                    pred[rows, a] = forest.predict(comps[rows])
        else:
            pred = np.asarray(self.forest.predict(comps), dtype=np.float64).reshape(len(comps), self.n_apps)
        return np.where(comps > 0, np.maximum(pred, 0.0), 0.0)

    # --- prediction ---------------------------------------------------------------------------
    def throughput(self, compositions: np.ndarray) -> np.ndarray:
        comps = np.asarray(compositions, dtype=np.int64)
        if comps.ndim == 0 or comps.shape[-1] != self.n_apps:
            # reshape(-1, A) turned (K, B) counts of another number of apps into rows of A silently
            raise ValueError(f"compositions of {comps.shape[-1] if comps.ndim else 0} apps given to a predictor of "
                             f"{self.n_apps} ({', '.join(self.app_names)})")
        shape = comps.shape
        comps = comps.reshape(-1, self.n_apps)
        if self.table is None:
            return self.predict_forest(comps).reshape(shape)
        # Counts above `slots` would alias in base slots + 1: such rows are outside the table anyway.
        in_range = (comps <= self.slots).all(axis=1) & (comps.sum(axis=1) <= self.slots) & (comps >= 0).all(axis=1)
        keys = self._keys(np.where(in_range[:, None], comps, 0))
        idx = np.minimum(np.searchsorted(self.table_keys, keys), len(self.table_keys) - 1)
        found = in_range & (self.table_keys[idx] == keys)
        out = np.where(found[:, None], self.table[idx], 0.0)
        if not found.all() and self.forest is not None:
            out[~found] = self.predict_forest(comps[~found])
        return np.where(comps > 0, out, 0.0).reshape(shape)

    def _keys(self, comps: np.ndarray) -> np.ndarray:
        # Most significant digit first, so sorted keys follow the lexicographic order of compositions.
        radix = (self.slots + 1) ** np.arange(self.n_apps - 1, -1, -1, dtype=np.int64)
        return comps @ radix

    # --- persistence --------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the table (not the forest) as a small .npz; written atomically."""
        if self.table is None:
            raise RuntimeError("nothing to save: fit with tabulate=True first")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            np.savez_compressed(
                fh,
                table_keys=self.table_keys,
                table=self.table,
                app_names=np.asarray(self.app_names, dtype=str),
                slots=np.int64(self.slots),
                meta_keys=np.asarray(list(self.meta), dtype=str),
                meta_values=np.asarray([str(v) for v in self.meta.values()], dtype=str),
            )
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ForestPredictor":
        """A saved table; ValueError naming the file for anything that is not one (a truncated
        file raised BadZipFile or EOFError, which the cache's rebuild did not catch)."""
        try:
            with np.load(path, allow_pickle=False) as npz:
                self = cls(app_names=tuple(str(n) for n in npz["app_names"]), slots=int(npz["slots"]))
                self.table_keys = npz["table_keys"].astype(np.int64)
                self.table = npz["table"].astype(np.float64)
                self.meta = dict(zip((str(k) for k in npz["meta_keys"]), (str(v) for v in npz["meta_values"])))
        except (OSError, EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile, zlib.error) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ValueError(f"{path}: not a saved interference table ({type(exc).__name__}: {exc})") from None
        shape_ok = self.table_keys.ndim == 1 and self.table.shape == (len(self.table_keys), self.n_apps)
        if not shape_ok or np.any(np.diff(self.table_keys) <= 0) or not np.isfinite(self.table).all():
            raise ValueError(f"{path}: corrupt interference table")
        return self


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "samm" / "lra"


def default_predictor(cache_dir: str | Path | None = None, seed: int = 0, path: str | Path | None = None,
                      slots: int = 8) -> ForestPredictor:
    """The paper's forest fit on the default Metis file (all 6,435 compositions), as a table.

    The table is cached as `<cache_dir>/forest-<sha256 of the data file, 16 hex>-seed<seed>-slots<slots>.npz`
    (default `~/.cache/samm/lra/`), so the experiment and the service fit it once. The returned
    predictor is always the table-only form (the same object whether or not the cache was warm).
    """
    from .data import default_path, load_metis

    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        load_metis(path)  # raises the loader's explanatory FileNotFoundError
    params = ForestParams()
    kind = "perapp" if params.per_app else "multi"
    key = (f"forest-{file_sha256(path)[:16]}-seed{seed}-slots{slots}-t{params.n_estimators}-d{params.max_depth}"
           f"-{kind}.npz")
    cached = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cached = cached / key
    if cached.is_file():
        try:
            return ForestPredictor.load(cached)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is simply rebuilt
    data = load_metis(path)
    fitted = ForestPredictor(app_names=data.app_names, slots=slots, params=params).fit(data.alloc, data.rps, seed=seed)
    fitted.meta["source_sha256"] = file_sha256(path)
    try:
        fitted.save(cached)
        return ForestPredictor.load(cached)
    except OSError as exc:
        # a HOME that is not a writable folder (a hardened unit, HOME=/dev/null): the table is
        # still served, fit again by the next process, rather than every /plan failing after a fit
        log.warning("cannot cache the interference model in %s (%s): kept in memory only", cached.parent,
                    exc.strerror or exc)
        with tempfile.TemporaryDirectory() as tmp:  # the same table-only form as a warm cache's
            return ForestPredictor.load(fitted.save(Path(tmp) / key))


_FOREST_BY_SLOTS: dict[int, "ForestPredictor"] = {}


def predictor_by_name(name: str, n_apps: int = 7, slots: int = 8):
    """The one place a predictor is chosen by name (CLI, experiment, service, trainer):
    'forest' (or 'metis'): the random forest on Metis's data, loaded once per process;
    'synthetic[:SEED]': the data-free model."""
    if name in ("forest", "metis"):
        if slots not in _FOREST_BY_SLOTS:
            _FOREST_BY_SLOTS[slots] = default_predictor(slots=slots)
        return _FOREST_BY_SLOTS[slots]
    if name.split(":", 1)[0] == "synthetic":
        seed = int(name.split(":", 1)[1]) if ":" in name else 0
        return SyntheticInterference(n_apps=n_apps, seed=seed, slots=slots)
    raise ValueError(f"unknown predictor {name!r}: forest (or metis) or synthetic[:SEED]")
