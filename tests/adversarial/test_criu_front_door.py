"""criu's front door (docs/state.md#processes-spaces): what a sandbox can do
to a freeze that dumps it whole, and to the sandbox it comes back as.

- The images are the server's alone: root's, 0600 in a 0700 directory,
  outside every sandbox's mounts, before and after a resume.
- A restored sandbox gets no more than it had: a new uid range of its own,
  the same capabilities, seccomp filters and no_new_privs, its memory
  limit, its egress policy.
- Tricks played while it is dumped (an attempt at a nested user namespace, credentials
  changed in a loop, hundreds of threads, a 64 GiB sparse mapping, a copy
  of the REPL's control socket handed to a child) each end cleanly: the
  freeze answers 200 with the kind it made, the sandbox comes back
  answering, confined as before, and the server goes on serving.
- A process of another user than the sandbox's root (E2B's `user`) comes
  back, from a freeze and in a criu fork's child, as that user with what
  it held and nothing more: the tools root's criu sets its ids keeping
  capabilities only for as long as it sets them.
- A lazy resume (docs/state.md#lazy-resume) leaves no process of the
  sandbox holding `/dev/userfaultfd` or a userfaultfd, and the sandbox
  cannot make one; a lazy-pages daemon killed while it fills the memory
  never lets the sandbox read a page it had not filled."""
from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import stat
import threading
import time

import pytest

from adversary import healthy, uid_base
from helpers import (SANDBOX_UID_BASE, Watch, create_raw, delete_raw, exec_ok, exec_raw, fd_links, freeze, host_repl_pid, lazy_daemons,
                     proc_cmdline, proc_status, resume, sandbox_host_pids)

CONFINEMENT = ("CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:", "NoNewPrivs:", "Seccomp:", "Seccomp_filters:")


def confinement(sid: str) -> dict:
    status = proc_status(host_repl_pid(sid))
    return {k: status[k.rstrip(":")] for k in CONFINEMENT}


def test_the_images_are_the_servers_alone_and_out_of_every_sandboxs_reach(server, http):
    sid = create_raw(http, keep_processes=True, egress=False)
    exec_ok(http, sid, "x = 1")
    space = freeze(http, sid)
    assert space["kind"] == "processes", space
    home = os.path.join(server.state_dir, "spaces", space["space_id"])
    images = os.path.join(home, "images")
    st = os.stat(images)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o700)
    for name in os.listdir(images):
        st = os.stat(os.path.join(images, name))
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600), name
    new = resume(http, space["space_id"])
    other = create_raw(http, egress=False)
    for who in (new, other):
        out = exec_ok(http, who, "grep -c -e spaces -e images /proc/self/mountinfo; "
                      "find / -xdev \\( -name 'pages-*.img' -o -name 'inventory.img' \\) 2>/dev/null | head -3", language="bash")
        assert out == "0\n", (who, out)
    delete_raw(http, new)
    delete_raw(http, other)


def test_a_restored_sandbox_gets_no_more_than_it_had(http):
    sid = create_raw(http, keep_processes=True, ram_mib=512, egress=False)
    exec_ok(http, sid, "import socket\nkept = 1")
    before, base = confinement(sid), uid_base(http, sid)
    victim = create_raw(http, keep_processes=True, egress=False)
    new = resume(http, freeze(http, sid)["space_id"])
    assert confinement(new) == before
    new_base = uid_base(http, new)
    assert new_base >= SANDBOX_UID_BASE and new_base not in (base, uid_base(http, victim)), (base, new_base)
    assert all(u >= SANDBOX_UID_BASE for u in map(int, proc_status(host_repl_pid(new))["Uid"].split()))
    # Its memory limit: 600 MiB does not fit in 512.
    hog = exec_raw(http, new, "b = bytearray(600 << 20)")
    assert hog.exit_code != 0, hog.events[-3:]
    # Its egress policy: still no way out.
    out = exec_ok(http, new, "import socket\ntry:\n    socket.create_connection(('pypi.org', 443), timeout=5); print('OUT')\n"
                             "except OSError as e:\n    print('blocked')")
    assert out == "blocked\n", out
    for s in (new, victim):
        delete_raw(http, s)


TRICKS = {
    # A process that tries for a user namespace of its own (refused inside;
    # criu would bring a nested one back in the sandbox's, with its capabilities).
    "an attempt at a nested user namespace": "import subprocess\nnest = subprocess.Popen(['unshare', '--user', '--map-root-user', 'sleep', '1000'])",
    # Credentials flipping while criu reads them.
    "credentials changed in a loop": (
        "import os, threading\nflipping = [True]\ndef flip():\n    while flipping[0]:\n        os.setresuid(0, 1000, 0); os.setresuid(0, 0, 0)\n"
        "threading.Thread(target=flip, daemon=True).start()"),
    "hundreds of threads": (
        "import threading\nstop = threading.Event()\nthreads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(400)]\n"
        "for t in threads: t.start()"),
    "a 64 GiB sparse mapping": (
        "import mmap\nm = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_NORESERVE)\n"
        "m[0] = 1; m[(64 << 30) - 1] = 2"),
    # A process of another user than the sandbox's root (a criu without
    # forkbox's restorer patch would fail to restore it, then hang).
    "a process of another user": "import subprocess\nother = subprocess.Popen(['sleep', '1000'], user=1000, group=1000)",
    # The REPL's control socket, copied and handed to a child that outlives it.
    "a copy of the control socket held by a child": (
        "import os, subprocess\nctl = os.dup(3)\nholder = subprocess.Popen(['sleep', '1000'], pass_fds=(ctl,))"),
}


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_played_during_a_dump_end_cleanly(server, http, trick):
    sid = create_raw(http, keep_processes=True, ram_mib=1024, egress=False)
    before = confinement(sid)
    exec_ok(http, sid, TRICKS[trick] + "\nmarker = 'kept'")
    r = http.post(f"/v1/sandboxes/{sid}/freeze")
    if r.status_code == 409:
        # A globals freeze the trick itself spoiled (the REPL's state file
        # written under a flipped uid): the sandbox goes on as it was.
        assert "could not save the REPL's state" in r.json()["error"], r.text
        assert exec_ok(http, sid, "flipping = [False]\nimport time; time.sleep(0.05)\nprint(marker)") == "kept\n"
        assert confinement(sid) == before and healthy(http)
        delete_raw(http, sid)
        return
    assert r.status_code == 200, r.text
    space = r.json()
    assert space["kind"] in ("processes", "globals"), space
    if space["kind"] == "globals":
        assert "criu could not dump it" in space["processes_not_kept"], space
    print(f"{trick}: {space.get('processes_not_kept') or 'kept'}")
    assert space["bytes"] < 2 << 30, space  # the sparse mapping's holes are not written
    new = resume(http, space["space_id"])
    # (A flipper kept running is stopped: its effective set comes and goes.)
    assert exec_ok(http, new, "flipping = [False]\nimport time; time.sleep(0.05)\nprint(marker)") == "kept\n"
    assert confinement(new) == before
    assert all(u >= SANDBOX_UID_BASE for u in map(int, proc_status(host_repl_pid(new))["Uid"].split()))
    # It can be frozen again, and the server serves on.
    again = resume(http, freeze(http, new)["space_id"])
    assert exec_ok(http, again, "print(marker)") == "kept\n"
    assert healthy(http)
    delete_raw(http, again)


def test_a_criu_forks_children_get_no_more_than_the_parent_and_nothing_of_each_other(server, http):
    """A keep_processes sandbox forks through criu (docs/fork.md): one dump,
    restored once per child. Each child is a family of its own: a uid
    range, user and network namespaces none other shares, the parent's
    confinement and no more; the dump is gone once the fork answers."""
    sid = create_raw(http, keep_processes=True, egress=False)
    exec_ok(http, sid, "import socket\nl = socket.create_server(('127.0.0.1', 9000))\nsecret = 'parent'")
    children = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2}).json()["children"]
    everyone = [sid] + children
    before = confinement(sid)
    assert all(confinement(child) == before for child in children)
    bases = [uid_base(http, s) for s in everyone]
    assert len(set(bases)) == 3 and min(bases) >= SANDBOX_UID_BASE, bases
    for ns in ("user", "net", "pid", "mnt", "ipc", "uts"):
        inodes = {os.stat(f"/proc/{host_repl_pid(s)}/ns/{ns}").st_ino for s in everyone}
        assert len(inodes) == 3, (ns, inodes)
    spaces = os.path.join(server.state_dir, "spaces")
    left = [d for d in os.listdir(spaces) if "fork" in d] if os.path.isdir(spaces) else []
    assert left == [], left
    # A child's loopback is its own: its listener is a copy, the parent's
    # is not reachable from it.
    exec_ok(http, sid, "l.close()")
    out = exec_ok(http, children[0], "c = socket.create_connection(('127.0.0.1', 9000), timeout=2); p, _ = l.accept(); print('own')")
    assert out == "own\n", out
    for child in children:
        out = exec_ok(http, child, "grep -c -e spaces -e images /proc/self/mountinfo; true", language="bash")
        assert out == "0\n", out
    for s in everyone:
        delete_raw(http, s)


@pytest.mark.parametrize("trick", TRICKS)
def test_tricks_played_during_a_criu_fork_end_cleanly(http, trick):
    """The same tricks while a fork dumps the sandbox: the fork makes its
    children, each as confined as the parent, or answers 409 and the
    parent goes on as it was."""
    sid = create_raw(http, keep_processes=True, ram_mib=1024, egress=False)
    before = confinement(sid)
    exec_ok(http, sid, TRICKS[trick] + "\nmarker = 'kept'")
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
    children = r.json()["children"] if r.status_code == 200 else []
    if r.status_code != 200:
        assert r.status_code == 409 and "could not fork" in r.json()["error"], r.text
        print(f"{trick}: {r.json()['error'][:200]}")
    for s in [sid] + children:
        assert exec_ok(http, s, "flipping = [False]\nimport time; time.sleep(0.05)\nprint(marker)") == "kept\n"
        assert confinement(s) == before
        assert all(u >= SANDBOX_UID_BASE for u in map(int, proc_status(host_repl_pid(s))["Uid"].split()))
    assert healthy(http)
    for s in [sid] + children:
        delete_raw(http, s)


# Run as uid 1000: answers each connection on 127.0.0.1:9300 with its
# credentials as the kernel holds them, and whether it can become root.
REPORTER = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
KEYS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters")
def report():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    fields = {k: " ".join(status[k].split()) for k in KEYS}
    fields["securebits"] = libc.prctl(27, 0, 0, 0, 0)  # PR_GET_SECUREBITS
    for name, call in (("setuid(0)", lambda: os.setuid(0)), ("setgid(0)", lambda: os.setgid(0))):
        try:
            call(); fields[name] = "allowed"
        except PermissionError:
            fields[name] = "EPERM"
    return repr(sorted(fields.items()))
listener = socket.create_server(("127.0.0.1", 9300))
while True:
    conn, _ = listener.accept(); conn.sendall(report().encode()); conn.close()
"""
ASK_REPORTER = ("import socket, time\nfor _ in range(200):\n    try:\n        print(socket.create_connection(('127.0.0.1', 9300), timeout=5).recv(4096).decode()); break\n"
                "    except ConnectionRefusedError:\n        time.sleep(0.05)")


def reporter_host_uid(sid: str) -> int:
    """The host uid of the REPL's child running as uid 1000 in `sid`."""
    repl = host_repl_pid(sid)
    children = open(f"/proc/{repl}/task/{repl}/children").read().split()
    uids = [int(proc_status(int(c))["Uid"].split()[0]) for c in children]
    assert len(uids) == 1, uids
    return uids[0]


def test_a_process_of_another_user_comes_back_as_that_user_with_nothing_more(server, http):
    sid = create_raw(http, keep_processes=True, egress=False)
    exec_ok(http, sid, f"import subprocess\nreporter = subprocess.Popen(['python3', '-c', {REPORTER!r}], user=1000, group=1000)")
    before = exec_ok(http, sid, ASK_REPORTER)
    for held in ("('Uid', '1000 1000 1000 1000')", "('Gid', '1000 1000 1000 1000')", "('CapEff', '0000000000000000')",
                 "('CapPrm', '0000000000000000')", "('securebits', 0)", "('setuid(0)', 'EPERM')", "('setgid(0)', 'EPERM')"):
        assert held in before, (held, before)
    assert reporter_host_uid(sid) == uid_base(http, sid) + 1000
    space = freeze(http, sid)
    assert space["kind"] == "processes", space
    new = resume(http, space["space_id"])
    # The same process (its listener kept), as the same user, holding the same.
    assert exec_ok(http, new, ASK_REPORTER) == before
    assert reporter_host_uid(new) == uid_base(http, new) + 1000
    assert exec_ok(http, new, "print(reporter.poll())") == "None\n"
    # A criu fork's child holds it too, in its own range.
    children = http.post(f"/v1/sandboxes/{new}/fork", json={"n": 1}).json()["children"]
    assert exec_ok(http, children[0], ASK_REPORTER) == before
    assert reporter_host_uid(children[0]) == uid_base(http, children[0]) + 1000
    assert healthy(http)
    for s in [new] + children:
        delete_raw(http, s)


MAKE_ONE = """import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(323, 0)  # userfaultfd(2)
print('syscall', fd, errno.errorcode.get(ctypes.get_errno()))
try:
    os.open('/dev/userfaultfd', os.O_RDWR)
    print('device opened')
except OSError as e:
    print('device', errno.errorcode[e.errno])"""


def test_a_lazy_resume_leaves_no_userfaultfd_in_the_sandbox(http):
    sid = create_raw(http, keep_processes=True, ram_mib=1024, egress=False)
    exec_ok(http, sid, "import hashlib, os, subprocess\ndata = os.urandom(256 << 20)\nwant = hashlib.sha256(data).hexdigest()\n"
                       "child = subprocess.Popen(['sleep', '1000'])")
    with Watch(lazy_daemons) as seen:
        new = resume(http, freeze(http, sid)["space_id"])
        # At once, while the daemon may still fill the memory, and after.
        at_once = [link for link in fd_links(sandbox_host_pids(new)) if "userfaultfd" in link]
    assert seen, "no criu lazy-pages daemon ran: the resume was not lazy"
    assert at_once == [], at_once
    assert exec_ok(http, new, "print(hashlib.sha256(data).hexdigest() == want, child.poll())") == "True None\n"
    assert [link for link in fd_links(sandbox_host_pids(new)) if "userfaultfd" in link] == []
    out = exec_ok(http, new, MAKE_ONE)
    assert out == "syscall -1 EPERM\ndevice ENOENT\n", out
    delete_raw(http, new)
    assert healthy(http)


class TaskUserfaultfdWatch:
    """Tells when a lazy-pages daemon holds a restored task's userfaultfd.
    Its own probe's userfaultfd comes and goes before it listens (while it
    holds one socket, the shim's); once it listened, any userfaultfd it
    holds is a task's, until every page is in."""

    def __init__(self):
        self.listened: set[int] = set()

    def holds_one(self, pid: int) -> bool:
        links = fd_links([pid])
        if sum("socket:" in link for link in links) >= 2:
            self.listened.add(pid)
        return pid in self.listened and any("anon_inode:[userfaultfd]" in link for link in links)


def test_a_lazy_pages_daemon_killed_mid_resume_never_leaves_zeroed_memory(http):
    sid = create_raw(http, keep_processes=True, ram_mib=2048, egress=False)
    exec_ok(http, sid, "import hashlib, os\ndata = os.urandom(768 << 20)\nwant = hashlib.sha256(data).hexdigest()")
    space = freeze(http, sid)["space_id"]
    # Killed as soon as it holds a task's userfaultfd: while the restore
    # hands them over (the restore fails at once, and the Space is put
    # back), or just after (the sandbox runs, and is killed below).
    killed = []
    stop = threading.Event()
    watch = TaskUserfaultfdWatch()

    def hunt():
        while not stop.is_set() and not killed:
            for pid in lazy_daemons():
                if watch.holds_one(pid):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.001)
    t = threading.Thread(target=hunt)
    t.start()
    try:
        r = http.post(f"/v1/spaces/{space}/resume", json={}, timeout=300)
    finally:
        stop.set()
        t.join()
    assert killed, "no lazy-pages daemon took the restore's userfaultfds: the resume was not lazy"
    if r.status_code != 200:
        assert r.status_code >= 500 and "error" in r.json(), r.text
        # Killed once the sandbox runs, while the rest of its pages come in.
        new = resume(http, space)
        daemons = lazy_daemons()
        assert daemons, "the resumed sandbox's pages were all in before its answer"
        for pid in daemons:
            os.kill(pid, signal.SIGKILL)
    else:
        new = r.json()["id"]
    # The sandbox is killed before it could read a page that was not
    # filled: its exec finds its REPL gone (or a new REPL), never a wrong
    # sum or a REPL crashed on zeros (without the shim's hold and kill,
    # it dies of SIGSEGV).
    out = exec_raw(http, new, "print(hashlib.sha256(data).hexdigest() == want)", timeout_ms=60_000)
    said = str(out.events)
    assert out.exit_code != 0 and "False" not in out.stdout, (out.exit_code, out.stdout, out.events[-3:])
    assert ("ReplDied" in said or "NameError" in said) and "SIGSEGV" not in said and "SIGBUS" not in said, out.events[-3:]
    delete_raw(http, new)
    assert healthy(http)


def userfaultfds(pid: int) -> list[int]:
    """The descriptors of host process `pid` that are userfaultfds."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if "userfaultfd" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                found.append(int(fd))
        except FileNotFoundError:
            pass
    return found


def same_file(pid_a: int, fd_a: int, pid_b: int, fd_b: int) -> bool:
    """kcmp(KCMP_FILE): whether two processes' descriptors are one open
    file (every userfaultfd shares one inode, so only this tells)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(312, pid_a, pid_b, 0, fd_a, fd_b) == 0  # SYS_kcmp on x86_64


FORK_WAITING = """r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0 if hashlib.sha256(data).hexdigest() == want else 3)
print(pid)"""


def test_a_task_forked_while_its_pages_come_in_is_held_too(http):
    """A task the tree forks while its pages come in gets a userfaultfd the
    kernel hands the daemon alone: the shim must hold it too, or a daemon
    that dies leaves that task's pages to be filled with zeros."""
    sid = create_raw(http, keep_processes=True, ram_mib=2048, egress=False)
    exec_ok(http, sid, "import hashlib, os\ndata = os.urandom(768 << 20)\nwant = hashlib.sha256(data).hexdigest()")
    new = resume(http, freeze(http, sid)["space_id"])
    child = exec_ok(http, new, FORK_WAITING).strip()
    daemons = lazy_daemons()
    assert len(daemons) == 1, f"the pages were all in before the fork (daemons: {daemons})"
    daemon = daemons[0]
    # Stopped, the daemon keeps what it holds as it is while we look.
    os.kill(daemon, signal.SIGSTOP)
    try:
        shim = int(proc_status(daemon)["PPid"])
        theirs, ours = userfaultfds(daemon), userfaultfds(shim)
        assert len(theirs) >= 2, ("the REPL's and its child's userfaultfds should both still be the daemon's", theirs)
        unheld = [fd for fd in theirs if not any(same_file(daemon, fd, shim, mine) for mine in ours)]
        assert unheld == [], f"the daemon alone holds userfaultfds {unheld} (the shim holds {ours})"
    finally:
        # The daemon dies: the tree is killed before the child reads a page.
        os.kill(daemon, signal.SIGKILL)
    out = exec_raw(http, new, f"os.write(w, b'x')\nprint(os.waitpid({child}, 0))", timeout_ms=60_000)
    said = str(out.events)
    assert out.exit_code != 0 and f"({child}, 768)" not in out.stdout, (out.exit_code, out.stdout, out.events[-3:])
    assert "ReplDied" in said or "NameError" in said, out.events[-3:]
    delete_raw(http, new)
    assert healthy(http)
