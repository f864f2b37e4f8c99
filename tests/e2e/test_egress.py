"""Egress (docs/network.md): off means loopback only; on reaches the
internet through pasta (a wheel no template has comes from PyPI, with the
hash PyPI publishes for it, and installs); allow-lists let out
only their domains and networks and refuse the rest at once; the host and
link-local addresses are never reachable; policies change at runtime and
forks inherit them on networks of their own.

Traffic goes only to loopback, to the package registries, and to a network
namespace this file creates (`testnet`)."""
from __future__ import annotations

import os
import socket
import time

import pytest

from helpers import assert_fetches_wheel, assert_json_error, assert_wheel_absent, create_raw, delete_raw, exec_ok, exec_raw, pastas
from netns import HostListener, NetNs


def py(http, sid, code, timeout_ms=120_000) -> str:
    return exec_ok(http, sid, code, timeout_ms=timeout_ms)


def egress(http, sid):
    r = http.get(f"/v1/sandboxes/{sid}/egress")
    assert r.status_code == 200, r.text
    return r.json()["egress"]


def patch(http, sid, policy):
    return http.patch(f"/v1/sandboxes/{sid}/egress", json={"egress": policy})


# Inside the sandbox: try a TCP connect and say how it ended, and how fast.
PROBE = r"""
import socket, time, errno
def probe(host, port, timeout=5):
    t = time.time()
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        r = "connected"
    except socket.timeout:
        r = "timeout"
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e))
    return r, round(time.time() - t, 2)
def lookup(name):
    t = time.time()
    try:
        return socket.getaddrinfo(name, 443, proto=socket.IPPROTO_TCP)[0][4][0], round(time.time() - t, 2)
    except socket.gaierror as e:
        return "gaierror", round(time.time() - t, 2)
"""


@pytest.fixture(scope="module")
def testnet(tmp_path_factory):
    """A network namespace of our own (netns.NetNs): the host side has
    10.213.N.1 and 169.254.213.N (host addresses a sandbox must never
    reach), the namespace 10.213.N.2 with an HTTP server on port 8080
    (somewhere a sandbox may go)."""
    with NetNs(213) as net:
        net.http_server(str(tmp_path_factory.mktemp("www")))
        yield {"ns": net.ns, "host_ip": net.host_ip, "ns_ip": net.ns_ip, "link_local": net.link_local}


def pypi_ip() -> str:
    return socket.getaddrinfo("pypi.org", 443, proto=socket.IPPROTO_TCP)[0][4][0]


def test_egress_off_is_loopback_only(http, testnet):
    listener = HostListener()
    sid = create_raw(http, egress=False)
    try:
        assert egress(http, sid) is False
        out = py(http, sid, PROBE + f"""
import os, socket, errno
print(sorted(os.listdir('/sys/class/net')))
print(probe({pypi_ip()!r}, 443))
print(lookup('pypi.org'))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b'x', ('10.255.255.53', 53)); print('udp sent')
except OSError as e: print('udp', errno.errorcode[e.errno])
try:
    i = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    i.sendto(b'\\x08\\0\\0\\0\\0\\0\\0\\0', ({pypi_ip()!r}, 0)); print('icmp sent')
except OSError as e: print('icmp', errno.errorcode[e.errno])
try:
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    r.sendto(b'\\0' * 8, ({pypi_ip()!r}, 0)); print('raw sent')
except OSError as e: print('raw', errno.errorcode[e.errno])
print(probe({testnet['host_ip']!r}, {listener.port}))
print(probe('127.0.0.1', {listener.port}))
""")
        lines = out.splitlines()
        assert lines[0] == "['lo']", out
        assert lines[1].startswith("('ENETUNREACH'"), out
        assert lines[2].startswith("('gaierror'"), out
        assert float(lines[2].split(",")[1].strip(" )")) < 3, "a lookup fails fast"
        for kind, line in zip(("udp", "icmp", "raw"), lines[3:6]):
            assert line.startswith(kind) and "sent" not in line, out
        # The host's own address and its loopback services: nothing.
        assert lines[6].startswith("('ENETUNREACH'"), out
        assert lines[7].startswith("('ECONNREFUSED'"), out  # the sandbox's own loopback
        assert listener.accepted == []
    finally:
        listener.close()
        delete_raw(http, sid)


def test_egress_on_reaches_pypi_and_pip_install_works(http):
    sid = create_raw(http, egress=True)
    try:
        assert egress(http, sid) is True
        out = py(http, sid, PROBE + "print(lookup('pypi.org')[0] != 'gaierror'); print(probe('pypi.org', 443)[0])")
        assert out == "True\nconnected\n", out
        assert_wheel_absent(http, sid)
        assert_fetches_wheel(http, sid)
        # The resolver is the server's proxy in the sandbox's namespace.
        assert "127.0.0.53" in py(http, sid, "print(open('/etc/resolv.conf').read())")
    finally:
        delete_raw(http, sid)


def test_the_host_and_link_local_addresses_are_never_reachable(http, testnet):
    listener = HostListener()
    sid = create_raw(http, egress=True)
    try:
        out = py(http, sid, PROBE + f"""
print(probe({testnet['host_ip']!r}, {listener.port}))
print(probe({testnet['link_local']!r}, {listener.port}))
print(probe('127.0.0.1', {listener.port}))
print(probe({testnet['ns_ip']!r}, 8080))
""")
        lines = out.splitlines()
        for line in lines[:3]:
            assert line.startswith("('ECONNREFUSED'"), out
            assert float(line.split(",")[1].strip(" )")) < 1, "refused at once, not a timeout"
        assert lines[3].startswith("('connected'"), "a namespace that is not the host is reachable: " + out
        assert listener.accepted == []
    finally:
        listener.close()
        delete_raw(http, sid)


def test_host_addresses_that_appear_later_are_blocked_too(http):
    """The firewall of a running sandbox was written before this host
    address existed (a bridge or VPN coming up); the server rewrites it
    when the host's addresses change
    (docs/network.md#the-host-is-never-reached). A sandbox whose way out
    starts after the change gets it in its firewall from the start."""
    listener = HostListener()
    running = create_raw(http, egress=True)
    later = None
    try:
        # Its way out (and firewall) starts with its first network socket.
        assert py(http, running, "import socket; socket.socket().close(); print(1)") == "1\n"
        with NetNs(217) as net:
            later = create_raw(http, egress=True)
            time.sleep(0.5)  # the kernel's notification, then one nft per sandbox
            for sid in (running, later):
                out = py(http, sid, PROBE + f"print(probe({net.host_ip!r}, {listener.port}))\nprint(probe({net.link_local!r}, {listener.port}))")
                assert all(line.startswith("('ECONNREFUSED'") for line in out.splitlines()), f"{sid}: {out}"
        assert listener.accepted == []
    finally:
        listener.close()
        delete_raw(http, running)
        if later:
            delete_raw(http, later)


def test_allow_lists_let_out_only_their_names_and_networks(http, testnet):
    policy = {"allow": ["pypi.org", "*.pythonhosted.org", f"{testnet['ns_ip']}/32"]}
    sid = create_raw(http, egress=policy)
    try:
        assert egress(http, sid) == policy
        out = py(http, sid, PROBE + f"""
print(lookup('pypi.org')[0] != 'gaierror')
print(probe('pypi.org', 443)[0])
print(lookup('crates.io'))
print(probe({testnet['ns_ip']!r}, 8080)[0])
print(probe('files.pythonhosted.org', 443)[0])
""")
        lines = out.splitlines()
        assert lines[0] == "True" and lines[1] == "connected", out
        assert lines[2].startswith("('gaierror'") and float(lines[2].split(",")[1].strip(" )")) < 3, out
        assert lines[3] == "connected", out
        assert lines[4] == "connected", out
        assert_wheel_absent(http, sid)
        assert_fetches_wheel(http, sid)
        # A registry the list does not name: refused (its name does not resolve).
        ex = exec_raw(http, sid, "curl -sS --max-time 20 -o /dev/null https://registry.npmjs.org/is-number", language="bash", timeout_ms=60_000)
        assert ex.exit_code == 6 and "resolve" in ex.stderr, ex
    finally:
        delete_raw(http, sid)


def test_an_address_not_learnt_or_listed_is_refused_at_once(http, testnet):
    sid = create_raw(http, egress={"allow": ["pypi.org"]})
    try:
        out = py(http, sid, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080))")
        assert out.startswith("('ECONNREFUSED'") and float(out.split(",")[1].strip(" )\n")) < 1, out
    finally:
        delete_raw(http, sid)


def test_policy_changes_at_runtime(http, testnet):
    sid = create_raw(http, egress=False)
    probe = PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])"
    try:
        assert py(http, sid, probe) == "ENETUNREACH\n"
        r = patch(http, sid, True)
        assert r.status_code == 200 and r.json() == {"egress": True}
        assert py(http, sid, probe) == "connected\n"
        assert patch(http, sid, {"allow": ["pypi.org"]}).status_code == 200
        assert py(http, sid, probe) == "ECONNREFUSED\n"
        assert egress(http, sid) == {"allow": ["pypi.org"]}
        assert http.get(f"/v1/sandboxes/{sid}").json()["egress"] == {"allow": ["pypi.org"]}
        assert patch(http, sid, False).status_code == 200
        assert py(http, sid, probe) == "ENETUNREACH\n"
        assert egress(http, sid) is False
    finally:
        delete_raw(http, sid)


def test_forks_inherit_the_policy_on_networks_of_their_own(http, testnet):
    policy = {"allow": [f"{testnet['ns_ip']}/32"]}
    parent = create_raw(http, egress=policy)
    try:
        py(http, parent, "import socket; s = socket.create_connection(('%s', 8080)); print(1)" % testnet["ns_ip"])
        r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2})
        assert r.status_code == 200, r.text
        a, b = r.json()["children"]
        for child in (a, b):
            assert egress(http, child) == policy
            # The parent's connection is not the child's (fork gives fresh sockets).
            assert py(http, child, "import errno\ntry:\n    s.send(b'x'); print('shared')\nexcept OSError as e: print(errno.errorcode[e.errno])") \
                in ("ENOTCONN\n", "EPIPE\n")
            assert py(http, child, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "connected\n"
        # Each child's network is its own: turning one off leaves the others.
        assert patch(http, a, False).status_code == 200
        assert py(http, a, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "ENETUNREACH\n"
        assert py(http, b, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "connected\n"
        assert py(http, parent, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "connected\n"
        for child in (a, b):
            delete_raw(http, child)
    finally:
        delete_raw(http, parent)


def test_bad_policies_are_refused(http):
    for bad in ("yes", 1, {"allow": ["not a domain"]}, {"allow": "pypi.org"}, {"allow": ["pypi.org"], "deny": []},
                {"allow": ["10.0.0.0/33"]}, {"allow": [f"h{i}.example.org" for i in range(257)]}):
        assert_json_error(http.post("/v1/sandboxes", json={"egress": bad}), 400)
    sid = create_raw(http, egress=False)
    try:
        assert_json_error(patch(http, sid, {"allow": ["*"]}), 400)
        assert_json_error(http.patch(f"/v1/sandboxes/{sid}/egress", json={"policy": True}), 400)
        assert egress(http, sid) is False
        r = patch(http, sid, {"allow": [f"h{i}.example.org" for i in range(256)]})
        assert r.status_code == 200, r.text
    finally:
        delete_raw(http, sid)
    assert_json_error(http.get("/v1/sandboxes/sb-nosuch/egress"), 404)


# The first network socket of a sandbox, then at once a connect through it:
# the call returned only once the sandbox's way out ran.
FIRST_SOCKET = PROBE + """
import os, socket
before = sorted(os.listdir('/sys/class/net'))
print(before, probe({ip!r}, 8080)[0], sorted(os.listdir('/sys/class/net')))
"""


def test_the_way_out_starts_on_the_first_network_socket(server, http, testnet):
    """A sandbox's way out (pasta, its firewall, its DNS proxy) is not
    started until one of its processes asks for a network socket
    (docs/network.md#the-way-out-starts-on-first-use): creates, execs,
    files, unix sockets and pipes start none. That first socket() waits
    until the way out runs, so a connect right after it goes through:
    from the REPL, from a command, from a REPL's subprocess."""
    first = FIRST_SOCKET.format(ip=testnet["ns_ip"])
    how = {
        "repl": lambda sid: py(http, sid, first),
        "command": lambda sid: exec_ok(http, sid, "python3 - <<'EOF'\n" + first + "EOF", language="bash"),
        "subprocess": lambda sid: py(http, sid, "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', " + repr(first) + "], capture_output=True, text=True, check=True).stdout, end='')"),
    }
    for name, run in how.items():
        sid = create_raw(http)
        try:
            out = py(http, sid, """
import socket, os
a, b = socket.socketpair(); a.send(b'x'); assert b.recv(1) == b'x'
r, w = os.pipe(); os.write(w, b'y'); assert os.read(r, 1) == b'y'
print(sorted(os.listdir('/sys/class/net')))
""")
            assert out == "['lo']\n", out
            assert exec_ok(http, sid, "echo hi > /tmp/f && cat /tmp/f", language="bash") == "hi\n"
            assert sid not in pastas(server.state_dir), f"{name}: pasta runs before any network socket"
            out = run(sid)
            # Before its first socket it had only loopback; the connect made
            # right after the socket call went through.
            assert out.startswith("['lo'] connected ['") and out.count("'") == 6, f"{name}: {out}"
            assert sid in pastas(server.state_dir), name
        finally:
            delete_raw(http, sid)


def test_a_sandbox_with_egress_off_gets_its_sockets_at_once_and_no_way_out(server, http, testnet):
    """With egress off nothing is held: sockets are made at once and reach
    nothing beyond loopback, and no pasta is started for them."""
    sid = create_raw(http, egress=False)
    try:
        out = py(http, sid, PROBE + f"""
import time, socket
t = time.time(); s = socket.socket(); s.close(); took = time.time() - t
print(probe({testnet['ns_ip']!r}, 8080)[0], took < 1)
""")
        assert out == "ENETUNREACH True\n", out
        assert sid not in pastas(server.state_dir)
        # Turned on later: the way out starts at once (its sockets are not held).
        assert patch(http, sid, True).status_code == 200
        assert sid in pastas(server.state_dir)
        assert py(http, sid, PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "connected\n"
    finally:
        delete_raw(http, sid)


def test_a_held_allow_list_is_in_force_before_the_first_socket_goes_through(server, http, testnet):
    """The firewall is written before the held socket is let through: the
    very first connect of an allow-listed sandbox, to an address the list
    does not name, is refused; the listed one is reached."""
    listener = HostListener()
    sid = create_raw(http, egress={"allow": [f"{testnet['ns_ip']}/32"]})
    try:
        assert sid not in pastas(server.state_dir)
        out = py(http, sid, PROBE + f"""
print(probe({testnet['host_ip']!r}, {listener.port}))
print(probe({testnet['ns_ip']!r}, 8080)[0])
""")
        lines = out.splitlines()
        assert lines[0].startswith("('ECONNREFUSED'"), out
        assert lines[1] == "connected", out
        assert listener.accepted == []
    finally:
        listener.close()
        delete_raw(http, sid)


def test_each_fork_starts_its_own_way_out(server, http, testnet):
    """Forks share their parent's family (and the shim that holds sockets)
    but each has its own gate: a child's first socket starts its own way
    out, not its parent's or its sibling's."""
    parent = create_raw(http)
    kids = []
    try:
        assert py(http, parent, "x = 41") == ""
        r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2})
        assert r.status_code == 200, r.text
        kids = r.json()["children"]
        assert len(kids) == 2, r.json()
        out = py(http, kids[0], PROBE + f"print(x + 1, probe({testnet['ns_ip']!r}, 8080)[0])")
        assert out == "42 connected\n", out
        running = pastas(server.state_dir)
        assert kids[0] in running and parent not in running and kids[1] not in running, running
        assert py(http, kids[1], PROBE + f"print(probe({testnet['ns_ip']!r}, 8080)[0])") == "connected\n"
        assert parent not in pastas(server.state_dir)
    finally:
        for sid in kids + [parent]:
            delete_raw(http, sid)


def test_a_sandboxs_pasta_is_gone_when_its_delete_or_egress_off_answers(server, http):
    """pasta is stopped off the server's runtime workers (its exit takes
    the tap interface down, tens of ms under load: docs/fork.md), but the
    answer still waits for it: once DELETE, or a PATCH turning egress off,
    has answered, the sandbox's pasta has exited and been reaped."""
    for how in ("delete", "egress off"):
        sid = create_raw(http)
        try:
            # Its first network socket starts its pasta.
            assert exec_ok(http, sid, "import socket; socket.socket().close(); print(1)") == "1\n"
            pid = pastas(server.state_dir).get(sid)
            assert pid, f"no pasta runs for {sid}"
            if how == "delete":
                assert delete_raw(http, sid) == 204
            else:
                assert patch(http, sid, False).status_code == 200
            assert sid not in pastas(server.state_dir)
            assert not os.path.exists(f"/proc/{pid}"), f"{sid}'s pasta {pid} is not reaped after {how}"
        finally:
            delete_raw(http, sid)
