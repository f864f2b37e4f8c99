"""Isolation, tried from inside sandboxes: the host's files and processes
are invisible, root inside is an unprivileged uid outside, privileged
operations fail, resource bombs hit only their own sandbox, and sandboxes
cannot see each other."""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest

from helpers import (
    REPO,
    SANDBOX_UID_BASE, create_raw, delete_raw, exec_raw, proc_cmdline, sandbox_cgroup_dirs, sandbox_host_pids, uids,
)


def py(sb, code):
    r = sb.run_code(code)
    assert r.exit_code == 0, (code, r)
    return r.stdout


def sh(sb, cmd):
    return sb.run_code(cmd, language="bash")


@pytest.fixture
def host_marker():
    path = f"/root/forkbox-e2e-host-marker-{uuid.uuid4().hex[:8]}"
    with open(path, "w") as f:
        f.write("host secret\n")
    yield path
    os.unlink(path)


def test_host_files_are_invisible(sandbox, host_marker):
    out = py(sandbox, "import os\nfor p in [" + repr(REPO) + ", '/root/.cargo', '/var/lib/forkbox', "
                      f"'/var/lib/forkbox-e2e', {host_marker!r}, '/root/.pyenv']:\n    print(p, os.path.exists(p))")
    for line in out.split("\n"):
        assert line.endswith(" False"), out
    # /root is the template's, not the host's
    listing = py(sandbox, "print(sorted(os.listdir('/root')))")
    assert os.path.basename(host_marker) not in listing and ".cargo" not in listing, listing


def test_proc_does_not_reveal_host_paths(sandbox, server):
    """What a sandbox can read about its own processes must not tell it the
    host's paths (binary, state dir, templates)."""
    r = sh(sandbox, "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
    assert r.exit_code == 0, r
    for host_path in (server.state_dir, REPO, "/var/lib/forkbox", "target/debug"):
        assert host_path not in r.stdout, (host_path, r.stdout[:2000])


def test_hostname_is_the_sandbox_id(sandbox):
    host_hostname = socket.gethostname()
    out = py(sandbox, "import socket, os\nprint(socket.gethostname())\nprint(os.uname().nodename)")
    assert out == f"{sandbox.id}\n{sandbox.id}"
    etc_hostname = py(sandbox, "import os\nprint(open('/etc/hostname').read().strip() if os.path.exists('/etc/hostname') else '')")
    with open("/etc/hostname") as f:
        assert etc_hostname != f.read().strip() or etc_hostname == ""
    assert sandbox.id != host_hostname


def test_proc_shows_only_the_sandbox(sandbox):
    r = sh(sandbox, "ps -e -o pid=,comm=")
    assert r.exit_code == 0, r
    procs = [line.split(None, 1) for line in r.stdout.strip().split("\n")]
    comms = [c for _, c in procs]
    assert len(procs) <= 6, procs
    for bad in ("pytest", "systemd", "process_api", "sshd", "cargo", "bash /dev/fd"):
        assert not any(bad in c for c in comms), procs
    # the sandbox's own init may be a forkbox process; the server may not
    args = sh(sandbox, "ps -e -o args=").stdout
    assert " serve " not in args and "--listen" not in args, args
    out = py(sandbox, "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint(len(pids))\n"
                      "cmds = [open(f'/proc/{p}/cmdline','rb').read() for p in pids]\n"
                      "print(any(b'pytest' in c or b' serve ' in c for c in cmds))")
    n, host_seen = out.split("\n")
    assert int(n) <= 6 and host_seen == "False", out


def test_root_inside_is_an_unprivileged_uid_outside(sandbox):
    assert py(sandbox, "import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getegid())") == "0 0 0 0"
    r = sh(sandbox, "id -u; cat /proc/self/uid_map")
    uid, mapping = r.stdout.split("\n")
    inside, outside, count = mapping.split()
    assert uid == "0" and inside == "0" and int(outside) >= SANDBOX_UID_BASE and int(count) <= 65536, r
    pids = sandbox_host_pids(sandbox.id)
    assert pids, "no processes found in the sandbox's cgroup"
    pythons = [p for p in pids if proc_cmdline(p)[:1] == ["/usr/bin/python3"]]
    assert pythons, [(p, proc_cmdline(p)) for p in pids]
    for p in pids:
        u = uids(p)
        assert u and all(x >= SANDBOX_UID_BASE for x in u), (p, proc_cmdline(p), u)


def test_mounting_fails(sandbox):
    r = sh(sandbox, "mount -t tmpfs none /mnt")
    assert r.exit_code != 0, r
    out = py(sandbox, "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                      "rc = libc.mount(b'none', b'/mnt', b'tmpfs', 0, None)\nprint(rc, ctypes.get_errno())")
    rc, errno_ = map(int, out.split())
    assert rc == -1 and errno_ in (1, 13), out  # EPERM / EACCES
    r = sh(sandbox, "grep -c ' /mnt ' /proc/self/mountinfo")
    assert r.stdout == "0", r


def test_loading_kernel_modules_fails(sandbox):
    out = py(sandbox, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                      "print(libc.init_module(0, 0, b''), ctypes.get_errno())")
    assert out == "-1 1", out  # EPERM
    r = sh(sandbox, "python3 -c \"import ctypes; libc=ctypes.CDLL(None, use_errno=True); "
                    "print(libc.init_module(0,0,b''), ctypes.get_errno())\"")
    assert r.stdout == "-1 1", r


def test_raw_sockets_are_refused(sandbox):
    out = py(sandbox, "import socket\ntry:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)\n    print('opened')\n"
                      "except PermissionError as e:\n    print('refused', e.errno)")
    assert out == "refused 1", out
    r = sh(sandbox, "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'")
    assert r.exit_code != 0 and "PermissionError" in r.stderr, r


def test_new_user_namespaces_are_refused(sandbox):
    r = sh(sandbox, "unshare --user true")
    assert r.exit_code != 0, r
    r = sh(sandbox, "unshare -U -r id -u")
    assert r.exit_code != 0, r
    out = py(sandbox, "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                      "print(libc.unshare(0x10000000), libc.unshare(0x20000000), libc.unshare(0x00020000))")
    assert out == "-1 -1 -1", out  # CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNS


def test_no_network_beyond_loopback(make_sandbox):
    # egress off (the server's default is on; docs/network.md)
    sandbox = make_sandbox(egress=False)
    out = py(sandbox, "import socket\ns = socket.socket()\ns.settimeout(2)\n"
                      "try:\n    s.connect(('1.1.1.1', 80))\n    print('connected')\nexcept OSError as e:\n    print('no route')")
    assert out == "no route"
    # but loopback works inside the sandbox
    out = py(sandbox, "import socket\nsrv = socket.socket()\nsrv.bind(('127.0.0.1', 0))\nsrv.listen()\n"
                      "c = socket.create_connection(srv.getsockname())\na, _ = srv.accept()\nc.sendall(b'hi')\n"
                      "print(a.recv(2).decode())")
    assert out == "hi"


def test_memory_bomb_kills_only_its_own_repl(make_sandbox, http):
    keeper = make_sandbox()
    bomb = make_sandbox(ram_mib=256)
    py(keeper, "kept = list(range(1000))")
    e = exec_raw(http, bomb.id, "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))")
    assert e.exit_code != 0, e
    assert any(x.get("ename") == "MemoryError" for x in e.errors), e
    assert py(keeper, "print(sum(kept))") == str(sum(range(1000)))
    assert http.get("/v1/healthz").text == "ok"
    # the bomb's sandbox works again (state lost, told so)
    e = exec_raw(http, bomb.id, "print('hog' in globals())")
    assert e.exit_code == 0 and e.stdout == "False\n" and len(e.warnings) == 1, e


def _pids_current(sid: str) -> int:
    for d in sandbox_cgroup_dirs(sid):
        f = os.path.join(d, "pids.current")
        if os.path.exists(f):
            return int(open(f).read())
    raise AssertionError(f"no pids.current for {sid}")


def test_python_fork_loop_is_stopped_by_the_pids_limit(small_http, small_sandbox):
    """The small server runs with --pids-limit 128."""
    code = ("import os, errno\nr, w = os.pipe()\nkids = []\nerr = None\n"
            "for i in range(1000):\n"
            "    try:\n        pid = os.fork()\n    except OSError as e:\n        err = e.errno\n        break\n"
            "    if pid == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)\n"
            "    kids.append(pid)\n"
            "print(len(kids), err == errno.EAGAIN)\n"
            "os.close(w)\nfor k in kids:\n    os.waitpid(k, 0)\nprint('reaped')")
    e = exec_raw(small_http, small_sandbox, code, timeout_ms=60_000)
    assert e.exit_code == 0, e
    n, eagain, reaped = e.stdout.split()
    assert 1 <= int(n) < 128 and eagain == "True" and reaped == "reaped", e
    e = exec_raw(small_http, small_sandbox, "echo alive", language="bash")
    assert e.exit_code == 0 and e.stdout == "alive\n", e


def test_bash_fork_bomb_is_contained(small_server, small_http, small_sandbox):
    sid = small_sandbox
    assert exec_raw(small_http, sid, "state = 'survives'").exit_code == 0
    peak = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                peak.append(_pids_current(sid))
            except (AssertionError, OSError, ValueError):
                pass
            time.sleep(0.1)
    w = threading.Thread(target=watch)
    w.start()
    t0 = time.monotonic()
    try:
        e = exec_raw(small_http, sid, ":(){ :|:& };:; sleep 10", language="bash", timeout_ms=3000)
    finally:
        done.set()
        w.join()
    assert time.monotonic() - t0 < 15
    assert e.exit_code == 124, e
    assert peak and max(peak) <= 128, max(peak or [0])
    # the REPL (no fork needed) answers with its state
    e = exec_raw(small_http, sid, "print(state)", timeout_ms=10_000)
    assert e.exit_code == 0 and e.stdout == "survives\n", e
    # the bomb's processes are gone, and new processes can start again
    deadline = time.monotonic() + 10
    while _pids_current(sid) > 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _pids_current(sid) <= 10, _pids_current(sid)
    e = exec_raw(small_http, sid, "echo recovered", language="bash")
    assert e.exit_code == 0 and e.stdout == "recovered\n", e
    assert small_http.get("/v1/healthz").text == "ok"


def test_bomb_left_running_is_cleaned_up_by_delete(small_http):
    """A fork bomb that outlives its bash call (fully detached) dies with the sandbox."""
    sid = create_raw(small_http)
    e = exec_raw(small_http, sid, "setsid bash -c ':(){ :|:& };:' >/dev/null 2>&1 &\necho launched", language="bash")
    assert e.exit_code == 0, e
    time.sleep(1.0)
    assert _pids_current(sid) > 20
    t0 = time.monotonic()
    assert delete_raw(small_http, sid) == 204
    assert time.monotonic() - t0 < 15
    assert sandbox_cgroup_dirs(sid) == []


def test_sandboxes_cannot_see_each_other(make_sandbox):
    a, b = make_sandbox(), make_sandbox()
    assert sh(a, "echo secret-a > /root/a.txt && (sleep 777 >/dev/null 2>&1 &) && echo ok").stdout == "ok"
    assert sh(b, "test -e /root/a.txt && echo visible || echo invisible").stdout == "invisible"
    r = sh(b, "ps -eo args")
    assert "sleep 777" not in r.stdout, r
    assert sh(a, "ps -eo args").stdout.count("sleep 777") == 1
    out = py(b, "import os\nprint(any(b'777' in open(f'/proc/{p}/cmdline','rb').read() for p in os.listdir('/proc') if p.isdigit()))")
    assert out == "False"
    # different hostnames, and b's writes do not reach a
    assert sh(b, "echo b > /tmp/shared-name").exit_code == 0
    assert sh(a, "cat /tmp/shared-name 2>/dev/null || echo absent").stdout == "absent"
