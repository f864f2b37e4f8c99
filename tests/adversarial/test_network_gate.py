"""Attacks on the network gate (docs/network.md#the-way-out-starts-on-first-use):
a sandbox's network sockets wait in its family's shim until the server has
started its way out. The shim serves every sandbox of a family (warm-pool
siblings share one), so a sandbox must not be able to starve it, wedge it,
open another sandbox's gate, or get a way out its policy does not give.

Traffic: loopback and the sandboxes' own namespaces only."""
from __future__ import annotations

import threading

from helpers import exec_ok, exec_raw, pastas


def py(http, sid, code, timeout_ms=120_000):
    return exec_ok(http, sid, code, timeout_ms=timeout_ms)


INTERFACES = "import os; print(sorted(os.listdir('/sys/class/net')))"


def test_a_socket_flood_does_not_starve_the_family(server, http, new_sandbox):
    """One sibling makes network sockets as fast as 4 threads can (each goes
    through the shim) while another, in the same family, makes its first
    socket, runs commands and signals its own processes (also vetted by
    the shim): all of it is answered, and the flood was real."""
    flooder, victim = new_sandbox(), new_sandbox()
    assert py(http, flooder, "import socket; socket.socket().close(); print('open')") == "open\n"
    flood = """
import socket, threading, time
made = [0] * 4
def run(i):
    end = time.time() + 6
    while time.time() < end:
        socket.socket(socket.AF_INET6 if i % 2 else socket.AF_INET, socket.SOCK_DGRAM).close()
        made[i] += 1
ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(made))
"""
    result = {}
    t = threading.Thread(target=lambda: result.update(made=py(http, flooder, flood)))
    t.start()
    try:
        out = py(http, victim, """
import socket, os, signal, subprocess, time
t = time.time(); socket.socket().close(); first = time.time() - t
p = subprocess.Popen(['sleep', '60']); os.kill(p.pid, signal.SIGTERM); p.wait()
print(sorted(os.listdir('/sys/class/net')) != ['lo'], p.returncode, first < 30)
""", timeout_ms=60_000)
        assert out == "True -15 True\n", out
        assert exec_ok(http, victim, "echo ok", language="bash", timeout_ms=60_000) == "ok\n"
    finally:
        t.join()
    assert int(result["made"]) > 1000, result
    assert http.get("/v1/sandboxes").status_code == 200


def test_callers_killed_while_they_wait_wedge_nothing(server, http, new_sandbox):
    """Processes killed while their first socket waits at the gate leave
    nothing behind: the sandbox's next socket still gets its way out, and
    its siblings' gates work."""
    sid, sibling = new_sandbox(), new_sandbox()
    out = py(http, sid, """
import os, signal, socket, time
kids = []
for i in range(20):
    pid = os.fork()
    if pid == 0:
        try:
            socket.socket()
        finally:
            os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
print(all(os.waitpid(pid, 0)[1] in (signal.SIGKILL, 0) for pid in kids))
socket.socket().close()
print(sorted(os.listdir('/sys/class/net')) != ['lo'])
""")
    assert out == "True\nTrue\n", out
    assert sid in pastas(server.state_dir)
    assert py(http, sibling, "import socket; socket.socket().close()\n" + INTERFACES) != "['lo']\n"


def test_a_sandbox_cannot_open_or_start_another_ones_way_out(server, http, new_sandbox):
    """A sibling's sockets, of every domain, open its own gate only; it
    cannot leave its mount namespace (by which the shim tells members
    apart) to pass for another."""
    attacker, other = new_sandbox(), new_sandbox()
    out = py(http, attacker, """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x00020000)  # CLONE_NEWNS
print(r, os.strerror(ctypes.get_errno()) if r else '')
for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM), (socket.AF_NETLINK, socket.SOCK_RAW)):
    socket.socket(family, kind).close()
print('made')
""")
    assert out.splitlines()[0].startswith("-1 "), out
    assert out.splitlines()[1] == "made", out
    running = pastas(server.state_dir)
    assert attacker in running and other not in running, running
    assert py(http, other, INTERFACES) == "['lo']\n"


def test_egress_off_gets_no_way_out_however_it_asks(server, http, new_sandbox):
    """With egress off, sockets of every domain (from the REPL, its
    subprocesses and commands) go through at once and start nothing."""
    sid = new_sandbox(egress=False)
    code = """
import socket
for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_DGRAM), (socket.AF_NETLINK, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW)):
    try:
        socket.socket(family, kind).close()
    except OSError:
        pass
"""
    py(http, sid, code)
    py(http, sid, "import subprocess, sys; subprocess.run([sys.executable, '-c', " + repr(code) + "], check=True)")
    ex = exec_raw(http, sid, "python3 - <<'EOF'\n" + code + "EOF\n", language="bash")
    assert ex.exit_code == 0, ex
    assert sid not in pastas(server.state_dir)
    assert py(http, sid, INTERFACES) == "['lo']\n"
