"""How well the interference forest predicts unseen compositions (the paper's Fig. 6).

The paper trains its random forest on a random fraction of the measured co-locations and reports the
held-out error: "more than 40%" of the data "can guarantee MSE < 0.145%" (MSE < 0.00145). We repeat
this on Metis's complete file. Error is measured on per-container normalised throughput over the
apps PRESENT in each held-out composition (absent apps are 0 by construction, and counting them would
flatter the model); the all-outputs MSE (absent apps counted as 0, as Metis measures it) is reported
beside it. Pooled R² hides weak apps, so `per_app_accuracy` gives MSE and R² per app.

Run: python -m agents.lra_placement.validation [--data PATH] [--out fig.png] [--seed 0]
"""
from __future__ import annotations

import argparse
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np

from agents.policy import one_line

from .data import MetisData, load_metis
from .predictor import ForestParams, ForestPredictor

PAPER_RATIOS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
PAPER_MSE_TARGET = 0.00145  # paper §6.1 / Fig. 6: "MSE < 0.145%" with more than 40% of the data


def _split(n_rows: int, ratio: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if n_rows < 2:  # one row to train on and one to test on, at least
        raise ValueError(f"the accuracy study needs at least 2 data rows, got {n_rows}")
    perm = rng.permutation(n_rows)
    n_train = min(max(int(round(ratio * n_rows)), 2), n_rows - 1)  # a forest needs >= 2 rows; keep >= 1 to test
    return perm[:n_train], perm[n_train:]


def _fit_predict(data: MetisData, train: np.ndarray, test: np.ndarray, seed: int, params: ForestParams):
    model = ForestPredictor(app_names=data.app_names, params=params)
    model.fit(data.alloc[train], data.rps[train], seed=seed, tabulate=False)
    return model.predict_forest(data.alloc[test]), data.targets()[test], data.alloc[test] > 0


def _r2(pred: np.ndarray, truth: np.ndarray) -> float:
    ss_res = float(((pred - truth) ** 2).sum())
    ss_tot = float(((truth - truth.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def accuracy_vs_sampling(
    data: MetisData, ratios=PAPER_RATIOS, seed: int = 0, params: ForestParams = ForestParams()
) -> list[dict]:
    """One row per training ratio: held-out MSE over present apps, all-output MSE and pooled R²."""
    rows = []
    for i, ratio in enumerate(ratios):
        # One generator per ratio's POSITION in `ratios`, not its value: adding a ratio at the end
        # leaves the others' splits alone, but the same ratio at another position gets another split
        # (0.4 is 5th in the experiment's list and 6th in PAPER_RATIOS, hence two 40 % figures in
        # docs/lra-placement.md); seeding by value would change every recorded figure.
        rng = np.random.default_rng([seed, i])
        train, test = _split(data.n_rows, ratio, rng)
        pred, truth, present = _fit_predict(data, train, test, seed, params)
        rows.append(
            {
                "ratio": float(ratio),
                "n_train": int(len(train)),
                "n_test": int(len(test)),
                "mse": float(((pred - truth)[present] ** 2).mean()),
                "mse_all_outputs": float(((pred - truth) ** 2).mean()),
                "r2": _r2(pred[present], truth[present]),
            }
        )
    return rows


def per_app_accuracy(
    data: MetisData, ratio: float = 0.5, seed: int = 0, params: ForestParams = ForestParams()
) -> list[dict]:
    """Held-out MSE and R² of each app, over the test compositions where the app is present."""
    train, test = _split(data.n_rows, ratio, np.random.default_rng([seed, 10_000]))
    pred, truth, present = _fit_predict(data, train, test, seed, params)
    rows = []
    for a, name in enumerate(data.app_names):
        m = present[:, a]
        rows.append(
            {
                "app": name,
                "n_test": int(m.sum()),
                "mse": float(((pred[m, a] - truth[m, a]) ** 2).mean()) if m.any() else float("nan"),
                "r2": _r2(pred[m, a], truth[m, a]) if m.any() else float("nan"),
            }
        )
    return rows


def plot_accuracy(rows: list[dict], path) -> None:
    """MSE (log scale, with the paper's 0.00145 line) and pooled R² against the training ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [r["ratio"] for r in rows]
    fig, (ax_mse, ax_r2) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax_mse.plot(ratios, [r["mse"] for r in rows], "o-", label="present apps")
    ax_mse.plot(ratios, [r["mse_all_outputs"] for r in rows], "s--", label="all outputs (absent = 0)")
    ax_mse.axhline(PAPER_MSE_TARGET, color="grey", linestyle=":", label="paper: MSE < 0.00145")
    ax_mse.set_yscale("log")
    ax_mse.set_xlabel("training fraction")
    ax_mse.set_ylabel("held-out MSE")
    ax_mse.legend(fontsize=8)
    ax_r2.plot(ratios, [r["r2"] for r in rows], "o-")
    ax_r2.set_xlabel("training fraction")
    ax_r2.set_ylabel("held-out R² (present apps)")
    fig.suptitle("Interference forest accuracy vs sampling ratio (Metis data)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="Metis .npz (default: the complete 6,435-row file)")
    parser.add_argument("--out", default=None, help="write the figure to this PNG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-app-ratio", type=float, default=0.5)
    parser.add_argument("--trees", type=int, default=ForestParams().n_estimators)
    parser.add_argument("--single-forest", action="store_true", help="one multi-output forest, not one per app")
    args = parser.parse_args(argv)
    _check_args(parser, args)
    try:
        data = load_metis(args.data)
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:  # a missing or not-a-Metis file
        parser.error(f"--data: {one_line(exc)}")
    params = replace(ForestParams(), n_estimators=args.trees, per_app=not args.single_forest)
    print(f"{data.source}: {data.n_rows} rows kept, {data.dropped_failed} failed-run rows and "
          f"{data.dropped_empty} empty rows dropped")
    rows = accuracy_vs_sampling(data, seed=args.seed, params=params)
    print(f"{'ratio':>6} {'train':>6} {'test':>6} {'MSE(present)':>13} {'MSE(all)':>10} {'R2':>7}")
    for r in rows:
        print(f"{r['ratio']:6.2f} {r['n_train']:6d} {r['n_test']:6d} {r['mse']:13.5f} "
              f"{r['mse_all_outputs']:10.5f} {r['r2']:7.3f}")
    print(f"per app, training fraction {args.per_app_ratio}:")
    for r in per_app_accuracy(data, ratio=args.per_app_ratio, seed=args.seed, params=params):
        print(f"  {r['app']:<12} n={r['n_test']:5d} MSE={r['mse']:.5f} R2={r['r2']:.3f}")
    if args.out:
        plot_accuracy(rows, args.out)
        print(f"figure: {args.out}")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad arguments as one-line usage errors before any work: each was a traceback, `--trees 0`
    after the data loaded, `--per-app-ratio nan`, `--seed -1` or an `--out` in a missing folder after
    the whole study ran."""
    if args.trees < 1:
        parser.error(f"--trees must be >= 1, got {args.trees}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0 (numpy's seeds), got {args.seed}")
    if not 0 <= args.per_app_ratio <= 1:  # NaN fails this too
        parser.error(f"--per-app-ratio must be a training fraction between 0 and 1, got {args.per_app_ratio}")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out: folder {Path(args.out).resolve().parent} does not exist")


if __name__ == "__main__":
    main()
