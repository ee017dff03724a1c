"""A loopback HTTP proxy in front of moto's server that makes chosen AWS API actions fail.

The testbed's daemon can run as its own process (so it can be killed -9), where botocore event
hooks cannot reach its client. This proxy sits between that process's boto3 and moto instead:
`fail_next("SetDesiredCapacity", 2)` answers the next two such requests with `Throttling`
(HTTP 400) as AWS does under a rate limit, then forwards again. The daemon's real botocore
parses the error and retries in standard mode, exactly as against AWS. Everything else is
forwarded unchanged, so the daemon's executor is the production code path.
"""
from __future__ import annotations

import http.client
import logging
import threading
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

# Query-protocol APIs put the version in the form; the error document differs per service.
_EC2_VERSION = "2016-11-15"
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


def error_document(code: str, message: str, ec2: bool = False) -> bytes:
    rid = uuid.uuid4()
    if ec2:
        return (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
                f"<RequestID>{rid}</RequestID></Response>").encode()
    return (f'<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error><RequestId>{rid}</RequestId>"
            f"</ErrorResponse>").encode()


class AwsFaultProxy:
    """Forwards to `upstream` (moto's endpoint URL); `fail_next` queues failures per action.
    `counts[action]` holds {"failed": n, "forwarded": m} for every action seen."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0):
        up = urlsplit(upstream)
        self._up_host, self._up_port = up.hostname or "127.0.0.1", up.port or 80
        self._lock = threading.Lock()
        self._pending: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: {"failed": 0, "forwarded": 0})
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, action: str, times: int, status: int = 400, code: str = "Throttling") -> None:
        """The next `times` requests for `action` get `status`/`code` instead of moto's answer."""
        with self._lock:
            self._pending[action].extend([(status, code)] * times)

    def pending(self, action: str) -> int:
        with self._lock:
            return len(self._pending[action])

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {a: dict(c) for a, c in self.counts.items()}

    def _decide(self, action: str) -> tuple[int, str] | None:
        with self._lock:
            queue = self._pending.get(action)
            fault = queue.pop(0) if queue else None
            self.counts[action]["failed" if fault else "forwarded"] += 1
            return fault

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        conn = http.client.HTTPConnection(self._up_host, self._up_port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                length = (self.headers.get("Content-Length") or "0").strip()
                if not length.isdigit():
                    # int() of garbage was a traceback on the testbed's stderr and no answer; a
                    # negative length read until the client hung up
                    self._reply(400, [("Content-Type", "text/plain")], f"bad Content-Length {length!r}".encode())
                    return
                body = self.rfile.read(int(length))
                form = parse_qs(body.decode("utf-8", "replace")) if body else {}
                form.update(parse_qs(urlsplit(self.path).query))
                action = (form.get("Action") or ["?"])[0]
                fault = proxy._decide(action)
                if fault is not None:
                    status, code = fault
                    doc = error_document(code, "Rate exceeded (injected by the testbed)",
                                         ec2=(form.get("Version") or [""])[0] == _EC2_VERSION)
                    log.info("aws proxy: %s answered %d %s", action, status, code)
                    self._reply(status, [("Content-Type", "text/xml")], doc)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                try:
                    status, out_headers, out = proxy._forward(self.command, self.path, headers, body)
                except (OSError, http.client.HTTPException) as exc:  # refused, or cut mid-answer (moto restarting)
                    self._reply(502, [("Content-Type", "text/plain")], f"upstream: {exc}".encode())
                    return
                self._reply(status, [(k, v) for k, v in out_headers
                                     if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"], out)

            def _reply(self, status, headers, body: bytes):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args):  # one line per request is noise
                pass

        return Handler

    def start(self) -> "AwsFaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="aws-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "AwsFaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
