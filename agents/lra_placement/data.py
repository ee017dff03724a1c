"""Loader for Metis's measured co-location data (the interference predictor's training set).

The paper (Deng et al. 2023) publishes no data; we use the Metis LRA profiling files (lwangbm/Metis,
Apache-2.0, copied unmodified to `<shared>/data/metis-lra/`; see SOURCE.txt there). Each row is one
machine: `alloc[r, a]` containers of app a, and `rps[r, a]` the per-container throughput of app a
normalised to its solo run (NaN where a is absent). The 7-app files keep the apps in columns 0..6
(columns 7 and 8 are always 0; a file with containers there is refused), in the order of `APP_NAMES`.

Some rows record failed runs: an app is present but its throughput is 0 or NaN. They would teach the
predictor that co-location kills an app, so they are dropped (and counted), as are empty machines.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Column order of the 7-app files (SOURCE.txt: the repo's pairwise CSV header and profiling script).
APP_NAMES = ("Redis", "MMS", "Checksum", "YCSB-A", "YCSB-B", "SceneDetect", "ISR")
# The most complete file: every composition of <= 8 containers of the 7 apps once (C(15, 7) = 6,435 rows).
DEFAULT_FILE = "0905-6435results-normed.npz"
SHARED_DIR_ENV = "SAMM_SHARED_DIR"


@dataclass(frozen=True)
class MetisData:
    alloc: np.ndarray  # (R, 7) int64 containers per app on the machine
    rps: np.ndarray  # (R, 7) float64 per-container normalised throughput, NaN where absent
    app_names: tuple[str, ...]
    dropped_failed: int = 0  # rows dropped because a present app had throughput 0 or NaN
    dropped_empty: int = 0  # rows dropped because the machine hosted nothing
    source: str = ""

    @property
    def n_rows(self) -> int:
        return len(self.alloc)

    def targets(self) -> np.ndarray:
        """(R, 7) regression targets: per-container throughput, 0 where the app is absent."""
        return np.where(self.alloc > 0, np.nan_to_num(self.rps, nan=0.0), 0.0)


def data_dir() -> Path:
    """`$SAMM_SHARED_DIR/data/metis-lra`, by default the `shared` folder next to the repository."""
    shared = os.environ.get(SHARED_DIR_ENV)
    if shared:
        return Path(shared) / "data" / "metis-lra"
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "data" / "metis-lra"


def default_path() -> Path:
    return data_dir() / DEFAULT_FILE


def _read_columns(path: Path, n_apps: int) -> tuple[np.ndarray, np.ndarray]:
    """The file's alloc and rps as (R, n_apps) floats, or a ValueError naming the file: a 1-D array
    or a missing key raised a bare IndexError or KeyError, an rps with fewer rows broadcast silently
    over alloc's, and a 9-app file (Metis's early profiles) lost its apps 8 and 9 silently, training
    the forest on compositions that leave out co-runners."""
    import zipfile

    # The rps/rt arrays may be object arrays of Python floats (old pickles): allow_pickle is required;
    # SOURCE.txt records that the embedded pickles reference only numpy reconstruction functions.
    try:
        with np.load(path, allow_pickle=True) as npz:
            alloc = np.asarray(npz["alloc"], dtype=np.float64)
            rps = np.asarray(npz["rps"], dtype=np.float64)
    except (EOFError, KeyError, ValueError, TypeError, zipfile.BadZipFile) as exc:  # OSError, UnpicklingError: as is
        raise ValueError(f"{path}: not a Metis co-location file ({type(exc).__name__}: {exc})") from None
    if alloc.ndim != 2 or rps.shape != alloc.shape or alloc.shape[1] < n_apps:
        raise ValueError(f"{path}: alloc and rps must be (rows, >= {n_apps} apps) of one shape, "
                         f"got {alloc.shape} and {rps.shape}")
    extra = (alloc[:, n_apps:] != 0).any(axis=1)
    if extra.any():
        raise ValueError(f"{path}: {int(extra.sum())} rows hold containers of apps past the first {n_apps} "
                         f"(columns {n_apps}..{alloc.shape[1] - 1}): not a {n_apps}-app file")
    return alloc[:, :n_apps], rps[:, :n_apps]


def load_metis(path: str | Path | None = None, n_apps: int = len(APP_NAMES)) -> MetisData:
    """Load one Metis .npz (default: the complete 6,435-row file) as clean float arrays."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"Metis co-location data not found at {path}; put the Metis .npz files in "
            f"<shared>/data/metis-lra/ and point the environment variable {SHARED_DIR_ENV} at <shared> "
            f"(currently {os.environ.get(SHARED_DIR_ENV, 'unset')})"
        )
    alloc_raw, rps = _read_columns(path, n_apps)
    if (alloc_raw < 0).any() or not np.array_equal(alloc_raw, np.round(alloc_raw)):
        raise ValueError(f"{path}: alloc must hold non-negative whole container counts")
    alloc = alloc_raw.astype(np.int64)

    present = alloc > 0
    with np.errstate(invalid="ignore"):  # NaN compares False: a failed run, as inf is (no real rate)
        measured = np.isfinite(rps) & (rps > 0)
    failed = (present & ~measured).any(axis=1)
    empty = alloc.sum(axis=1) == 0
    keep = ~failed & ~empty
    rps = np.where(present, rps, np.nan)[keep]
    return MetisData(
        alloc=alloc[keep],
        rps=rps,
        app_names=APP_NAMES[:n_apps] if n_apps <= len(APP_NAMES) else tuple(f"app{i}" for i in range(n_apps)),
        dropped_failed=int(failed.sum()),
        dropped_empty=int((empty & ~failed).sum()),
        source=str(path),
    )
