"""How well does each Sinan-style model predict the real containers? (docs/microservice-testbed.md,
"A Sinan-style model fitted on the real containers"). Each live run collected by
`samm testbed-microservices --agent sinan-explore --agent-param out=DIR` is held out in turn; models
fitted on the other runs (live only, and live beside simulator samples at a few weights) and the
shipped model (simulator samples only) predict it: the violation classifier's AUC, Brier score and
mean predicted chance against the observed share, and the latency regressor's mean |log error|.

    .venv/bin/python benchmarks/sinan_live_crossfit.py --samples DIR1 --samples DIR2 [--twin-seconds 14400]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.microservice_cores.sinan import SHIPPED_DIR, load_sinan  # noqa: E402
from agents.microservice_cores.sinan_live import fit_live, load_samples  # noqa: E402
from agents.microservice_cores.topology import load_topology  # noqa: E402
from agents.report import writable_folder  # noqa: E402


def scores(model, data) -> dict:
    from sklearn.metrics import roc_auc_score

    lat, pv = model.predict(data.X)
    yv = data.y_viol
    true_ms = model.qos_ms * np.exp(data.y_lat)
    return {"auc": float(roc_auc_score(yv, pv)) if 0 < yv.mean() < 1 else None,
            "brier": float(np.mean((pv - yv) ** 2)), "mean_p": float(pv.mean()), "share": float(yv.mean()),
            "mae_log": float(np.mean(np.abs(np.log(np.maximum(lat, 1e-3) / np.maximum(true_ms, 1e-3)))))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", action="append", required=True, help="a sinan-explore run's folder; repeat (2 or more)")
    ap.add_argument("--topology", default="testbed")
    ap.add_argument("--twin-seconds", type=int, default=14_400, help="simulator seconds beside the live samples")
    ap.add_argument("--weights", default="1,5,20", help="live weights to try beside the simulator's samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    a = ap.parse_args(argv)
    if len(a.samples) < 2:
        ap.error("give two or more --samples runs: each is held out in turn")
    # every refusal as one line before the first fit: a bad weight or run failed part-way through
    # the table, a bad --out only after all of it
    try:
        weights = [int(x) for x in a.weights.split(",") if x.strip().lstrip("-").isdigit()]
        if a.twin_seconds < 1 or len(weights) != len(a.weights.split(",")) or min(weights) < 1:
            raise ValueError("--twin-seconds and every --weights must be whole numbers of at least 1")
        topo = load_topology(a.topology)
        for held in a.samples:
            load_samples([held], topo)
        if a.out:
            writable_folder(Path(a.out).parent)
    except (ValueError, OSError) as exc:
        ap.error(str(exc))
    shipped = load_sinan(SHIPPED_DIR, topo.name)
    rows = []
    for i, held in enumerate(a.samples):
        rest = [s for j, s in enumerate(a.samples) if j != i]
        test = load_samples([held], topo)
        models = {"shipped (simulator only)": shipped,
                  "live only": fit_live(topo, rest, seed=a.seed)}
        for w in weights:
            models[f"live x{w} + simulator"] = fit_live(topo, rest, seed=a.seed, twin_seconds=a.twin_seconds,
                                                       live_weight=w)
        for name, m in models.items():
            rows.append({"held_out": held, "model": name, **scores(m, test)})
            r = rows[-1]
            print(f"{Path(held).name:>24}  {name:<26} AUC {r['auc'] if r['auc'] is None else round(r['auc'], 3)}  "
                  f"Brier {r['brier']:.3f}  mean P {r['mean_p']:.3f} (seen {r['share']:.3f})  |log err| {r['mae_log']:.3f}",
                  flush=True)
    summary = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        summary[name] = {k: float(np.mean([r[k] for r in mine if r[k] is not None]))
                         for k in ("auc", "brier", "mae_log")}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "mean": summary}, indent=1))
    return summary


if __name__ == "__main__":
    main()
