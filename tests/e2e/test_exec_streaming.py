"""The exec NDJSON stream: events arrive while the code runs, are numbered
and ordered, carry raw-fd output, `nl`/`b64` fields, and concurrent execs
on one sandbox run one at a time in arrival order."""
from __future__ import annotations

import ast
import base64
import json
import os
import threading
import time

import httpx

from helpers import exec_raw, host_repl_pid


def assert_streams(sandbox):
    """A line printed before a 2 s sleep arrives long before the exit event
    (through the SDK's streaming iterator)."""
    arrivals = []
    for ev in sandbox.run_code_stream("import time\nprint('early')\ntime.sleep(2)\nprint('late')"):
        arrivals.append((time.monotonic(), ev))
    early = [t for t, ev in arrivals if ev.type == "stdout" and ev.data == "early"]
    late = [t for t, ev in arrivals if ev.type == "stdout" and ev.data == "late"]
    exits = [(t, ev) for t, ev in arrivals if ev.type == "exit"]
    assert early and late and len(exits) == 1, arrivals
    assert exits[0][1].data == 0
    assert exits[0][0] - early[0] >= 1.5, f"'early' arrived only {exits[0][0] - early[0]:.2f} s before exit"
    assert late[0] - early[0] >= 1.5
    # server timestamps agree
    ev_early = next(ev for _, ev in arrivals if ev.data == "early")
    ev_exit = exits[0][1]
    assert ev_exit.ts - ev_early.ts >= 1500, (ev_early, ev_exit)


def test_events_arrive_incrementally(sandbox):
    assert_streams(sandbox)


def test_output_held_in_fork_children_still_streams(sandbox):
    """The REPL holds a line up to 10 ms for more to go with it and a timer
    thread sends it (docs/repl-protocol.md); a forked REPL starts its own
    timer and thread, at every depth, and the parent's still works."""
    (child,) = sandbox.fork(1)
    try:
        (grandchild,) = child.fork(1)
        try:
            for sb in (grandchild, child, sandbox):
                assert_streams(sb)
                # Its own timer at fd 7 and the thread that waits on it.
                pid = host_repl_pid(sb.id)
                assert os.readlink(f"/proc/{pid}/fd/7") == "anon_inode:[timerfd]"
                assert len(os.listdir(f"/proc/{pid}/task")) == 2
        finally:
            grandchild.close()
    finally:
        child.close()


def test_bash_output_streams_too(sandbox, http):
    e = exec_raw(http, sandbox.id, "echo first; sleep 1.5; echo second", language="bash")
    assert e.exit_code == 0 and e.stdout == "first\nsecond\n", e
    i_first = next(i for i, ev in enumerate(e.events) if ev.get("data") == "first")
    assert e.arrivals[-1] - e.arrivals[i_first] >= 1.0


def test_seq_from_zero_strictly_increasing_and_exit_last(sandbox, http):
    e = exec_raw(http, sandbox.id, "import sys\nfor i in range(50):\n    print(i)\n    print('e', i, file=sys.stderr)\n'done'")
    seqs = [ev["seq"] for ev in e.events]
    assert seqs == list(range(len(e.events))), seqs
    ts = [ev["ts"] for ev in e.events]
    assert ts == sorted(ts)
    assert abs(ts[0] / 1000 - time.time()) < 60  # unix milliseconds
    assert e.events[-1]["type"] == "exit" and [ev["type"] for ev in e.events].count("exit") == 1
    for ev in e.events:
        assert set(ev) >= {"type", "data", "seq", "ts"}, ev
    # every exec numbers from 0 again
    e2 = exec_raw(http, sandbox.id, "print(1)")
    assert [ev["seq"] for ev in e2.events] == list(range(len(e2.events)))


def test_interleaved_stdout_and_stderr_keep_their_order(sandbox, http):
    e = exec_raw(http, sandbox.id, "import sys\nfor i in range(30):\n    print(f'o{i}')\n    print(f'e{i}', file=sys.stderr)")
    assert e.exit_code == 0
    got = [(ev["type"], ev["data"]) for ev in e.events if ev["type"] in ("stdout", "stderr")]
    want = []
    for i in range(30):
        want += [("stdout", f"o{i}"), ("stderr", f"e{i}")]
    assert got == want


def test_output_of_subprocesses_and_os_system_is_captured_in_order(sandbox, http):
    code = ("import os, subprocess, sys\n"
            "print('before')\n"
            "os.system('echo from-shell; echo shell-err >&2')\n"
            "subprocess.run(['echo', 'x'])\n"
            "os.write(1, b'raw-fd\\n')\n"
            "print('after')\n")
    e = exec_raw(http, sandbox.id, code)
    assert e.exit_code == 0, e
    assert e.stdout == "before\nfrom-shell\nx\nraw-fd\nafter\n"
    assert e.stderr == "shell-err\n"
    # and through the SDK
    r = sandbox.run_code("import subprocess\nsubprocess.run(['echo', 'x'])\nimport os\nos.system('echo from-shell')")
    assert r.exit_code == 0
    assert r.stdout == "x\nfrom-shell"


def test_nl_flags(sandbox, http):
    e = exec_raw(http, sandbox.id, "print('a', end='')")
    assert [(ev["data"], ev["nl"]) for ev in e.of("stdout")] == [("a", False)], e
    e = exec_raw(http, sandbox.id, "print('x')\nprint()\nprint('y', end='')")
    assert [(ev["data"], ev["nl"]) for ev in e.of("stdout")] == [("x", True), ("", True), ("y", False)], e
    e = exec_raw(http, sandbox.id, "import sys\nsys.stdout.write('par'); sys.stdout.write('tial\\nrest')")
    assert [(ev["data"], ev["nl"]) for ev in e.of("stdout")] == [("partial", True), ("rest", False)], e
    e = exec_raw(http, sandbox.id, "printf 'no-newline'", language="bash")
    assert [(ev["data"], ev["nl"]) for ev in e.of("stdout")] == [("no-newline", False)], e


def test_undecodable_bytes_travel_in_b64(sandbox, http):
    e = exec_raw(http, sandbox.id, "import os\nos.write(1, b'\\xff\\xfeok\\n')")
    assert e.exit_code == 0
    outs = e.of("stdout")
    assert len(outs) == 1, e
    assert base64.b64decode(outs[0]["b64"]) == b"\xff\xfeok"
    assert outs[0]["nl"] is True
    assert outs[0]["data"].endswith("ok")


def test_concurrent_execs_run_one_at_a_time_in_arrival_order(sandbox, server):
    sid = sandbox.id
    r = sandbox.run_code("import time\norder = []\nspans = []")
    assert r.exit_code == 0
    n = 6
    results: dict[int, object] = {}
    code = ("import time\n_t0 = time.monotonic()\norder.append({i})\ntime.sleep(0.15)\n"
            "spans.append(({i}, _t0, time.monotonic()))\nprint('done {i}')")

    def submit(i: int, client: httpx.Client) -> None:
        results[i] = exec_raw(client, sid, code.format(i=i))

    clients = [server.http() for _ in range(n)]
    for c in clients:  # connect first, so the stagger is the arrival order
        assert c.get("/v1/healthz").status_code == 200
    threads = [threading.Thread(target=submit, args=(i, clients[i])) for i in range(n)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    for i in range(n):
        e = results[i]
        assert e.exit_code == 0 and e.stdout == f"done {i}\n", (i, e)
    r = sandbox.run_code("print(order)\nprint(spans)")
    lines = r.stdout.split("\n")
    assert ast.literal_eval(lines[0]) == list(range(n))
    spans = ast.literal_eval(lines[1])
    for (i1, s1, e1), (i2, s2, e2) in zip(spans, spans[1:]):
        assert s2 >= e1, f"exec {i2} started at {s2} before exec {i1} ended at {e1}"


def test_background_thread_output_is_attached_to_the_next_exec(sandbox, http):
    e = exec_raw(http, sandbox.id, "import threading, time\n"
                                   "def later():\n    time.sleep(0.3)\n    print('from-thread', flush=True)\n"
                                   "threading.Thread(target=later).start()")
    assert e.exit_code == 0
    time.sleep(0.8)
    e = exec_raw(http, sandbox.id, "print('now')")
    assert e.exit_code == 0
    assert "from-thread\n" in e.stdout and e.stdout.endswith("now\n"), e


def test_replay_returns_recent_events(sandbox, http):
    r = sandbox.run_code("print('replay-me')")
    assert r.exit_code == 0
    events = sandbox.replay()  # the SDK parses it
    assert any(ev.type == "stdout" and ev.data == "replay-me" for ev in events), events
    assert events[-1].type == "exit"
    # capped at 1000 events
    r = sandbox.run_code("for i in range(1500):\n    print(i)")
    assert r.exit_code == 0
    resp = http.get(f"/v1/sandboxes/{sandbox.id}/replay")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in resp.text.splitlines() if x.strip()]
    assert len(lines) == 1000
    assert lines[-1]["type"] == "exit" and lines[-2]["data"] == "1499"
