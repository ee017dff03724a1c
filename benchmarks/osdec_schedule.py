"""Latency of the deferrable-jobs schedule operation: `POST /v1/agents/{name}/schedule` on
loopback with `--eligible` eligible jobs (plus running and future ones) per request, at a fixed
rate, and the same call in-process, in one run.

    .venv/bin/python benchmarks/osdec_schedule.py --eligible 200 --rate 100 --seconds 20 --json

Starts `samm serve --agent osdec[=DIR]` on a free loopback port, sends requests from one keep-alive
stdlib HTTP client (open loop: latency counts from each request's scheduled send time), then
calls `service.schedule` directly. The shipped policy shows the first `max_eligible` (64) eligible
jobs in EDF order to the network; the rest wait for a later slot (docs/deferrable-jobs.md).
"""
from __future__ import annotations

import argparse
import http.client
import json
import time

import numpy as np

from samm.localproc import start_samm_serve


def pct(xs, q):
    return round(float(np.percentile(np.asarray(xs) * 1000, q)), 3)


def bodies(n_eligible: int, count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        t = 100 + k
        elig = [{"id": f"e{k}-{i}", "cores": int(rng.choice([1, 2, 4, 8])), "duration": int(rng.integers(1, 13)),
                 "earliest": t - int(rng.integers(0, 4)), "latest": t + int(rng.integers(0, 6))}
                for i in range(n_eligible)]
        running = [{"id": f"r{k}-{i}", "cores": int(rng.choice([1, 2, 4])), "remaining": int(rng.integers(1, 6))}
                   for i in range(30)]
        future = [{"id": f"f{k}-{i}", "cores": 1, "duration": 2, "earliest": t + 2, "latest": t + 6} for i in range(20)]
        out.append({"slot": t, "capacity": float(rng.integers(40, 80)), "eligible": elig, "running": running,
                    "future": future, "session": "bench"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default="osdec", help="NAME or NAME=POLICY_DIR, as `samm serve --agent`.")
    ap.add_argument("--eligible", type=int, default=200)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (args.rate > 0 and args.seconds > 0 and args.rate * args.seconds >= 1):  # no request to time
        ap.error("--rate and --seconds must be > 0 and make at least one request")
    if args.eligible < 0:  # range() of a negative count timed empty requests, as --eligible 0
        ap.error(f"--eligible must be at least 0, not {args.eligible}")
    from agents.deferrable_jobs.features import SummaryHistory
    from agents.deferrable_jobs.service import ScheduleRequest, schedule
    from agents.registry import make_policy

    name = args.agent.partition("=")[0]
    try:  # the reason, before the service starts: `samm serve` dies with it on its (discarded) stderr
        policy = make_policy(name, args.agent.partition("=")[2] or None)
    except (ValueError, OSError) as exc:
        ap.error(f"--agent {args.agent}: {exc}")
    reqs = bodies(args.eligible, 200)
    proc, url, port = start_samm_serve(["--agent", args.agent])
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"content-type": "application/json"}
        encoded = [json.dumps(b) for b in reqs]

        def call(i: int) -> int:
            conn.request("POST", f"/v1/agents/{name}/schedule", body=encoded[i % len(encoded)], headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status

        for i in range(50):
            call(i)
        from service_latency import open_loop  # with the machine's own pauses beside it

        n = int(args.rate * args.seconds)
        lat, errors, achieved, pauses = open_loop(call, n, args.rate, args.seconds)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    hist = SummaryHistory()
    parsed = [ScheduleRequest(**b) for b in reqs]
    inproc = []
    for i in range(1000):
        t = time.perf_counter()
        schedule(policy, parsed[i % len(parsed)], hist)
        inproc.append(time.perf_counter() - t)
    out = {"eligible_per_request": args.eligible,
           "rest": {"requests": n, "rate_target": args.rate, "rate_achieved": round(achieved, 1), "errors": errors,
                    "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": round(max(lat) * 1000, 3)},
           "machine_pauses": pauses,
           "in_process": {"calls": len(inproc), "p50_ms": pct(inproc, 50), "p99_ms": pct(inproc, 99)}}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
