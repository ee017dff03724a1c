"""Sinan's data collection on a live application, and a Sinan-style model fitted on what it saw.

Sinan (Zhang et al., ASPLOS'21) trains its models on data collected from the deployment it will
schedule; `sinan.train_sinan` collects in the simulator instead, so on the real containers the
shipped model meets latencies it never saw (it breaks QoS in 8-12 % of the seconds there). This
module is the deployment's half (ours in its details):

1. `SinanCollector` is a controller: Sinan's exploration policy (`sinan.SinanExplorer`, one copy)
   sets the limits of a live application each second, and every second's features (history and
   the allocation applied: the limits the engine held in the next second, read back, since the
   guard's bounds, the executor's clamp to the engine's CPUs or a failed update may differ from
   what was chosen; a container without a CPU quota counts as its cap) are kept with the p99 of
   the second in which that allocation was in force. Each sample is appended as it comes to the
   run's journal `sinan-samples.jsonl` (a header line, then one JSON line a sample), so a process
   killed with SIGKILL keeps all but the last; `close()` writes them to `sinan-samples.npz` in its
   place (`samm testbed-microservices --agent sinan-explore --agent-param out=DIR`); where an
   earlier run (a restarted daemon on the same `out`) left such a file, to the next free
   `sinan-samples-<n>.{jsonl,npz}` beside it, never over it.
2. `load_samples` turns such files into `sinan.SinanData` (labels as `sinan.collect`'s: the next
   second's log p99 over the QoS, and a violation within the next k seconds), one group per file;
   a folder stands for every run in it (its .npz, else the journal a killed run left).
3. `fit_live` fits the two models on those samples, optionally beside simulator samples of the
   same application (`twin_seconds`), each live sample counted `live_weight` times (repeated), and
   keeps the scheduler's parameters of a reference model (the shipped one) unless told otherwise.

    python -m agents.microservice_cores.sinan_live --samples DIR [--samples DIR ...] --out DIR
"""
from __future__ import annotations

import copy
import json
import logging
import os
import re
import time
from dataclasses import asdict, replace
from pathlib import Path

import click
import numpy as np

from .control import AppLimits
from .observation import FIELD, PERCENTILES, StepMeasurement
from .sinan import (History, SinanData, SinanExplorer, SinanTrainParams, build_features, collect, fit,
                    load_sinan, n_features, outcome_labels, params_for_budget, SHIPPED_DIR)
from .topology import Topology, load_topology

SAMPLES_FILE = "sinan-samples.npz"
JOURNAL_EXT = "jsonl"   # a run's samples as they come (JSON lines), until close() writes its .npz
_NAME = re.compile(r"sinan-samples(?:-([1-9][0-9]*))?\.(npz|jsonl)")   # later runs on the same `out`: -<n>
_P99 = PERCENTILES.index(99)
log = logging.getLogger(__name__)


class SinanCollector:
    """Sinan's explorer on one live application, recording (features, outcome) each second."""

    name = "sinan-explore"

    def __init__(self, topo: Topology, out: str | Path | None, seed: int = 0,
                 params: SinanTrainParams | None = None):
        self.topo, self.out, self.seed = topo, (Path(out) if out is not None else None), int(seed)
        self.p = params or SinanTrainParams()
        self.rows: list[np.ndarray] = []
        self.p99: list[float] = []
        self.limits: AppLimits | None = None
        self.written: Path | None = None   # this collector's file: a second close() rewrites it
        self._pending = None               # (history, cores chosen): the allocation the next act measures
        self._journal = None               # the open journal (JOURNAL_EXT) of this run's samples
        self._number: int | None = None    # this run's number in `out` (0: sinan-samples.*)
        self._journal_failed = False

    def reset(self, limits: AppLimits) -> None:
        if tuple(limits.services) != self.topo.service_names:
            raise ValueError(f"sinan-explore was built for {self.topo.name}'s services, not {tuple(limits.services)}")
        self.limits = limits
        self.hist = History(1, self.topo.n_services)
        self.explorer = SinanExplorer(self.topo, 1, self.p, np.random.default_rng(self.seed))
        self.rows, self.p99 = [], []
        self._pending = None
        self._end_journal()   # the earlier samples stay as they were written
        self._number = None
        self._journal_failed = False
        self.written = None   # new samples: a new file, the earlier one stays

    def observe(self, m: StepMeasurement) -> None:
        """A warm-up second: history only, as `sinan.collect` warms its copies up."""
        self.hist.push_measurement(self._capped(m))

    def act(self, m: StepMeasurement) -> np.ndarray:
        # this second is the one in which the previous allocation was in force: its outcome, and
        # the limits the engine held in it are the allocation (the guard's bounds, the executor's
        # clamp to the engine's CPUs, or a failed update may have made them other than chosen)
        if self._pending is not None:
            hist, chosen = self._pending
            row = build_features(hist, self._applied(m, chosen)[None], self.topo.caps,
                                 self.topo.qos_ms)[0].astype(np.float32)
            p99 = float(np.nan_to_num(m.latency_ms[_P99], nan=0.0))
            self.rows.append(row)
            self.p99.append(p99)
            self._append(row, p99)
        self.hist.push_measurement(self._capped(m))
        cores = self.explorer.act(self.hist)
        self._pending = (copy.deepcopy(self.hist), np.asarray(cores[0], dtype=np.float64).copy())
        return np.asarray(cores[0], dtype=np.float64)

    def _capped(self, m: StepMeasurement) -> StepMeasurement:
        """`m` with the limit of a container without a CPU quota read as its service's cap: the
        measurer reads "unlimited" as the engine's CPUs, a limit the model never saw (the
        simulator's are within [floor, cap]) and one the guard never sets."""
        unlimited = [self.topo.service_names.index(s) for s in (m.extra.get("unlimited") or ())
                     if s in self.topo.service_names]
        if not unlimited:
            return m
        per = m.per_service.copy()
        per[unlimited, FIELD["cpu_limit"]] = self.topo.caps[unlimited]
        return replace(m, per_service=per)

    def _applied(self, m: StepMeasurement, chosen: np.ndarray) -> np.ndarray:
        """The limits in force during `m`'s second, as the engine held them (unlimited: the cap;
        unknown: what was chosen)."""
        applied = self._capped(m).cpu_limit.astype(np.float64)
        return np.where(np.isfinite(applied) & (applied > 0), applied, chosen)

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, p99 ms) of every second whose outcome was measured."""
        n = len(self.p99)
        X = np.stack(self.rows[:n]) if n else np.zeros((0, 0), dtype=np.float32)
        return X, np.asarray(self.p99, dtype=np.float64)

    # -- written as they come: a daemon killed (SIGKILL, the OOM killer) loses the last second only
    def _append(self, row: np.ndarray, p99: float) -> None:
        """One sample onto this run's journal, flushed to the kernel; a journal that cannot be
        written is said once and the samples stay in memory for close()."""
        if self.out is None or self._journal_failed:
            return
        try:
            if self._journal is None:
                self._open_journal()
                for x, y in zip(self.rows[:-1], self.p99[:-1]):   # what came before (after a close)
                    self._journal.write(_journal_line(x, y))
            self._journal.write(_journal_line(row, p99))
            self._journal.flush()
        except OSError as exc:
            self._journal_failed = True
            log.warning("sinan-explore: writing samples to %s failed (%s); they are kept in memory "
                        "until close()", self.out, exc)

    def _open_journal(self) -> None:
        """This run's journal, under a number no earlier run in `out` holds (created exclusively,
        so two writers never share one), its header first."""
        self.out.mkdir(parents=True, exist_ok=True)
        while True:
            if self._number is None:
                taken = [_number(f) for f in self.out.iterdir() if _number(f) is not None]
                n = max(taken) + 1 if taken else 0
            else:
                n = self._number
            path = _run_path(self.out, n, JOURNAL_EXT)
            try:
                self._journal = open(path, "x" if self._number is None else "w", encoding="utf-8")
            except FileExistsError:
                continue
            self._number = n
            break
        header = {"app": self.topo.name, "services": list(self.topo.service_names), "qos_ms": self.topo.qos_ms,
                  "seed": self.seed, "features": n_features(self.topo.n_services)}
        self._journal.write(json.dumps(header) + "\n")

    def _end_journal(self) -> None:
        if self._journal is not None:
            try:
                self._journal.close()
            except OSError:
                pass
            self._journal = None

    def close(self) -> Path | None:
        """Writes the samples as one .npz (a run that measured no outcome writes nothing), in
        place of the journal they were written to as they came."""
        X, p99 = self.samples()
        if self.out is None or not len(p99):
            return None
        self.out.mkdir(parents=True, exist_ok=True)
        # written beside and then put in place: a write cut short (a full disk, a kill) leaves
        # the samples an earlier run wrote whole, not a torn file
        tmp = self.out / f".{SAMPLES_FILE}.{os.getpid()}.tmp.npz"   # numpy adds .npz to a name without it
        try:
            np.savez_compressed(tmp, X=X, p99_ms=p99, qos_ms=self.topo.qos_ms, app=self.topo.name,
                                services=np.array(self.topo.service_names), seed=self.seed)
            if self.written is not None:
                os.replace(tmp, self.written)
            elif self._number is not None:   # the number its journal holds is this run's
                self.written = _run_path(self.out, self._number, "npz")
                os.replace(tmp, self.written)
            else:
                self.written = _put_new(tmp, self.out)
                self._number = _number(self.written)
        finally:
            tmp.unlink(missing_ok=True)
        # the .npz holds every sample now (a reader takes it over the journal of the same number)
        self._end_journal()
        _run_path(self.out, self._number, JOURNAL_EXT).unlink(missing_ok=True)
        return self.written


def _journal_line(row: np.ndarray, p99: float) -> str:
    # float32 -> float -> repr is exact: the journal reads back as the .npz would
    return json.dumps({"x": [float(v) for v in row], "p99_ms": float(p99)}) + "\n"


def _run_path(out: Path, n: int, ext: str) -> Path:
    return out / (f"sinan-samples.{ext}" if n == 0 else f"sinan-samples-{n}.{ext}")


def _put_new(tmp: Path, out: Path) -> Path:
    """Links `tmp` in as `sinan-samples.npz`, or the next free `sinan-samples-<n>.npz` when an
    earlier run's file (or journal) is there: a daemon restarted on the same `out` replaced those
    samples. A link never replaces a file, so two writers cannot take the same name."""
    while True:
        taken = [_number(f) for f in out.iterdir() if _number(f) is not None]
        path = _run_path(out, max(taken) + 1 if taken else 0, "npz")
        try:
            os.link(tmp, path)
        except FileExistsError:
            continue
        except OSError:   # a file system without hard links: the free name is taken by renaming
            os.replace(tmp, path)
        return path


def _number(path: Path) -> int | None:
    """The run number of a samples file or journal (0: `sinan-samples.*`), None for another file."""
    m = _NAME.fullmatch(path.name)
    return None if m is None else int(m.group(1) or 0)


def _samples_in(folder: Path) -> list[Path]:
    """Every run's samples in `folder`, in the order they were written: its .npz, or where a run
    was killed before writing one, the journal it left."""
    runs: dict[int, Path] = {}
    for f in folder.iterdir():
        n = _number(f)
        if n is not None and (f.suffix == ".npz" or n not in runs):
            runs[n] = f
    return [runs[n] for n in sorted(runs)]


def _sample_files(p: str | Path) -> list[Path]:
    """A samples file, or every one in a folder (a folder without any: its `sinan-samples.npz`,
    which the reader then names as missing)."""
    p = Path(p)
    if not p.is_dir():
        return [p]
    return _samples_in(p) or [p / SAMPLES_FILE]


def _listed(paths) -> list:
    """One folder or file given alone is one path, not the characters of its name."""
    return [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)


def _read_npz(path: Path) -> tuple[str, tuple, np.ndarray, np.ndarray]:
    """(app, services, X, p99 ms) of a closed run's .npz."""
    with np.load(path, allow_pickle=False) as f:
        missing = sorted({"X", "p99_ms", "app", "services"} - set(f.files))
        if missing:
            raise ValueError(f"{path}: not a {SAMPLES_FILE} (no {', '.join(missing)})")
        return (str(f["app"]), tuple(str(s) for s in f["services"]), f["X"],
                np.asarray(f["p99_ms"], dtype=np.float64))


def _read_journal(path: Path) -> tuple[str, tuple, np.ndarray, np.ndarray]:
    """(app, services, X, p99 ms) of a run's journal. Its last line may be torn (the writer was
    killed in the middle of it): that line is skipped, and said; a bad line before it is refused."""
    lines = path.read_bytes().split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()            # the file ends with a whole line
    rows, p99 = [], []
    header = None
    for i, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            if header is None:
                header = (str(rec["app"]), tuple(str(s) for s in rec["services"]))
                continue
            x, y = [float(v) for v in rec["x"]], float(rec["p99_ms"])
        except (ValueError, KeyError, TypeError) as exc:
            if i < len(lines):
                raise ValueError(f"{path}: line {i} is not a sample ({type(exc).__name__}: {exc})") from None
            log.warning("%s: its last line (%d) is torn (the writer stopped in it): skipped", path, i)
            break
        rows.append(x)
        p99.append(y)
    if header is None:   # killed before its header was whole: a run of no sample
        return "", (), np.zeros((0, 0), dtype=np.float32), np.zeros(0)
    if len({len(r) for r in rows}) > 1:
        raise ValueError(f"{path}: its samples are not all of one width")
    X = np.asarray(rows, dtype=np.float32).reshape(len(rows), len(rows[0]) if rows else 0)
    return header[0], header[1], X, np.asarray(p99, dtype=np.float64)


def load_samples(paths, topo: Topology, k: int = SinanTrainParams.k, group_offset: int = 0) -> SinanData:
    """The samples of `SinanCollector` runs as training data: a violation label needs k seconds of
    future, so each run's last k-1 seconds are features without labels and are dropped. A folder
    stands for every samples file in it (one per daemon run on that `out`), each a group of its own;
    a run killed before its close is read from its journal (a torn last line skipped, and said;
    one too short to label is skipped, and said, where a folder holds other runs)."""
    Xs, yl, yv, gs = [], [], [], []
    width = n_features(topo.n_services)
    files = [f for p in _listed(paths) for f in _sample_files(p)]
    for g, path in enumerate(files):
        journal = path.suffix == f".{JOURNAL_EXT}"
        try:
            app, services, X, p99 = (_read_journal if journal else _read_npz)(path)
        except (OSError, EOFError, KeyError, UnicodeDecodeError) as exc:   # missing, unreadable, not an npz
            raise ValueError(f"{path}: cannot read the samples: {type(exc).__name__}: {exc}") from None
        except ValueError as exc:
            if str(exc).startswith(str(path)):
                raise
            raise ValueError(f"{path}: cannot read the samples: {exc}") from None
        if (app != topo.name or services != topo.service_names) and not (journal and not len(p99)):
            raise ValueError(f"{path}: samples of {app!r}, not of {topo.name!r}'s services")
        if p99.ndim != 1:   # a 0-d one raised a bare TypeError; a 2-d one became labels of 2-d garbage
            raise ValueError(f"{path}: p99_ms is {p99.shape}, not one value per measured second")
        if X.ndim != 2 or (len(p99) and X.shape != (len(p99), width)):   # a journal of no sample is (0, 0)
            raise ValueError(f"{path}: X is {X.shape}, not ({len(p99)}, {width}) (one row of "
                             f"{width} features per measured second)")
        if not np.isfinite(X).all() or not np.isfinite(p99).all() or (p99 < 0).any():
            raise ValueError(f"{path}: samples hold NaN, infinite or negative values")
        n = len(p99) - k + 1
        if n <= 0:
            if journal and len(files) > 1:   # a run killed soon after its start: the others still count
                log.warning("%s: %d measured seconds, fewer than the look-ahead k = %d: skipped", path, len(p99), k)
                continue
            raise ValueError(f"{path}: {len(p99)} measured seconds, fewer than the look-ahead k = {k}")
        y_lat, y_viol = outcome_labels(p99, topo.qos_ms, k)
        Xs.append(X[:n])
        yl.append(y_lat)
        yv.append(y_viol)
        gs.append(np.full(n, group_offset + g))
    if not Xs:
        raise ValueError(f"{', '.join(map(str, files))}: no run with more than the look-ahead k = {k} seconds")
    return SinanData(np.concatenate(Xs), np.concatenate(yl), np.concatenate(yv), np.concatenate(gs),
                     np.zeros(sum(len(x) for x in Xs)))


def _concat(a: SinanData, b: SinanData) -> SinanData:
    return SinanData(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in
                       ("X", "y_lat", "y_viol", "group", "users")))


def fit_live(topo: Topology | str, sample_paths, seed: int = 0, twin_seconds: int = 0, live_weight: int = 1,
             scheduler_from: str | Path | None = None, out_dir: str | Path | None = None):
    """A Sinan-style model fitted on live samples (and `twin_seconds` of simulator exploration
    beside them, 0 for none); the scheduler's parameters are those of the model at
    `scheduler_from` (default: the shipped model of the application) since tuning them needs runs
    on the deployment. `model.info["live"]` says what went in."""
    topo = topo if isinstance(topo, Topology) else load_topology(topo)
    sample_paths = _listed(sample_paths)
    if live_weight < 1:
        raise ValueError(f"live_weight must be a whole number >= 1, not {live_weight!r}")
    p = SinanTrainParams()
    t0 = time.time()
    live = load_samples(sample_paths, topo, k=p.k)
    data = SinanData(*(np.concatenate([getattr(live, f)] * live_weight) for f in
                       ("X", "y_lat", "y_viol", "group", "users")))
    twin = None
    if twin_seconds:
        twin = collect(topo, seed, params_for_budget(twin_seconds, p))
        # twin copies are groups of their own, after the live runs'
        twin.group = twin.group + int(live.group.max()) + 1
        data = _concat(data, twin)
    # the held-out share (which reports the fit) is drawn from the twin's copies only: one or two
    # live runs are too few to lose one
    model = fit(topo, data, replace(p, validation_share=0.15 if twin is not None else 0.0), seed=seed,
                holdout_from=None if twin is None else np.unique(twin.group))
    ref = load_sinan(Path(scheduler_from) if scheduler_from else SHIPPED_DIR, topo.name)
    model.scheduler = dict(ref.scheduler)
    model.info["live"] = {"runs": [str(f) for s in sample_paths for f in _sample_files(s)],
                          "samples": int(len(live.y_lat)),
                          "violation_share": float(live.y_viol.mean()), "live_weight": int(live_weight),
                          "twin_samples": 0 if twin is None else int(len(twin.y_lat)),
                          "scheduler_from": str(scheduler_from or SHIPPED_DIR), "fit_s": time.time() - t0}
    model.info.update({"seed": seed, "params": asdict(p), "scheduler": dict(model.scheduler)})
    if out_dir is not None:
        model.info["path"] = str(model.save(out_dir))
    return model


@click.command()
@click.option("--samples", "samples", multiple=True, required=True, type=click.Path(exists=True),
              help="A folder (or .npz) a `--agent sinan-explore --agent-param out=DIR` run wrote; repeatable.")
@click.option("--topology", default="testbed", show_default=True, help="The application the samples are of.")
@click.option("--twin-seconds", type=int, default=0, show_default=True,
              help="Simulator exploration seconds fitted beside the live samples (0: live samples only).")
@click.option("--live-weight", type=int, default=1, show_default=True,
              help="How many times each live sample counts (repeated) beside the simulator's.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Where sinan-<app>.joblib goes.")
def main(samples, topology, twin_seconds, live_weight, seed, out):
    """Fit a Sinan-style model on samples collected on a live application."""
    if twin_seconds < 0:
        raise click.BadParameter(f"must be >= 0, not {twin_seconds}", param_hint="--twin-seconds")
    try:
        model = fit_live(topology, list(samples), seed=seed, twin_seconds=twin_seconds, live_weight=live_weight,
                         out_dir=out)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({k: model.info.get(k) for k in ("live", "samples", "held_out", "violation_share",
                                                             "val_auc", "val_mae_ms", "path")}, default=str))


if __name__ == "__main__":
    main()
