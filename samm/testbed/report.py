"""The demo's report: the paper-style comparison table, the sim-to-testbed gaps, and the
paper's Fig. 11 (VMs per type against waiting jobs over time) as PNGs."""
from __future__ import annotations

import math
from pathlib import Path

COLUMNS = (("runtime (makespan) min", "makespan_s", lambda v: f"{v / 60:.1f}"),
           ("total cost $", "total_cost", lambda v: f"{v:.2f}"),
           ("VM cost $", "vm_cost", lambda v: f"{v:.2f}"),
           ("wait penalty $", "wait_penalty", lambda v: f"{v:.2f}"),
           ("mean allocated cores", "mean_allocated_cores", lambda v: f"{v:.1f}"),
           ("CPU utilisation", "mean_cpu_util", lambda v: f"{100 * v:.0f} %"),
           ("mean wait s", "mean_wait_s", lambda v: f"{v:.0f}"))
FIDELITY_KEYS = ("total_cost", "makespan_s", "mean_allocated_cores")


def _known(v) -> bool:
    """A value the tables can print: a number, not None, NaN or an infinity (shown as "-", not
    "nan" or "inf %")."""
    return v is not None and math.isfinite(v)


def table(rows: list[tuple[str, dict]]) -> str:
    head = ["policy"] + [c[0] for c in COLUMNS]
    body = [[name] + [(f(r[k]) if _known(r.get(k)) else "-") for _, k, f in COLUMNS] for name, r in rows]
    widths = [max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(head)]  # no rows: the header's
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def gap_pct(testbed: float, sim: float) -> float:
    return 100.0 * (testbed - sim) / sim if sim else float("nan")


def fidelity_table(pairs: list[tuple[str, dict, dict]]) -> str:
    lines = ["| policy | metric | simulator | testbed | gap |", "|---|---|---|---|---|"]
    for name, sim, tb in pairs:
        for k in FIDELITY_KEYS:
            a, b = sim.get(k), tb.get(k)
            if not (_known(a) and _known(b)):  # e.g. no job finished: no makespan to compare
                lines.append(f"| {name} | {k} | {f'{a:.2f}' if _known(a) else '-'} | "
                             f"{f'{b:.2f}' if _known(b) else '-'} | - |")
                continue
            gap = f"{gap_pct(b, a):+.1f} %" if a else "-"  # no relative gap to a zero
            lines.append(f"| {name} | {k} | {a:.2f} | {b:.2f} | {gap} |")
    return "\n".join(lines)


def figure_vms_vs_waiting(timeline: list[dict], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in timeline]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for g, colour in (("S", "tab:blue"), ("M", "tab:orange"), ("L", "tab:green")):
        ax.step(t, [r[f"{g}_vms"] for r in timeline], where="post", label=f"VMs {g}", color=colour)
    ax.set_xlabel("workload time (min)")
    ax.set_ylabel("VMs (booting + running)")
    ax2 = ax.twinx()
    ax2.fill_between(t, [r["waiting"] for r in timeline], step="post", alpha=0.25, color="tab:red", label="waiting jobs")
    ax2.set_ylabel("waiting jobs")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper right", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: Path, workload: str, testbed_rows: list[tuple[str, dict]], sim_rows: list[tuple[str, dict]],
                 figures: list[Path], notes: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    sim = dict(sim_rows)
    pairs = [(n, sim[n], r) for n, r in testbed_rows if n in sim]
    text = [f"# SAMM demo: {workload} on the emulated cloud testbed", "",
            "## Testbed (moto ASGs, worker processes, real Graphite, the SAMM daemon)", "", table(testbed_rows), ""]
    if sim_rows:
        text += ["## The same in CloudSim Plus", "", table(sim_rows), ""]
    if pairs:
        text += ["## Sim-to-testbed fidelity", "", fidelity_table(pairs), ""]
    text += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures] + ["", "## Notes", ""]
    text += [f"- {n}" for n in notes]
    path = out / "report.md"
    path.write_text("\n".join(text) + "\n")
    return path
