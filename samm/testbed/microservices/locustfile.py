"""The Locust side of the load generator (run by `load.LoadGenerator` in its own process, never
imported by the controller: Locust monkey-patches the standard library with gevent).

    python -m locust -f locustfile.py --headless -u USERS -r USERS --host http://127.0.0.1:PORT \
        --ms-topology conf/topology.json --ms-base-port PORT --ms-out load.jsonl

Closed-loop users: each user sends one request, waits for its answer, thinks for an exponential
time of mean 1/rate_per_user, and starts again (each user's first request is delayed by a uniform
random part of one think time, so the users do not fire in lock-step). The request type is drawn
by the topology's weights; a type is sent to its root service's port as GET /r/<type>/-.

Every wall-clock second s, one JSON line goes to --ms-out about 20 ms after s+1 ends:

    {"second": s, "t_end": s+1, "written": <epoch>, "completed": n, "ok": n_ok, "failures": n_fail,
     "requests_per_s": n, "failures_per_s": n_fail, "latency_ms": [p50 ... p100] or null,
     "users": u, "inflight": k, "oldest_inflight_ms": x}

`latency_ms` holds observation.PERCENTILES of the end-to-end latencies (ms) of the requests that
completed successfully (HTTP 200) in second s (null when none did); failed requests (errors,
timeouts, HTTP != 200) count in `failures` only.
"""
from __future__ import annotations

import json
import random
import time

import gevent
import numpy as np
from locust import FastHttpUser, events, task

from agents.microservice_cores.observation import PERCENTILES

_S: dict = {"ok": {}, "fail": {}, "inflight": {}, "next_id": 0}


@events.init_command_line_parser.add_listener
def _arguments(parser):
    parser.add_argument("--ms-topology", default="", help="the testbed topology as JSON")
    parser.add_argument("--ms-base-port", type=int, default=18100, help="port of the first service")
    parser.add_argument("--ms-out", default="load.jsonl", help="per-second JSON lines go here")
    parser.add_argument("--ms-seed", type=int, default=None, help="seed of the users' random draws")


@events.init.add_listener
def _init(environment, **_kw):
    opts = environment.parsed_options
    if opts is None or not opts.ms_topology:
        return
    with open(opts.ms_topology) as f:
        topo = json.load(f)
    ports = {s: opts.ms_base_port + i for i, s in enumerate(topo["services"])}
    reqs = topo["requests"]
    MsUser.types = list(reqs)
    MsUser.weights = [float(r["weight"]) for r in reqs.values()]
    MsUser.urls = {name: f"http://127.0.0.1:{ports[r['call']]}/r/{name}/-" for name, r in reqs.items()}
    MsUser.rate = float(topo["rate_per_user"])
    MsUser.network_timeout = MsUser.connection_timeout = float(topo.get("timeout_s", 5.0))
    MsUser.rng = random.Random(opts.ms_seed)
    gevent.spawn(_writer, environment, opts.ms_out)


def _writer(environment, path: str) -> None:
    with open(path, "a", buffering=1) as f:
        nxt = int(time.time()) + 1
        while True:
            gevent.sleep(max(0.0, nxt + 0.02 - time.time()))
            s = nxt - 1
            ok = _S["ok"].pop(s, [])
            fail = _S["fail"].pop(s, 0)
            now = time.time()
            oldest = min(_S["inflight"].values(), default=None)
            runner = environment.runner
            rec = {"second": s, "t_end": s + 1, "written": round(now, 3), "completed": len(ok) + fail,
                   "ok": len(ok), "failures": fail, "requests_per_s": len(ok) + fail, "failures_per_s": fail,
                   "latency_ms": [round(float(x), 3) for x in np.percentile(ok, PERCENTILES)] if ok else None,
                   "users": runner.user_count if runner is not None else 0, "inflight": len(_S["inflight"]),
                   "oldest_inflight_ms": None if oldest is None else round((now - oldest) * 1000, 1)}
            f.write(json.dumps(rec) + "\n")
            nxt += 1


class MsUser(FastHttpUser):
    types: list = []
    weights: list = []
    urls: dict = {}
    rate = 1.0
    rng = random.Random()
    host = "http://127.0.0.1"

    def wait_time(self):
        return self.rng.expovariate(self.rate)

    def on_start(self):
        gevent.sleep(self.rng.uniform(0.0, 1.0 / self.rate))

    @task
    def one_request(self):
        rtype = self.rng.choices(self.types, self.weights)[0]
        _S["next_id"] += 1
        key = _S["next_id"]
        t0 = time.time()
        _S["inflight"][key] = t0
        try:
            resp = self.client.get(self.urls[rtype], name=rtype)
            ok = resp.status_code == 200
        except Exception:  # noqa: BLE001 - any client error is a failed request
            ok = False
        finally:
            _S["inflight"].pop(key, None)
        t1 = time.time()
        second = int(t1)
        if ok:
            _S["ok"].setdefault(second, []).append((t1 - t0) * 1000.0)
        else:
            _S["fail"][second] = _S["fail"].get(second, 0) + 1
