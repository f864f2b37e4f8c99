"""Sandboxes survive the server (docs/state.md#restarts): kill -9 the
server, or let it exit with SIGUSR2 for an upgrade, start it again on the
same state directory, and every live sandbox is there, REPL state and all;
a sandbox whose supervisor died meanwhile is reported lost and freed."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from conftest import start_server, stop_and_assert_clean
from helpers import (
    all_pids, create_raw, delete_raw, exec_ok, exec_raw, proc_cmdline, sandbox_host_pids, wait_gone, wait_no_leaks,
)


@pytest.fixture(scope="module")
def srv(say, server):
    """A server of this module's own, which the tests crash and restart."""
    s = start_server(say, "restart", build=False)
    yield s
    stop_and_assert_clean(s)


@pytest.fixture
def c(srv):
    with srv.http(timeout=120) as c:
        yield c


def crash_and_restart(srv) -> None:
    srv.kill()
    srv.start()
    srv.wait_ready()


def live(c) -> dict[str, dict]:
    return {s["id"]: s for s in c.get("/v1/sandboxes").json()["sandboxes"]}


def wait_for_spare(c, timeout: float = 60) -> None:
    """Until the warm pool has a spare ready (the next create is a fork)."""
    deadline = time.monotonic() + timeout
    while not c.get("/v1/pool").json()["templates"].get("default", {}).get("spares"):
        assert time.monotonic() < deadline, "the warm pool has no spare"
        time.sleep(0.1)


def shim_pids(family: str) -> list[int]:
    """Host pids of the supervisor of the family named `family` (and of
    its reaper, forked from it)."""
    return [p for p in all_pids() if "__shim" in proc_cmdline(p) and f'"family":"{family}"' in " ".join(proc_cmdline(p))]


STATE = """
import json, math
x = 41
data = {'k': [1, 2, 3]}
def f(): return x + 1
class Point:
    def __init__(self, a): self.a = a
p = Point(5)
fh = open('/root/log.txt', 'w')
fh.write('line 1\\n'); fh.flush()
open('/root/a.txt', 'w').write('file kept')
"""
CHECK = "fh.write('line 2\\n'); fh.flush(); print(f(), data['k'], p.a, math.pi > 3, json.dumps(1), open('/root/a.txt').read(), open('/root/log.txt').read().split())"
EXPECT = "42 [1, 2, 3] 5 True 1 file kept ['line', '1', 'line', '2']\n"


def test_a_killed_server_gives_back_every_sandbox_with_its_state(srv, c):
    cold = create_raw(c)
    exec_ok(c, cold, STATE)
    [child] = c.post(f"/v1/sandboxes/{cold}/fork", json={"n": 1}).json()["children"]
    exec_ok(c, child, "x = 99")
    wait_for_spare(c)
    pooled = create_raw(c)  # from the warm pool: a fork of the zygote, in its family
    exec_ok(c, pooled, STATE)
    netted = create_raw(c, egress=True)
    exec_ok(c, netted, "import socket")
    before = live(c)
    repl_pids = {sid: sandbox_host_pids(sid) for sid in (cold, child, pooled)}

    crash_and_restart(srv)

    # Nothing was restarted: the same processes run on.
    for sid, pids in repl_pids.items():
        assert set(pids) <= set(sandbox_host_pids(sid)), sid
    after = live(c)
    assert set(before) <= set(after)
    for sid in before:
        for key in ("created_at", "expires_at", "template", "ram_mib", "egress", "timeout_seconds"):
            assert after[sid][key] == before[sid][key], (sid, key)
    assert exec_ok(c, cold, CHECK) == EXPECT
    assert exec_ok(c, pooled, CHECK) == EXPECT
    assert exec_ok(c, child, "print(f())") == "100\n"
    assert exec_ok(c, cold, "echo bash $(cat /root/a.txt)", "bash") == "bash file kept\n"
    # Files both ways, a fork of an adopted sandbox, a merge back.
    assert c.put(f"/v1/sandboxes/{cold}/files", params={"path": "/root/up.txt"}, content=b"up").status_code in (200, 201, 204)
    assert exec_ok(c, cold, "print(open('/root/up.txt').read())") == "up\n"
    [grandchild] = c.post(f"/v1/sandboxes/{cold}/fork", json={"n": 1}).json()["children"]
    assert exec_ok(c, grandchild, "x = 7; print(f())") == "8\n"
    assert c.post(f"/v1/sandboxes/{cold}/merge_into/{grandchild}").status_code in (200, 204)
    assert exec_ok(c, cold, "print(f())") == "8\n"
    # Its network was started again: DNS through the proxy, and a way out.
    out = exec_ok(c, netted, "print(socket.getaddrinfo('pypi.org', 443)[0][4][1]); s = socket.create_connection(('pypi.org', 443), timeout=20); print('out'); s.close()")
    assert out == "443\nout\n"
    for sid in (cold, child, pooled, netted):
        assert delete_raw(c, sid) == 204
    assert wait_no_leaks(srv, expect_volume_mounted=True, live_ids=set(live(c))) == []


def test_a_second_crash_is_survived_too(srv, c):
    sid = create_raw(c)
    exec_ok(c, sid, "n = 1")
    for _ in range(2):
        crash_and_restart(srv)
        exec_ok(c, sid, "n += 1")
    assert exec_ok(c, sid, "print(n)") == "3\n"
    assert delete_raw(c, sid) == 204


def test_code_running_during_the_crash_is_interrupted_and_said_so(srv, c):
    sid = create_raw(c)
    exec_ok(c, sid, "kept = 'yes'")
    started = threading.Event()

    def long_run():
        try:
            with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"code": "import time\nprint('go', flush=True)\ntime.sleep(60)"}) as r:
                for _ in r.iter_lines():
                    started.set()
        except Exception:
            pass

    t = threading.Thread(target=long_run)
    t.start()
    assert started.wait(30)
    crash_and_restart(srv)
    t.join(30)
    ex = exec_raw(c, sid, "print(kept)")
    assert ex.exit_code == 0 and ex.stdout == "yes\n", ex.events
    warnings = [str(e.get("data")) for e in ex.events if e["type"] == "warning"]
    assert any("server restarted while code was running" in w for w in warnings), ex.events
    assert delete_raw(c, sid) == 204


def test_timeouts_are_still_enforced_after_a_restart(srv, c):
    short = create_raw(c, timeout_seconds=12)
    exec_ok(c, short, "pass")
    created = live(c)[short]["created_at"]
    crash_and_restart(srv)
    # An exec timeout still stops runaway code, and the REPL stays.
    exec_ok(c, short, "kept = 1")
    ex = exec_raw(c, short, "while True: pass", timeout_ms=500)
    assert ex.exit_code == 124, ex.events
    assert exec_ok(c, short, "print(kept)") == "1\n"
    # The lifetime runs from the original create, not from the restart.
    gone_at = wait_gone(c, short, timeout=30)
    assert gone_at > 0
    assert time.time() * 1000 - created < 30_000


def test_a_paused_sandbox_stays_paused_and_resumes_with_its_state(srv, c):
    sid = create_raw(c)
    exec_ok(c, sid, "import threading, time\nticks = [0]\ndef spin():\n    while True: ticks[0] += 1\nthreading.Thread(target=spin, daemon=True).start()\ntime.sleep(0.2)")
    assert c.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    crash_and_restart(srv)
    assert live(c)[sid]["state"] == "paused"
    cpu = live(c)[sid]["cpu_seconds"]
    time.sleep(1.0)
    assert live(c)[sid]["cpu_seconds"] - cpu < 0.05  # frozen: no CPU
    assert exec_ok(c, sid, "a = ticks[0]; time.sleep(0.2); print(ticks[0] > a)") == "True\n"
    assert delete_raw(c, sid) == 204


def test_a_sandbox_whose_supervisor_died_is_reported_lost_and_freed(say, server):
    # Without the warm pool each create starts a family of its own, named
    # after the sandbox.
    s = start_server(say, "lost", ["--no-warm-pool"], build=False)
    try:
        with s.http() as c:
            doomed, fine = create_raw(c), create_raw(c)
            exec_ok(c, fine, "v = 'fine'")
            shims = shim_pids(doomed)  # the shim, and its family's reaper (a fork of it)
            assert shims and not set(shims) & set(shim_pids(fine))
            s.kill()
            for pid in shims:
                os.kill(pid, signal.SIGKILL)
            s.start()
            s.wait_ready()
            r = c.get(f"/v1/sandboxes/{doomed}")
            assert r.status_code == 404 and "lost when the server restarted" in r.json()["error"], r.text
            metrics = c.get("/metrics").text
            assert 'forkbox_restart_sandboxes_total{outcome="lost"} 1' in metrics, metrics
            assert 'forkbox_restart_sandboxes_total{outcome="adopted"} 1' in metrics, metrics
            assert c.post(f"/v1/sandboxes/{doomed}/exec", json={"code": "1"}).status_code == 404
            assert exec_ok(c, fine, "print(v)") == "fine\n"
            assert delete_raw(c, fine) == 204
            # What the lost sandbox used is gone: processes, cgroups, files.
            assert wait_no_leaks(s, expect_volume_mounted=True, live_ids=set(live(c))) == []
    finally:
        stop_and_assert_clean(s)


def test_sigusr2_leaves_the_sandboxes_to_the_next_server(srv, c):
    sid = create_raw(c)
    exec_ok(c, sid, "upgraded = 'kept'")
    srv.proc.send_signal(signal.SIGUSR2)
    assert srv.proc.wait(60) == 0
    assert sandbox_host_pids(sid), "the sandbox ended with the server"
    srv.start()
    srv.wait_ready()
    assert exec_ok(c, sid, "print(upgraded)") == "kept\n"
    assert delete_raw(c, sid) == 204


def test_checkpoints_do_not_survive_a_restart_and_leave_nothing(srv, c):
    sid = create_raw(c)
    exec_ok(c, sid, "v = 1")
    assert c.post(f"/v1/sandboxes/{sid}/checkpoints").status_code == 200
    crash_and_restart(srv)
    assert c.get(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoints"] == []
    assert exec_ok(c, sid, "print(v)") == "1\n"
    assert delete_raw(c, sid) == 204
    assert wait_no_leaks(srv, expect_volume_mounted=True, live_ids=set(live(c))) == []


def test_families_end_when_no_server_comes_back(say, server):
    s = start_server(say, "orphans", ["--orphan-grace-seconds", "2", "--no-warm-pool"], build=False)
    try:
        with s.http() as c:
            sid = create_raw(c)
            exec_ok(c, sid, "pass")
        pids = sandbox_host_pids(sid)
        assert pids
        s.kill()
        deadline = time.monotonic() + 15
        while any(os.path.exists(f"/proc/{p}") for p in pids) or shim_pids(sid):
            assert time.monotonic() < deadline, "the orphaned family outlived its grace period"
            time.sleep(0.2)
        s.start()
        s.wait_ready()
        with s.http() as c:
            r = c.get(f"/v1/sandboxes/{sid}")
            assert r.status_code == 404 and "lost" in r.json()["error"], r.text
    finally:
        stop_and_assert_clean(s)
