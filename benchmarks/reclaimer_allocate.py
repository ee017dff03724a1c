"""Latency of `POST /v1/agents/reclaimer/allocate` (one second of per-service measurements in,
cores out) on loopback, sequential keep-alive requests at a fixed rate, beside the in-process
`policy.act` for the same measurements. Issue 18's target: p99 <= 5 ms for 28 services.
Also reported: the round trip alone (from when a request was sent, not when it was due) and the
same pacing on `GET /healthz`, the machine's floor for one round trip through the HTTP stack.

    .venv/bin/python -m benchmarks.reclaimer_allocate --policy agents/microservice_cores/policies/reclaimer-social --rate 100 --seconds 20
"""
from __future__ import annotations

import argparse
import http.client
import json
import time

import numpy as np

from samm.localproc import start_samm_serve


def paced(conn, method: str, path: str, bodies: list, rate: float, n: int):
    """n sequential requests, the i-th due at i / rate s: (latency from when it was due, round trip
    from when it was sent, errors). The first includes the client's own timer overshoot."""
    lat, trip, errors = [], [], 0
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        while time.perf_counter() < due:
            time.sleep(max(0.0, due - time.perf_counter()))
        sent = time.perf_counter()
        conn.request(method, path, body=bodies[i % len(bodies)], headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        errors += r.status != 200
        lat.append(time.perf_counter() - due)
        trip.append(time.perf_counter() - sent)
    return lat, trip, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default="agents/microservice_cores/policies/reclaimer-social")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args(argv)
    if not (args.rate > 0 and args.seconds > 0 and args.rate * args.seconds >= 1):  # no request to time
        ap.error("--rate and --seconds must be > 0 and make at least one request")
    from agents.microservice_cores.control import AppLimits
    from agents.microservice_cores.policy import ReclaimerPolicy
    from agents.microservice_cores.sim import MicroserviceSim

    try:
        pol = ReclaimerPolicy.load(args.policy)
    except (ValueError, OSError) as exc:
        ap.error(f"--policy: {exc}")
    topo = pol.topo
    sim = MicroserviceSim(topo, n_envs=1, seed=0)
    sim.reset(np.mean(topo.users))
    ms = [sim.step(np.tile(topo.caps * 0.4, (1, 1))).measurement(0, topo.service_names) for _ in range(200)]
    bodies = [json.dumps({"session": "bench", "services": list(topo.service_names),
                          "per_service": m.per_service.tolist(), "latency_ms": m.latency_ms.tolist(),
                          "requests_per_s": m.requests_per_s, "failures_per_s": m.failures_per_s}) for m in ms]
    proc, url, port = start_samm_serve(["--agent", f"reclaimer={args.policy}"])
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        n = int(args.rate * args.seconds)
        lat, trip, errors = paced(conn, "POST", "/v1/agents/reclaimer/allocate", bodies, args.rate, n)
        # the same pacing on a route that does nothing: this machine's floor for one HTTP round trip
        _, floor, _ = paced(conn, "GET", "/healthz", [None], args.rate, min(n, int(args.rate * 5)))
    finally:
        proc.terminate()
        proc.wait(10)
    ctl = pol.fork()
    ctl.reset(AppLimits(topo.service_names, topo.caps, topo.qos_ms))
    inproc = []
    for m in ms * 5:
        t0 = time.perf_counter()
        ctl.act(m)
        inproc.append(time.perf_counter() - t0)
    q = lambda xs, p: round(float(np.percentile(np.asarray(xs) * 1000, p)), 3)  # noqa: E731
    out = {"services": topo.n_services, "requests": len(lat), "errors": errors, "p50_ms": q(lat, 50),
           "p99_ms": q(lat, 99), "max_ms": q(lat, 100),
           "round_trip_p50_ms": q(trip, 50), "round_trip_p99_ms": q(trip, 99),
           "healthz_round_trip_p50_ms": q(floor, 50), "healthz_round_trip_p99_ms": q(floor, 99), "in_process_p50_ms": q(inproc, 50),
           "in_process_p99_ms": q(inproc, 99)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
