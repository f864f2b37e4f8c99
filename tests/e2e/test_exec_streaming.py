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


# ── output: "chunks" (forkbox's SDKs ask for it; podflare's gets lines) ──

MANY_LINES = ("import sys\n"
              "for i in range(20000):\n"
              "    print(i)\n"
              "    if i % 5000 == 0:\n"
              "        print('err', i, file=sys.stderr)\n"
              "sys.stdout.buffer.write(b'\\xff\\xfe raw\\n')\n"
              "print('tail', end='')")


def test_chunks_carry_the_same_bytes_as_lines_in_far_fewer_events(sandbox, http):
    """The same cell both ways: every byte, in order, stdout against stderr;
    one event per line by default, a few per batch with chunks; sequence
    numbers count lines either way."""
    lines = exec_raw(http, sandbox.id, MANY_LINES)
    chunks = exec_raw(http, sandbox.id, MANY_LINES, output="chunks")
    assert lines.exit_code == 0 and chunks.exit_code == 0, chunks
    want = "".join(f"{i}\n" for i in range(20000)) + "\ufffd\ufffd raw\ntail"
    assert lines.stdout == want and chunks.stdout == want
    assert chunks.stderr == lines.stderr == "".join(f"err {i}\n" for i in range(0, 20000, 5000))
    assert len(lines.of("stdout")) == 20002
    assert len(chunks.of("stdout")) < 200, len(chunks.of("stdout"))
    assert all(ev.get("lines", 2) > 1 for ev in chunks.of("stdout")), "`lines` only on events of more than one"
    # The raw bytes come whole in b64.
    b64 = [base64.b64decode(ev["b64"]) for ev in chunks.of("stdout") if "b64" in ev]
    assert len(b64) == 1 and b"\xff\xfe raw" in b64[0], chunks

    # stdout and stderr interleave the same way.
    def runs(e):
        out = []
        for ev in e.events:
            if ev["type"] in ("stdout", "stderr"):
                text = ev["data"] + ("\n" if ev.get("nl") else "")
                if out and out[-1][0] == ev["type"]:
                    out[-1][1] += text
                else:
                    out.append([ev["type"], text])
        return out
    assert runs(chunks) == runs(lines)
    assert len(runs(chunks)) == 9  # 4 stderr lines between 5 runs of stdout
    seq = 0
    for ev in chunks.events:
        assert ev["seq"] == seq, (ev, seq)
        seq += ev.get("lines", 1)
    assert chunks.events[-1]["seq"] == lines.events[-1]["seq"]


def test_chunks_keep_stdout_and_stderr_in_order(sandbox, http):
    e = exec_raw(http, sandbox.id, "import sys\nfor i in range(30):\n    print(f'o{i}')\n    print(f'e{i}', file=sys.stderr)",
                 output="chunks")
    got = [(ev["type"], line) for ev in e.events if ev["type"] in ("stdout", "stderr") for line in ev["data"].split("\n")]
    assert got == [(k, f"{p}{i}") for i in range(30) for k, p in (("stdout", "o"), ("stderr", "e"))], e


def test_replay_after_chunks_holds_at_most_1000_lines_newest_last(sandbox, http):
    e = exec_raw(http, sandbox.id, "for i in range(5000):\n    print(i)", output="chunks")
    assert e.exit_code == 0
    resp = http.get(f"/v1/sandboxes/{sandbox.id}/replay")
    events = [json.loads(x) for x in resp.text.splitlines() if x.strip()]
    assert 0 < sum(ev.get("lines", 1) for ev in events) <= 1000, events
    assert events[-1]["type"] == "exit" and events[-2]["data"].endswith("4999")
    text = "\n".join(ev["data"] for ev in events if ev["type"] == "stdout")
    assert text.endswith("4998\n4999") and len(text.split("\n")) >= 500, text[-50:]


def test_an_unknown_output_mode_is_a_400(sandbox, http):
    for bad in ("bytes", "", 1, None):
        r = http.post(f"/v1/sandboxes/{sandbox.id}/exec", json={"code": "print(1)", "output": bad})
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert "output" in r.json()["error"], r.text
    assert exec_raw(http, sandbox.id, "print(1)").stdout == "1\n"
