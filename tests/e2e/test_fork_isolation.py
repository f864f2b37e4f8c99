"""Isolation between the members of a family, tried from inside them: after a
fork, the parent, the children and their siblings share a user and a pid
namespace (docs/architecture.md#processes-and-namespaces), so every way of naming another member's process
is attempted here and must fail — from the REPLs (which see the family's pid
namespace) and from bash (which sees only its own sandbox)."""
from __future__ import annotations

import json

import pytest

from helpers import create_raw, delete_raw, exec_ok, exec_raw


def fork(http, sid: str, n: int) -> list[str]:
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": n})
    assert r.status_code == 200, r.text
    return r.json()["children"]


py = exec_ok


@pytest.fixture
def family(http):
    """A parent with a background process, and two children of it."""
    parent = create_raw(http)
    py(http, parent, "import os, subprocess, json, ctypes, signal\n"
                     "bg = subprocess.Popen(['sleep', '1000'])")
    a, b = fork(http, parent, 2)
    members = {"parent": parent, "a": a, "b": b}
    # Each member's REPL pid (in the family pid namespace) and a background process of its own.
    info = {}
    for name, sid in members.items():
        if name != "parent":
            py(http, sid, "bg = subprocess.Popen(['sleep', '1000'])")
        info[name] = json.loads(py(http, sid, "print(json.dumps({'repl': os.getpid(), 'bg': bg.pid}))"))
    yield members, info
    for sid in members.values():
        delete_raw(http, sid)


def alive(http, sid: str) -> bool:
    """The member's REPL still holds its state and its background sleep runs."""
    r = exec_raw(http, sid, "print(bg.poll() is None)")
    return r.exit_code == 0 and r.stdout == "True\n" and not r.warnings


def test_ps_and_proc_show_only_the_members_own_processes(http, family):
    members, _ = family
    for name, sid in members.items():
        out = exec_raw(http, sid, "ps -eo pid,args --no-headers", "bash").stdout
        sleeps = [line for line in out.splitlines() if "sleep 1000" in line]
        assert len(sleeps) == 1, (name, out)
        listed = py(http, sid, "print(sum(1 for p in os.listdir('/proc') if p.isdigit() and b'sleep' in open(f'/proc/{p}/cmdline','rb').read()))")
        assert listed == "1\n", name


def test_guessed_pids_of_other_members_look_nonexistent(http, family):
    members, info = family
    mine = info["a"]["repl"]
    others = [info[n][k] for n in ("parent", "b") for k in ("repl",)]
    # Guesses around the family's REPL pids (from 2^21 up; a warm pool's
    # zygote serves many creates, so they may be far above it).
    lo = max(2097152, min(mine, *others) - 1500)
    hi = max(mine, *others) + 1500
    code = (f"found = []\nfor pid in sorted(set(range({lo}, {hi})) | set({others})):\n"
            "    try:\n        os.kill(pid, 0)\n        found.append(pid)\n"
            "    except ProcessLookupError:\n        pass\n"
            "    except PermissionError:\n        found.append(-pid)\n"
            "print(json.dumps(found))")
    found = json.loads(py(http, members["a"], code))
    assert mine in found
    for pid in others:
        assert pid not in found and -pid not in found, (pid, found)
    # Everything it found is its own: signalling it does not touch the others.
    py(http, members["a"], "for pid in " + json.dumps([p for p in found if p > 0 and p != mine]) + ":\n"
                           "    os.kill(pid, signal.SIGCONT)")
    assert alive(http, members["parent"]) and alive(http, members["b"])


def test_kill_minus_one_from_a_repl_stays_in_its_member(http, family):
    members, _ = family
    r = exec_raw(http, members["a"], "os.kill(-1, signal.SIGKILL)\nimport time\ntime.sleep(0.5)\nprint(bg.poll())")
    assert r.exit_code == 0, r
    assert r.stdout.strip() == "-9", r        # its own background process died
    assert alive(http, members["parent"]) and alive(http, members["b"])


def test_kill_zero_from_a_repl_stays_in_its_member(http, family):
    members, _ = family
    # Forked REPLs share a process group: kill(0) must still not leave the member.
    exec_raw(http, members["b"], "os.kill(0, signal.SIGKILL)")
    assert alive(http, members["parent"]) and alive(http, members["a"])


def test_direct_kills_of_other_repls_fail(http, family):
    members, info = family
    for target in ("parent", "b"):
        for call in (f"os.kill({info[target]['repl']}, signal.SIGKILL)",
                     f"signal.pthread_kill({info[target]['repl']}, signal.SIGKILL) if False else os.kill({info[target]['bg']}, signal.SIGKILL)",
                     f"ctypes.CDLL(None, use_errno=True).syscall(200, {info[target]['repl']}, 9) == 0 or (_ for _ in ()).throw(OSError(ctypes.get_errno(), 'tkill'))",
                     f"ctypes.CDLL(None, use_errno=True).syscall(234, {info[target]['repl']}, {info[target]['repl']}, 9) == 0 or (_ for _ in ()).throw(OSError(ctypes.get_errno(), 'tgkill'))",
                     f"signal.pidfd_send_signal(os.open('/proc/{info[target]['repl']}', os.O_RDONLY), 9)"):
            r = exec_raw(http, members["a"], call)
            assert r.exit_code == 1, (call, r)
    assert alive(http, members["parent"]) and alive(http, members["b"])


def test_bash_kill_and_pkill_stay_in_the_member(http, family):
    members, _ = family
    r = exec_raw(http, members["a"], "pkill -9 python; pkill -9 sleep; kill -9 -1; echo done", "bash")
    assert alive(http, members["parent"]) and alive(http, members["b"])


def test_ptrace_and_proc_mem_cannot_reach_other_members(http, family):
    members, info = family
    target = info["parent"]["repl"]
    code = ("libc = ctypes.CDLL(None, use_errno=True)\n"
            f"rc = libc.ptrace(16, {target}, None, None)\n"       # PTRACE_ATTACH
            "err = ctypes.get_errno()\n"
            "try:\n"
            f"    open('/proc/{target}/mem', 'rb')\n    mem = 'opened'\n"
            "except OSError as e:\n    mem = e.errno\n"
            "print(json.dumps([rc, err, mem]))")
    rc, err, mem = json.loads(py(http, members["a"], code))
    assert rc == -1 and err in (1, 3), (rc, err)     # EPERM or ESRCH
    assert mem != "opened"
    # process_vm_readv and pidfd_open are refused to the REPL outright.
    r = exec_raw(http, members["a"], f"import os\nos.pidfd_open({target})")
    assert r.exit_code == 1 and "PermissionError" in r.stderr, r
    assert alive(http, members["parent"])


def test_priorities_and_limits_of_other_members_are_out_of_reach(http, family):
    members, info = family
    target = info["parent"]["repl"]
    for call, err in ((f"os.setpriority(os.PRIO_PROCESS, {target}, 10)", "ProcessLookupError"),
                      ("os.setpriority(os.PRIO_USER, 0, 10)", "PermissionError"),
                      (f"os.sched_setaffinity({target}, {{0}})", "ProcessLookupError"),
                      (f"import resource\nresource.prlimit({target}, resource.RLIMIT_NOFILE, (10, 10))", "ProcessLookupError"),
                      (f"import fcntl\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, {target})", "ProcessLookupError")):
        r = exec_raw(http, members["a"], call)
        assert r.exit_code == 1 and err in r.stderr, (call, r)
    # Its own processes stay reachable.
    py(http, members["a"], "os.setpriority(os.PRIO_PROCESS, bg.pid, 5)\nos.setpriority(os.PRIO_PROCESS, 0, 1)")
    assert alive(http, members["parent"])


def test_memory_written_in_one_member_is_invisible_to_the_others(http, family):
    members, _ = family
    py(http, members["a"], "secret = bytearray(b'A' * 4096)")
    for other in ("parent", "b"):
        assert py(http, members[other], "print('secret' in dir())") == "False\n"
