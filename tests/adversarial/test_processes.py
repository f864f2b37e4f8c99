"""Signalling, tracing and reading other processes from inside a sandbox:
the host's, the server's, the sandbox's own supervisor (shim) and its
family's reaper and zygote, another family's, and the other members of its
own family: a sibling from the same warm-pool zygote, and the parent and
siblings of a fork child. The pids are given to the attacker (the host's
from the host's /proc, the others from the victims themselves): knowing
them must not help."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from adversary import alive, bash_python, both, healthy, host_pids_running, repl, sh, uid_base
from helpers import (children_of, create_raw, delete_raw, exec_ok, exec_raw, host_repl_pid, ns, proc_cmdline, proc_status, root_of,
                     sandbox_host_pids)

# In the sandbox: per_pid(pid) makes every call that acts on one pid.
PER_PID = """
import signal
def per_pid(pid):
    if pid == _os.getpid() or attempt(_os.kill, pid, 0) == 'ok':
        return 'own'      # the number names a process of the attacker's own sandbox
    return {
        'kill': attempt(_os.kill, pid, signal.SIGKILL),
        'tgkill': sc(234, pid, pid, 9),
        'rt_sigqueueinfo': sc(129, pid, 9, _ct.create_string_buffer(bytes(8) + (-1).to_bytes(4, 'little', signed=True), 128)),
        'ptrace attach': sc(101, 16, pid, 0, 0),
        'ptrace seize': sc(101, 0x4206, pid, 0, 0),
        'process_vm_readv': sc(310, pid, _ct.create_string_buffer(16), 1, _ct.create_string_buffer(16), 1, 0),
        'proc mem': attempt(_os.open, '/proc/%d/mem' % pid, _os.O_RDONLY),
        'setpriority': attempt(_os.setpriority, _os.PRIO_PROCESS, pid, 19),
        'prlimit': sc(302, pid, 7, _ct.create_string_buffer(16), 0),
    }
"""

# What each of them answers, from the REPL (whose calls naming a pid are
# vetted by the shim: any pid outside its member does not exist) and from
# a process bash started (the pid does not exist in the leaf namespace).
# A number may also name a process of the attacker's own (pid namespaces
# are per family, and REPL pids start at 2^21 in each): then it says "own".
NOT_MINE = {"kill": "ESRCH", "tgkill": "ESRCH", "rt_sigqueueinfo": "ESRCH", "ptrace attach": "EPERM",
            "ptrace seize": "EPERM", "process_vm_readv": "EPERM", "proc mem": "ENOENT", "setpriority": "ESRCH", "prlimit": "ESRCH"}


def attack_pids(http, sid, pids) -> dict:
    code = PER_PID + f"report({{str(p): per_pid(p) for p in {list(pids)}}})"
    return both(http, sid, code)


def assert_not_reached(seen: dict):
    for where, per in seen.items():
        for pid, results in per.items():
            assert results in (NOT_MINE, "own"), (where, pid, results)
    for pid in seen["bash"]:
        assert NOT_MINE in (seen["bash"][pid], seen["repl"][pid]), (pid, "never attacked: it names the attacker's own processes")


def test_host_processes_are_out_of_reach(http, sid):
    victim = subprocess.Popen(["sleep", "300"])
    try:
        assert_not_reached(attack_pids(http, sid, [victim.pid]))
        assert sh(http, sid, f"kill -9 {victim.pid}; kill -9 -1").exit_code != 0
        assert victim.poll() is None, "a host process was killed from inside a sandbox"
    finally:
        victim.kill()
        victim.wait()


def test_the_server_is_out_of_reach(http, server, sid):
    pid = server.proc.pid
    try:
        assert_not_reached(attack_pids(http, sid, [pid]))
        sh(http, sid, f"kill -STOP {pid}; kill -9 {pid}; kill -9 -1")
        assert server.proc.poll() is None and proc_status(pid).get("State", "").startswith(("S", "R")), proc_status(pid)
        assert healthy(http)
    finally:
        os.kill(pid, signal.SIGCONT)   # had a stop got through, the rest of the suite still has its server


def supervisors(sid: str) -> dict[str, int]:
    """Host pids above the sandbox's REPL: the REPL it was forked from (the
    zygote, for a warm-pool sandbox), the family's reaper and its shim."""
    out = {}
    pid = int(proc_status(host_repl_pid(sid))["PPid"])
    while pid > 1 and "serve" not in proc_cmdline(pid):
        cmd = " ".join(proc_cmdline(pid))
        kind = "zygote" if "forkbox_repl" in cmd else "shim" if "__shim" in cmd else "other"
        out[f"{kind} {pid}"] = pid
        pid = int(proc_status(pid)["PPid"])
    assert any(k.startswith("shim") for k in out), out
    return out


def test_the_sandboxs_supervisors_are_out_of_reach(http, sid):
    """The family's shim (by host pid), its reaper (pid 1 of the family's
    pid namespace, which the REPL shares) and the warm pool's zygote (the
    REPL's parent: os.getppid())."""
    exec_ok(http, sid, "state = 'kept'")
    targets = supervisors(sid)
    assert_not_reached(attack_pids(http, sid, targets.values()))
    seen = repl(http, sid, PER_PID + "report({'reaper': per_pid(1), 'parent': per_pid(_os.getppid())})")
    # (its /proc is its sandbox's: /proc/1 there is its own init, closed)
    assert seen == {"reaper": {**NOT_MINE, "proc mem": "EACCES"}, "parent": NOT_MINE}, seen
    assert all(alive(p) for p in targets.values()), {k: proc_status(p).get("State") for k, p in targets.items()}
    assert exec_ok(http, sid, "print(state)") == "kept\n"
    assert healthy(http)


BACKGROUND = "import subprocess, os, json\nbg = subprocess.Popen(['sleep', '1000'])\n"


def victim_pids(http, sid) -> list[int]:
    """The victim's REPL and background process, as the victim names them."""
    return json.loads(exec_ok(http, sid, "print(json.dumps([os.getpid(), bg.pid]))"))


def intact(http, sid) -> bool:
    r = exec_raw(http, sid, "print(state, bg.poll())")
    return r.exit_code == 0 and r.stdout == "kept None\n" and not r.warnings


def another_family(http, new_sandbox) -> str:
    """A sandbox of another family: resumed from a Space, so created the
    slow way, with its own user and pid namespaces and host uids."""
    frozen = new_sandbox()
    r = http.post(f"/v1/sandboxes/{frozen}/freeze")
    assert r.status_code == 200, r.text
    r = http.post(f"/v1/spaces/{r.json()['space_id']}/resume", json={})
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_another_family_is_out_of_reach(http, new_sandbox):
    victim = another_family(http, new_sandbox)
    try:
        attacker = new_sandbox()
        assert uid_base(http, victim) != uid_base(http, attacker)
        exec_ok(http, victim, BACKGROUND + "state = 'kept'")
        deadline = time.monotonic() + 10
        while len(pids := host_pids_running(victim, "sleep 1000|forkbox_repl")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(pids) == 2, [(p, proc_cmdline(p)) for p in sandbox_host_pids(victim)]
        host = {p: open(f"/proc/{p}/stat").read().split()[18] for p in pids}
        assert_not_reached(attack_pids(http, attacker, victim_pids(http, victim) + list(host)))
        # Everything "my uid" may do, by uid: renice it, signal it.
        sh(http, attacker, "renice -n 19 -u root; kill -9 -1")
        assert repl(http, attacker, "report(attempt(_os.setpriority, _os.PRIO_USER, 0, 19))") == "EPERM"
        assert intact(http, victim)
        assert {p: open(f"/proc/{p}/stat").read().split()[18] for p in host} == host, "the victim's niceness changed"
    finally:
        http.delete(f"/v1/sandboxes/{victim}")


@pytest.fixture
def pool_siblings(http, new_sandbox):
    """Two sandboxes from the warm pool: members of one family (one user
    namespace, one pid namespace, one host uid range)."""
    attacker, victim = new_sandbox(), new_sandbox()
    assert uid_base(http, attacker) == uid_base(http, victim), "not one family"
    exec_ok(http, victim, BACKGROUND + "state = 'kept'")
    return attacker, victim


def test_a_pool_sibling_cannot_signal_or_trace_another(http, pool_siblings):
    attacker, victim = pool_siblings
    assert_not_reached(attack_pids(http, attacker, victim_pids(http, victim)))
    assert intact(http, victim)


def test_a_pool_siblings_kill_everything_stays_in_its_sandbox(http, pool_siblings):
    """kill(-1) and kill(0) with SIGKILL from the REPL (which sees the whole
    family's pid namespace), pkill by name and kill -1 from bash."""
    attacker, victim = pool_siblings
    exec_raw(http, attacker, "import os, signal\nos.kill(-1, signal.SIGKILL)")
    exec_raw(http, attacker, "import os, signal\nos.kill(0, signal.SIGKILL)")
    sh(http, attacker, "pkill -9 sleep; pkill -9 python3; kill -9 -1")
    assert intact(http, victim)


@pytest.fixture
def forked(http, new_sandbox):
    """A parent with a background process, forked into two children."""
    parent = new_sandbox()
    exec_ok(http, parent, BACKGROUND + "state = 'kept'")
    r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2})
    assert r.status_code == 200, r.text
    a, b = r.json()["children"]
    yield parent, a, b
    for sid in (a, b):
        http.delete(f"/v1/sandboxes/{sid}")


def test_a_fork_child_cannot_kill_its_parent_or_sibling_by_sweeping_pids(http, forked):
    """A fork child SIGKILLs every pid it might guess in the family's pid
    namespace (the low range where inits and bash calls live, the range of
    REPLs above 2^21 and around its own), except what it can see (its own
    member's)."""
    parent, a, b = forked
    exec_ok(http, b, "bg = subprocess.Popen(['sleep', '1000'])")
    code = """
import signal
me, hit = _os.getpid(), []
# REPLs of a long-lived family (a warm pool's zygote serves many creates)
# sit further up: around this one's own pid too.
candidates = sorted(set(range(2, 2000)) | set(range(1 << 21, (1 << 21) + 4000)) | set(range(max(2000, me - 2000), me + 2000)))
visible = [p for p in candidates if p != me and attempt(_os.kill, p, 0) == 'ok']
for p in candidates:
    if p != me and p not in visible and attempt(_os.kill, p, signal.SIGKILL) == 'ok':
        hit.append(p)
report({'visible': visible, 'killed': hit})
"""
    seen = repl(http, a, code, timeout_ms=120_000)
    assert seen["killed"] == [], seen
    others = victim_pids(http, parent) + victim_pids(http, b)
    assert not set(others) & set(seen["visible"]), (others, seen)
    assert bash_python(http, a, PER_PID + f"report({{str(p): per_pid(p) for p in {others}}})") == {str(p): NOT_MINE for p in others}
    assert intact(http, parent) and exec_ok(http, b, "print(bg.poll())") == "None\n"


def test_a_fork_parent_cannot_take_its_childrens_namespaces(http, new_sandbox):
    """While the server forks a sandbox, each child's descriptors (its mount,
    network, UTS, IPC and pid namespaces, its control socket, its output
    pipes, its cgroups) go to the child the parent's REPL forks. Threads of
    the parent's user code try to get them during three forks: two copy
    every descriptor that appears in the REPL (any number up to 1024), one
    asks the family's supervisor for a child's descriptors the way a fork
    child does (from the thread, and from processes it forks in the family
    pid namespace) and names guessed pids as children the way the forking
    REPL does. With a child's mount namespace the parent could read and
    write the child's files after the fork, with its control socket read the
    code sent to it. None may be caught, and no impostor may be served."""
    parent = new_sandbox()
    exec_ok(http, parent, """
import os, posix, sys, threading, fcntl, ctypes
sys.setswitchinterval(1e-6)     # the thieves run as often as they can
def is_open(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
known = {fd for fd in range(0, 1024) if is_open(fd)}
lock = threading.Lock()
stolen = {}
ours = set()        # (st_dev, st_ino) of the pipes the impostor thread makes
stop = False
def thief(order):
    while not stop:
        for fd in order:
            if fd in known:
                continue
            try:
                n = os.dup(fd)
            except OSError:
                continue
            with lock:
                known.add(n)
                st = os.fstat(n)
                if (st.st_dev, st.st_ino) in stolen or (st.st_dev, st.st_ino) in ours:
                    os.close(n)
                else:
                    stolen[(st.st_dev, st.st_ino)] = n
TAKE, GIVE = 0x00464201, 0x00464202
pylibc = ctypes.PyDLL(None, use_errno=True)
pylibc.syscall.restype = ctypes.c_long
impostors = {'thread take': set(), 'thread give': set(), 'forked take': set()}
def ioctl(slot, req, arg):
    ctypes.set_errno(0)
    r = pylibc.syscall(ctypes.c_long(16), ctypes.c_long(slot), ctypes.c_long(req), ctypes.c_long(arg))
    return 'served %d' % r if r >= 0 else os.strerror(ctypes.get_errno())
def impostor():
    while not stop:
        for slot in range(3):
            impostors['thread take'].add(ioctl(slot, TAKE, 0))
            for guess in range(os.getpid() + 1, os.getpid() + 40):
                impostors['thread give'].add(ioctl(slot, GIVE, guess))
        with lock:
            r, w = os.pipe()
            st = os.fstat(r)
            ours.add((st.st_dev, st.st_ino))
        pid = posix.fork()      # not os.fork, which moves children to the leaf: this one stays in the family pid namespace
        if pid == 0:
            os.write(w, ','.join(ioctl(s, TAKE, 0) for s in range(3)).encode())
            os._exit(0)
        os.close(w)
        got = os.read(r, 300).decode()
        os.close(r)
        os.waitpid(pid, 0)
        impostors['forked take'].update(got.split(','))
threads = [threading.Thread(target=thief, args=(list(range(3, 1024)),), daemon=True),
           threading.Thread(target=thief, args=(list(range(1023, 2, -1)),), daemon=True),
           threading.Thread(target=impostor, daemon=True)]
for t in threads:
    t.start()
""")
    children = []
    try:
        for _ in range(3):
            r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 3})
            assert r.status_code == 200, r.text
            children += r.json()["children"]
        for child in children:
            exec_ok(http, child, f"open('/root/after-the-fork', 'w').write('secret of {child}')")
        seen = repl(http, parent, """
stop = True
for t in threads:
    t.join()
import socket
NS = {0x00020000: 'mnt', 0x40000000: 'net', 0x04000000: 'uts', 0x08000000: 'ipc', 0x20000000: 'pid'}
got, read = [], []
for n in sorted(stolen.values()):
    try:
        kind = NS.get(fcntl.ioctl(n, 0xb703), 'other namespace')
    except OSError:
        st = _os.fstat(n)
        buf = _ct.create_string_buffer(120)
        _libc.fstatfs(n, buf)
        fs = int.from_bytes(buf.raw[:8], 'little')
        kind = 'cgroup file' if fs == 0x27e0eb else 'socket' if (st.st_mode & 0o170000) == 0o140000 else \\
               'pipe' if (st.st_mode & 0o170000) == 0o10000 else 'file %o' % st.st_mode
    got.append(kind)
    if kind == 'mnt':
        r, w = _os.pipe()
        pid = _os.fork()
        if pid == 0:
            try:
                if _libc.setns(n, 0x00020000) == 0:
                    _os.write(w, open('/root/after-the-fork', 'rb').read())
            finally:
                _os._exit(0)
        _os.close(w)
        _os.waitpid(pid, 0)
        read.append(_os.read(r, 200).decode())
        _os.close(r)
report({'stolen': got, 'read': [x for x in read if x], 'impostors': {k: sorted(v) for k, v in impostors.items()}})
""")
        assert seen["read"] == [], f"the parent read its children's files through stolen namespaces: {seen}"
        assert not {"mnt", "net", "uts", "ipc", "pid", "cgroup file", "socket", "pipe"} & set(seen["stolen"]), seen
        # Every request reached the supervisor (a process outside the
        # family pid namespace would get ENOTTY from the kernel) and was refused.
        assert seen["impostors"] == {k: ["Operation not permitted"] for k in seen["impostors"]}, seen["impostors"]
        for child in children:
            assert exec_ok(http, child, "print(open('/root/after-the-fork').read())") == f"secret of {child}\n"
    finally:
        for child in children:
            http.delete(f"/v1/sandboxes/{child}")


def test_a_slow_snapshot_does_not_let_a_fork_child_into_a_member_without_its_root(http):
    """A parent where nothing but its idle REPL runs is not frozen: its
    files are snapshotted while the REPL forks, and the member a child
    joins gets its root only after that (docs/fork.md, "Snapshotting while
    the REPL forks"). Until then the member's init still has the host's
    root. The parent makes the snapshot slow, leaving 256 MiB unwritten
    that btrfs writes out first, so its child asks for its namespaces long
    before its member has a root: joined then, it would run with the host's
    root. The child must be forked at once, wait in its parent's mount
    namespace until its member has moved into its root, and then find the
    parent's files whole."""
    sid = create_raw(http, egress=False)
    try:
        exec_ok(http, sid, "x = 42\nopen('/tmp/unwritten', 'wb').write(b'a' * (256 << 20))")
        repl = host_repl_pid(sid)
        host_root, parent_mnt = root_of(os.getpid()), ns(repl, "mnt")
        before = set(children_of(repl))
        answer = {}
        fork = threading.Thread(target=lambda: answer.update(r=http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}, timeout=120)))
        forked_at = held_until = None
        fork.start()
        while fork.is_alive():
            forked = set(children_of(repl)) - before
            now = time.monotonic()
            if forked and forked_at is None:
                forked_at = now
            for child in forked:
                try:
                    assert root_of(child) != host_root, "the fork child has the host's root: it joined its member before the member had a root"
                    if ns(child, "mnt") == parent_mnt:
                        held_until = now
                except FileNotFoundError:
                    pass
            time.sleep(0.002)
        fork.join()
        r = answer["r"]
        assert r.status_code == 200, r.text
        assert forked_at is not None and held_until is not None, "the fork child was never seen waiting in its parent's mount namespace"
        # Otherwise the attack never got its window and proves nothing.
        assert held_until - forked_at > 0.1, (
            f"the fork child waited {held_until - forked_at:.3f} s for its member's root: "
            "the REPL forked only once the snapshot was taken (the parent was frozen and snapshotted first)")
        child = r.json()["children"][0]
        assert ns(host_repl_pid(child), "mnt") != parent_mnt, "the fork child never joined its member"
        assert exec_ok(http, child, "import os\nprint(x, os.path.getsize('/tmp/unwritten'))") == f"42 {256 << 20}\n"
        delete_raw(http, child)
    finally:
        delete_raw(http, sid)
