"""Request handling of the Policy Evaluation Service against a real uvicorn: what no route should
read (a JSON body nested past any request's depth, an object with a key twice), the placement
route's exact optimum stopped by its time limit, and the bounds on a request's headers. Each test
once failed: a deep body was an unnamed 400 ("There was an error parsing the body"), a key given
twice was read last-wins (`{"app0": 1, "app0": 2}` planned 2 containers), a timed-out optimum was
a text/plain 500, and a client trickling its headers held a connection open for ever."""
import json
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from agents.deferrable_jobs.policy import shipped_policy
from agents.factory import make_agent
from samm.localproc import AppInThread
from samm.plan.registry import PolicyRegistry
from samm.plan.service import create_app
from sim_bridge.config import SimConfig

sys.path.insert(0, str(Path(__file__).parent))
from test_lra_service import policy as lra_policy  # noqa: E402 - the placement tests' small policy

TOKEN = "gaps-token"
SHIPPED = make_agent("lstm-ppo", SimConfig())
OBS = {n: 0.2 for n in SHIPPED.feature_names}
JSON = {"content-type": "application/json"}
PLAN = "/v1/agents/lra/plan"


@pytest.fixture(scope="module")
def service():
    reg = PolicyRegistry()
    reg.host("lstm-ppo", SHIPPED)
    reg.host("osdec", shipped_policy())
    reg.host("lra", lra_policy())
    with AppInThread(create_app(reg, token=TOKEN)) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client


def post(client, path: str, body: str, **headers):
    return client.post(path, content=body.encode(), headers={**JSON, **headers})


def assert_named(r, status: int, *words: str):
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.headers
    detail = r.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and all(w in detail for w in words), detail


# -- gap 1: a deeply nested body ------------------------------------------------------------------
@pytest.mark.parametrize("depth", [100_000, 990, 65])
@pytest.mark.parametrize("path", ["/v1/agents/lstm-ppo/decide", "/v1/agents/osdec/decide",
                                  "/v1/agents/osdec/schedule", PLAN])
def test_a_deeply_nested_body_is_a_422_naming_the_nesting(service, path, depth):
    """Python's parser gives up near 1,000 levels with a RecursionError: FastAPI answered it "There
    was an error parsing the body" (400), /schedule "recursion limit exceeded" (422), and a body
    just under Python's limit reached the routes' validation."""
    nested = "[" * depth + "]" * depth
    r = post(service, path, '{"session_id": "s", "observation": %s}' % nested)
    assert_named(r, 422, "nested too deeply", "64 levels")


def test_the_service_still_answers_after_deep_bodies_and_reads_shallow_ones(service):
    r = post(service, "/v1/agents/lstm-ppo/decide", json.dumps({"session_id": "s", "observation": OBS}))
    assert r.status_code == 200, r.text
    # a string full of brackets is not nesting
    r = post(service, "/v1/agents/lstm-ppo/decide", json.dumps({"session_id": "s", "observation": {"[" * 200: 1}}))
    assert_named(r, 422, "unknown")


@pytest.mark.parametrize("path, body, words", [
    ("/v1/agents/lstm-ppo/decide", b'{"session_id": "s", "observation": {"cpu_mean": 1' + b"0" * 5000 + b"}}",
     ("not readable as JSON", "4300 digits")),
    (PLAN, b'{"nodes": ["a"], "batch": {"app0": 1}, "seed": 1' + b"0" * 5000 + b"}", ("4300 digits",)),
    ("/v1/agents/lstm-ppo/decide", b'{"session_id": "\xff", "observation": {}}', ("not UTF-8", "\\xff")),
])
def test_a_body_python_will_not_read_is_a_422_naming_why(service, path, body, words):
    """A number past Python's 4,300 digits, or bytes that are not UTF-8: FastAPI's unnamed 400
    "There was an error parsing the body"."""
    assert_named(service.post(path, content=body, headers=JSON), 422, *words)


# -- gap 3: a key given twice ---------------------------------------------------------------------
def test_a_batch_with_an_app_twice_is_refused_not_read_last_wins(service):
    """`{"app0": 1, "app0": 2}` planned 2 containers of app0: which one the caller meant is unknown."""
    body = '{"nodes": ["a", "b"], "batch": {"app0": 1, "app0": 2}, "planner": "greedy"}'
    assert_named(post(service, PLAN, body), 422, "'app0'", "twice")
    r = post(service, PLAN, '{"nodes": ["a", "b"], "batch": {"app0": 2}, "planner": "greedy"}')
    assert r.status_code == 200 and sum(row["count"] for row in r.json()["placement"]) == 2, r.text


@pytest.mark.parametrize("path, body", [
    ("/v1/agents/lstm-ppo/decide", '{"session_id": "a", "session_id": "b", "observation": %s}' % json.dumps(OBS)),
    ("/v1/agents/lstm-ppo/decide", '{"session_id": "a", "observation": {"cpu_mean": 0.1, "cpu_mean": 0.9}}'),
    ("/v1/agents/osdec/schedule", '{"slot": 1, "slot": 2, "capacity": 4, "eligible": []}'),
    ("/v1/agents/lra/sessions/s1/reset", '{"x": 1, "x": 2}'),
])
def test_every_route_refuses_a_key_given_twice(service, path, body):
    assert_named(post(service, path, body), 422, "appears twice")


def test_an_upload_with_a_file_twice_is_refused_after_the_token(service):
    body = '{"files": {"metadata.json": "e30=", "metadata.json": "e30="}}'
    assert post(service, "/v1/agents/lstm-ppo/policy", body).status_code == 401   # anonymous: nothing more
    r = post(service, "/v1/agents/lstm-ppo/policy", body, authorization=f"Bearer {TOKEN}")
    assert_named(r, 422, "'metadata.json'", "twice")


def test_a_chunked_body_is_still_bounded_and_read_whole(tmp_path):
    """The body is now read before the route: the limit still cuts a chunked one, with its 413."""
    import http.client

    reg = PolicyRegistry()
    reg.host("lstm-ppo", SHIPPED)
    with AppInThread(create_app(reg, max_body_bytes=4096)) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/agents/lstm-ppo/decide", body=(b" " * 2000 for _ in range(5)),
                     headers={**JSON, "transfer-encoding": "chunked"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and "4,096" in json.loads(resp.read())["detail"]
        conn.close()
        good = json.dumps({"session_id": "s", "observation": OBS}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/v1/agents/lstm-ppo/decide", body=(good[i:i + 50] for i in range(0, len(good), 50)),
                     headers={**JSON, "transfer-encoding": "chunked"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        conn.close()


# -- gap 2: /plan's optimum stopped by its time limit ---------------------------------------------
def test_an_optimum_stopped_by_its_time_limit_is_a_504_and_frees_the_worker(service, monkeypatch):
    """HiGHS stopped by the limit before it found a plan raised TimeoutError out of the route: a
    text/plain "Internal Server Error" with nothing a caller could act on."""
    from agents.lra_placement import service as plan_service

    monkeypatch.setattr(plan_service, "OPTIMUM_TIME_LIMIT_S", 1e-6)  # the 120-s limit, made reachable
    body = {"nodes": [f"n{i}" for i in range(20)], "batch": {f"app{i}": 10 for i in range(7)}, "planner": "optimum"}
    started = time.monotonic()
    r = service.post(PLAN, json=body)
    assert_named(r, 504, "planner: optimum", "time limit", "greedy-ls")
    assert time.monotonic() - started < 30
    # nothing is left running: the next requests are answered at once
    started = time.monotonic()
    assert service.post(PLAN, json={**body, "planner": "greedy"}).status_code == 200
    assert service.get("/healthz").status_code == 200
    assert time.monotonic() - started < 10
    monkeypatch.setattr(plan_service, "OPTIMUM_TIME_LIMIT_S", None)   # the optimum's own 120 s
    r = service.post(PLAN, json=body)
    assert r.status_code == 200 and r.json()["planner"] == "optimum", r.text


def test_openapi_documents_the_plans_504(service):
    spec = service.get("/openapi.json").json()
    responses = spec["paths"][PLAN]["post"]["responses"]
    assert responses["504"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Problem"}
    assert "time limit" in responses["504"]["description"]


# -- gap 4: a request's headers are bounded in time and size --------------------------------------
@pytest.fixture(scope="module")
def bounded():
    """The service on uvicorn configured by `server_config` (1-s header deadline, 8 KB of headers)."""
    import threading

    import uvicorn

    from samm.plan.service import server_config

    reg = PolicyRegistry()
    reg.host("lstm-ppo", SHIPPED)
    srv = AppInThread(create_app(reg, max_body_bytes=2**20))
    srv.server = uvicorn.Server(server_config(srv.server.config.app, "127.0.0.1", srv.port, header_timeout_s=1.0,
                                              max_header_bytes=8192, log_level="warning", access_log=False))
    srv.thread = threading.Thread(target=srv.server.run, daemon=True)
    with srv:
        yield srv.port


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def answer_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def assert_an_idle_connection_gets_408(port: int) -> None:
    """A connection that sends nothing is answered 408 once the 1-s header timeout passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as idle:
        started = time.monotonic()
        status, body = answer_of(read_all(idle))
        assert status == 408 and "not complete within 1 s" in body["detail"], body
        assert time.monotonic() - started < 5


def test_a_connection_that_never_sends_its_headers_is_closed_with_a_408(bounded):
    """uvicorn's httptools protocol arms no timer before a request's headers: an idle connection
    (or one trickling a header byte at a time, slowloris) was held open for ever."""
    assert_an_idle_connection_gets_408(bounded)
    with socket.create_connection(("127.0.0.1", bounded), timeout=15) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(40):
                slow.sendall(b"X-a: b\r\n")
                time.sleep(0.1)
        except OSError:   # closed under the trickle
            pass
        raw = read_all(slow)
        assert answer_of(raw)[0] == 408, raw[:200]
        assert time.monotonic() - started < 5


def test_headers_over_the_limit_are_a_431_not_held_in_memory(bounded):
    """httptools takes headers of any size: 200 MB of them were held and the request answered."""
    with socket.create_connection(("127.0.0.1", bounded), timeout=15) as big:
        # 12 KB of headers, never ended: refused once read (a sender going on would be reset)
        big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 4096)
                                                                      for i in range(3)))
        status, body = answer_of(read_all(big))
        assert status == 431 and "8,192 bytes" in body["detail"], body


def test_bounded_headers_leave_ordinary_requests_alone(bounded):
    """Keep-alive requests, a body larger than the header limit and a slow body (the body is the
    body limit's, not the header deadline's) are answered as before."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", bounded, timeout=30)
    for _ in range(3):   # one connection, several requests, past the header deadline in all
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() and conn.sock is not None
        time.sleep(0.4)
    body = json.dumps({"session_id": "s", "observation": OBS, "deterministic": True}).encode()
    padded = body[:-1] + b"," + b" " * 20_000 + b'"deterministic": true}'
    conn.request("POST", "/v1/agents/lstm-ppo/decide", body=padded, headers=JSON)
    r = conn.getresponse()
    assert r.status == 422 and b"appears twice" in r.read()   # read whole, past 8 KB, then refused by name

    def slowly():
        for i in range(0, len(body), 40):
            time.sleep(0.1)
            yield body[i:i + 40]
    conn.request("POST", "/v1/agents/lstm-ppo/decide", body=slowly(), headers={**JSON, "transfer-encoding": "chunked"},
                 encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 200, r.read()
    conn.close()


def test_a_trickled_body_is_cut_at_the_body_deadline():
    """The body was bounded in size, not in time: a client sending one byte a second (or none
    after its headers) held its connection and request for ever."""
    reg = PolicyRegistry()
    reg.host("lstm-ppo", SHIPPED)
    import select

    with AppInThread(create_app(reg, body_timeout_s=2.0)) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=15) as slow:
            started = time.monotonic()
            slow.sendall(b"POST /v1/agents/lstm-ppo/decide HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                         b"content-length: 400\r\n\r\n{")
            for _ in range(3):
                time.sleep(0.4)
                if select.select([slow], [], [], 0)[0]:   # answered already: a loaded machine slept past the deadline
                    break                                  # (writing to the closed connection would reset it)
                slow.sendall(b" ")
            raw = read_all(slow)   # answered, and the connection closed
            status, body = answer_of(raw)
            assert status == 408 and "not complete within 2 s" in body["detail"], raw[:300]
            assert time.monotonic() - started < 6
        with httpx.Client(base_url=srv.url, timeout=30) as client:   # the others are served as before
            r = client.post("/v1/agents/lstm-ppo/decide", json={"session_id": "s", "observation": OBS})
            assert r.status_code == 200, r.text
            spec = client.get("/openapi.json").json()
            assert "408" in spec["paths"]["/v1/agents/{agent}/decide"]["post"]["responses"]


# -- /plan's work no longer starves the service's other routes ------------------------------------
def test_a_crowd_of_plans_leaves_healthz_a_thread():
    """/plan ran in the thread pool every synchronous route shares (40 threads): 50 greedy-ls plans
    held /healthz for 17 s here (and an optimum holds its thread up to 120 s), long enough for a
    liveness probe to restart a service that was only busy."""
    import threading

    reg = PolicyRegistry()
    reg.host("lra", lra_policy())
    body = {"nodes": [f"n{i}" for i in range(150)], "batch": {f"app{i}": 150 for i in range(7)}, "planner": "greedy-ls"}
    statuses: list[int] = []
    with AppInThread(create_app(reg)) as srv:
        def plan_once():
            with httpx.Client(base_url=srv.url, timeout=300) as client:
                statuses.append(client.post(PLAN, json=body).status_code)

        started = time.monotonic()
        plan_once()
        one_plan = time.monotonic() - started
        crowd = [threading.Thread(target=plan_once) for _ in range(45)]
        for t in crowd:
            t.start()
        time.sleep(1.0)  # every plan has arrived
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            started = time.monotonic()
            assert client.get("/healthz").status_code == 200
            healthz = time.monotonic() - started
        for t in crowd:
            t.join()
    assert statuses == [200] * 46
    # before, /healthz waited for a thread until some of the 40 plans sharing the CPU were through (~11 plans' time)
    assert healthz < 3 * one_plan, (healthz, one_plan)   # now: a few hundredths of a second


def test_samm_serve_bounds_headers_with_its_options():
    """The CLI's server is the bounded one: an idle connection gets its 408 after
    --header-timeout, a head over --max-header-kb a 431, and ordinary requests are answered."""
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "samm.cli.main", "serve", "--agent", "threshold", "--port", str(port),
                             "--header-timeout", "1", "--max-header-kb", "8"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("samm serve did not come up: " + proc.stderr.read().decode()[-2000:])
            time.sleep(0.2)
        assert_an_idle_connection_gets_408(port)
        with socket.create_connection(("127.0.0.1", port), timeout=15) as big:
            big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 12_000 + b"\r\n")
            status, body = answer_of(read_all(big))
            assert status == 431 and "8,192 bytes" in body["detail"], body
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_samm_serve_refuses_bad_header_and_body_limits():
    from click.testing import CliRunner

    from samm.cli.main import cli

    for args, name in ((["--header-timeout", "0"], "--header-timeout"), (["--header-timeout", "nan"], "--header-timeout"),
                       (["--max-header-kb", "0"], "--max-header-kb"), (["--body-timeout", "-1"], "--body-timeout"),
                       (["--body-timeout", "nan"], "--body-timeout")):
        res = CliRunner().invoke(cli, ["serve", "--port", "8", *args])  # a refusal before binding: never serves
        assert res.exit_code == 2 and name in res.output, (args, res.output)
