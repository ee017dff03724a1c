"""Round trip of one bridge-sized frame exchange, loopback TCP against a Unix-domain socket.

A server process answers each 11-byte request with an 11,720-byte reply (8 envs' records plus
the 8-byte header, the step channel's sizes); the client times N round trips after a warm-up.
It measures what switching the step channel to a Unix socket could save, without the JVM.

    .venv/bin/python benchmarks/loopback_roundtrip.py [--trips 20000] [--repeats 2] [--json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import tempfile
import time

REQUEST = b"y" * 11
REPLY = b"x" * (8 + 11_712)


def _serve(kind: str, path: str, ready) -> None:
    if kind == "tcp":
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        ready.put(srv.getsockname()[1])
    else:
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        ready.put(path)
    srv.listen(1)
    conn, _ = srv.accept()
    if kind == "tcp":
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64)
    while conn.recv_into(buf):
        conn.sendall(REPLY)


def round_trip_us(kind: str, trips: int, warmup: int = 2000) -> float:
    ready = mp.Queue()
    path = os.path.join(tempfile.mkdtemp(), "s")
    server = mp.Process(target=_serve, args=(kind, path, ready), daemon=True)
    server.start()
    where = ready.get(timeout=10)
    if kind == "tcp":
        c = socket.create_connection(("127.0.0.1", where))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        c = socket.socket(socket.AF_UNIX)
        c.connect(where)
    view = memoryview(bytearray(1 << 16))

    def once() -> None:
        c.sendall(REQUEST)
        got = 0
        while got < len(REPLY):
            got += c.recv_into(view[got:])

    for _ in range(warmup):
        once()
    t0 = time.perf_counter()
    for _ in range(trips):
        once()
    elapsed = time.perf_counter() - t0
    c.close()
    server.join(timeout=10)
    return elapsed / trips * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trips", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.trips < 1 or args.repeats < 1:  # a mean over no trips, or no rows at all
        ap.error("--trips and --repeats must be at least 1")
    runs = {"tcp": [], "unix": []}
    for _ in range(args.repeats):  # interleaved, so drift hits both alike
        for kind in runs:
            runs[kind].append(round(round_trip_us(kind, args.trips), 2))
    result = {"trips": args.trips, "round_trip_us": runs, "cpus": os.cpu_count()}
    print(json.dumps(result) if args.json else
          "\n".join(f"{k:5s} {', '.join(f'{x:.1f}' for x in v)} µs per round trip" for k, v in runs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
