"""E2B's network settings become forkbox egress, `lifecycle.on_timeout:
pause` pauses instead of killing, and a forkbox key's quota holds for E2B
creates. Traffic goes only to loopback, to the package registries, and to
a network namespace this file creates."""
import socket
import time

import httpx
import pytest

from helpers import ForkboxServer
from netns import NetNs

PROBE = """
import socket, errno
def probe(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
"""


@pytest.fixture(scope="module")
def testnet(tmp_path_factory):
    with NetNs(214) as net:
        net.http_server(str(tmp_path_factory.mktemp("www")))
        yield net


def forkbox_egress(server, sid):
    r = httpx.get(f"{server.url}/v1/sandboxes/{sid}/egress")
    assert r.status_code == 200, r.text
    return r.json()["egress"]


def probe(sb, host, port):
    return sb.run_code(PROBE + f"probe({host!r}, {port})").text.strip("'")


def test_internet_access_and_allow_lists_become_egress(server, testnet):
    from e2b_code_interpreter import Sandbox

    pypi = socket.getaddrinfo("pypi.org", 443, proto=socket.IPPROTO_TCP)[0][4][0]
    off = Sandbox.create(timeout=120, allow_internet_access=False)
    try:
        assert forkbox_egress(server, off.sandbox_id) is False
        assert probe(off, pypi, 443) == "ENETUNREACH"
        assert off.commands.run("ls /sys/class/net").stdout.split() == ["lo"]
        assert off.get_info().allow_internet_access is False
    finally:
        off.kill()

    only = Sandbox.create(timeout=120, network={"deny_out": ["0.0.0.0/0"], "allow_out": [f"{testnet.ns_ip}/32"]})
    try:
        assert forkbox_egress(server, only.sandbox_id) == {"allow": [f"{testnet.ns_ip}/32"]}
        assert probe(only, testnet.ns_ip, 8080) == "connected"
        assert probe(only, pypi, 443) != "connected"
    finally:
        only.kill()

    on = Sandbox.create(timeout=120)
    try:
        assert forkbox_egress(server, on.sandbox_id) is True, "E2B's default is internet access on"
        assert probe(on, pypi, 443) == "connected"
    finally:
        on.kill()


def test_network_settings_forkbox_cannot_honour_are_refused(server):
    from e2b import InvalidArgumentException, Sandbox, SandboxException

    for network in ({"deny_out": ["10.0.0.0/8"]}, {"dns_servers": ["1.1.1.1"]}):
        with pytest.raises((InvalidArgumentException, SandboxException)) as e:
            Sandbox.create(timeout=30, network=network)
        assert "400" in str(e.value) or "not offered" in str(e.value) or "denyOut" in str(e.value), e.value


def test_on_timeout_pause_pauses_and_connect_resumes(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    sb.commands.run("echo kept > /tmp/k")
    for _ in range(100):
        if Sandbox.get_info(sb.sandbox_id).state.value == "paused":
            break
        time.sleep(0.1)
    assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
    again = Sandbox.connect(sb.sandbox_id, timeout=60)
    try:
        assert again.commands.run("cat /tmp/k").stdout == "kept\n"
    finally:
        again.kill()

    gone = Sandbox.create(timeout=2)
    time.sleep(4)
    assert not Sandbox.kill(gone.sandbox_id), "without on_timeout: pause, the end of its lifetime kills it"


@pytest.fixture(scope="module")
def quota_server():
    srv = ForkboxServer("e2b-quota", build_templates=False)
    key = srv.add_key("one", max_sandboxes=1)
    srv.start()
    srv.wait_ready()
    yield srv, key
    srv.stop()


def test_a_keys_quota_holds_for_e2b_creates(quota_server):
    from e2b import RateLimitException, Sandbox

    srv, key = quota_server
    opts = dict(api_key=key, api_url=srv.url, sandbox_url=srv.url)
    first = Sandbox.create(timeout=60, **opts)
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(timeout=60, **opts)
        r = httpx.post(f"{srv.url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": key})
        assert r.status_code == 429 and r.json()["code"] == 429 and "sandbox" in r.json()["message"], r.text
    finally:
        first.kill()
    Sandbox.create(timeout=60, **opts).kill()
