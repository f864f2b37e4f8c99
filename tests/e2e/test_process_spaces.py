"""`processes` Spaces (docs/state.md): a sandbox created with
`keep_processes` (the default for `persistent: true`) is frozen whole by
criu and resumed with every process running again: the REPL's objects
(identity, a generator part-way, a thread still counting, an open file's
offset), a `python -m http.server` it started, a process started from bash.
Freezes criu cannot make fall back to a `globals` Space saying why; criu
forks and checkpoints such a sandbox with every process; ten freeze → resume cycles keep state and leak
nothing; a crash at any moment of a freeze leaves the sandbox or a whole
Space. Hibernation: a sandbox sent to disk keeps its id and wakes on
the next call."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest
from podflare import Client, Sandbox

from conftest import start_server, stop_and_assert_clean
from helpers import (Watch, assert_json_error, crash_during_freeze, create_raw, delete_raw, exec_ok, exec_raw, freeze, host_repl_pid, lazy_daemons, resume,
                     sandbox_host_pids, wait_no_leaks, wait_until)

py = exec_ok


def bash(http, sid, cmd) -> str:
    return exec_ok(http, sid, cmd, language="bash")


@pytest.fixture(scope="module")
def srv(say):
    """A server of this module's own, which the crash test kills."""
    s = start_server(say, "process-spaces", build=False)
    yield s
    stop_and_assert_clean(s)


@pytest.fixture
def c(srv):
    with srv.http(timeout=300) as c:
        yield c


SETUP = """
import itertools, os, subprocess, threading, time, urllib.request
x = [41]
alias = x
it = iter(range(100)); skipped = (next(it), next(it))
n = [0]
def tick():
    while True:
        n[0] += 1
        time.sleep(0.005)
t = threading.Thread(target=tick, daemon=True); t.start()
log = open('/root/log', 'w'); log.write('abc'); log.flush()
server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], cwd='/root', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def answers():
    return urllib.request.urlopen('http://127.0.0.1:8000/log', timeout=2).read()
"""

SERVER_UP = "import time\nfor _ in range(100):\n    try:\n        answers(); break\n    except OSError:\n        time.sleep(0.1)\nprint(answers())"


def test_a_freeze_keeps_every_process_and_the_resume_brings_them_back(c):
    sid = create_raw(c, persistent=True, egress=False)
    info = c.get(f"/v1/sandboxes/{sid}").json()
    assert (info["persistent"], info["keep_processes"]) == (True, True), info
    py(c, sid, SETUP)
    assert py(c, sid, SERVER_UP) == "b'abc'\n"
    # A process started from bash, outside the REPL.
    bash(c, sid, "nohup sleep 1000 > /dev/null 2>&1 &")
    counted = int(py(c, sid, "print(n[0])"))

    space = freeze(c, sid)
    assert space["kind"] == "processes" and "processes_not_kept" not in space, space
    was = c.get(f"/v1/sandboxes/{sid}").json()
    assert (was["state"], was["space_id"]) == ("frozen", space["space_id"]), was
    listed = c.get(f"/v1/spaces/{space['space_id']}").json()
    assert (listed["kind"], listed["bytes"] > 0) == ("processes", True), listed

    new = resume(c, space["space_id"])
    assert new != sid
    assert c.get(f"/v1/sandboxes/{new}").json()["keep_processes"] is True
    got = py(c, new, "print(x[0] + 1, alias is x, next(it), log.tell(), server.poll(), answers())")
    assert got == "42 True 2 3 None b'abc'\n", got
    after = int(py(c, new, "time.sleep(0.1); print(n[0])"))
    assert after > counted, (counted, after)
    # The sandbox is the new one: its name, its HOSTNAME; bash's process lives.
    assert py(c, new, "import os\nprint(os.uname().nodename, os.environ['HOSTNAME'])") == f"{new} {new}\n"
    assert "sleep 1000" in bash(c, new, "ps -eo args")
    # It goes on working: a new process, a new file.
    assert bash(c, new, "echo more >> /root/log && cat /root/log") == "abcmore\n"
    delete_raw(c, new)


LAZY_SETUP = """
import os, subprocess, time, urllib.request
blob = os.urandom(100 << 20)
server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], cwd='/root', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def up():
    try:
        return urllib.request.urlopen('http://127.0.0.1:8000/', timeout=2).status
    except OSError as e:
        return repr(e)
for _ in range(100):
    if up() == 200: break
    time.sleep(0.1)
print(up())
"""
# Memory the REPL did not have at the freeze: its heap grows (pages no
# image holds, in ranges the restore registered) and is given back.
GROW = "more = bytearray(64 << 20)\nmore[::4096] = b'x' * (len(more) // 4096)\ndel more\nprint(hashlib.sha256(blob).hexdigest() == want)"


def test_a_lazy_resume_runs_every_process_while_its_pages_come_in(c):
    """By default a resume is lazy (docs/state.md#lazy-resume): each process
    runs at once, and its faults are answered while the rest of its pages
    come in and after. (When the shim held its copy of a process's
    userfaultfd until the daemon ended, the child here did not answer.)"""
    sid = create_raw(c, keep_processes=True, ram_mib=1024, egress=False)
    assert py(c, sid, LAZY_SETUP) == "200\n"
    py(c, sid, "import hashlib\nwant = hashlib.sha256(blob).hexdigest()")
    # Three rounds: whether a process is done with its pages before another
    # touches memory it did not have is a race each round.
    for _ in range(3):
        with Watch(lazy_daemons) as seen:
            sid = resume(c, freeze(c, sid)["space_id"])
        assert seen, "no criu lazy-pages daemon ran: the resume was not lazy"
        assert py(c, sid, "print(up(), server.poll())") == "200 None\n"
        assert py(c, sid, GROW) == "True\n"
        assert py(c, sid, "print(up())") == "200\n"
    delete_raw(c, sid)


def test_the_podflare_sdk_resumes_a_processes_space(srv, c):
    sid = create_raw(c, persistent=True, egress=False)
    py(c, sid, "import threading, time\nn = [0]\nthreading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()")
    space = freeze(c, sid)["space_id"]
    client = Client(host=srv.url, timeout=300.0)
    try:
        sb = Sandbox.resume(space, client=client)
        first = int(sb.run_code("print(n[0])").stdout)
        time.sleep(0.1)
        assert int(sb.run_code("print(n[0])").stdout) > first
        sb.close()
    finally:
        client.close()


def test_a_resumed_sandbox_forks_with_every_process_each_child_its_own(c):
    """A keep_processes sandbox is solo, so criu forks it: each child has
    the REPL's objects, the thread still counting and its own copy of the
    http.server; what one child does, no other sandbox sees."""
    sid = resume(c, freeze(c, create_with_setup(c))["space_id"])
    py(c, sid, "import random\nrandom.seed(3)")
    r = c.post(f"/v1/sandboxes/{sid}/fork", json={"n": 3})
    assert r.status_code == 200, r.text
    children = r.json()["children"]
    assert len(set(children + [sid])) == 4
    for i, child in enumerate(children):
        got = py(c, child, f"x[0] += {i}\nprint(x[0], alias is x, next(it), log.tell(), server.poll(), answers())")
        assert got == f"{41 + i} True 2 3 None b'abc'\n", (child, got)
        counted = int(py(c, child, "print(n[0])"))
        assert int(py(c, child, "time.sleep(0.1); print(n[0])")) > counted
        assert py(c, child, "print(os.uname().nodename)") == f"{child}\n"
        info = c.get(f"/v1/sandboxes/{child}").json()
        assert info["keep_processes"] is True, info
    # Copies, as fork children, draw their own random numbers.
    draws = {py(c, child, "print(random.random())") for child in children}
    assert len(draws) == 3, draws
    # Each child's server serves its own files; the parent's is untouched.
    bash(c, children[0], "echo changed > /root/log")
    assert py(c, children[0], "print(answers())") == "b'changed\\n'\n"
    assert py(c, children[1], "print(answers())") == "b'abc'\n"
    assert py(c, sid, "print(x[0], next(it), answers())") == "41 2 b'abc'\n"
    # Killing a child's server leaves every other one serving.
    py(c, children[1], "server.kill(); server.wait()")
    assert py(c, children[2], "print(server.poll(), answers())") == "None b'abc'\n"
    # Merge: the parent's id takes a child's processes.
    assert c.post(f"/v1/sandboxes/{sid}/merge_into/{children[0]}").status_code == 204
    assert py(c, sid, "print(x[0], answers())") == "41 b'changed\\n'\n"
    for child in children[1:] + [sid]:
        delete_raw(c, child)


def test_checkpoints_of_a_keep_processes_sandbox_roll_back_every_process(c):
    sid = create_with_setup(c)
    cp = c.post(f"/v1/sandboxes/{sid}/checkpoints")
    assert cp.status_code == 200, cp.text
    checkpoint = cp.json()["checkpoint"]
    py(c, sid, "x[0] = 0\nserver.kill(); server.wait()")
    bash(c, sid, "rm /root/log")
    # Restored twice: each time the server runs again, on the files it had.
    for _ in range(2):
        r = c.post(f"/v1/sandboxes/{sid}/restore", json={"checkpoint": checkpoint})
        assert r.status_code == 200, r.text
        assert py(c, sid, "print(x[0], server.poll(), answers(), next(it))") == "41 None b'abc' 2\n"
    delete_raw(c, sid)


def test_a_keep_processes_sandbox_can_opt_out(c):
    """keep_processes: false keeps a persistent sandbox a pooled one."""
    plain = create_raw(c, persistent=True, keep_processes=False, egress=False)
    assert c.get(f"/v1/sandboxes/{plain}").json()["keep_processes"] is False
    r = c.post(f"/v1/sandboxes/{plain}/fork", json={"n": 1})
    assert r.status_code == 200, r.text
    for child in r.json()["children"]:
        delete_raw(c, child)
    assert c.post("/v1/sandboxes", json={"keep_processes": "yes"}).status_code == 400
    delete_raw(c, plain)


def create_with_setup(c) -> str:
    sid = create_raw(c, persistent=True, egress=False)
    py(c, sid, SETUP)
    assert py(c, sid, SERVER_UP) == "b'abc'\n"
    return sid


def test_a_freeze_criu_cannot_make_keeps_the_globals_and_says_why(c):
    """An established TCP connection (loopback too) is one criu refuses
    without --tcp-established: the sandbox is not lost, the freeze makes a
    `globals` Space naming criu's reason, and the globals come back."""
    sid = create_raw(c, persistent=True, egress=False)
    py(c, sid, "import socket\nkept = 'yes'\nl = socket.create_server(('127.0.0.1', 9000))\n"
               "conn = socket.create_connection(('127.0.0.1', 9000)); peer, _ = l.accept()")
    space = freeze(c, sid)
    assert space["kind"] == "globals", space
    why = space["processes_not_kept"]
    assert "criu could not dump it" in why and "TCP" in why, why
    new = resume(c, space["space_id"])
    assert py(c, new, "print(kept)") == "yes\n"
    delete_raw(c, new)


def test_ten_freeze_resume_cycles_keep_state_and_leak_nothing(srv, c):
    sid = create_raw(c, persistent=True, egress=False)
    py(c, sid, "import threading, time\nhistory = []\nn = [0]\n"
               "threading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()")
    bash(c, sid, "nohup sleep 1000 > /dev/null 2>&1 &")
    last = 0
    for cycle in range(10):
        py(c, sid, f"history.append({cycle})")
        sid = resume(c, freeze(c, sid)["space_id"])
        assert py(c, sid, "print(history)") == f"{list(range(cycle + 1))}\n"
        now = int(py(c, sid, "print(n[0])"))
        assert now > last, (cycle, last, now)
        last = now
        assert bash(c, sid, "pgrep -c -f 'sleep 1000'") == "1\n"
        # Each resumed sandbox forks and is checkpointed too; the child
        # is deleted, the checkpoint goes with the next freeze.
        child = c.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}).json()["children"][0]
        assert py(c, child, "print(history[-1])") == f"{cycle}\n"
        delete_raw(c, child)
        checkpoint = c.post(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoint"]
    # The last checkpoint is a family of its own; the earlier ones are gone.
    assert c.delete(f"/v1/sandboxes/{sid}/checkpoints/{checkpoint}").status_code == 204
    assert wait_no_leaks(srv, expect_volume_mounted=True, live_ids={sid}) == []
    delete_raw(c, sid)
    assert c.get("/v1/spaces").json() == {"spaces": []}


def test_a_crash_during_a_processes_freeze_leaves_the_sandbox_or_a_whole_space(srv):
    """kill -9 the server at random moments of a freeze: afterwards the
    sandbox answers with its state (adopted by the restarted server, and
    running: the freeze had paused it), or a `processes` Space resumes
    with it; never neither, never both."""
    rng = random.Random(11)
    outcomes = []
    for round_no in range(6):
        with srv.http(timeout=300) as c:
            sid = create_raw(c, persistent=True, egress=False)
            py(c, sid, "import os, threading, time\nblob = os.urandom(256 << 20)\nmarker = 'round-%d'\nn = [0]\n"
                       "threading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()" % round_no)
        # Spread over the freeze (0.2-0.45 s here, paused from about
        # 0.2 s): early kills find the sandbox, late ones the Space.
        crash_during_freeze(srv, sid, 0.1 + round_no * 0.08 + rng.uniform(0.0, 0.04))
        with srv.http(timeout=300) as c:
            spaces = c.get("/v1/spaces").json()["spaces"]
            was = c.get(f"/v1/sandboxes/{sid}")
            alive = was.status_code == 200 and was.json()["state"] != "frozen"
            assert len(spaces) + int(alive) == 1, (spaces, alive)
            if alive:
                # Paused by the freeze the crash cut short: running again.
                assert was.json()["state"] == "ready", was.json()
                target, outcome = sid, "sandbox"
            else:
                assert spaces[0]["kind"] == "processes", spaces
                target, outcome = resume(c, spaces[0]["space_id"]), "space"
            got = py(c, target, "print(marker, len(blob), n[0] > 0)")
            assert got == f"round-{round_no} {256 << 20} True\n", got
            outcomes.append(outcome)
            delete_raw(c, target)
            assert c.get("/v1/spaces").json() == {"spaces": []}
    print("crashed freezes left:", outcomes)


def criu_is_inside(pid: int) -> bool:
    """Whether criu's parasite code is mapped into host process `pid`
    (from a memfd criu names CRIUMFD, for as long as it reads the
    process's memory)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/memfd:CRIUMFD" in f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False


BLOB = """import os, threading, time
blob = os.urandom(512 << 20)
n = [0]
threading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()"""


def seconds_criu_is_inside(c, sid: str, repl: int) -> float:
    """Freeze `sid` to its end, timing how long criu's parasite stays in
    its REPL; the Space is deleted again."""
    seen = []
    done = threading.Event()
    space = {}

    def freeze_it():
        try:
            space.update(freeze(c, sid))
        finally:
            done.set()        # a failed freeze must not leave the poll below spinning

    t = threading.Thread(target=freeze_it)
    t.start()
    while not done.is_set():
        if criu_is_inside(repl):
            seen.append(time.monotonic())
        time.sleep(0.001)
    t.join()
    assert "space_id" in space, "the freeze failed"
    assert c.delete(f"/v1/spaces/{space['space_id']}").status_code == 204, space
    assert seen, "criu was never seen inside the REPL"
    return seen[-1] - seen[0]


def test_a_server_killed_while_criu_is_inside_the_repl_leaves_the_repl_running(srv):
    """kill -9 the server while criu's dump has its parasite inside the
    REPL, early and late in the REPL's memory: criu runs on to its end
    (killed with the server, it left its code mapped in the REPL, and at
    times the REPL died of it), the restarted server waits for it before it
    takes the sandbox back, and the same REPL process answers with its
    state, running again; no Space is left."""
    # How long criu is inside varies with the machine and its load (about
    # a second per 512 MiB on a quiet 2-core one, 0.3 s seen under CI's
    # parallel suites): the later moments are shares of it, timed here.
    with srv.http(timeout=300) as c:
        sid = create_raw(c, persistent=True, egress=False)
        py(c, sid, BLOB)
        inside_for = seconds_criu_is_inside(c, sid, host_repl_pid(sid))
    for share in (0.0, 0.1, 0.4):
        with srv.http(timeout=300) as c:
            sid = create_raw(c, persistent=True, egress=False)
            py(c, sid, BLOB)
        repl = host_repl_pid(sid)
        inside = []
        later = share * inside_for

        def when():
            if not inside and criu_is_inside(repl):
                inside.append(time.monotonic())
            return bool(inside) and time.monotonic() >= inside[0] + later and criu_is_inside(repl)

        try:
            crash_during_freeze(srv, sid, 60, until=when)
        finally:
            with srv.http(timeout=300) as c:
                spaces = c.get("/v1/spaces").json()["spaces"]
                for space in spaces:      # a freeze the crash missed: none for the next tests
                    c.delete(f"/v1/spaces/{space['space_id']}")
        with srv.http(timeout=300) as c:
            assert spaces == [], f"a Space was made (criu inside for {inside_for:.2f} s, crash {later:.2f} s in)"
            assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "ready"
            assert host_repl_pid(sid) == repl, "the REPL is the same process"
            assert not criu_is_inside(repl), "criu's code was left in the REPL"
            before = int(py(c, sid, "print(n[0])"))
            time.sleep(0.2)
            assert py(c, sid, "print(len(blob), n[0] > %d)" % before) == f"{512 << 20} True\n"
            delete_raw(c, sid)


def test_a_hibernated_sandbox_keeps_its_id_frees_its_memory_and_wakes_on_the_next_call(c):
    sid = create_raw(c, persistent=True, egress=False)
    py(c, sid, SETUP)
    assert py(c, sid, SERVER_UP) == "b'abc'\n"
    assert sandbox_host_pids(sid), "the sandbox runs processes"
    info = c.post(f"/v1/sandboxes/{sid}/hibernate").json()
    assert (info["id"], info["state"]) == (sid, "hibernated"), info
    # On disk only: no process, no Space listed, but its id answers.
    assert sandbox_host_pids(sid) == []
    assert c.get("/v1/spaces").json() == {"spaces": []}
    assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "hibernated"
    listed = {s["id"]: s["state"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
    assert listed.get(sid) == "hibernated", listed
    assert sandbox_host_pids(sid) == [], "listing it does not wake it"
    # Five calls at once: each is served, by one waking.
    results = [None] * 5

    def call(i):
        results[i] = exec_raw(c, sid, "print(x[0] + 1, next(it), server.poll(), answers())")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    outs = sorted(r.stdout for r in results)
    assert [o.split()[0] for o in outs] == ["42"] * 5 and sorted(int(o.split()[1]) for o in outs) == [2, 3, 4, 5, 6], outs
    assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "ready"
    assert bash(c, sid, "hostname") == f"{sid}\n"
    delete_raw(c, sid)
    assert c.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_a_hibernating_sandbox_whose_lifetime_ends_is_discarded(srv, c):
    sid = create_raw(c, persistent=True, timeout_seconds=3, egress=False)
    assert c.post(f"/v1/sandboxes/{sid}/hibernate").json()["state"] == "hibernated"
    spaces = os.path.join(srv.state_dir, "spaces")
    assert [d for d in os.listdir(spaces) if d.startswith("sp-")], "its Space is on disk"
    # Discarded within the sweep's 30 s once its 3 s are up.
    wait_until(lambda: c.get(f"/v1/sandboxes/{sid}").status_code == 404, 45, "the hibernating sandbox is discarded")
    assert not [d for d in os.listdir(spaces) if d.startswith("sp-")]
