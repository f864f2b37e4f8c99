"""Attacks on the ways out this suite's other files do not cover: the
egress proxy a sandbox gets with `--egress-proxy` (docs/network.md#upstream-proxies)
and the trust layer that carries the host's CAs (docs/network.md#host-cas).

Traffic: loopback only (the operator's proxy here is the tests' own,
upstream_proxy.py, and nothing is asked of it that is not refused first)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from adversary import SECRET
from helpers import create_raw, delete_raw, exec_ok, exec_raw
from netns import HostListener
from upstream_proxy import find_secrets_code

PROXY = "http://127.0.0.53:3128"


def sh(c, sid, code, timeout_ms=180_000):
    return exec_raw(c, sid, code, language="bash", timeout_ms=timeout_ms)


def test_the_proxy_does_not_take_a_sandbox_to_the_host(proxied_http, upstream_proxy):
    """Through its own proxy, to the host's loopback and metadata addresses
    by address and by name, over CONNECT and plain HTTP."""
    listener = HostListener()
    sid = create_raw(proxied_http, egress=True)
    try:
        before = len(upstream_proxy.seen)
        for url in (f"http://127.0.0.1:{listener.port}/", f"https://127.0.0.1:{listener.port}/", f"http://localhost:{listener.port}/",
                    f"https://sub.localhost:{listener.port}/", f"http://[::1]:{listener.port}/", f"http://127.1:{listener.port}/",
                    f"http://0.0.0.0:{listener.port}/", "http://169.254.169.254/latest/meta-data/", f"http://[::ffff:127.0.0.1]:{listener.port}/"):
            ex = sh(proxied_http, sid, f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}} %{{http_connect}}' --noproxy '' --proxy {PROXY} '{url}'")
            assert ex.stdout in ("403 000", "000 403", "400 000", "000 400"), (url, ex)
        assert listener.accepted == []
        assert upstream_proxy.lines()[before:] == []
    finally:
        listener.close()
        delete_raw(proxied_http, sid)


def test_the_servers_proxy_credentials_are_out_of_a_sandboxs_reach(proxied_http, upstream_proxy, proxied_server):
    """Look for them in the environment and files, send a request carrying
    credentials of one's own, and make the upstream refuse: the upstream
    only ever sees the server's, and no answer shows them or its challenge."""
    sid = create_raw(proxied_http, egress=True)
    try:
        assert exec_ok(proxied_http, sid, find_secrets_code(upstream_proxy.password)) == "[]\n"
        before = len(upstream_proxy.seen)
        ex = sh(proxied_http, sid, f"curl -sS --max-time 20 -o /dev/null -D - --proxy-user mallory:forged --proxy {PROXY} https://pypi.org/simple/iniconfig/")
        assert ex.exit_code == 0, ex
        seen = upstream_proxy.seen[before:]
        assert seen and all(s["authorized"] for s in seen), seen
        assert upstream_proxy.password not in ex.stdout + ex.stderr
    finally:
        delete_raw(proxied_http, sid)
    assert upstream_proxy.password not in open(proxied_server.log_path, errors="replace").read()


def test_a_flood_of_proxy_connections_stops_at_the_limit_and_hurts_no_one_else(proxied_http):
    """300 connections held open to its own proxy: past 256 they are
    answered 503 and closed; another sandbox's proxy and the API go on."""
    attacker, other = create_raw(proxied_http, egress=True), create_raw(proxied_http, egress=True)
    try:
        out = exec_ok(proxied_http, attacker, """
import socket, json
held, answers = [], {}
for i in range(300):
    s = socket.create_connection(('127.0.0.53', 3128), timeout=10)
    held.append(s)
    if i >= 256:
        s.settimeout(10)
        answers[i] = s.recv(64).decode(errors='replace').split('\\r\\n')[0]
print(json.dumps(sorted(set(answers.values()))))
""", timeout_ms=120_000)
        assert json.loads(out) == ["HTTP/1.1 503 Service Unavailable"], out
        ex = sh(proxied_http, other, "curl -sS --max-time 30 -o /dev/null -w '%{http_code}' https://pypi.org/simple/iniconfig/")
        assert ex.stdout == "200", ex
        assert proxied_http.get("/v1/healthz").status_code == 200
    finally:
        delete_raw(proxied_http, attacker)
        delete_raw(proxied_http, other)


def test_a_sandbox_holding_its_proxys_address_gets_a_clear_refusal(proxied_http):
    """Bind 127.0.0.53:3128 with egress off, then ask for egress: a 409
    naming the address, and the sandbox still works."""
    sid = create_raw(proxied_http, egress=False)
    try:
        exec_ok(proxied_http, sid, "import socket; squat = socket.socket(); squat.bind(('127.0.0.53', 3128)); squat.listen(1)")
        r = proxied_http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": True})
        assert r.status_code == 409 and "127.0.0.53:3128" in r.json()["error"], r.text
        assert exec_ok(proxied_http, sid, "squat.close(); print('ok')") == "ok\n"
        r = proxied_http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": True})
        assert r.status_code == 200, r.text
    finally:
        delete_raw(proxied_http, sid)


def test_a_template_bundle_linked_to_a_host_file_is_not_read(server, http, host_dir):
    """A recipe whose step makes the template's CA bundle a link to a host
    file: a sandbox of that template never sees the file's contents (the
    server reads a template's bundle without following links)."""
    secret = os.path.join(host_dir, "secret")
    assert os.path.isfile(secret)
    recipe = {"name": "linked-bundle", "commands": [f"ln -sf {secret} /etc/ssl/certs/ca-certificates.crt", "ls -l /etc/ssl/certs/ca-certificates.crt"]}
    events = []
    with http.stream("POST", "/v1/templates", json=recipe, timeout=600) as r:
        assert r.status_code == 200
        events = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert events[-1]["type"] == "done", events[-3:]
    sid = create_raw(http, template="linked-bundle")
    try:
        out = exec_raw(http, sid, "cat /etc/ssl/certs/ca-certificates.crt", language="bash")
        assert out.exit_code == 0 and SECRET.decode() not in out.stdout + out.stderr, out
        # The trust layers on the host hold no copy of it either.
        found = subprocess.run(["grep", "-rlF", SECRET.decode(), os.path.join(server.state_dir, "trust")], capture_output=True, text=True)
        assert found.returncode == 1, found
    finally:
        delete_raw(http, sid)
        http.delete("/v1/templates/linked-bundle")
