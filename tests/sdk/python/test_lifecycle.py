"""Create, connect, info, close/kill, configuration, and the typed errors."""
from __future__ import annotations

import httpx
import pytest

import forkbox
from forkbox import Sandbox


def test_create_arguments_reach_the_server(make):
    sb = make(template="default", timeout_seconds=1200, idle_timeout_seconds=300, ram_mib=512, rootfs_gb=2,
              egress=False)
    info = sb.info()
    assert info["id"] == sb.id and sb.id.startswith("sb-")
    assert (info["template"], info["timeout_seconds"], info["idle_timeout_seconds"], info["ram_mib"],
            info["rootfs_gb"], info["egress"]) == ("default", 1200, 300, 512, 2, False)


def test_template_as_first_argument(url):
    with Sandbox("python-datasci", url=url) as sb:
        assert sb.info()["template"] == "python-datasci"
        assert sb.run_code("import matplotlib; print('ok')").stdout == "ok\n"


def test_context_manager_destroys_and_close_is_idempotent(url, http):
    with Sandbox(url=url) as sb:
        sid = sb.id
        assert http.get(f"/v1/sandboxes/{sid}").status_code == 200
    assert http.get(f"/v1/sandboxes/{sid}").status_code == 404
    sb.close()  # again: nothing to do
    with pytest.raises(forkbox.NotFound):
        Sandbox.connect(sid, url=url)


def test_kill_then_calls_are_not_found(make):
    sb = make()
    sb.kill()
    with pytest.raises(forkbox.NotFound) as info:
        sb.run_code("1")
    assert info.value.status == 404 and info.value.message
    sb.close()  # a sandbox already gone is fine


def test_connect_to_an_existing_sandbox(sb, url):
    sb.run_code("shared = 'yes'")
    other = Sandbox.connect(sb.id, url=url)
    assert other.id == sb.id
    assert other.run_code("print(shared)").stdout == "yes\n"
    with pytest.raises(forkbox.NotFound):
        Sandbox.connect("sb-doesnotexist2345678", url=url)


def test_url_and_key_from_the_environment(url, monkeypatch):
    monkeypatch.setenv("FORKBOX_URL", url)
    with Sandbox() as sb:
        assert sb._cfg.url == url
        assert sb.run_code("print(1)").stdout == "1\n"


def test_default_url_is_local_7070(monkeypatch):
    monkeypatch.delenv("FORKBOX_URL", raising=False)
    assert forkbox.Client().host == "http://127.0.0.1:7070" == forkbox.DEFAULT_URL


def test_api_key_is_sent_as_bearer(auth_server, monkeypatch):
    with pytest.raises(forkbox.Unauthorized) as info:
        Sandbox(url=auth_server.url)
    assert info.value.status == 401 and "API key" in info.value.message
    with pytest.raises(forkbox.Unauthorized):
        Sandbox(url=auth_server.url, api_key="wrong")
    with Sandbox(url=auth_server.url, api_key="sdk-key") as sb:
        assert sb.run_code("print('in')").stdout == "in\n"
        assert sb.download_to is not None and sb.list("/root") is not None  # files routes carry it too
    monkeypatch.setenv("FORKBOX_API_KEY", "sdk-key")
    with Sandbox(url=auth_server.url) as sb:
        assert sb.info()["state"] == "ready"


def test_bad_request_carries_the_servers_message(url):
    with pytest.raises(forkbox.BadRequest) as info:
        Sandbox(url=url, ram_mib=1)
    assert info.value.status == 400
    assert info.value.message == "ram_mib must be between 64 and 16384, got 1"
    assert info.value.body == {"error": info.value.message}


def test_unknown_template_is_not_found(url):
    with pytest.raises(forkbox.NotFound):
        Sandbox("no-such-template", url=url)


def test_rate_limited_beyond_eight_watches(sb):
    streams = [sb.watch("/root") for _ in range(8)]
    try:
        for s in streams:
            assert next(s)["type"] == "ready"
        with pytest.raises(forkbox.RateLimited) as info:
            next(sb.watch("/root"))
        assert info.value.status == 429 and info.value.retry_after == 1.0  # the server's Retry-After
    finally:
        for s in streams:
            s.close()


def test_server_error_from_the_port_proxy(sb):
    with pytest.raises(forkbox.ServerError) as info:
        sb.ports.request("GET", 9, "/", raise_for_status=True)
    assert info.value.status == 502 and "nothing listens" in info.value.message


def test_unreachable_server_is_a_forkbox_error():
    with pytest.raises(forkbox.ForkboxError) as info:
        Sandbox(url="http://127.0.0.1:9")
    assert info.value.status is None


SLOW_SERVICE = """
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(3)
        self.send_response(200); self.end_headers(); self.wfile.write(b"slow")
http.server.HTTPServer(("127.0.0.1", 8123), H).serve_forever()
"""


def wait_for_port(sb, port):
    assert sb.run_code(f"for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
                       language="bash").ok


def test_client_timeout_is_timeout(url):
    c = forkbox.Client(url, timeout=0.5)
    try:
        with Sandbox(client=c) as sb:
            sb.upload("/root/slow.py", SLOW_SERVICE.encode())
            sb.run_code("nohup python3 /root/slow.py >/dev/null 2>&1 &", language="bash")
            wait_for_port(sb, 8123)
            with pytest.raises(forkbox.Timeout) as info:
                sb.ports.request("GET", 8123, "/")
            assert isinstance(info.value, TimeoutError)
            # execs are not cut by the client's read timeout
            assert sb.run_code("import time; time.sleep(1); print('late')").stdout == "late\n"
    finally:
        c.close()


def test_shared_client_lists_sandboxes_and_templates(client, url):
    with Sandbox(client=client) as sb:
        assert sb.id in [s["id"] for s in client.list_sandboxes()]
    assert {t["name"] for t in client.templates()} >= {"default", "python-datasci"}
    assert client.healthz() is True
    assert not client._http.is_closed  # a client you pass is yours: closing a sandbox leaves it open


def test_children_keep_the_connection_after_the_parent_closes(url):
    parent = Sandbox(url=url)
    [child] = parent.fork(1)
    parent.close()
    assert child.run_code("print('child alive')").stdout == "child alive\n"
    child.close()
    assert parent._client._http.is_closed  # the last user closed the client the SDK made
