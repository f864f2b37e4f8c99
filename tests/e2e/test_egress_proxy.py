"""Egress through an operator's proxy (docs/network.md#upstream-proxies):
with `--egress-proxy`, a sandbox with egress has no way out but its own
proxy at 127.0.0.53:3128, which checks each request against the sandbox's
policy and sends it on to the operator's proxy (upstream_proxy.py, on the
host's loopback) with credentials the sandbox never sees.

Traffic: loopback, the package registries (through the test's proxy), and
a network namespace this file makes."""
from __future__ import annotations

import subprocess

import pytest

from helpers import FORKBOX_BIN, assert_fetches_wheel, assert_wheel_absent, create_raw, delete_raw, exec_ok, exec_raw
from netns import HostListener, NetNs
from upstream_proxy import find_secrets_code

PROXY_ENV = "http://127.0.0.53:3128"


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    www = tmp_path_factory.mktemp("www")
    (www / "hello.txt").write_text("plain http through the proxy\n")
    with NetNs(216) as net:
        net.http_server(str(www))
        yield net


def sh(proxied_http, sid, code, timeout_ms=120_000):
    return exec_raw(proxied_http, sid, code, language="bash", timeout_ms=timeout_ms)


def test_pip_reaches_pypi_only_through_the_operators_proxy(proxied_http, upstream_proxy, proxied_server):
    sid = create_raw(proxied_http, egress=True)
    try:
        before = len(upstream_proxy.seen)
        assert_wheel_absent(proxied_http, sid)
        assert_fetches_wheel(proxied_http, sid)
        seen = upstream_proxy.seen[before:]
        lines = [s["line"] for s in seen]
        assert "CONNECT pypi.org:443 HTTP/1.1" in lines and "CONNECT files.pythonhosted.org:443 HTTP/1.1" in lines, lines
        assert all(s["authorized"] for s in seen), seen
        # No other way out: only loopback, and a direct connection fails.
        assert exec_ok(proxied_http, sid, "import os; print(sorted(os.listdir('/sys/class/net')))") == "['lo']\n"
        ex = sh(proxied_http, sid, "curl -sS --max-time 10 --noproxy '*' -o /dev/null https://pypi.org/simple/")
        assert ex.exit_code in (6, 7), ex
        # The proxy variables name the sandbox's own proxy; the credentials
        # are nowhere in the sandbox.
        env = exec_ok(proxied_http, sid, "env | grep -i _proxy= | sort", language="bash")
        assert f"HTTPS_PROXY={PROXY_ENV}\n" in env and f"http_proxy={PROXY_ENV}\n" in env and "NO_PROXY=localhost" in env, env
        assert exec_ok(proxied_http, sid, find_secrets_code(upstream_proxy.password, upstream_proxy.user)) == "[]\n"
    finally:
        delete_raw(proxied_http, sid)
    assert upstream_proxy.password not in open(proxied_server.log_path, errors="replace").read()


def test_an_allow_list_refuses_other_names_before_they_reach_the_proxy(proxied_http, upstream_proxy):
    sid = create_raw(proxied_http, egress={"allow": ["pypi.org", "files.pythonhosted.org"]})
    try:
        assert_fetches_wheel(proxied_http, sid)
        before = len(upstream_proxy.seen)
        ex = sh(proxied_http, sid, "curl -sS --max-time 20 -o /dev/null https://crates.io/; echo rc=$?")
        assert "403" in ex.stderr and "rc=56" in ex.stdout, ex
        ex = sh(proxied_http, sid, "curl -sS --max-time 20 http://deb.debian.org/debian/ | head -c 200")
        assert "not allowed by this sandbox's egress policy" in ex.stdout, ex
        assert upstream_proxy.lines()[before:] == [], upstream_proxy.lines()[before:]
    finally:
        delete_raw(proxied_http, sid)


def test_plain_http_is_proxied_request_by_request(proxied_http, upstream_proxy, origin):
    ip = origin.ns_ip
    sid = create_raw(proxied_http, egress={"allow": [f"{ip}/32"]})
    try:
        before = len(upstream_proxy.seen)
        # Two URLs on one connection (curl reuses it): the first goes
        # through, the second is for a host the list does not name.
        ex = sh(proxied_http, sid, f"curl -sS --max-time 20 http://{ip}:8080/hello.txt http://example.com/")
        assert ex.stdout.startswith("plain http through the proxy\n") and "not allowed" in ex.stdout, ex
        assert upstream_proxy.lines()[before:] == [f"GET http://{ip}:8080/hello.txt HTTP/1.1"], upstream_proxy.lines()[before:]
    finally:
        delete_raw(proxied_http, sid)


def test_the_host_is_not_reached_through_the_proxy(proxied_http, upstream_proxy, origin):
    listener = HostListener()
    sid = create_raw(proxied_http, egress=True)
    try:
        before = len(upstream_proxy.seen)
        for url in (f"http://127.0.0.1:{listener.port}/", f"https://localhost:{listener.port}/", f"http://[::1]:{listener.port}/",
                    f"https://{origin.host_ip}:{listener.port}/", f"http://169.254.169.254/latest/meta-data/"):
            # `--noproxy ''`: the proxy for every host, even those NO_PROXY names.
            ex = sh(proxied_http, sid, f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}} %{{http_connect}}' --noproxy '' --proxy {PROXY_ENV} '{url}'")
            assert ex.stdout in ("403 000", "000 403"), (url, ex)
        assert listener.accepted == []
        assert upstream_proxy.lines()[before:] == [], upstream_proxy.lines()[before:]
    finally:
        listener.close()
        delete_raw(proxied_http, sid)


def test_policy_changes_and_forks_apply_to_the_proxy(proxied_http, upstream_proxy):
    sid = create_raw(proxied_http, egress=False)
    fetch = "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' https://pypi.org/simple/iniconfig/; echo \" rc=$?\""
    try:
        # Off: nothing listens at the proxy's address.
        assert "rc=7" in sh(proxied_http, sid, fetch).stdout
        assert proxied_http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": True}).status_code == 200
        assert sh(proxied_http, sid, fetch).stdout.strip() == "200 rc=0"
        assert proxied_http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": {"allow": ["crates.io"]}}).status_code == 200
        assert "rc=56" in sh(proxied_http, sid, fetch).stdout
        assert proxied_http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": True}).status_code == 200
        r = proxied_http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2})
        assert r.status_code == 200, r.text
        a, b = r.json()["children"]
        # Each child has a proxy of its own, on its own network.
        assert proxied_http.patch(f"/v1/sandboxes/{a}/egress", json={"egress": False}).status_code == 200
        assert "rc=7" in sh(proxied_http, a, fetch).stdout
        assert sh(proxied_http, b, fetch).stdout.strip() == "200 rc=0"
        assert sh(proxied_http, sid, fetch).stdout.strip() == "200 rc=0"
        for child in (a, b):
            delete_raw(proxied_http, child)
    finally:
        delete_raw(proxied_http, sid)


def test_a_bad_egress_proxy_stops_the_start_with_a_clear_error():
    for bad, says in (("https://p:3128", "http://"), ("http://p", "port"), ("nonsense", "URL"), ("http://p:3128/path", "path")):
        out = subprocess.run([FORKBOX_BIN, "serve", "--egress-proxy", bad, "--listen", "127.0.0.1:1"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and says in out.stderr and "--egress-proxy" in out.stderr, (bad, out)
