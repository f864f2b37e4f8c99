"""Pause and resume in memory (docs/state.md): a paused sandbox uses no CPU
and keeps its memory; resume goes on exactly; calls that need it running
resume it; a paused sandbox can be forked; idle sandboxes can be paused by
the server."""
from __future__ import annotations

import os
import time

import pytest

from helpers import assert_json_error, create_raw, delete_raw, exec_ok, exec_raw, sandbox_host_pids


def cpu_ns(sid: str) -> int:
    """CPU time the sandbox's processes have used, in nanoseconds (utime +
    stime of each, all threads; from the host's /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in sandbox_host_pids(sid):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total * 1_000_000_000 // tick


def state(http, sid) -> str:
    return http.get(f"/v1/sandboxes/{sid}").json()["state"]


py = exec_ok


@pytest.fixture
def sid(http):
    s = create_raw(http, egress=False)
    yield s
    delete_raw(http, s)


def test_a_paused_busy_loop_uses_no_cpu_and_resumes_exactly(http, sid):
    # A thread of the REPL spins and counts; a bash job spins too.
    py(http, sid, "import threading\nn = [0]\ndef spin():\n    while True:\n        n[0] += 1\n"
                  "threading.Thread(target=spin, daemon=True).start()\nx = 41")
    exec_raw(http, sid, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &", language="bash")
    time.sleep(0.5)
    r = http.post(f"/v1/sandboxes/{sid}/pause")
    assert r.status_code == 200 and r.json()["state"] == "paused", r.text
    assert state(http, sid) == "paused"
    before = cpu_ns(sid)
    time.sleep(1.0)
    used = cpu_ns(sid) - before
    assert used <= 10_000_000, f"a paused sandbox used {used / 1e6:.1f} ms of CPU in 1 s"
    r = http.post(f"/v1/sandboxes/{sid}/resume")
    assert r.status_code == 200 and r.json()["state"] == "ready", r.text
    before = cpu_ns(sid)
    time.sleep(0.5)
    assert cpu_ns(sid) - before > 100_000_000, "it runs again"
    # State and threads went on where they were.
    out = py(http, sid, "a = n[0]\nimport time\ntime.sleep(0.2)\nprint(x + 1, n[0] > a)")
    assert out == "42 True\n"


def test_calls_resume_a_paused_sandbox(http, sid):
    py(http, sid, "y = 'kept'")
    for call in (lambda: exec_raw(http, sid, "print(y)"),
                 lambda: http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root", "list": "1"})):
        assert http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
        assert state(http, sid) == "paused"
        r = call()
        assert getattr(r, "status_code", 200) == 200
        assert state(http, sid) == "ready"
    assert py(http, sid, "print(y)") == "kept\n"


def test_pause_and_resume_are_idempotent_and_checked(http, sid):
    assert http.post(f"/v1/sandboxes/{sid}/resume").json()["state"] == "ready"
    assert http.post(f"/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
    assert http.post(f"/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
    assert http.post(f"/v1/sandboxes/{sid}/resume").json()["state"] == "ready"
    assert_json_error(http.post("/v1/sandboxes/sb-nosuchsandbox/pause"), 404)
    assert_json_error(http.post("/v1/sandboxes/sb-nosuchsandbox/resume"), 404)


def test_a_running_exec_is_not_paused(server, http, sid):
    import threading
    t = threading.Thread(target=lambda: exec_raw(http, sid, "import time\ntime.sleep(2)"))
    t.start()
    time.sleep(0.5)
    with server.http() as c:
        assert_json_error(c.post(f"/v1/sandboxes/{sid}/pause"), 409)
    t.join()
    assert http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200


def test_a_paused_sandbox_can_be_forked(http, sid):
    py(http, sid, "z = 7")
    assert http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2})
    assert r.status_code == 200, r.text
    children = r.json()["children"]
    try:
        assert state(http, sid) == "paused", "the parent stays paused"
        for c in children:
            assert state(http, c) == "ready"
            assert py(http, c, "print(z)") == "7\n"
        assert state(http, sid) == "paused"
        assert py(http, sid, "print(z)") == "7\n"
    finally:
        for c in children:
            delete_raw(http, c)


def test_idle_sandboxes_are_paused_by_the_server(say):
    from conftest import start_server
    srv = start_server(say, "idle-pause", ["--idle-pause-seconds", "1"], build=False)
    try:
        with srv.http() as c:
            s = create_raw(c, egress=False)
            py(c, s, "w = 'still here'")
            deadline = time.time() + 10
            while time.time() < deadline and state(c, s) != "paused":
                time.sleep(0.2)
            assert state(c, s) == "paused"
            assert py(c, s, "print(w)") == "still here\n"
            delete_raw(c, s)
    finally:
        srv.stop()
        srv.cleanup()
