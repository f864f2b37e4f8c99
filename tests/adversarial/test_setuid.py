"""Escalation through setuid binaries and file capabilities: those the
template ships, and those root inside plants. no_new_privs is set on every
sandbox process, so exec never raises privileges; and what root inside
holds is held in the family's user namespace only, none in the host's."""
from __future__ import annotations

import os
import subprocess
import time

from adversary import bash_python, host_pids_running, sh, uid_base
from helpers import exec_ok, proc_status

# Run each program as uid/gid 65534 with a stdin that never ends (so those
# that prompt for a password wait), and read its credentials while it runs.
AS_NOBODY = """
import subprocess, time
def creds(pid):
    st = dict(l.split(':\\t', 1) for l in open('/proc/%d/status' % pid).read().splitlines() if ':\\t' in l)
    return {'uid': st['Uid'].split(), 'gid': st['Gid'].split(), 'CapEff': st['CapEff'].strip(),
            'CapPrm': st['CapPrm'].strip(), 'NoNewPrivs': st['NoNewPrivs'].strip()}
def as_nobody(argv):
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, user=65534, group=65534)
    time.sleep(0.3)
    try:
        seen = creds(p.pid) if p.poll() is None else 'exited'
    except OSError:
        seen = 'exited'
    p.kill()
    p.communicate()
    return seen
"""

NOBODY = {"uid": ["65534"] * 4, "gid": ["65534"] * 4, "CapEff": "0" * 16, "CapPrm": "0" * 16, "NoNewPrivs": "1"}


def test_the_templates_setuid_binaries_grant_nothing(http, sid):
    code = AS_NOBODY + """
found = []
for root, dirs, files in _os.walk('/'):
    dirs[:] = [d for d in dirs if _os.path.join(root, d) not in ('/proc', '/sys', '/dev')]
    for f in files:
        p = _os.path.join(root, f)
        try:
            st = _os.lstat(p)
        except OSError:
            continue
        if st.st_mode & 0o6000 and (st.st_mode & 0o170000) == 0o100000:
            found.append(p)
report({p: as_nobody([p]) for p in sorted(found)})
"""
    seen = bash_python(http, sid, code, timeout_ms=120_000)
    assert {"/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount"} <= set(seen), seen
    running = {p: c for p, c in seen.items() if c != "exited"}
    assert {"/usr/bin/su", "/usr/bin/passwd"} <= set(running), seen   # they wait for a password
    for path, creds in running.items():
        assert creds == NOBODY, (path, creds)


def test_a_blocked_setuid_program_has_no_privilege_on_the_host(http, sid):
    """Seen from the host: `su`, run as nobody inside and waiting for a
    password, is an unprivileged host uid in a user namespace of its own."""
    base = uid_base(http, sid)
    r = sh(http, sid, "mkfifo /tmp/pw; (sleep 1000 > /tmp/pw &); "
                      "(setpriv --reuid=65534 --regid=65534 --keep-groups /usr/bin/su root -c id < /tmp/pw > /dev/null 2>&1 &); echo started")
    assert r.exit_code == 0, r
    # pam_unix forks a helper (unix_chkpwd) while su starts; until it execs,
    # it too reads as "su root". Every process seen is checked, and the wait
    # ends once su alone is left, blocked on the password.
    seen: dict[int, dict[str, str]] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = host_pids_running(sid, r"^/usr/bin/su root")
        for pid in pids:
            if st := proc_status(pid):
                seen[pid] = st
        if len(pids) == 1 and seen.get(pids[0], {}).get("State", "").startswith("S"):
            break
        time.sleep(0.1)
    assert len(pids) == 1, pids
    for st in seen.values():
        assert st["Uid"].split() == [str(base + 65534)] * 4 and st["Gid"].split() == [str(base + 65534)] * 4, st
        assert st["CapEff"] == st["CapPrm"] == "0" * 16 and st["NoNewPrivs"] == "1", st
    assert os.readlink(f"/proc/{pids[0]}/ns/user") != os.readlink("/proc/self/ns/user")


def test_a_setuid_root_copy_planted_by_root_grants_nothing(http, sid):
    """Root inside makes a setuid-root, setgid-root copy of python; run by
    nobody, it stays nobody."""
    exec_ok(http, sid, "cp /usr/bin/python3 /tmp/supy && chown 0:0 /tmp/supy && chmod 6755 /tmp/supy", language="bash")
    seen = bash_python(http, sid, AS_NOBODY + """
import sys
p = subprocess.run(['/tmp/supy', '-c', 'import os; print(os.getresuid(), os.getresgid())'],
                   capture_output=True, text=True, user=65534, group=65534)
report({'mode': oct(_os.stat('/tmp/supy').st_mode), 'ids': p.stdout.strip(), 'waiting': as_nobody(['/tmp/supy', '-c', 'import time; time.sleep(9)'])})
""")
    assert seen == {"mode": "0o106755", "ids": "(65534, 65534, 65534) (65534, 65534, 65534)", "waiting": NOBODY}, seen


def test_file_capabilities_planted_by_root_grant_nothing(http, sid):
    """Root inside sets CAP_SYS_ADMIN, CAP_NET_RAW and CAP_SYS_PTRACE as
    file capabilities on copies of python, effective (+eip) and only
    permitted (+ip): the first is not executed at all (the kernel refuses a
    program that must start with capabilities it cannot have), the second
    runs, for root as for nobody, with none of them."""
    r = sh(http, sid, "cp /usr/bin/python3 /tmp/capy && cp /usr/bin/python3 /tmp/capy-ip && "
                      "setcap cap_sys_admin,cap_net_raw,cap_sys_ptrace+eip /tmp/capy && "
                      "setcap cap_sys_admin,cap_net_raw,cap_sys_ptrace+ip /tmp/capy-ip && getcap /tmp/capy /tmp/capy-ip")
    assert r.exit_code == 0 and r.stdout.count("cap_sys_admin") == 2, r
    probe = ("import socket, json\\n"
             "st = dict(l.split(':\\\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\\\t' in l)\\n"
             "try:\\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, 1); raw = 'ok'\\n"
             "except OSError as e:\\n    raw = e.errno\\n"
             "print(json.dumps([int(st['CapEff'], 16) & ((1 << 21) | (1 << 13) | (1 << 19)), raw]))")
    seen = bash_python(http, sid, f"""
import subprocess, json
def run(path, **kw):
    try:
        p = subprocess.run([path, '-c', "{probe}"], capture_output=True, text=True, **kw)
    except OSError as e:       # execve refused
        return _ename(e.errno)
    return json.loads(p.stdout) if p.returncode == 0 else p.stderr[-300:]
report({{'root': run('/tmp/capy'), 'nobody': run('/tmp/capy', user=65534, group=65534),
        'root +ip': run('/tmp/capy-ip'), 'nobody +ip': run('/tmp/capy-ip', user=65534, group=65534)}})
""")
    # [capabilities among SYS_ADMIN, NET_RAW, SYS_PTRACE in effect, errno of a raw socket]
    assert seen == {"root": "EPERM", "nobody": "EPERM", "root +ip": [0, 1], "nobody +ip": [0, 1]}, seen


def test_a_frozen_setuid_program_grants_nothing_on_the_host(http, server, sid):
    """Freezing a sandbox copies its files to the host's disk (a Space,
    under the server's state directory), owners shifted so that the
    sandbox's root is uid 0. A setuid-root program planted inside must not
    become one on the host: an unprivileged host user (nobody) who runs
    the copy stays nobody."""
    exec_ok(http, sid, "cp /usr/bin/python3 /tmp/supy && chown 0:0 /tmp/supy && chmod 6755 /tmp/supy", language="bash")
    r = http.post(f"/v1/sandboxes/{sid}/freeze")
    assert r.status_code == 200, r.text
    space = r.json()["space_id"]
    try:
        planted = os.path.join(server.state_dir, "spaces", space, "upper", "tmp", "supy")
        assert os.path.exists(planted), os.listdir(os.path.join(server.state_dir, "spaces", space))
        # As the host's nobody, without any capability (setuid(2) from root
        # to another uid clears them; setpriv would keep them up to the exec).
        try:
            run = subprocess.run([planted, "-c", "import os; print(os.geteuid(), os.getegid())"],
                                 user=65534, group=65534, extra_groups=[], capture_output=True, text=True)
            refused, said = run.returncode != 0, run.stdout.split()
        except PermissionError:
            refused, said = True, []
        st = os.stat(planted)
        # Refused (not reachable, not executable), or run as nobody.
        assert refused or said == ["65534", "65534"], (
            f"host user nobody ran the frozen copy with euid, egid {said} "
            f"(mode {st.st_mode:o}, owner {st.st_uid}:{st.st_gid})")
    finally:
        assert http.delete(f"/v1/spaces/{space}").status_code == 204
