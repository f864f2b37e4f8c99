"""Leaks from one sandbox into a later one that reuses its resources (pids,
uid ranges, warm-pool spares, the same zygote, hollow fork spares): a
sandbox leaves a secret everywhere it can (files, /tmp, /dev/shm, SysV
shared memory, POSIX message queues, its environment, its hostname, process
memory and command lines), is destroyed, and none of the sandboxes made
after it finds the secret anywhere it can look."""
from __future__ import annotations

import uuid

from adversary import bash_python, repl
from helpers import exec_ok

# Leave `token` everywhere (run in the REPL; the background process outlives the call).
PLANT = """
import subprocess, socket, os
t = {token!r}
for path in ('/root/secret', '/tmp/secret', '/var/tmp/secret', '/etc/secret.conf', '/dev/shm/secret', '/tmp/' + t):
    with open(path, 'w') as f:
        f.write(t)
os.environ['FORKBOX_SECRET'] = t
hoard = t.encode() * 65536                                  # REPL memory
socket.sethostname(t[:40])
_libc.shmat.restype = _ct.c_void_p
shm = _libc.shmget(0x0f0b0c5, 4096, 0o1666)                 # SysV shared memory
_ct.memmove(_libc.shmat(shm, None, 0), t.encode(), len(t))
rt = _ct.CDLL('librt.so.1', use_errno=True)
mq = rt.mq_open(('/' + t[:32]).encode(), 0o100 | 0o2, 0o600, None)   # POSIX message queue
bg = subprocess.Popen(['python3', '-c', 'import sys, time; x = sys.stdin.read().encode() * 65536; time.sleep(1000)'],
                      stdin=subprocess.PIPE, env={{'FORKBOX_SECRET': t}})
bg.stdin.write(t.encode()); bg.stdin.close()
report([shm >= 0, mq >= 0])
"""

# Look for the token everywhere a sandbox can (run by bash: it sees its
# leaf pid namespace). The token comes reversed, so this code and its
# command line do not hold it; the scanner skips its own memory.
SCAN = """
import glob, subprocess
t = {reversed_token!r}[::-1].encode()
hits = []
for top in ('/root', '/tmp', '/var/tmp', '/etc', '/dev/shm', '/dev/mqueue', '/run', '/home', '/srv', '/opt', '/var/lib'):
    for root, dirs, files in _os.walk(top):
        for name in dirs + files:
            p = _os.path.join(root, name)
            if t[:32] in p.encode():       # (message queue names hold the first 32 characters)
                hits.append('name ' + p)
            elif name in files and not _os.path.islink(p):
                try:
                    if t in open(p, 'rb').read(1 << 20):
                        hits.append('file ' + p)
                except OSError:
                    pass
me = str(_os.getpid())
for pid in _os.listdir('/proc'):
    if not pid.isdigit() or pid == me:
        continue
    for what in ('environ', 'cmdline'):
        try:
            if t in open('/proc/%s/%s' % (pid, what), 'rb').read():
                hits.append('%s of pid %s' % (what, pid))
        except OSError:
            pass
    try:
        mem = open('/proc/%s/mem' % pid, 'rb')
        for line in open('/proc/%s/maps' % pid):
            start, end = (int(x, 16) for x in line.split()[0].split('-'))
            if 'r' in line.split()[1] and end - start < (256 << 20):
                try:
                    mem.seek(start)
                    if t in mem.read(end - start):
                        hits.append('memory of pid %s' % pid)
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
n = 64 << 20
_libc.malloc.restype = _ct.c_void_p
if t in _ct.string_at(_libc.malloc(n), n):
    hits.append('fresh memory')
ipcs = subprocess.run(['ipcs', '-m'], capture_output=True, text=True).stdout
if '0x00f0b0c5' in ipcs:
    hits.append('SysV shared memory')
report(hits)
"""

# The same in the REPL: its environment, hostname and globals (the token
# stays a local of the function, out of the globals it reads).
LOOK_IN_REPL = """
import socket
def _look(t):
    return [k for k, v in {{'environ': ' '.join(_os.environ.values()), 'hostname': socket.gethostname(),
            'globals': ' '.join(repr(v)[:200] for v in list(globals().values()))}}.items() if t[:40] in v]
report(_look({reversed_token!r}[::-1]))
"""


def plant(http, sid, token):
    assert repl(http, sid, PLANT.format(token=token)) == [True, True]
    # The sandbox sees its own secret: the scan finds what is there.
    found = bash_python(http, sid, SCAN.format(reversed_token=token[::-1]))
    assert {"file /root/secret", "file /dev/shm/secret", f"name /dev/mqueue/{token[:32]}", "SysV shared memory"} <= set(found), found
    assert any(h.startswith("memory of pid") for h in found) and any(h.startswith("environ of pid") for h in found), found
    assert sorted(repl(http, sid, LOOK_IN_REPL.format(reversed_token=token[::-1]))) == ["environ", "globals", "hostname"]


def assert_nothing_left(http, sid, token):
    assert bash_python(http, sid, SCAN.format(reversed_token=token[::-1]), timeout_ms=60_000) == [], sid
    assert repl(http, sid, LOOK_IN_REPL.format(reversed_token=token[::-1])) == [], sid


def test_a_destroyed_sandbox_leaves_nothing_to_the_next_ones(http, new_sandbox):
    token = f"forkbox-secret-{uuid.uuid4().hex}"
    victim = new_sandbox()
    plant(http, victim, token)
    assert http.delete(f"/v1/sandboxes/{victim}").status_code == 204
    # More than the warm pool's spares: reused spares, fresh ones, the same zygote.
    later = [new_sandbox() for _ in range(6)]
    for sid in later:
        assert_nothing_left(http, sid, token)


def test_destroyed_fork_children_leave_nothing_to_the_next_forks(http, new_sandbox):
    """Fork children reuse their family's hollow spare members (namespaces,
    init, cgroup, made ahead): children that planted a secret are destroyed,
    and the next fork's children, and the parent, find nothing."""
    token = f"forkbox-secret-{uuid.uuid4().hex}"
    parent = new_sandbox()
    exec_ok(http, parent, "x = 1")
    for round_ in range(2):
        r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2})
        assert r.status_code == 200, r.text
        children = r.json()["children"]
        try:
            for child in children:
                if round_ == 0:
                    plant(http, child, token)
                else:
                    assert_nothing_left(http, child, token)
        finally:
            for child in children:
                http.delete(f"/v1/sandboxes/{child}")
    assert_nothing_left(http, parent, token)
