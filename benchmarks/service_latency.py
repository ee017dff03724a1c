"""Decision latency of the Policy Evaluation Service: REST on loopback at a fixed request rate,
and the same agent called in-process, in one run.

    .venv/bin/python benchmarks/service_latency.py --rate 200 --seconds 60 --json

Starts `samm serve` (uvicorn) on a free loopback port hosting the shipped LSTM-PPO policy,
sends `decide` requests from one keep-alive client at `--rate` per second (open loop: the
schedule does not wait for slow replies, each request's latency counts from its scheduled send
time), then times `agent.act` directly for the same observations.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs, q):
    return round(float(np.percentile(np.asarray(xs) * 1000.0, q)), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import httpx

    from agents.factory import make_agent
    from samm.analyze import OBSERVATION_NAMES
    from sim_bridge.config import SimConfig

    rng = np.random.default_rng(0)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--port", str(port), "--agent", "lstm-ppo"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=5.0) as client:
            deadline = time.time() + 60
            while time.time() < deadline:
                try:
                    if client.get(url + "/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            n = int(args.rate * args.seconds)
            obs = rng.random((n, len(OBSERVATION_NAMES))).round(4)
            for i in range(200):  # warm-up
                client.post(url + "/v1/agents/lstm-ppo/decide",
                            json={"session_id": "warm", "observation": dict(zip(OBSERVATION_NAMES, obs[i].tolist()))})
            lat, errors = [], 0
            start = time.perf_counter()
            for i in range(n):
                due = start + i / args.rate
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                r = client.post(url + "/v1/agents/lstm-ppo/decide",
                                json={"session_id": f"s{i % 50}", "observation": dict(zip(OBSERVATION_NAMES, obs[i].tolist()))})
                lat.append(time.perf_counter() - due)
                errors += r.status_code != 200
            achieved = n / (time.perf_counter() - start)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    agent = make_agent("lstm-ppo", SimConfig())
    state = agent.initial_state(1)
    inproc = []
    for i in range(min(n, 5000)):
        t = time.perf_counter()
        _, state = agent.act(obs[i : i + 1].astype(np.float32), state)
        inproc.append(time.perf_counter() - t)
    out = {
        "rest": {"requests": n, "rate_target": args.rate, "rate_achieved": round(achieved, 1), "errors": errors,
                 "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "max_ms": round(max(lat) * 1000, 3)},
        "in_process": {"calls": len(inproc), "p50_ms": pct(inproc, 50), "p99_ms": pct(inproc, 99)},
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
