"""Sandbox lifecycle: info and listing, lifetime and idle timeouts, and that
creating, destroying and shutting down leaves nothing behind on the host."""
from __future__ import annotations

import concurrent.futures as cf
import glob
import subprocess
import os
import signal
import threading
import time

import httpx

from helpers import (
    ForkboxServer, create_raw, delete_raw, exec_raw, proc_status, sandbox_cgroup_dirs, sandbox_host_pids, server_leaks,
    wait_gone, wait_no_leaks,
)


def test_info_and_list(http):
    t_before = int(time.time() * 1000)
    sid = create_raw(http, timeout_seconds=120, idle_timeout_seconds=60, ram_mib=512)
    try:
        info = http.get(f"/v1/sandboxes/{sid}").json()
        for key in ("id", "state", "template", "ram_mib", "rootfs_gb", "egress", "persistent", "created_at",
                    "last_active_at", "expires_at", "timeout_seconds", "idle_timeout_seconds", "execs", "repl_restarts"):
            assert key in info, (key, info)
        assert info["id"] == sid and info["state"] == "ready" and info["template"] == "default"
        assert info["ram_mib"] == 512 and info["timeout_seconds"] == 120 and info["idle_timeout_seconds"] == 60
        assert info["egress"] is True and info["persistent"] is False  # the server default (--default-egress)
        assert info["execs"] == 0 and info["repl_restarts"] == 0
        assert t_before - 5000 <= info["created_at"] <= int(time.time() * 1000) + 5000
        assert info["expires_at"] == info["created_at"] + 120_000
        assert exec_raw(http, sid, "print(1)").exit_code == 0
        info2 = http.get(f"/v1/sandboxes/{sid}").json()
        assert info2["execs"] == 1 and info2["last_active_at"] >= info["last_active_at"]
        listed = http.get("/v1/sandboxes").json()["sandboxes"]
        assert sid in [s["id"] for s in listed]
    finally:
        assert delete_raw(http, sid) == 204


def test_state_is_running_during_an_exec(http):
    sid = create_raw(http)
    try:
        t = threading.Thread(target=exec_raw, args=(http, sid, "import time\ntime.sleep(1.5)"))
        t.start()
        time.sleep(0.5)
        assert http.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        t.join()
        assert http.get(f"/v1/sandboxes/{sid}").json()["state"] == "ready"
    finally:
        delete_raw(http, sid)


def test_lifetime_and_idle_timeouts_destroy_the_sandbox(http):
    t0 = time.monotonic()
    lifetime = create_raw(http, timeout_seconds=2)
    idle = create_raw(http, idle_timeout_seconds=2)
    # the lifetime counts even while busy
    busy_result = {}
    t = threading.Thread(target=lambda: busy_result.setdefault("e", exec_raw(http, lifetime, "import time\ntime.sleep(30)")))
    t.start()
    time.sleep(1.0)
    for sid in (lifetime, idle):
        assert http.get(f"/v1/sandboxes/{sid}").status_code == 200, "destroyed too early"
    gone_lifetime = wait_gone(http, lifetime, timeout=10) - t0
    gone_idle = wait_gone(http, idle, timeout=10) - t0
    assert 1.5 <= gone_lifetime <= 2 + 1.5, gone_lifetime
    assert 1.5 <= gone_idle <= 2 + 1.5, gone_idle
    t.join(10)
    assert not t.is_alive(), "the exec of a destroyed sandbox did not end"
    assert busy_result["e"].events[-1]["type"] == "exit"
    for sid in (lifetime, idle):
        assert exec_raw(http, sid, "print(1)").status == 404
        wait_no_cgroup(sid)


def wait_no_cgroup(sid: str, timeout: float = 5.0) -> None:
    """Teardown may finish just after the id is gone from the registry."""
    deadline = time.monotonic() + timeout
    while sandbox_cgroup_dirs(sid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_cgroup_dirs(sid) == [], f"cgroup of {sid} still there {timeout} s after it was destroyed"


def test_activity_keeps_an_idle_timeout_at_bay(http):
    sid = create_raw(http, idle_timeout_seconds=2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
        e = exec_raw(http, sid, "print('tick')")
        assert e.status == 200 and e.exit_code == 0, f"destroyed while active after {time.monotonic() - t0:.1f} s"
        time.sleep(0.5)
    # an exec longer than the idle timeout is not cut short either
    e = exec_raw(http, sid, "import time\ntime.sleep(2.5)\nprint('long done')")
    assert e.exit_code == 0 and e.stdout == "long done\n", e
    assert http.get(f"/v1/sandboxes/{sid}").status_code == 200
    t_idle = time.monotonic()
    gone = wait_gone(http, sid, timeout=10) - t_idle
    assert gone <= 3.5, gone


def test_destroy_kills_every_process_of_the_sandbox(http):
    sid = create_raw(http)
    assert exec_raw(http, sid, "nohup sleep 1000 >/dev/null 2>&1 &\nsetsid sleep 1001 >/dev/null 2>&1 &", language="bash").exit_code == 0
    assert exec_raw(http, sid, "import subprocess\np = subprocess.Popen(['sleep', '1002'])").exit_code == 0
    pids = sandbox_host_pids(sid)
    assert len(pids) >= 4, pids  # init, REPL, 3 sleeps
    assert delete_raw(http, sid) == 204
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if proc_status(p) and not proc_status(p).get("State", "").startswith("Z")]
        time.sleep(0.05)
    assert alive == [], f"processes of destroyed sandbox still alive: {alive}"
    wait_no_cgroup(sid)


def test_create_and_destroy_200_sandboxes_leaks_nothing(server, http):
    n, batch = 200, 8
    ids: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            sid = create_raw(c)
            with lock:
                ids.append(sid)
                if server.cgroup_parent is None:
                    server.learn_cgroup_parent(sid)
            e = exec_raw(c, sid, "print(1)")
            assert e.exit_code == 0 and e.stdout == "1\n", e
            assert delete_raw(c, sid) == 204

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(batch) as pool:
        for f in [pool.submit(one, i) for i in range(n)]:
            f.result()
    took = time.monotonic() - t0
    print(f"200 sandboxes created, used and destroyed in {took:.1f} s")
    assert len(set(ids)) == n
    live = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
    assert not (live & set(ids))
    problems = wait_no_leaks(server, expect_volume_mounted=True, live_ids=live)
    assert problems == [], problems
    for sid in ids[:: 10]:
        assert sandbox_cgroup_dirs(sid) == []


def test_sigterm_with_live_sandboxes_leaves_nothing(say):
    # The busy exec below is interrupted after a 2 s drain (test_faults.py
    # has the drain itself).
    srv = ForkboxServer("sigterm", ["--drain-seconds", "2"], build_templates=False, log=say).start()
    try:
        srv.wait_ready()
        with srv.http() as c:
            ids = [create_raw(c) for _ in range(3)]
            srv.learn_cgroup_parent(ids[0])
            for sid in ids:
                e = exec_raw(c, sid, "sleep 1000 >/dev/null 2>&1 &\necho started", language="bash")
                assert e.exit_code == 0
                e = exec_raw(c, sid, "import subprocess\np = subprocess.Popen(['sleep', '1000'])\nbig = bytearray(50 << 20)")
                assert e.exit_code == 0
            # one is busy when the signal comes
            busy = threading.Thread(target=lambda: exec_raw(c, ids[0], "import time\ntime.sleep(60)"))
            busy.start()
            time.sleep(0.3)
            host_pids = [p for sid in ids for p in sandbox_host_pids(sid)]
            assert len(host_pids) >= 9, host_pids
            assert os.path.ismount(os.path.join(srv.state_dir, "volume"))
            # cgroup v1: an empty cgroup kept frozen beside the parent keeps
            # the kernel's freezer switched on (docs/fork.md#the-v1-freezer).
            anchor = f"/sys/fs/cgroup/freezer/{srv.cgroup_parent}.freezer-on"
            if os.path.isdir("/sys/fs/cgroup/freezer"):
                with open(os.path.join(anchor, "freezer.state")) as f:
                    assert f.read().strip() == "FROZEN"
                with open(os.path.join(anchor, "cgroup.procs")) as f:
                    assert f.read() == "", "the anchor holds no process"
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            rc = srv.proc.wait(60)
            took = time.monotonic() - t0
            busy.join(10)
        assert rc == 0, (rc, srv.log_tail())
        assert took < 30, took
        problems = wait_no_leaks(srv, expect_volume_mounted=False)
        assert problems == [], problems
        still = [p for p in host_pids if os.path.exists(f"/proc/{p}")]
        assert still == [], still
        for sid in ids:
            assert sandbox_cgroup_dirs(sid) == []
        assert not os.path.ismount(os.path.join(srv.state_dir, "volume"))
        # The volume's loop device went with the mount (autoclear).
        image = os.path.join(srv.state_dir, "volume.img")
        loops = subprocess.run(["losetup", "-j", image], capture_output=True, text=True).stdout
        assert loops.strip() == "", loops
        # So did this server's parent cgroups.
        leftover = [d for d in glob.glob("/sys/fs/cgroup/*/" + (srv.cgroup_parent or "forkbox-none") + "*") if os.path.isdir(d)]
        assert leftover == [], leftover
    finally:
        srv.stop()
        srv.cleanup()


def test_server_leak_helper_sees_a_live_sandbox(server, http):
    """Guard against a leak check that cannot see anything: with one live
    sandbox, the helpers must report its cgroup and processes."""
    sid = create_raw(http)
    try:
        server.learn_cgroup_parent(sid)
        live = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
        problems = server_leaks(server, expect_volume_mounted=True, live_ids=live - {sid}, check_run_dir=False)
        assert any("cgroups left" in p and sid in p for p in problems), problems
        assert any(p.startswith("pid ") for p in problems), problems
        assert any("sandboxes not empty" in p and sid in p for p in problems), problems
        # Pool and fork spares are built in the background and listed once
        # built: give work in flight the moment wait_no_leaks gives.
        assert wait_no_leaks(server, expect_volume_mounted=True, live_ids=live, check_run_dir=False) == []
    finally:
        delete_raw(http, sid)


def hang_up(server: ForkboxServer, method: str, path: str, body: bytes = b"", until=None) -> None:
    """Send a request and close the connection without reading the answer:
    at once, or as soon as `until()` holds (the server is mid-way)."""
    import socket
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head.encode() + body)
        deadline = time.monotonic() + 10
        while until is not None and not until():
            assert time.monotonic() < deadline, f"{method} {path} did not start"
            time.sleep(0.002)


def test_a_client_hanging_up_cancels_nothing_half_way(server, http):
    """hyper drops a handler when its client goes away; work it started
    must still finish (a DELETE cut between unregistering a sandbox and
    freeing it used to leak its files and cgroups), and work it never
    started must leave nothing behind."""
    def listed() -> set[str]:
        return {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
    before = listed()
    for _ in range(3):
        parent = create_raw(http)
        assert exec_raw(http, parent, "x = 1").exit_code == 0
        kids = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2}).json()["children"]
        hang_up(server, "POST", f"/v1/sandboxes/{parent}/fork", b'{"n": 2}')
        hang_up(server, "POST", "/v1/sandboxes", b"{}")
        hang_up(server, "POST", f"/v1/sandboxes/{parent}/checkpoints")
        for sid in [*kids, parent]:
            # Hang up once the sandbox is unregistered, while it is freed.
            hang_up(server, "DELETE", f"/v1/sandboxes/{sid}", until=lambda: sid not in listed())
    # What the hung-up creates and forks made is whole: it runs, and goes.
    time.sleep(0.5)
    for sid in listed() - before:
        assert exec_raw(http, sid, "print(2)").stdout == "2\n"
        assert delete_raw(http, sid) == 204
    problems = wait_no_leaks(server, expect_volume_mounted=True, live_ids=listed())
    assert problems == [], problems
