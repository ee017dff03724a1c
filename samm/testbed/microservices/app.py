"""One generic microservice: every service of the testbed application is this program.

    python -I app.py --service rate --topology /conf/topology.json --base-port 18100 [--state-dir /state]

Standard library only: it runs inside a busybox container with the host's Python interpreter
bind-mounted read-only, so nothing from the project's virtual environment is available.

The topology is the JSON rendering of an `agents.microservice_cores.topology.Topology` (the host
writes it from the validated YAML). Service i listens on 127.0.0.1:(base_port + i), i being its
position in `services` (host networking). A request is

    GET /r/<request type>/<node path>

where the node path locates the call in that type's call tree: `-` is the root node, `0.1` the
second node of the first stage under the root, `0.1.2.0` one level further, and so on. The
service checks that the node calls it, then:

  1. holds one of its `workers` slots for the whole call (a thread-pool service, as DeathStarBench's
     Thrift services: a worker waits while its downstream calls run);
  2. burns CPU: busy work until its thread has used X ms of CPU time, X ~ Exponential(mean cpu_ms),
     so a CFS quota stretches the wall time of the call exactly as it would a real service;
  3. makes the node's calls: stages one after another, the nodes of a stage in parallel, a node
     with `p` < 1 called only with probability p (the caller draws the cache miss);
  4. answers 200 with a JSON trace of the services visited (502 when a downstream call failed,
     503 when it could not get a worker slot within the timeout, 500 when its own work raised,
     e.g. the db's "database is locked").

Kinds: `cache` keeps a dict of recently read keys; `db` serves reads from a real SQLite file
(in the container's writable layer: real file IO) and writes one row in 10 % of the calls.

Every second the service writes its cumulative counters to <state-dir>/<service>.json (bytes and
HTTP messages in and out, calls served and failed): with host networking a container has no
network interface of its own, so these are the testbed's per-service network counters.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.v = {"rx_bytes": 0, "tx_bytes": 0, "rx_messages": 0, "tx_messages": 0, "served": 0, "failed": 0,
                  "calls": 0, "call_failures": 0, "busy_ms": 0.0, "db_reads": 0, "db_writes": 0}

    def add(self, **kw) -> None:
        with self.lock:
            for k, x in kw.items():
                self.v[k] += x

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.v)


def burn(ms: float) -> None:
    """Busy work until this thread has used `ms` of CPU time (not wall time: throttling and
    other threads holding the GIL do not count)."""
    end = time.thread_time() + ms / 1000.0
    x = 1
    while time.thread_time() < end:
        for i in range(200):
            x = (x * 1103515245 + 12345 + i) & 0x7FFFFFFF


def find_node(request: dict, path: str) -> dict | None:
    node = request
    if path in ("", "-"):
        return node
    parts = path.split(".")
    if len(parts) % 2:
        return None
    try:
        for s, i in zip(parts[0::2], parts[1::2]):
            node = node["stages"][int(s)][int(i)]
    except (IndexError, KeyError, ValueError):
        return None
    return node


class Service:
    def __init__(self, name: str, topology: dict, base_port: int, state_dir: str | None, seed: int | None):
        self.name = name
        self.topology = topology
        names = list(topology["services"])
        if name not in names:
            raise SystemExit(f"unknown service {name!r} (known: {', '.join(names)})")
        self.ports = {s: base_port + i for i, s in enumerate(names)}
        self.port = self.ports[name]
        spec = topology["services"][name]
        self.cpu_ms = float(spec["cpu_ms"])
        self.kind = spec.get("kind", "logic")
        self.timeout_s = float(topology.get("timeout_s", 5.0))
        self.slots = threading.BoundedSemaphore(int(spec.get("workers", 32)))
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="call")
        self.counters = Counters()
        self.state_dir = state_dir
        self.rng = random.Random(seed)
        self.local = threading.local()
        self.cache: dict[int, bytes] = {}
        self.db_path = None
        if self.kind == "db":
            self.db_path = os.path.join("/tmp" if os.path.isdir("/tmp") else ".", f"{name}.sqlite")
            con = sqlite3.connect(self.db_path)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("CREATE TABLE IF NOT EXISTS item (id INTEGER PRIMARY KEY, body BLOB)")
            if con.execute("SELECT COUNT(*) FROM item").fetchone()[0] == 0:
                con.executemany("INSERT INTO item VALUES (?, ?)", ((i, os.urandom(512)) for i in range(2000)))
            con.commit()
            con.close()

    # -- work ------------------------------------------------------------------------------------
    def own_work(self) -> None:
        ms = self.rng.expovariate(1.0 / self.cpu_ms)
        burn(ms)
        self.counters.add(busy_ms=ms)
        if self.kind == "cache":
            key = self.rng.randrange(10_000)
            if key not in self.cache:
                if len(self.cache) >= 5_000:
                    self.cache.pop(next(iter(self.cache)))
                self.cache[key] = b"x" * 256
        elif self.kind == "db":
            con = getattr(self.local, "db", None)
            if con is None:
                con = self.local.db = sqlite3.connect(self.db_path, timeout=self.timeout_s)
            key = self.rng.randrange(2000)
            con.execute("SELECT body FROM item WHERE id = ?", (key,)).fetchone()
            self.counters.add(db_reads=1)
            if self.rng.random() < 0.1:
                con.execute("UPDATE item SET body = ? WHERE id = ?", (os.urandom(512), key))
                con.commit()
                self.counters.add(db_writes=1)

    def call(self, rtype: str, path: str, service: str) -> tuple[bool, object]:
        """One downstream call on this thread's keep-alive connection to `service`."""
        conns = getattr(self.local, "conns", None)
        if conns is None:
            conns = self.local.conns = {}
        url = f"/r/{rtype}/{path}"
        for attempt in (0, 1):  # a kept-alive connection closed by the peer: one fresh retry
            conn = conns.get(service)
            try:
                if conn is None:
                    conn = conns[service] = http.client.HTTPConnection(HOST, self.ports[service],
                                                                       timeout=self.timeout_s)
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.request("GET", url)
                resp = conn.getresponse()
                body = resp.read()
                self.counters.add(calls=1, tx_messages=1, rx_messages=1, tx_bytes=len(url) + 40,
                                  rx_bytes=len(body) + 120)
                if resp.status != 200:
                    self.counters.add(call_failures=1)
                    return False, f"{service}: HTTP {resp.status}"
                return True, json.loads(body)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if conn is not None:
                    conn.close()
                conns.pop(service, None)
                if attempt == 1 or isinstance(exc, TimeoutError):
                    self.counters.add(calls=1, call_failures=1)
                    return False, f"{service}: {type(exc).__name__}"
        return False, f"{service}: unreachable"

    def handle(self, rtype: str, path: str) -> tuple[int, dict]:
        req = self.topology["requests"].get(rtype)
        node = None if req is None else find_node(req, path)
        if node is None or node.get("call") != self.name:
            return 404, {"error": f"no node {rtype}/{path} on service {self.name}"}
        if not self.slots.acquire(timeout=self.timeout_s):
            return 503, {"error": f"{self.name}: no free worker"}
        try:
            self.own_work()
            trace: list = [self.name]
            base = "" if path in ("", "-") else path + "."
            for s, stage in enumerate(node.get("stages") or []):
                chosen = [(i, child) for i, child in enumerate(stage)
                          if child.get("p", 1.0) >= 1.0 or self.rng.random() < child["p"]]
                if not chosen:
                    continue
                if len(chosen) == 1:
                    i, child = chosen[0]
                    results = [self.call(rtype, f"{base}{s}.{i}", child["call"])]
                else:
                    futures = [self.pool.submit(self.call, rtype, f"{base}{s}.{i}", child["call"]) for i, child in chosen]
                    results = [f.result() for f in futures]
                for ok, value in results:
                    if not ok:
                        return 502, {"error": value, "trace": trace}
                    trace.append(value.get("trace", []))
            return 200, {"trace": trace}
        finally:
            self.slots.release()

    # -- counters --------------------------------------------------------------------------------
    def write_state(self) -> None:
        if not self.state_dir:
            return
        path = os.path.join(self.state_dir, f"{self.name}.json")
        tmp = path + ".tmp"
        while True:
            try:
                with open(tmp, "w") as f:
                    json.dump(self.counters.snapshot() | {"t": time.time(), "pid": os.getpid()}, f)
                os.replace(tmp, path)
            except OSError:
                pass
            time.sleep(1.0 - time.time() % 1.0 + 0.01)


def make_handler(svc: Service):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive between services
        wbufsize = -1                  # headers and body leave in one write (flushed per request)

        def setup(self):
            super().setup()
            # no Nagle: with keep-alive, a small second segment would wait for a delayed ACK (40 ms)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            svc.counters.add(rx_messages=1, rx_bytes=len(self.requestline) + sum(len(k) + len(v) + 4 for k, v in
                                                                                   self.headers.items()))
            parts = self.path.split("?", 1)[0].split("/")
            if self.path == "/health":
                code, body = 200, {"service": svc.name, "kind": svc.kind}
            elif len(parts) == 4 and parts[1] == "r":
                try:
                    code, body = svc.handle(parts[2], parts[3])
                except Exception as exc:  # noqa: BLE001 - e.g. the db's "database is locked"
                    # an answer, not a dropped connection: the caller would take that for a stale
                    # keep-alive and send the whole call again, and the failure went uncounted
                    code, body = 500, {"error": f"{svc.name}: {type(exc).__name__}: {exc}"[:300]}
            else:
                code, body = 404, {"error": f"unknown path {self.path}"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            svc.counters.add(tx_messages=1, tx_bytes=len(data) + 100, served=1, failed=int(code != 200))

        def log_message(self, *args):  # no per-request log lines
            pass

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--service", required=True)
    ap.add_argument("--topology", required=True, help="the topology as JSON (written by the host)")
    ap.add_argument("--base-port", type=int, required=True)
    ap.add_argument("--state-dir", default=None, help="write <service>.json counters here every second")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args(argv)
    with open(a.topology) as f:
        topology = json.load(f)
    svc = Service(a.service, topology, a.base_port, a.state_dir, a.seed)
    server = Server((HOST, svc.port), make_handler(svc))
    threading.Thread(target=svc.write_state, daemon=True, name="state").start()
    print(f"{svc.name} ({svc.kind}) listening on {HOST}:{svc.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
