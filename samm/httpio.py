"""HTTP answers read with a bound on their whole body, and error pages as one line: shared by
the Monitor's Graphite client and the Plan stage's service client, which both must not let a
server or proxy hold a loop iteration."""
from __future__ import annotations

import time

import requests
import urllib3


def one_line_page(body: bytes, limit: int = 300) -> str:
    """The start of an error page as one line: a proxy's HTML page spans many, and a reason
    (the log, the knowledge store's record) must stay one line."""
    return " ".join(body.decode("utf-8", "replace").split())[:limit]


def fetch_bounded(send, url: str, timeout_s: float, **kwargs) -> tuple[int, bytes, str]:
    """(status, body, URL sent) of `send(url, ...)` (a requests verb): its headers within
    `timeout_s` (requests' timeout), then its whole body within `timeout_s` more. requests'
    timeout bounds each socket read only, so a server or proxy that trickles its answer a byte
    at a time would hold the loop for hours. Raises `requests.RequestException`."""
    with send(url, timeout=timeout_s, stream=True, **kwargs) as r:
        # counted from the headers: a large answer that graphite-web took a while to compute
        # still has its own `timeout_s` to arrive
        deadline = time.monotonic() + timeout_s
        # read1 returns what has arrived (urllib3 2); a sized read would wait for the whole size
        read = getattr(r.raw, "read1", None) or r.raw.read
        chunks, size = [], 0
        while True:
            try:
                chunk = read(64 * 1024, decode_content=True)  # a proxy may gzip it
            except (urllib3.exceptions.HTTPError, OSError) as exc:  # what requests' own reads wrap
                raise requests.ConnectionError(f"reading the answer failed after {size} bytes: {exc}") from exc
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if time.monotonic() > deadline:
                raise requests.Timeout(f"the answer's body did not arrive within {timeout_s:g} s of its headers "
                                       f"({size} bytes so far, still arriving)")
        return r.status_code, b"".join(chunks), r.url
