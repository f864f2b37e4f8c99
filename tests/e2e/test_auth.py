"""Bearer API keys: a server started with `--api-key` refuses requests
without a right key (but the health check), and refuses to listen beyond
loopback without keys; each key uses only its own sandboxes (another key's
answer 404; test_keys.py covers every route, the keys file and quotas)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid

import httpx
import pytest
from podflare import Client, Sandbox

from helpers import E2E_ROOT, FORKBOX_BIN, TEMPLATES_DIR, ForkboxServer, assert_json_error, free_port

KEY = "secret"
OTHER_KEY = "another-key-7"


@pytest.fixture(scope="module")
def auth_server(say, server):  # `server` first: the default template is built
    srv = ForkboxServer("auth", api_keys=[KEY, OTHER_KEY], build_templates=False, log=say).start()
    try:
        srv.wait_ready()
        yield srv
    finally:
        rc = srv.stop()
        srv.cleanup()
    assert rc == 0, srv.log_tail()


def test_healthz_needs_no_key(auth_server):
    r = httpx.get(auth_server.url + "/v1/healthz")
    assert r.status_code == 200 and r.text == "ok"


@pytest.mark.parametrize("headers", [
    {},
    {"authorization": "Bearer wrong"},
    {"authorization": f"Bearer {KEY}x"},
    {"authorization": KEY},  # no scheme
    {"authorization": f"Basic {KEY}"},
    {"authorization": "Bearer"},
])
def test_missing_or_wrong_key_is_401(auth_server, headers):
    with httpx.Client(base_url=auth_server.url, headers=headers, timeout=30) as c:
        for r in (c.post("/v1/sandboxes", json={}), c.get("/v1/sandboxes"), c.get("/v1/openapi.json"),
                  c.get("/v1/sandboxes/sb-whatever/replay"), c.post("/v1/sandboxes/sb-whatever/exec", json={"code": "1"})):
            assert_json_error(r, 401)


def _response_head(s: socket.socket) -> bytes:
    """Read one response (head and a content-length body) from s; its head, lowercased."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")))
    while len(body) < length:
        body += s.recv(65536)
    return head.lower()


def test_a_refusal_that_leaves_the_body_unread_says_it_closes_the_connection(auth_server):
    # The 401 goes out before the body arrives, so the server never reads
    # it and cannot keep the connection: it must say so, or the client's
    # next request on it fails ("server disconnected").
    host, port = auth_server.url.split("//")[1].rsplit(":", 1)
    request = (b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
               b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        head = _response_head(s)
        assert head.startswith(b"http/1.1 401") and b"\r\nconnection: close" in head, head
        time.sleep(0.2)
        s.sendall(b"{}")
        assert s.recv(100) == b""      # closed, as it said
    # A request whose body was read keeps its connection for the next one.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request.replace(b"Bearer wrong", f"Bearer {KEY}".encode()).replace(b"/v1/sandboxes", b"/v1/sandboxes/sb-none/fork")
                  .replace(b"Length: 2", b"Length: 8") + b'{"n": 1}')
        head = _response_head(s)
        assert head.startswith(b"http/1.1 404") and b"connection: close" not in head, head
        s.sendall(f"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        assert _response_head(s).startswith(b"http/1.1 200")


def test_sdk_with_the_right_key_works(auth_server):
    for key in (KEY, OTHER_KEY):
        sb = Sandbox(host=auth_server.url, api_key=key)
        try:
            r = sb.run_code("print('authorized')")
            assert r.exit_code == 0 and r.stdout == "authorized"
            # another client without the key cannot touch it
            with httpx.Client(base_url=auth_server.url, timeout=30) as anon:
                assert_json_error(anon.post(f"/v1/sandboxes/{sb.id}/exec", json={"code": "print(1)"}), 401)
                assert_json_error(anon.delete(f"/v1/sandboxes/{sb.id}"), 401)
                assert_json_error(anon.get(f"/v1/sandboxes/{sb.id}"), 401)
            # nor can a client with the other key: to it the id is unknown
            other = OTHER_KEY if key == KEY else KEY
            with auth_server.http(other) as c:
                assert_json_error(c.post(f"/v1/sandboxes/{sb.id}/exec", json={"code": "print(1)"}), 404)
                assert_json_error(c.delete(f"/v1/sandboxes/{sb.id}"), 404)
                assert c.get(f"/v1/sandboxes/{sb.id}").json() == {"error": f"no sandbox `{sb.id}`"}
                assert sb.id not in c.get("/v1/sandboxes").text
            assert sb.run_code("print('still mine')").stdout == "still mine"
        finally:
            sb.close()


def test_sdk_without_a_key_gets_401(auth_server):
    with pytest.raises(httpx.HTTPStatusError) as err:
        Sandbox(client=Client(host=auth_server.url))
    assert err.value.response.status_code == 401


def test_listening_beyond_loopback_needs_api_keys():
    state = os.path.join(E2E_ROOT, f"exposed-{uuid.uuid4().hex[:8]}")
    try:
        out = subprocess.run([FORKBOX_BIN, "serve", "--listen", f"0.0.0.0:{free_port()}", "--state-dir", state,
                              "--templates-dir", TEMPLATES_DIR, "--no-build-templates"],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "FORKBOX_API_KEYS"})
        assert out.returncode != 0, out
        assert "api key" in (out.stderr + out.stdout).lower(), out
    finally:
        shutil.rmtree(state, ignore_errors=True)
