"""PTY sessions through the published podflare SDK's `sandbox.pty`, and the
raw routes it does not wrap (read, attach after a disconnect), with every
limit at its edge."""
from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from helpers import assert_json_error, exec_raw


class Screen:
    """Collects a session's output; `wait_for` blocks until text appears."""

    def __init__(self):
        self.data = b""
        self.cond = threading.Condition()

    def __call__(self, chunk: bytes):
        with self.cond:
            self.data += chunk
            self.cond.notify_all()

    def wait_for(self, text: str, timeout: float = 15) -> str:
        with self.cond:
            ok = self.cond.wait_for(lambda: text.encode() in self.data, timeout)
        assert ok, f"{text!r} never appeared; screen so far: {self.data[-2000:]!r}"
        return self.data.decode(errors="replace")


def pty_url(sid, *rest):
    return "/".join([f"/v1/sandboxes/{sid}/pty", *rest])


def test_bash_on_a_real_terminal_via_the_sdk(sandbox):
    screen = Screen()
    h = sandbox.pty.create(cmd="bash", cols=100, rows=30, on_data=screen)
    try:
        assert h.id.startswith("pty-")
        h.send_input("python3 -c 'import os,sys; print(\"TTY\", sys.stdin.isatty(), sys.stdout.isatty(), os.ttyname(0), os.get_terminal_size())'\r")
        out = screen.wait_for("columns=100, lines=30)")
        assert "TTY True True /dev/pts/" in out, out
        # The terminal is the session's controlling tty: ^C reaches the
        # foreground job, and the shell lives on.
        h.send_input("sleep 60; echo not-interrupted\r")
        time.sleep(0.5)
        h.send_input(b"\x03")
        h.send_input("echo status=$?\r")
        out = screen.wait_for("status=130")
        assert "\r\nnot-interrupted" not in out, out
        # Resizing sends SIGWINCH to the foreground program.
        h.send_input("python3 -c \"import signal,os,time; signal.signal(signal.SIGWINCH, lambda *a: print('WINCH', os.get_terminal_size(), flush=True)); print('armed', flush=True); time.sleep(20)\"\r")
        screen.wait_for("armed")
        # bash hands the terminal's foreground to its job a moment after the
        # job starts (a SIGWINCH before that goes to bash, as on any terminal).
        time.sleep(0.5)
        h.resize(cols=132, rows=43)
        screen.wait_for("WINCH os.terminal_size(columns=132, lines=43)")
        h.send_input(b"\x03")
        h.send_input("exit 7\r")
        assert h.wait(timeout=15) == 7
    finally:
        h.close()
    info = {s.pty_id: s for s in sandbox.pty.list()}
    assert info[h.id].exit_code == 7 and info[h.id].cmd_label == "bash"


def test_a_pty_runs_in_the_sandbox_like_bash_calls(sandbox, http):
    screen = Screen()
    h = sandbox.pty.create(cmd=["/bin/sh", "-c", "echo host=$(hostname); grep -E '^(Seccomp|CapEff|NoNewPrivs):' /proc/self/status"], on_data=screen)
    assert h.wait(timeout=15) == 0
    out = screen.data.decode()
    bash = exec_raw(http, sandbox.id, "echo host=$(hostname); grep -E '^(Seccomp|CapEff|NoNewPrivs):' /proc/self/status", language="bash").stdout
    for line in bash.splitlines():
        assert line in out.replace("\r\n", "\n"), (line, out)
    assert f"host={sandbox.id}" in out


def test_env_cwd_argv_and_exit_codes(sandbox):
    sandbox.run_code("open('/tmp/shared', 'w').write('same files')")
    screen = Screen()
    h = sandbox.pty.create(cmd=["/bin/bash", "-c", "echo $MY_VAR $TERM $(pwd); cat /tmp/shared; echo; exit 3"], on_data=screen,
                           env={"MY_VAR": "hello"}, cwd="/tmp")
    assert h.wait(timeout=15) == 3
    out = screen.data.decode()
    assert "hello xterm-256color /tmp" in out and "same files" in out, out
    screen = Screen()
    h = sandbox.pty.create(cmd=["/no/such/program"], on_data=screen)
    assert h.wait(timeout=15) == 127
    assert "/no/such/program" in screen.data.decode()


def test_several_sessions_at_once(sandbox):
    screens = [Screen() for _ in range(3)]
    handles = [sandbox.pty.create(cmd=f"for i in 1 2 3; do echo session-{n}-$i; sleep 0.2; done", on_data=screens[n]) for n in range(3)]
    for n, h in enumerate(handles):
        assert h.wait(timeout=15) == 0
        out = screens[n].data.decode()
        assert all(f"session-{n}-{i}" in out for i in (1, 2, 3)), out
        assert not any(f"session-{m}-" in out for m in range(3) if m != n), out


def test_disconnect_reattach_and_long_poll_read(sandbox, http):
    # Open a session with raw HTTP and walk away from its stream.
    with http.stream("POST", pty_url(sandbox.id), json={"shellCmd": "bash", "cols": 80, "rows": 24}) as r:
        assert r.status_code == 200
        first = json.loads(next(r.iter_lines()))
        assert first["type"] == "pty_ready"
        pid = first["session_id"]
    # The session lives on: type into it and read with long polls.
    def send(text):
        r = http.post(pty_url(sandbox.id, pid, "input"), json={"data_b64": base64.b64encode(text.encode()).decode()})
        assert r.status_code == 204, r.text
    send("echo marker-$((6*7))\r")
    seq, out = 0, b""
    deadline = time.time() + 15
    while b"marker-42" not in out and time.time() < deadline:
        chunk = http.post(pty_url(sandbox.id, pid, "read"), json={"since_seq": seq, "max_bytes": 4096, "timeout_ms": 2000}).json()
        assert chunk["seq"] == seq and chunk["dropped"] == 0
        out += base64.b64decode(chunk["data_b64"])
        seq = chunk["next_seq"]
    assert b"marker-42" in out
    # A read with nothing new waits about its timeout, then answers empty.
    t0 = time.time()
    quiet = http.post(pty_url(sandbox.id, pid, "read"), json={"since_seq": 10**9, "timeout_ms": 700}).json()
    assert 0.5 < time.time() - t0 < 5 and quiet["data_b64"] == "" and quiet["exited"] is False
    # Re-attach with the SDK: the ring replays what was missed, then live.
    screen = Screen()
    h = sandbox.pty.attach(pid, on_data=screen)
    screen.wait_for("marker-42")
    h.send_input("echo after-attach; exit 5\r")
    assert h.wait(timeout=15) == 5
    assert "after-attach" in screen.data.decode()
    done = http.post(pty_url(sandbox.id, pid, "read"), json={"since_seq": 10**9}).json()
    assert done["exited"] is True and done["exit_code"] == 5


def test_ring_buffer_keeps_the_last_mebibyte(sandbox, http):
    screen = Screen()
    h = sandbox.pty.create(cmd="head -c 3000000 /dev/zero | tr '\\0' x; echo; echo THE-END", on_data=screen)
    assert h.wait(timeout=60) == 0
    replay = Screen()
    a = sandbox.pty.attach(h.id, on_data=replay)
    assert a.wait(timeout=15) == 0
    assert replay.data.endswith(b"THE-END\r\n")
    assert len(replay.data) == 1 << 20, len(replay.data)
    chunk = http.post(pty_url(sandbox.id, h.id, "read"), json={"since_seq": 0, "max_bytes": 10}).json()
    assert chunk["dropped"] > 1_900_000 and chunk["seq"] == chunk["dropped"] and len(base64.b64decode(chunk["data_b64"])) == 10
    assert_json_error(http.post(pty_url(sandbox.id, h.id, "read"), json={"max_bytes": 0}), 400)
    assert_json_error(http.post(pty_url(sandbox.id, h.id, "read"), json={"max_bytes": (1 << 20) + 1}), 400)
    assert http.post(pty_url(sandbox.id, h.id, "read"), json={"max_bytes": 1 << 20, "since_seq": 0}).status_code == 200


def test_kill_ends_the_whole_session(sandbox, http):
    screen = Screen()
    h = sandbox.pty.create(cmd="bash", on_data=screen)
    h.send_input("sleep 1000 & sleep 1001 & echo started\r")
    screen.wait_for("started")
    # (each job execs `sleep` a moment after the shell forks it)
    deadline = time.time() + 5
    while time.time() < deadline:
        running = exec_raw(http, sandbox.id, "pgrep -c -f 'sleep 100[01]'", language="bash").stdout.strip()
        if running == "2":
            break
        time.sleep(0.1)
    assert running == "2"
    h.kill()
    assert h.wait(timeout=15) == 137
    deadline = time.time() + 5
    while time.time() < deadline:
        left = exec_raw(http, sandbox.id, "pgrep -f 'sleep 100[01]' || true", language="bash").stdout.strip()
        if not left:
            break
        time.sleep(0.2)
    assert left == "", "background jobs of the session are killed with it"
    # Input, resize to an exited session: 409; kill again: fine.
    assert_json_error(http.post(pty_url(sandbox.id, h.id, "input"), json={"data_b64": "eA=="}), 409)
    assert_json_error(http.post(pty_url(sandbox.id, h.id, "resize"), json={"cols": 10, "rows": 10}), 409)
    assert http.post(pty_url(sandbox.id, h.id, "kill")).status_code == 204


def test_a_kill_right_after_create_is_not_lost(sandbox):
    # The command may not have become a session leader yet when the kill
    # arrives; it must die all the same.
    for i in range(15):
        h = sandbox.pty.create(cmd="sleep 1000")
        h.kill()
        assert h.wait(timeout=15) == 137, i


def test_timeout_ms_kills_the_session(sandbox, http):
    r = http.post(pty_url(sandbox.id), json={"shellCmd": "sleep 100", "timeout_ms": 500})
    ready = json.loads(r.text.splitlines()[0])
    assert json.loads(r.text.splitlines()[-1]) == {"type": "pty_exit", "data": 137}, r.text
    assert ready["type"] == "pty_ready"


def test_limits_and_bad_requests(sandbox, http):
    sid = sandbox.id
    for body in ({}, {"shellCmd": "x", "argv": ["y"]}, {"argv": []}, {"argv": [""]}, {"shellCmd": "x", "cols": 0},
                 {"shellCmd": "x", "rows": 4097}, {"shellCmd": "x", "env": [["A=B", "c"]]}, {"shellCmd": "x", "bogus": 1},
                 {"shellCmd": "x", "cwd": "/etc/hostname"}):
        assert_json_error(http.post(pty_url(sid), json=body), 400)
    assert_json_error(http.post(pty_url(sid), json={"shellCmd": "x", "cwd": "/nope"}), 404)
    assert_json_error(http.post(pty_url(sid, "pty-nosuch", "input"), json={"data_b64": ""}), 404)
    assert_json_error(http.get(pty_url(sid, "pty-nosuch", "attach")), 404)
    # 16 running sessions at once; the 17th is refused until one ends.
    streams = []
    try:
        for _ in range(16):
            cm = http.stream("POST", pty_url(sid), json={"shellCmd": "sleep 300", "rows": 4096, "cols": 4096})
            r = cm.__enter__()
            assert r.status_code == 200
            streams.append((cm, json.loads(next(r.iter_lines()))["session_id"]))
        assert_json_error(http.post(pty_url(sid), json={"shellCmd": "true"}), 429)
        big = base64.b64encode(b"x" * ((1 << 20) + 1)).decode()
        assert_json_error(http.post(pty_url(sid, streams[0][1], "input"), json={"data_b64": big}), 413)
        assert_json_error(http.post(pty_url(sid, streams[0][1], "input"), json={"data_b64": "not base64!"}), 400)
        assert http.post(pty_url(sid, streams[0][1], "kill")).status_code == 204
        deadline = time.time() + 10
        while time.time() < deadline:
            r = http.post(pty_url(sid), json={"shellCmd": "true"})
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and '"pty_exit"' in r.text
    finally:
        for cm, pid in streams:
            http.post(pty_url(sid, pid, "kill"))
            cm.__exit__(None, None, None)


def test_sessions_end_with_their_sandbox(make_sandbox, http):
    sb = make_sandbox()
    screen = Screen()
    h = sb.pty.create(cmd="sleep 600", on_data=screen)
    http.delete(f"/v1/sandboxes/{sb.id}")
    assert h.wait(timeout=20) in (-1, 137)
