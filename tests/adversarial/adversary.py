"""What the attacks share: running attack code inside a sandbox, from the
REPL (its own seccomp filter, CAP_SYS_ADMIN in its family, the family's pid
namespace) and from a Python that bash starts (the `member` filter, the
container capability set, the sandbox's leaf pid namespace), and the
host-side checks that an attack changed nothing.

Attack code gets PRELUDE first: `sc(nr, *args)` makes a raw x86_64 system
call and answers "ok" or the errno's name, `lc(name, *args)` and
`attempt(f, ...)` do the same for a libc function and for a Python call, `report(x)` prints JSON for the test to read.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import httpx

from helpers import exec_ok, exec_raw, proc_cmdline, proc_status, sandbox_host_pids
from test_files_escape import SECRET  # noqa: F401  (what the host_dir fixture's file holds)

PRELUDE = r'''
import ctypes as _ct, errno as _errno, json as _json, os as _os
_libc = _ct.CDLL(None, use_errno=True)
_libc.syscall.restype = _ct.c_long
def _ename(n):
    return _errno.errorcode.get(n, str(n))
def sc(nr, *args):
    """A raw system call: "ok", or the name of its errno."""
    _ct.set_errno(0)
    r = _libc.syscall(_ct.c_long(nr), *[_ct.c_long(a) if isinstance(a, int) else a for a in args])
    return "ok" if r >= 0 else _ename(_ct.get_errno())
def lc(name, *args):
    """A libc function that fails with -1 and errno: "ok", or the errno's name."""
    _ct.set_errno(0)
    return "ok" if getattr(_libc, name)(*args) != -1 else _ename(_ct.get_errno())
def attempt(f, *args, **kwargs):
    """f(*args): "ok", or the name of the errno of the OSError it raised."""
    try:
        f(*args, **kwargs)
        return "ok"
    except OSError as e:
        return _ename(e.errno)
def report(x):
    print(_json.dumps(x))
'''

HEREDOC = "FORKBOX_ADVERSARY_EOF"


def _report(http: httpx.Client, sid: str, code: str, language: str, timeout_ms: int | None):
    ex = exec_raw(http, sid, code, language, timeout_ms)
    assert ex.exit_code == 0, f"the attack code itself failed ({language}, exit {ex.exit_code}):\n{ex.stderr[-3000:]}"
    return json.loads(ex.stdout)


def repl(http: httpx.Client, sid: str, code: str, timeout_ms: int | None = None):
    """Run attack code in the sandbox's REPL; its report (JSON on stdout)."""
    return _report(http, sid, PRELUDE + code, "python", timeout_ms)


def bash_python(http: httpx.Client, sid: str, code: str, timeout_ms: int | None = None):
    """Run attack code in a python3 that bash starts; its report."""
    return _report(http, sid, f"python3 - <<'{HEREDOC}'\n{PRELUDE}{code}\n{HEREDOC}\n", "bash", timeout_ms)


def both(http: httpx.Client, sid: str, code: str) -> dict:
    """The same attack from the REPL and from a process bash started."""
    return {"repl": repl(http, sid, code), "bash": bash_python(http, sid, code)}


def sh(http: httpx.Client, sid: str, cmd: str, timeout_ms: int | None = None):
    """A bash command in the sandbox: the Exec (exit code, stdout, stderr)."""
    return exec_raw(http, sid, cmd, language="bash", timeout_ms=timeout_ms)


def healthy(http: httpx.Client) -> bool:
    return http.get("/v1/healthz").text == "ok"


def uid_base(http: httpx.Client, sid: str) -> int:
    """The host uid that root of the sandbox's family is."""
    return int(exec_ok(http, sid, "cat /proc/self/uid_map", language="bash").split()[1])


def fingerprint(path: str) -> tuple:
    """What must not change about a host file: mode, owner, size, content."""
    st = os.lstat(path)
    h = hashlib.sha256()
    if os.path.isfile(path) and not os.path.islink(path):
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, h.hexdigest()


def tree(path: str) -> dict:
    """Every entry below a host directory with its fingerprint (links not followed)."""
    out = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = os.path.join(root, name)
            out[os.path.relpath(p, path)] = fingerprint(p)
    return out


def host_pids_running(sid: str, pattern: str) -> list[int]:
    """Host pids of the sandbox's processes whose command line matches."""
    return [p for p in sandbox_host_pids(sid) if re.search(pattern, " ".join(proc_cmdline(p)))]


def alive(pid: int) -> bool:
    return bool(proc_status(pid)) and not proc_status(pid).get("State", "").startswith("Z")
