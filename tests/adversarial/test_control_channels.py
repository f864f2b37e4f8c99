"""The server's control channels, reached for from inside a sandbox: its
HTTP port on the host's loopback (with egress on and off), the host's own
addresses and unix sockets, the socket between the family's shim and the
sandbox's init, the DNS proxy the server runs inside the sandbox's network
namespace, and the REPL's own control socket to the server (which user code
in the REPL can write to: forged frames must hurt only that REPL).

Traffic goes only to loopback and to the host's own addresses."""
from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest

from adversary import both, healthy, repl
from helpers import exec_ok, exec_raw, proc_status


class Listeners:
    """TCP listeners on every host address (v4 and v6) and two unix sockets,
    counting the connections they accept."""

    def __init__(self):
        self.accepted = []
        self.tcp4 = self._listen(socket.socket(socket.AF_INET), ("0.0.0.0", 0))
        self.tcp6 = self._listen(socket.socket(socket.AF_INET6), ("::", 0))
        self.abstract = f"\0forkbox-adv-{id(self):x}"
        self.path = f"/tmp/forkbox-adv-{id(self):x}.sock"
        self.unix = [self._listen(socket.socket(socket.AF_UNIX), self.abstract), self._listen(socket.socket(socket.AF_UNIX), self.path)]

    def _listen(self, s, addr):
        s.bind(addr)
        s.listen()
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return s

    def _accept(self, s):
        while True:
            try:
                conn, peer = s.accept()
            except OSError:
                return
            self.accepted.append(peer)
            conn.close()

    def close(self):
        for s in [self.tcp4, self.tcp6] + self.unix:
            s.close()
        subprocess.run(["rm", "-f", self.path], check=False)


@pytest.fixture
def listeners():
    ls = Listeners()
    yield ls
    ls.close()


def host_addresses() -> list[str]:
    """Every address of every host interface (link-local included)."""
    out = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return [a["local"] for link in out for a in link.get("addr_info", [])]


CONNECT = """
import socket
def connect(addr, port):
    fam = socket.AF_INET6 if ':' in addr else socket.AF_INET
    s = socket.socket(fam)
    s.settimeout(5)
    target = (addr, port)
    if addr.startswith('fe80:'):   # a link-local address, by way of the sandbox's own interface
        ifaces = [n for _, n in socket.if_nameindex() if n != 'lo']
        if not ifaces:
            return 'ENETUNREACH'
        target = (addr, port, 0, socket.if_nametoindex(ifaces[0]))
    try:
        s.connect(target)
        return 'CONNECTED'
    except socket.timeout:
        return 'TIMEOUT'
    except OSError as e:
        return _ename(e.errno)
"""


@pytest.mark.parametrize("egress", [True, False], ids=["egress-on", "egress-off"])
def test_the_servers_port_and_host_listeners_are_unreachable(http, server, new_sandbox, listeners, egress):
    """The server listens on the host's loopback; a host service listens on
    every address. From the sandbox, loopback is its own, and the host's
    addresses are refused (the firewall with egress on, no route without)."""
    sid = new_sandbox(egress=egress)
    targets = [(a, p) for a in ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::1", "::ffff:127.0.0.1"] + host_addresses()
               for p in (server.port, listeners.tcp4.getsockname()[1], listeners.tcp6.getsockname()[1])]
    seen = repl(http, sid, CONNECT + f"report({{'%s %d' % t: connect(*t) for t in {targets}}})")
    assert set(seen.values()) <= {"ECONNREFUSED", "ENETUNREACH"}, seen
    assert "ECONNREFUSED" in seen.values(), seen   # loopback is there, it is the sandbox's own
    assert listeners.accepted == []


def test_the_hosts_unix_sockets_are_unreachable(http, sid, listeners):
    """Abstract unix sockets belong to a network namespace; path sockets to
    a filesystem: neither of the host's is there."""
    code = f"""
import socket
def unix(addr):
    return attempt(socket.socket(socket.AF_UNIX).connect, addr)
report({{'abstract': unix({listeners.abstract!r}), 'path': unix({listeners.path!r}),
        'listed': {listeners.abstract[1:]!r} in open('/proc/1/net/unix').read()}})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"abstract": "ECONNREFUSED", "path": "ENOENT", "listed": False}, (where, seen)
    assert listeners.accepted == []


def test_the_shim_socket_held_by_init_cannot_be_taken(http, sid):
    """init holds its end of the seqpacket socket to the family's shim (the
    shim spawns commands for whoever sends on it). Its descriptors are
    closed to the sandbox: /proc/1/fd and pidfd_getfd."""
    code = """
import signal
fds = sorted(int(x) for x in _os.listdir('/proc/1/fd'))
out = {'open %d' % fd: attempt(_os.open, '/proc/1/fd/%d' % fd, _os.O_RDWR) for fd in fds}
out.update({'readlink %d' % fd: attempt(_os.readlink, '/proc/1/fd/%d' % fd) for fd in fds})
pidfd = sc(434, 1, 0)
if pidfd == 'ok':
    pidfd = _libc.syscall(434, 1, 0)
    out.update({'pidfd_getfd %d' % fd: sc(438, pidfd, fd, 0) for fd in fds})
else:
    out['pidfd_open'] = pidfd
report(out)
"""
    seen = both(http, sid, code)
    for where, results in seen.items():
        assert any(k.startswith("open ") for k in results), (where, results)
        for call, result in results.items():
            expected = "EPERM" if call.startswith("pidfd") else "EACCES"
            assert result == expected, (where, call, result)
    assert "pidfd_open" in seen["repl"] and "pidfd_getfd 3" in seen["bash"], seen   # the REPL may not even open one
    assert exec_ok(http, sid, "echo still served", language="bash") == "still served\n"


def server_rss_kib(server) -> int:
    return int(proc_status(server.proc.pid)["VmRSS"].split()[0])


def test_garbage_to_the_in_sandbox_dns_proxy_hurts_nothing(http, server, new_sandbox):
    """The server answers DNS inside the sandbox's namespace (127.0.0.53):
    random bytes, empty and oversized datagrams, a compression-pointer loop
    and a flood. It keeps answering, and keeps serving everyone else."""
    sid = new_sandbox(egress={"allow": ["pypi.org"]})
    other = new_sandbox()
    exec_ok(http, other, "state = 'kept'")
    rss = server_rss_kib(server)
    code = """
import socket, struct, random
def query(name, qid=0x4242):
    q = b''.join(bytes([len(p)]) + p.encode() for p in name.split('.')) + b'\\0'
    return struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0) + q + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rnd = random.Random(7)
bad = [b'', b'\\0' * 65507, struct.pack('>HHHHHH', 1, 0x0100, 1, 0, 0, 0) + b'\\xc0\\x0c' + b'\\0\\1\\0\\1',
       struct.pack('>HHHHHH', 2, 0x0100, 0xffff, 0xffff, 0xffff, 0xffff), query('a.' * 120 + 'pypi.org')]
for i in range(4000):
    s.sendto(bad[i] if i < len(bad) else bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 600))), ('127.0.0.53', 53))
s.settimeout(5)
s.sendto(query('forkbox-adv.invalid'), ('127.0.0.53', 53))
answers = []
try:
    while True:
        data = s.recv(4096)
        if data[:2] == b'\\x42\\x42':
            answers.append(data[3] & 0xf)     # RCODE
            break
except OSError:
    pass
report(answers)
"""
    assert repl(http, sid, code) == [5], "the proxy stopped answering (5: REFUSED)"
    assert healthy(http)
    assert exec_ok(http, other, "print(state)") == "kept\n"
    assert server_rss_kib(server) < rss + 64 * 1024


def test_forged_frames_on_the_repls_control_socket_hurt_only_that_repl(http, server, new_sandbox):
    """User code in the REPL writes to its control socket (fd 3): frames of
    unknown types, an exec result for an exec that does not exist, a frame
    that announces 4 GiB. The server must not allocate what it announces,
    nor confuse another sandbox; the forger's exec times out, its REPL is
    replaced, and the server goes on."""
    sid, other = new_sandbox(), new_sandbox()
    exec_ok(http, other, "state = 'kept'")
    rss = server_rss_kib(server)
    t0 = time.monotonic()
    r = exec_raw(http, sid, """
import os, struct, json
def frame(kind, payload):
    os.write(3, struct.pack('>I', len(payload) + 1) + kind + payload)
frame(b'Q', b'nonsense')
frame(b'D', json.dumps({'id': 987654321, 'exit_code': 0, 'error': None}).encode())
frame(b'R', b'{"pid": 1}')
os.write(3, struct.pack('>I', 0xffffffff) + b'O' + b'A' * 65536)
print('after the forged frames')
""", timeout_ms=3000)
    assert r.exit_code == 124 and time.monotonic() - t0 < 30, r
    assert "after the forged frames" not in r.stdout
    again = exec_raw(http, sid, "print('fresh')")
    assert again.exit_code == 0 and again.stdout == "fresh\n" and again.warnings, again
    assert exec_ok(http, other, "print(state)") == "kept\n"
    assert healthy(http) and server_rss_kib(server) < rss + 64 * 1024


# The REPL's output journal (fd 8, docs/repl-protocol.md): user code can
# write anything into it, resize it, or point its header anywhere, and then
# die. The server reads it after the death, through the same bounded frame
# parser as the socket, and takes only output frames.
JOURNAL_FORGERIES = {
    # a length of 4 GiB
    "huge-length": "os.pwrite(8, struct.pack('<QIII', 0, 0xffffffff, 0, 0), 0)",
    # the file grown to 1 TiB (sparse), the length at 2 GiB
    "grown-file": "os.ftruncate(8, 1 << 40)\nos.pwrite(8, struct.pack('<QIII', 0, 0x7fffffff, 0, 0), 0)",
    # an open frame said to start far past the end, or inside the header
    "wild-open-frame": "os.pwrite(8, struct.pack('<QIII', 0, 64, 0xfffffff0, 0), 0)\nos.pwrite(8, b'A' * 64, 24)",
    # frames placed where the server will look (the REPL's count of bytes
    # written): an exec's end that never happened, a bundle that is no
    # JSON, a line, a frame announcing 4 GiB
    "forged-frames": ("body = frame(b'D', json.dumps({'id': 1, 'exit_code': 0, 'error': None}).encode())"
                      " + frame(b'V', b'{not json') + frame(b'O', b'forged line\\n')"
                      " + struct.pack('>I', 0xffffffff) + b'O' + b'B' * 1000\n"
                      "at = __import__('sys').modules['forkbox_repl']._jat\n"
                      "os.pwrite(8, body, 24)\nos.pwrite(8, struct.pack('<QIII', at, len(body), 0, 0), 0)"),
}


@pytest.mark.parametrize("forgery", list(JOURNAL_FORGERIES.values()), ids=list(JOURNAL_FORGERIES))
def test_a_forged_output_journal_hurts_only_that_repl(http, server, new_sandbox, forgery):
    sid, other = new_sandbox(), new_sandbox()
    exec_ok(http, other, "state = 'kept'")
    rss = server_rss_kib(server)
    code = ("import os, struct, json, signal\n"
            "def frame(kind, payload):\n    return struct.pack('>I', len(payload) + 1) + kind + payload\n"
            f"{forgery}\nos.kill(os.getpid(), signal.SIGKILL)")
    r = exec_raw(http, sid, code, timeout_ms=10_000)
    # The forged end of an exec is not taken: the exec ends with the death.
    assert r.exit_code != 0 and [e.get("ename") for e in r.errors] == ["ReplDied"], r
    # Only an output frame gets through, and only into this sandbox's own exec.
    assert r.stdout == ("forged line\n" if "forged line" in forgery else ""), r
    again = exec_raw(http, sid, "print('fresh')")
    assert again.exit_code == 0 and again.stdout == "fresh\n" and again.warnings, again
    assert exec_ok(http, other, "print(state)") == "kept\n"
    assert healthy(http) and server_rss_kib(server) < rss + 64 * 1024
