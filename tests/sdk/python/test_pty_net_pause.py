"""sandbox.pty, egress, ports, pause and resume."""
from __future__ import annotations

import time

import pytest

import forkbox

from test_lifecycle import wait_for_port


def wait_until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_pty_create_input_resize_wait(sb):
    got = []
    exits = []
    pty = sb.pty.create(cmd="bash", cols=100, rows=30, on_data=got.append, on_exit=exits.append)
    assert pty.id.startswith("pty-")
    pty.send_input("stty size\r")
    wait_until(lambda: b"30 100" in b"".join(got))
    pty.resize(cols=120, rows=40)
    pty.send_input(b"stty size; exit 5\r")
    assert pty.wait(10) == 5 and exits == [5]
    assert b"40 120" in pty.output and pty.output == b"".join(got)
    [info] = [s for s in sb.pty.list() if s.pty_id == pty.id]
    assert info.exit_code == 5 and info.cmd_label
    with pytest.raises(forkbox.Conflict):
        pty.send_input("late\r")


def test_pty_argv_kill_attach_read(sb):
    pty = sb.pty.create(cmd=["python3", "-u", "-c", "import time\nprint('tick', flush=True)\ntime.sleep(60)"])
    wait_until(lambda: b"tick" in pty.output)
    again = sb.pty.attach(pty.id)  # replays the ring
    wait_until(lambda: b"tick" in again.output)
    r = sb.pty.read(pty.id, since_seq=0, timeout_ms=2000)
    assert b"tick" in r["data"] and r["next_seq"] == len(r["data"]) and r["exited"] is False
    r2 = pty.read(since_seq=r["next_seq"], timeout_ms=300)  # long poll that times out empty
    assert r2["data"] == b""
    pty.kill()
    assert pty.wait(10) == 137 and again.wait(10) == 137
    with pytest.raises(forkbox.NotFound):
        sb.pty.read("pty-nosuchsession")


def test_pty_start_failure_is_an_error(sb):
    with pytest.raises(forkbox.NotFound):
        sb.pty.create(cmd="true", cwd="/nonexistent")


def test_egress_get_and_set(make):
    sb = make(egress=False)
    assert sb.get_egress() is False
    policy = {"allow": ["pypi.org", "10.0.0.0/8"]}
    assert sb.set_egress(policy) == policy
    assert sb.get_egress() == policy and sb.info()["egress"] == policy
    assert sb.set_egress(True) is True
    with pytest.raises(forkbox.BadRequest):
        sb.set_egress({"deny": []})
    assert sb.get_egress() is True


def test_ports(sb):
    sb.upload("/root/www/hello.txt", b"hello through the proxy")
    sb.run_code("nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory /root/www >/dev/null 2>&1 &",
                language="bash")
    wait_for_port(sb, 8000)
    url = sb.ports.url(8000, "/hello.txt")
    assert url == f"{sb._cfg.url}/v1/sandboxes/{sb.id}/ports/8000/hello.txt"
    r = sb.ports.request("GET", 8000, "hello.txt")
    assert r.status_code == 200 and r.content == b"hello through the proxy"
    assert sb.ports.request("GET", 8000, "/missing").status_code == 404  # the service's own answer


def test_pause_and_resume(sb):
    sb.run_code("import threading, time\nticks = [0]\n"
                "def loop():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.01)\n"
                "threading.Thread(target=loop, daemon=True).start()")
    assert sb.pause()["state"] == "paused"
    assert sb.info()["state"] == "paused"
    assert sb.resume()["state"] == "ready"
    assert int(sb.run_code("ticks[0]").text) > 0
    sb.pause()
    assert sb.run_code("print('a call resumes it')").stdout == "a call resumes it\n"
