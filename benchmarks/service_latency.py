"""Decision latency of the Policy Evaluation Service: REST on loopback at a fixed request rate,
and the same agent called in-process, in one run.

    .venv/bin/python benchmarks/service_latency.py --rate 200 --seconds 60 --json
    .venv/bin/python benchmarks/service_latency.py --agent lra-reinforce=DIR --rate 200 --seconds 60 --json
    .venv/bin/python benchmarks/service_latency.py --sessions 10,10000 --rate 200 --seconds 30 --json

Starts `samm serve` (uvicorn) on a free loopback port hosting the shipped LSTM-PPO policy (or
`--agent NAME[=POLICY_DIR]` of any problem: its observations are drawn from its observation space,
with an all-ones action mask where the action space is Discrete),
sends `decide` requests from one keep-alive stdlib HTTP client at `--rate` per second (open loop: the
schedule does not wait for slow replies, each request's latency counts from its scheduled send
time), then times `agent.act` directly for the same observations. `--sessions A,B,...` repeats the
REST part with that many live sessions (each opened before timing, requests cycling over them),
in one server, so the cost of the session store is read as a ratio within the run.
"""
from __future__ import annotations

import argparse
import http.client
import json

import subprocess
import sys
import time

import numpy as np

from samm.localproc import start_samm_serve


def pct(xs, q):
    return round(float(np.percentile(np.asarray(xs) * 1000.0, q)), 3)


PAUSE_PROBE = """
import json, sys, time
end = time.perf_counter() + float(sys.argv[1])
prev, gaps = time.perf_counter(), []
while time.perf_counter() < end:
    time.sleep(0.001)
    now = time.perf_counter()
    if now - prev > 0.010:
        gaps.append(round((now - prev) * 1e3, 1))
    prev = now
print(json.dumps({"pauses_over_10ms": len(gaps), "max_pause_ms": max(gaps, default=0.0)}))
"""


def open_loop(call, n: int, rate: float, seconds: float) -> tuple[list[float], int, float, dict]:
    """`call(i)` (→ HTTP status) at `rate` per second, open loop: each latency counts from its
    scheduled send time, so a slow reply delays the next ones' figures, as a real caller sees it.
    An idle process that sleeps 1 ms at a time runs alongside: the pauses it sees are the
    machine's (scheduler, host steal), not the service's; they tell a noisy run apart.
    Returns (latencies in s, non-200 answers, achieved rate, pauses)."""
    probe = subprocess.Popen([sys.executable, "-c", PAUSE_PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)
    lat, errors = [], 0
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        errors += call(i) != 200
        lat.append(time.perf_counter() - due)
    achieved = n / (time.perf_counter() - start)
    return lat, errors, achieved, json.loads(probe.communicate(timeout=30)[0])


def sampled_bodies(info: dict, count: int, seed: int = 0) -> list[dict]:
    """Decide requests drawn from an agent's observation space (GET /v1/agents/{name})."""
    from agents.spaces import space_from_json

    space = space_from_json(info["observation_space"])
    space.seed(seed)
    act = info["action_space"]
    out = []
    for i in range(count):
        body = {"session_id": f"s{i % 50}", "observation": _jsonable(space.sample())}
        if act["type"] == "Discrete":
            body["action_mask"] = [1] * act["n"]
        out.append(body)
    return out


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return np.asarray(x).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--agent", default="lstm-ppo", help="NAME or NAME=POLICY_DIR, as `samm serve --agent`.")
    ap.add_argument("--agent-param", action="append", default=[], help="NAME:KEY=VALUE, as `samm serve --agent-param`.")
    ap.add_argument("--sessions", default="50", help="Live sessions during the timed part; a comma list runs "
                                                      "one timed part per count (default 50).")
    args = ap.parse_args()
    if not (args.rate > 0 and args.seconds > 0 and args.rate * args.seconds >= 1):  # no request to time
        ap.error("--rate and --seconds must be > 0 and make at least one request")
    try:  # before the service starts, not after its first timed part
        sessions = [int(c) for c in args.sessions.split(",")]
    except ValueError:
        ap.error(f"--sessions must be comma-separated whole numbers, got {args.sessions!r}")
    if min(sessions) < 1:
        ap.error("--sessions must be at least 1")

    from agents.factory import make_agent
    from sim_bridge.config import SimConfig

    rng = np.random.default_rng(0)
    name = args.agent.partition("=")[0]
    extra = [x for p in args.agent_param for x in ("--agent-param", p)]
    try:
        proc, url, port = start_samm_serve(["--agent", args.agent, *extra])
    except RuntimeError as exc:  # a bad --agent or --agent-param: the service refused to start
        ap.error(f"{exc} (`samm serve --agent {args.agent}{' ' + ' '.join(extra) if extra else ''}` says why)")
    try:
        # the load generator: stdlib http.client on one keep-alive connection (httpx itself
        # adds ~1 ms per request, which would be measured as service latency)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        headers = {"content-type": "application/json"}

        def get_json(path: str):  # on the same connection: httpx is only a test dependency (the dev extra)
            conn.request("GET", path)
            return json.loads(conn.getresponse().read())

        def decide(session: str, row) -> int:
            body = json.dumps({"session_id": session, "observation": dict(zip(names, row.tolist()))}
                              if name == "lstm-ppo" else row)
            conn.request("POST", f"/v1/agents/{name}/decide", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status

        n = int(args.rate * args.seconds)
        if name == "lstm-ppo":  # the hosted policy's own features, drawn within its observation bounds
            agent = make_agent("lstm-ppo", SimConfig())
            names, space = agent.feature_names, agent.observation_space
            lo, hi = np.asarray(space.low, float), np.minimum(np.asarray(space.high, float), np.asarray(space.low) + 10)
            obs = (lo + rng.random((n, len(names))) * (hi - lo)).round(4)
        else:
            obs = sampled_bodies(get_json(f"/v1/agents/{name}"), min(n, 500))
            obs = [obs[i % len(obs)] for i in range(n)]
        for i in range(min(200, n)):  # warm-up
            decide("warm", obs[i])
        rest = {}
        for count in sessions:
            tag = f"n{count}-"
            for j in range(count):  # every session live before the clock starts
                decide(f"{tag}{j}", obs[j % n])
            lat, errors, achieved, pauses = open_loop(lambda i: decide(f"{tag}{i % count}", obs[i]), n, args.rate,
                                                      args.seconds)
            rest[count] = {"requests": n, "rate_target": args.rate, "rate_achieved": round(achieved, 1),
                           "errors": errors, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                           "max_ms": round(max(lat) * 1000, 3),
                           "slowest_at_s": sorted(round(i / args.rate, 1) for i in np.argsort(lat)[-5:]),
                           "machine_pauses": pauses}
        live = get_json("/healthz").get("sessions")
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    inproc = []
    if name == "lstm-ppo":
        state = agent.initial_state(1)
        for i in range(min(n, 5000)):
            t = time.perf_counter()
            _, state = agent.act(obs[i : i + 1].astype(np.float32), state)
            inproc.append(time.perf_counter() - t)
    else:  # the same data plane call the service makes, without HTTP
        from agents.registry import make_policy
        from samm.plan import dataplane

        params = dict(p.partition(":")[2].split("=", 1) for p in args.agent_param if p.startswith(name + ":"))
        policy = make_policy(name, args.agent.partition("=")[2] or None, **params)
        state = policy.initial_state()
        for i in range(min(n, 5000)):
            t = time.perf_counter()
            _, state = dataplane.decide(policy, obs[i]["observation"], mask=obs[i].get("action_mask"), state=state)
            inproc.append(time.perf_counter() - t)
    counts = list(rest)
    out = {"rest": rest[counts[0]] if len(counts) == 1 else {f"sessions_{c}": rest[c] for c in counts},
           "in_process": {"calls": len(inproc), "p50_ms": pct(inproc, 50), "p99_ms": pct(inproc, 99)}}
    if len(counts) == 1:
        out["machine_pauses"] = out["rest"].pop("machine_pauses")
    else:
        out["live_sessions_at_end"] = live
        base = rest[counts[0]]
        out["ratio_to_first"] = {f"sessions_{c}": {q: round(rest[c][q] / base[q], 2) for q in ("p50_ms", "p99_ms")}
                                 for c in counts[1:]}
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
