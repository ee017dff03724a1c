"""Every controller on the real-container testbed beside the simulator's twin of it (issue 18,
"Real containers": the sim-to-testbed gap of the same policy).

For each agent and user level:
  real:  `samm testbed-microservices --agent A --users U --seconds S --out DIR/A-U` (a subprocess,
         one run at a time; its summary.json)
  sim:   `run_episodes` on the same topology (default `testbed`) at the same users with the same
         controller from `hosting.make_controller`, --sim-seeds seeds, S control seconds after
         --sim-warmup seconds at the caps (default 2, the testbed's warm-up)

and prints / writes (DIR/compare.json, DIR/compare.md; an earlier pair is moved aside to
compare.previous.json / .md) per agent and level: real mean / max total
cores, real p99 mean, real violation rate beside the simulator's, and the gap real - sim of the
mean cores and of the violation rate. The load average (`os.getloadavg`) is recorded before and
after every real run and around the simulator's part, since the 2-core machine may be shared.

Cores: the testbed's row k holds the limits in force during second k (row 0: the caps of the
warm-up), the simulator's the limit set at step k; "aligned" is the simulator's mean over the same
window (the caps, then its first S-1 decisions), and the gap of mean cores uses it.

Violation rate: real = seconds with a known p99 above the QoS target / seconds with a known p99
(the testbed's summary); sim = control seconds with p99 above the target / control seconds
(EpisodeResult.violation_rate), mean over the seeds.

    .venv/bin/python benchmarks/microservice_testbed_compare.py \
        --agents reclaimer,autoscale,sinan,vpa --users 6,14 --seconds 60 --out runs/ms-compare
    # --skip-real: simulator only; --reuse: take an existing DIR/A-U/summary.json instead of running
    # an agent may name its policy: reclaimer@runs/rc-x/policy (two policies of one method in one run)
    # and a scale-down window and/or a headroom floor (hosting.make_controller's scale_down_window,
    # headroom_floor): reclaimer+window5, autoscale+window5, reclaimer+window5+floor4
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def split_agent(spec: str) -> tuple[str, str | None, dict]:
    """`reclaimer@DIR+window5+floor4` -> ("reclaimer", "DIR", {"scale_down_window": 5, "headroom_floor": 4.0});
    a plain name -> (name, None, {})."""
    head, *mods = spec.split("+")
    params: dict = {}
    for mod in mods:
        if mod.startswith("window"):
            params["scale_down_window"] = int(mod[len("window"):])
        elif mod.startswith("floor"):
            params["headroom_floor"] = float(mod[len("floor"):])
        elif mod.startswith("throttle"):  # on the twin the guard reads the model's chance θ of a throttled period
            params["throttle_guard"] = float(mod[len("throttle"):])
        else:
            raise ValueError(f"{spec!r}: unknown modifier +{mod} (known: +windowN, +floorK, +throttleS)")
    name, _, policy = head.partition("@")
    return name, policy or None, params


def run_real(agent: str, users: int, seconds: int, out: Path, topology: str, reuse: bool,
             timeout_s: float) -> dict:
    summary = out / "summary.json"
    name, policy, params = split_agent(agent)
    cmd = [str(ROOT / ".venv" / "bin" / "samm"), "testbed-microservices", "--agent", name,
           "--users", str(users), "--seconds", str(seconds), "--out", str(out),
           "--topology", topology, "--no-plots"]
    if policy:
        cmd += ["--agent-param", f'policy_dir="{policy}"']
    for key, value in params.items():
        cmd += ["--agent-param", f"{key}={value}"]
    rec: dict = {"command": " ".join(cmd), "load_before": load_avg()}
    if reuse and summary.is_file():
        rec["reused"] = True
    else:
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            rec["rc"] = p.returncode
            if p.returncode != 0:
                rec["error"] = (p.stderr or p.stdout)[-2000:]
        except subprocess.TimeoutExpired:
            rec["rc"] = None
            rec["error"] = f"timed out after {timeout_s} s"
        rec["wall_s"] = round(time.time() - t0, 1)
    rec["load_after"] = load_avg()
    if summary.is_file() and "error" not in rec:
        s = json.loads(summary.read_text())
        rec.update({"mean_cores": s["total_cores"]["mean"], "max_cores": s["total_cores"]["max"],
                    "mean_used": s.get("used_cores_mean"), "p99_mean_ms": s["p99_ms"].get("mean"),
                    "p99_max_ms": s["p99_ms"].get("max"), "violation_rate": s["violation_rate"],
                    "violation_seconds": s.get("violation_seconds"),
                    "known_seconds": s.get("known_latency_seconds"),
                    "unknown_seconds": s.get("unknown_latency_seconds"),
                    "rps": s.get("requests_per_s_mean"), "failures": s.get("failures_total"),
                    "no_action_reasons": s.get("no_action_reasons")})
    return rec


def twin_controllers(agent: str, topo):
    """(method name, make(i)): the controller of the simulator's copy i for an agent spec."""
    from agents.microservice_cores.hosting import make_controller

    name, policy, extra = split_agent(agent)
    base = make_controller(name, topo, policy_dir=policy, **extra)
    # a learned policy forks (one network, a frame stack per copy); a window forks when what it holds does
    fork = getattr(base, "fork", None) if getattr(base, "forks", True) else None

    def make(i):
        if i == 0:
            return base
        return fork() if fork else make_controller(name, topo, policy_dir=policy, **extra)

    return name, make


def run_sim(agent: str, users: int, seconds: int, topology: str, seeds: list[int], warmup: int) -> dict:
    from agents.microservice_cores.episode import run_episodes
    from agents.microservice_cores.topology import load_topology

    topo = load_topology(topology)
    name, make = twin_controllers(agent, topo)
    t0 = time.time()
    res = run_episodes(topo, make, users, seeds, steps=seconds, warmup=warmup, method=name)
    s = [r.summary() for r in res]
    mean = lambda k: float(np.mean([x[k] for x in s if x[k] is not None]))
    # the testbed's row k holds the limits in force during second k, so its series is the caps
    # (the warm-up's) followed by the first S-1 decisions; the same window of the simulator's
    aligned = [float(np.concatenate([[topo.caps.sum()], r.total_cores[:-1]]).mean()) for r in res]
    return {"seeds": seeds, "warmup_s": warmup, "mean_cores": mean("mean_cores"),
            "mean_cores_aligned": float(np.mean(aligned)),
            "max_cores": float(max(x["max_cores"] for x in s)), "mean_used": mean("mean_used"),
            "p99_mean_ms": mean("p99_mean_ms"), "violation_rate": mean("violation_rate"),
            "violation_rate_per_seed": [x["violation_rate"] for x in s],
            "mean_cores_per_seed": [x["mean_cores"] for x in s],
            # the model's share of throttled CFS periods, beside the real containers' measured one
            "throttled_mean": {k: float(np.mean([r.extra["throttled_mean"][k] for r in res]))
                               for k in topo.service_names},
            "wall_s": round(time.time() - t0, 1)}


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def num(x, f="{:.3f}") -> str:
    return "-" if x is None else f.format(x)


def table(rows: list[dict]) -> str:
    head = ("| agent | users | real mean cores | real max cores | real p99 mean (ms) | real violations "
            "| sim mean cores (aligned) | sim max cores | sim p99 mean (ms) | sim violations | gap mean cores (real − sim) "
            "| gap violations (real − sim) | load avg (1 min) before / after |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    lines = []
    for r in rows:
        re, si = r["real"], r["sim"]
        gc = None if re.get("mean_cores") is None else re["mean_cores"] - si["mean_cores_aligned"]
        gv = None if re.get("violation_rate") is None else re["violation_rate"] - si["violation_rate"]
        vs = "-" if re.get("violation_rate") is None else \
            f"{pct(re['violation_rate'])} ({re.get('violation_seconds')}/{re.get('known_seconds')})"
        lines.append(f"| {r['agent']} | {r['users']} | {num(re.get('mean_cores'))} | {num(re.get('max_cores'))} "
                     f"| {num(re.get('p99_mean_ms'), '{:.1f}')} | {vs} | {num(si['mean_cores'])} "
                     f"({num(si['mean_cores_aligned'])}) | {num(si['max_cores'])} | {num(si['p99_mean_ms'], '{:.1f}')} | {pct(si['violation_rate'])} "
                     f"| {'-' if gc is None else f'{gc:+.3f}'} | {'-' if gv is None else f'{100 * gv:+.1f} pp'} "
                     f"| {re['load_before'][0]} / {re['load_after'][0]} |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="reclaimer,autoscale,sinan,vpa")
    ap.add_argument("--users", default="6,14")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--out", default="runs/ms-compare")
    ap.add_argument("--topology", default="testbed")
    ap.add_argument("--sim-seeds", default="0,1,2")
    ap.add_argument("--sim-warmup", type=int, default=2, help="seconds at the caps before control (testbed: 2)")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="reuse DIR/A-U/summary.json where present")
    ap.add_argument("--timeout", type=float, default=None, help="per real run (default: seconds + 120)")
    a = ap.parse_args(argv)
    from agents.microservice_cores.topology import load_topology
    from agents.report import writable_folder
    from samm.cli.seeds import parse_seeds
    agents = [x for x in a.agents.split(",") if x]
    try:  # before the output folder is made and the first run starts
        levels = [int(x) for x in a.users.split(",") if x]
        seeds = parse_seeds(a.sim_seeds)
    except ValueError as exc:
        ap.error(f"--users / --sim-seeds: {exc}")
    if a.seconds < 1 or a.sim_warmup < 0 or not levels or min(levels) < 1 or not agents:
        ap.error("--seconds and every --users must be at least 1, --sim-warmup at least 0, and --agents name one")
    # the simulator's part runs after every real run (hours): an unknown agent, modifier, policy or
    # topology failed only there, with a traceback and no compare.json
    try:
        topo = load_topology(a.topology)
        for agent in agents:
            twin_controllers(agent, topo)
    except (ValueError, OSError) as exc:
        ap.error(f"--agents / --topology: {exc}")
    try:
        out = writable_folder(a.out)
    except OSError as exc:
        ap.error(f"--out: {exc}")
    prior = {}
    if a.reuse:    # keep the load, wall time and command recorded when a reused run was made
        for f in ("compare.json", "compare.partial.json", "compare.previous.json"):
            if (out / f).is_file():
                d = json.loads((out / f).read_text())
                for r in (d["rows"] if isinstance(d, dict) else d):
                    if not r["real"].get("skipped"):  # a --skip-real row recorded no real run
                        prior.setdefault((r["agent"], r["users"]), r["real"])
    for name, aside in (("compare.json", "compare.previous.json"), ("compare.md", "compare.previous.md")):
        if (out / name).is_file():  # an earlier comparison's figures (a --skip-real rerun wrote over them)
            os.replace(out / name, out / aside)
    rows = []
    for agent in agents:
        for u in levels:
            if a.skip_real:
                real = {"skipped": True, "load_before": load_avg(), "load_after": load_avg()}
            else:
                real = run_real(agent, u, a.seconds, out / f"{agent.replace('@', '-').replace('/', '_').replace('+', '-')}-{u}", a.topology, a.reuse,
                                a.timeout or a.seconds + 120)
                if real.get("reused") and (agent, u) in prior:
                    real = {**real, **{k: prior[(agent, u)][k] for k in ("load_before", "load_after", "wall_s")
                                       if k in prior[(agent, u)]}}
            rows.append({"agent": agent, "users": u, "real": real})
            print(f"real {agent} u={u}: " + json.dumps({k: real.get(k) for k in
                  ("mean_cores", "max_cores", "p99_mean_ms", "violation_rate", "wall_s", "load_before",
                   "load_after", "error")}), flush=True)
            (out / "compare.partial.json").write_text(json.dumps(rows, indent=1, default=str))
    sim_load_before = load_avg()
    for r in rows:
        r["sim"] = run_sim(r["agent"], r["users"], a.seconds, a.topology, seeds, a.sim_warmup)
        print(f"sim  {r['agent']} u={r['users']}: mean cores {r['sim']['mean_cores']:.3f}, "
              f"violations {pct(r['sim']['violation_rate'])}", flush=True)
    meta = {"argv": sys.argv, "seconds": a.seconds, "topology": a.topology, "sim_seeds": seeds,
            "sim_warmup_s": a.sim_warmup, "sim_load_before": sim_load_before, "sim_load_after": load_avg(),
            "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    (out / "compare.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    md = table(rows)
    (out / "compare.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
