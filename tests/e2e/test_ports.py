"""The port proxy (docs/network.md#ports): a service listening inside a
sandbox is reached at /v1/sandboxes/{id}/ports/{port}/… — plain files from
`python3 -m http.server`, methods, paths, queries, headers and bodies both
ways, streaming, WebSocket, auth, every limit at its edge, the failures a
service can cause, and isolation between sandboxes, from the host and
across a fork."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import start_server, stop_and_assert_clean
from helpers import ForkboxServer, assert_json_error, create_raw, delete_raw, exec_raw, free_port
from port_service import SERVICE, ports, run_bash, start_service, wait_listening  # noqa: F401

KEY = "ports-test-key"
RESPONSE_TIMEOUT_S = 1.5
CONNECT_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8

@pytest.fixture
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


@pytest.fixture(scope="module")
def keyed(say, server):
    """A server with an API key and small proxy limits."""
    srv = start_server(say, "ports", ["--port-response-timeout-ms", str(int(RESPONSE_TIMEOUT_S * 1000)),
                                      "--port-connect-timeout-ms", str(int(CONNECT_TIMEOUT_S * 1000)),
                                      "--max-port-connections", str(MAX_CONNECTIONS)],
                       api_keys=[KEY], build=False)
    # The leak checks at the end talk to it through `http()`: with the key.
    srv.http = lambda api_key=KEY, timeout=60.0: ForkboxServer.http(srv, api_key, timeout)
    yield srv
    stop_and_assert_clean(srv)


@pytest.fixture(scope="module")
def keyed_http(keyed):
    with keyed.http(api_key=KEY) as c:
        yield c


@pytest.fixture
def keyed_sid(keyed_http):
    s = create_raw(keyed_http)
    start_service(keyed_http, s, 8000)
    yield s
    delete_raw(keyed_http, s)


def test_http_server_serves_files_written_in_the_sandbox(http, sid):
    run_bash(http, sid, "mkdir -p /root/site/sub && echo 'hello from the sandbox' > /root/site/hello.txt && "
                        "nohup setsid python3 -m http.server 8000 --directory /root/site >/tmp/http.log 2>&1 </dev/null &")
    wait_listening(http, sid, 8000)
    r = http.get(ports(sid, 8000, "/hello.txt"))
    assert r.status_code == 200, r.text
    assert r.content == b"hello from the sandbox\n"
    assert r.headers["content-length"] == "23"
    # The directory listing, with and without the trailing slash.
    for path in ("/", ""):
        r = http.get(ports(sid, 8000, path))
        assert r.status_code == 200 and 'href="hello.txt"' in r.text, r.text
    # http.server redirects /sub to /sub/: the redirect points back through the proxy.
    r = http.get(ports(sid, 8000, "/sub"))
    assert r.status_code == 301, r.text
    assert r.headers["location"] == ports(sid, 8000, "/sub/")
    r = http.get(ports(sid, 8000, "/missing"))
    assert r.status_code == 404  # the service's own 404, passed through


def test_methods_paths_queries_headers_and_bodies(http, sid):
    start_service(http, sid, 8001)
    r = http.post(ports(sid, 8001, "/a/b%20c?x=1&y=%2F&z"), content=b"posted \x00 bytes",
                  headers={"X-App": "kept", "Connection": "keep-alive, X-Hop", "X-Hop": "dropped", "Cookie": "c=1"})
    assert r.status_code == 200, r.text
    assert r.headers["x-service"] == "echo"
    e = r.json()
    assert e["method"] == "POST"
    assert e["path"] == "/a/b%20c?x=1&y=%2F&z"
    assert e["body"] == "posted \x00 bytes"
    h = e["headers"]
    assert h["x-app"] == "kept" and h["cookie"] == "c=1"
    assert "x-hop" not in h
    assert h["host"] == "127.0.0.1:8001"
    assert h["x-forwarded-for"] == "127.0.0.1"
    assert h["x-forwarded-proto"] == "http"
    assert h["x-forwarded-host"] == http.base_url.netloc.decode()
    assert h["x-forwarded-prefix"] == ports(sid, 8001)
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        r = http.request(method, ports(sid, 8001, "/m"), content=method.encode())
        assert r.status_code == 200 and r.json()["method"] == method and r.json()["body"] == method, r.text
    # Statuses, HEAD and redirects come back as the service sent them.
    assert http.post(ports(sid, 8001, "/created")).status_code == 201
    r = http.head(ports(sid, 8001, "/x"))
    assert r.status_code == 200 and r.headers["content-length"] == "1234" and r.content == b""
    r = http.get(ports(sid, 8001, "/redirect"))
    assert r.status_code == 302 and r.headers["location"] == ports(sid, 8001, "/echo?from=redirect")
    # A streamed (chunked) upload of 8 MiB arrives whole.
    big = bytes(range(256)) * (32 * 1024)
    r = http.post(ports(sid, 8001, "/up"), content=big, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and len(r.json()["body"]) == len(big)


def test_the_api_key_is_required_and_never_reaches_the_service(keyed, keyed_http, keyed_sid):
    with httpx.Client(base_url=keyed.url) as anonymous:
        assert_json_error(anonymous.get(ports(keyed_sid, 8000, "/echo")), 401)
    with keyed.http(api_key="wrong") as wrong:
        assert_json_error(wrong.get(ports(keyed_sid, 8000, "/echo")), 401)
    r = keyed_http.get(ports(keyed_sid, 8000, "/echo"))
    assert r.status_code == 200, r.text
    assert "authorization" not in r.json()["headers"]
    assert KEY not in r.text


def test_streaming_responses_arrive_as_they_are_produced(http, sid):
    start_service(http, sid, 8002)
    t0 = time.monotonic()
    arrivals = []
    with http.stream("GET", ports(sid, 8002, "/stream")) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            arrivals.append((time.monotonic() - t0, chunk))
    text = b"".join(c for _, c in arrivals).decode()
    assert text.count("chunk ") == 5, text
    # Five chunks 0.5 s apart: the first is here long before the last is made.
    assert arrivals[0][0] < 1.0, arrivals
    assert arrivals[-1][0] > 2.0, arrivals
    assert len(arrivals) >= 4, arrivals


def test_websocket_echo(http, server, sid):
    start_service(http, sid, 8003)
    url = server.url.replace("http://", "ws://") + ports(sid, 8003, "/ws")
    with ws_connect(url, open_timeout=10) as ws:
        for msg in ["hello", "é" * 1000, "x" * 70000]:
            ws.send(msg)
            assert ws.recv(timeout=10) == msg
        ws.send(b"\x00\x01binary")
        assert ws.recv(timeout=10) == b"\x00\x01binary"
        ws.ping()
    # The connection is released: plain requests still work.
    assert http.get(ports(sid, 8003, "/echo")).status_code == 200


def test_destroying_the_sandbox_ends_its_tunnels(http, server):
    sid = create_raw(http)
    start_service(http, sid, 8003)
    url = server.url.replace("http://", "ws://") + ports(sid, 8003, "/ws")
    with ws_connect(url, open_timeout=10) as ws:
        ws.send("before")
        assert ws.recv(timeout=10) == "before"
        assert delete_raw(http, sid) == 204
        t0 = time.monotonic()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
        assert time.monotonic() - t0 < 5
    assert http.get("/v1/healthz").status_code == 200


def test_websocket_with_an_api_key(keyed, keyed_sid):
    url = keyed.url.replace("http://", "ws://") + ports(keyed_sid, 8000, "/ws")
    with pytest.raises(Exception, match="401"):
        with ws_connect(url, open_timeout=10):
            pass
    with ws_connect(url, open_timeout=10, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        ws.send("through the key")
        assert ws.recv(timeout=10) == "through the key"


def test_request_errors(http, sid):
    r = http.get(ports(sid, 8004, "/"))
    body = assert_json_error(r, 502)
    assert body["error"] == f"nothing listens on port 8004 in sandbox {sid}"
    for bad in ("0", "65536", "-1", "http", "80.5"):
        assert_json_error(http.get(ports(sid, bad, "/")), 400)
    assert_json_error(http.get(ports("sb-doesnotexist234567", 8000, "/")), 404)
    assert_json_error(http.get(ports("bad id!", 8000, "/")), 400)


def test_a_service_bound_to_ipv6_loopback_is_reached(http, sid):
    start_service(http, sid, 8005, host="::1")
    r = http.get(ports(sid, 8005, "/echo"))
    assert r.status_code == 200, r.text
    assert r.json()["headers"]["host"] == "[::1]:8005"


def test_a_misbehaving_service_never_hurts_the_server(keyed, keyed_http, keyed_sid):
    c = keyed_http
    # Never answers: 504 once the response timeout has passed.
    t0 = time.monotonic()
    body = assert_json_error(c.get(ports(keyed_sid, 8000, "/hang")), 504)
    took = time.monotonic() - t0
    assert RESPONSE_TIMEOUT_S <= took < RESPONSE_TIMEOUT_S + 2, took
    assert "no response headers" in body["error"]
    # Closes mid-response: the client sees the body cut short.
    with pytest.raises(httpx.RemoteProtocolError):
        c.get(ports(keyed_sid, 8000, "/cut"))
    # Garbage, or nothing at all: 502.
    assert "invalid HTTP response" in assert_json_error(c.get(ports(keyed_sid, 8000, "/garbage")), 502)["error"]
    assert "without answering" in assert_json_error(c.get(ports(keyed_sid, 8000, "/close")), 502)["error"]
    # And everything still works.
    assert c.get(ports(keyed_sid, 8000, "/echo")).status_code == 200
    assert c.get("/v1/healthz").status_code == 200
    assert c.get(f"/v1/sandboxes/{keyed_sid}").status_code == 200


def test_connect_timeout(keyed_http, keyed_sid):
    # A listener whose accept queue is full: the kernel drops further SYNs,
    # so a connect hangs until the proxy's connect timeout.
    code = ("import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 8009)); s.listen(0)\n"
            "fill = []\nfor i in range(3):\n    c = socket.socket(); c.setblocking(False); c.connect_ex(('127.0.0.1', 8009)); fill.append(c)\n"
            "open('/tmp/full.ready', 'w').close()\ntime.sleep(3600)\n")
    keyed_http.put(f"/v1/sandboxes/{keyed_sid}/files", params={"path": "/root/full.py"}, content=code.encode())
    run_bash(keyed_http, keyed_sid, "nohup setsid python3 /root/full.py >/tmp/full.log 2>&1 </dev/null & "
                                    "for i in $(seq 200); do [ -e /tmp/full.ready ] && break; sleep 0.025; done; [ -e /tmp/full.ready ]")
    time.sleep(0.3)
    t0 = time.monotonic()
    body = assert_json_error(keyed_http.get(ports(keyed_sid, 8009, "/")), 504)
    took = time.monotonic() - t0
    assert CONNECT_TIMEOUT_S <= took < CONNECT_TIMEOUT_S + 2, took
    assert "timed out" in body["error"]


def test_open_connections_are_capped_per_sandbox(keyed, keyed_http, keyed_sid):
    # MAX_CONNECTIONS requests that the service never answers hold every slot…
    socks = []
    for _ in range(MAX_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", keyed.port))
        s.sendall(f"GET {ports(keyed_sid, 8000, '/hang')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        socks.append(s)
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        r = keyed_http.get(ports(keyed_sid, 8000, "/echo"))
        assert "proxied connections" in assert_json_error(r, 429)["error"]
        assert time.monotonic() - t0 < RESPONSE_TIMEOUT_S
        # …and another sandbox is not affected.
        other = create_raw(keyed_http)
        try:
            assert_json_error(keyed_http.get(ports(other, 8000, "/")), 502)
        finally:
            delete_raw(keyed_http, other)
        # When they time out (504), their slots come back.
        for s in socks:
            s.settimeout(RESPONSE_TIMEOUT_S + 5)
            assert s.recv(100).startswith(b"HTTP/1.1 504"), "no 504"
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 5
    while True:
        r = keyed_http.get(ports(keyed_sid, 8000, "/echo"))
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text


def test_each_sandbox_reaches_only_its_own_ports(http, make_sandbox):
    a, b = create_raw(http), create_raw(http)
    try:
        for s in (a, b):
            start_service(http, s, 8006)
        ra, rb = http.get(ports(a, 8006, "/who")).json(), http.get(ports(b, 8006, "/who")).json()
        assert ra["hostname"] == a and rb["hostname"] == b
        # A port bound on the host's loopback is not the sandbox's.
        host_port = free_port()
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", host_port))
            listener.listen(8)
            assert_json_error(http.get(ports(a, host_port, "/")), 502)
        # Nor is the forkbox server's own port.
        port = int(http.base_url.port)
        assert_json_error(http.get(ports(a, port, "/v1/healthz")), 502)
    finally:
        delete_raw(http, a)
        delete_raw(http, b)


def test_a_fork_child_has_its_own_ports(http, sid):
    run_bash(http, sid, "echo parent > /root/token")
    start_service(http, sid, 8007)
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
    assert r.status_code == 200, r.text
    child = r.json()["children"][0]
    try:
        # Processes are not carried into a child: nothing listens there.
        assert_json_error(http.get(ports(child, 8007, "/")), 502)
        assert http.get(ports(sid, 8007, "/who")).json()["token"] == "parent"
        run_bash(http, child, "echo child > /root/token")
        start_service(http, child, 8007)
        assert http.get(ports(child, 8007, "/who")).json()["token"] == "child"
        assert http.get(ports(sid, 8007, "/who")).json()["token"] == "parent"
    finally:
        delete_raw(http, child)


def test_proxied_traffic_counts_as_activity(http):
    sid = create_raw(http, idle_timeout_seconds=2)
    try:
        start_service(http, sid, 8008)
        before = http.get(f"/v1/sandboxes/{sid}").json()["last_active_at"]
        # 4 s of requests, none of them execs: the 2 s idle timeout never fires.
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            assert http.get(ports(sid, 8008, "/ping")).status_code == 200
            time.sleep(0.4)
        info = http.get(f"/v1/sandboxes/{sid}")
        assert info.status_code == 200
        assert info.json()["last_active_at"] > before + 3000
    finally:
        delete_raw(http, sid)


def test_concurrent_requests_through_one_sandbox(http, sid):
    start_service(http, sid, 8010)
    errors = []

    def worker(i):
        try:
            with httpx.Client(base_url=http.base_url, timeout=30) as c:
                for j in range(10):
                    r = c.post(ports(sid, 8010, f"/w{i}/{j}"), content=f"{i}-{j}".encode())
                    e = r.json()
                    if r.status_code != 200 or e["body"] != f"{i}-{j}" or e["path"] != f"/w{i}/{j}":
                        errors.append((i, j, r.status_code, r.text[:200]))
        except Exception as e:  # reported below
            errors.append((i, repr(e)))
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


def test_openapi_lists_the_proxy(http):
    doc = http.get("/v1/openapi.json").json()
    p = doc["paths"]["/v1/sandboxes/{id}/ports/{port}/{path}"]
    assert {"get", "post", "put", "delete"} <= set(p), list(p)
    assert json.dumps(p).count("502") >= 1
