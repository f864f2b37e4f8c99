"""The REPL's process model: it lives in its family's pid namespace while
what it starts lives in the sandbox's own, so threads (Python and C) work,
subprocesses show up in the sandbox's `ps`, and killing everything from the
REPL cannot brick the sandbox."""
from __future__ import annotations

from helpers import delete_raw, pooled_sandbox, sandbox_host_pids, wait_until


def family_supervisor(sandbox_id):
    """Host pid of the sandbox's family supervisor: its init is a child of
    the family's reaper, itself a child of the supervisor (which the sandbox
    may share with others: a fork family, or the warm pool's)."""
    def ppid(pid):
        return int(next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")))
    inits = [p for p in sandbox_host_pids(sandbox_id) if open(f"/proc/{p}/comm").read().strip() == "forkbox-init"]
    assert len(inits) == 1, inits
    return ppid(ppid(inits[0]))


def py(sb, code):
    r = sb.run_code(code)
    assert r.exit_code == 0, (code, r)
    return r.stdout


def test_python_and_c_threads_start_in_the_repl(sandbox):
    out = py(sandbox, """
import threading, ctypes, concurrent.futures
t = threading.Thread(target=lambda: None); t.start(); t.join()
with concurrent.futures.ThreadPoolExecutor(4) as ex:
    print(sum(ex.map(lambda x: x * 2, range(10))))
libc = ctypes.CDLL(None)
tid = ctypes.c_ulong()
CB = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
cb = CB(lambda arg: None)
print(libc.pthread_create(ctypes.byref(tid), None, cb, None))
libc.pthread_join(tid, None)
""")
    assert out.split() == ["90", "0"]


def test_numpy_uses_its_thread_pool(sandbox):
    out = py(sandbox, "import numpy as np\na = np.ones((300, 300))\nprint(float((a @ a)[0, 0]))")
    assert out.strip() == "300.0"


def test_subprocesses_of_the_repl_live_in_the_sandbox_pid_namespace(sandbox):
    out = py(sandbox, """
import subprocess, os
p = subprocess.Popen(['sleep', '30'])
ps = subprocess.run(['ps', '-eo', 'comm'], capture_output=True, text=True).stdout.split()
print('sleep' in ps)
pid_seen_inside = subprocess.run(['sh', '-c', 'echo $$'], capture_output=True, text=True).stdout.strip()
print(int(pid_seen_inside) < 1000)
p.kill(); p.wait()
print(p.returncode)
r = os.fork()
if r == 0:
    os._exit(7)
print(os.waitpid(r, 0)[1] >> 8)
""")
    assert out.split() == ["True", "True", "-9", "7"]


def test_kill_minus_one_from_the_repl_is_survived(sandbox):
    # kill(-1) from the REPL is vetted by the family's supervisor (docs/
    # isolation.md): it reaches the sandbox's processes but, as in any pid
    # namespace, neither the caller nor the sandbox's init.
    py(sandbox, "import subprocess\nbg = subprocess.Popen(['sleep', '300'])\nx = 1")
    r = sandbox.run_code("import os, signal, time\nos.kill(-1, signal.SIGKILL)\ntime.sleep(0.3)\nprint(bg.poll())")
    assert (r.exit_code, r.stdout.strip()) == (0, "-9"), r
    events = list(sandbox.run_code_stream("print(x)"))
    assert not [e for e in events if e.type == "warning"], events
    assert [e.data for e in events if e.type == "stdout"] == ["1"], events
    assert events[-1].type == "exit" and events[-1].data == 0
    b = sandbox.run_code("echo bash works; ps -e | wc -l", language="bash")
    assert b.exit_code == 0 and "bash works" in b.stdout, b


def test_the_repls_own_pid_never_names_another_process(sandbox):
    # The REPL lives in its family's pid namespace; the sandbox's /proc shows
    # the sandbox's leaf namespace, whose pids stay below 2**21 while the
    # REPL's pid is at or above it: /proc/<its pid> is absent, never wrong.
    out = py(sandbox, """
import os, subprocess
me = os.getpid()
print(me >= 2**21, os.path.exists(f'/proc/{me}'))
kids = [subprocess.Popen(['sleep', '5']) for _ in range(3)]
inside = subprocess.run(['sh', '-c', 'echo $$'], capture_output=True, text=True).stdout.strip()
print(int(inside) < 2**21)
for k in kids: k.kill(); k.wait()
""")
    assert out.split() == ["True", "False", "True"]


def test_a_killed_supervisor_is_replaced_and_files_survive(sandbox):
    import os
    import signal
    import time
    py(sandbox, "open('/root/kept.txt', 'w').write('still here')")
    supervisor = family_supervisor(sandbox.id)
    assert open(f"/proc/{supervisor}/cmdline", "rb").read().split(b"\0")[1] == b"__shim"
    os.kill(supervisor, signal.SIGKILL)
    time.sleep(0.2)
    events = list(sandbox.run_code_stream("print(open('/root/kept.txt').read())"))
    assert any(e.type == "warning" for e in events), events
    assert [e.data for e in events if e.type == "stdout"] == ["still here"], events
    b = sandbox.run_code("echo ok", language="bash")
    assert (b.exit_code, b.stdout) == (0, "ok"), b


def test_sandboxes_made_after_the_pools_supervisor_died_are_whole(http, make_sandbox):
    import os
    import signal
    import time
    # A sandbox forked from the warm zygote shares its family's supervisor
    # with the zygote and the sandboxes forked ahead of demand. Once that
    # supervisor dies, none of them may be handed out: a new sandbox comes
    # whole, with no lost-REPL notice, its files and terminals working.
    pooled = pooled_sandbox(http)
    wait_until(lambda: http.get("/v1/pool").json()["templates"]["default"]["ready"], 30, "sandboxes forked ahead of demand")
    try:
        os.kill(family_supervisor(pooled), signal.SIGKILL)
        time.sleep(0.2)
        for _ in range(4):
            fresh = make_sandbox()
            seen = []
            h = fresh.pty.create(cmd=["/bin/sh", "-c", "echo pty-ok"], on_data=seen.append)
            assert h.wait(timeout=15) == 0
            assert b"pty-ok" in b"".join(seen), seen
            fresh.upload(b"kept", "/root/f.txt")
            assert fresh.download("/root/f.txt") == b"kept"
            events = list(fresh.run_code_stream("print('fresh')"))
            assert [e.type for e in events if e.type in ("warning", "error")] == [], events
            assert [e.data for e in events if e.type == "stdout"] == ["fresh"], events
    finally:
        delete_raw(http, pooled)


def test_bash_right_after_kill_minus_one_runs(sandbox):
    # No pause between the kill and the next call: bash still runs (the
    # server rebuilds the sandbox when it finds init gone, retrying once).
    sandbox.run_code("import os, signal\nos.kill(-1, signal.SIGKILL)")
    b = sandbox.run_code("echo ok", language="bash")
    assert (b.exit_code, b.stdout) == (0, "ok"), b
