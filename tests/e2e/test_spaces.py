"""Spaces (docs/state.md): freeze a sandbox to disk, survive a server
crash, resume it into a new sandbox with its files, imports, cwd,
environment, sys.path and picklable globals; say what could not be kept;
never resume a half-written Space."""
from __future__ import annotations

import os
import random
import re
import time

import pytest
from podflare import Client, Sandbox

from conftest import start_server, stop_and_assert_clean
from helpers import assert_json_error, crash_during_freeze, create_raw, delete_raw, exec_ok, exec_raw, freeze, resume


py = exec_ok


def restart(srv, crash: bool = True) -> None:
    srv.kill() if crash else srv.stop()
    srv.start()
    srv.wait_ready()


@pytest.fixture(scope="module")
def srv(say, datasci):
    """A server of this module's own, which the tests crash and restart
    (the python-datasci template is built by then)."""
    s = start_server(say, "spaces", build=False)
    yield s
    stop_and_assert_clean(s)


@pytest.fixture
def c(srv):
    with srv.http(timeout=300) as c:
        yield c


SETUP = """
import os, sys, socket, json
import pandas as pd
df = pd.DataFrame({'a': range(1000), 'b': [str(i) * 3 for i in range(1000)]})
twice = df            # the same object under two names
def scaled(k):
    return df.a.sum() * k
class Point:
    def __init__(self, x): self.x = x
    def norm(self): return abs(self.x)
p = Point(-7)
def make_adder(n):
    return lambda v: v + n
add5 = make_adder(5)
sock = socket.socket()
gen = (i for i in range(3))
os.makedirs('/tmp/work', exist_ok=True); os.chdir('/tmp/work')
os.environ['MY_SETTING'] = 'kept'
sys.path.append('/opt/mylib')
os.makedirs('/opt/mylib', exist_ok=True)
open('/opt/mylib/mymod.py', 'w').write('VALUE = 42\\n')
import mymod
open('/root/notes.txt', 'w').write('hello space')
os.remove('/etc/motd')
"""

CHECK = """
import sys, os
print(df.shape, twice is df, scaled(2), p.norm(), add5(1), mymod.VALUE, 'pandas' in sys.modules)
print(os.getcwd(), os.environ['MY_SETTING'], '/opt/mylib' in sys.path, os.environ['HOSTNAME'] == SID)
print(open('/root/notes.txt').read(), os.path.exists('/etc/motd'), os.path.exists('/.forkbox-space'))
print('sock' in globals(), 'gen' in globals())
"""


def test_freeze_crash_the_server_and_resume_everything(srv, c):
    http = c
    sid = create_raw(http, template="python-datasci", egress=False)
    py(http, sid, SETUP)
    space = freeze(http, sid)
    assert space["sandbox_id"] == sid and space["space_id"].startswith("sp-") and space["bytes"] > 0, space
    unsaved = {u["name"]: u for u in space["unsaved"]}
    assert set(unsaved) == {"sock", "gen"}, space["unsaved"]
    assert unsaved["sock"]["type"] == "socket" and unsaved["gen"]["type"] == "generator"

    # The sandbox is gone from memory but shows as frozen.
    info = http.get(f"/v1/sandboxes/{sid}").json()
    assert info["state"] == "frozen" and info["space_id"] == space["space_id"] and info["template"] == "python-datasci"
    assert "frozen in space" in assert_json_error(http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "1"}), 409)["error"]
    assert sid not in [s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]]

    restart(srv, crash=True)
    with srv.http(timeout=300) as c:
        listed = c.get("/v1/spaces").json()["spaces"]
        assert [s["space_id"] for s in listed] == [space["space_id"]]
        assert c.get(f"/v1/spaces/{space['space_id']}").json() == listed[0]
        new = resume(c, space["space_id"])
        assert new != sid
        ex = exec_raw(c, new, CHECK.replace("SID", repr(new)))
        assert ex.exit_code == 0, ex.events
        assert ex.stdout.splitlines() == [
            "(1000, 2) True 999000 7 6 42 True",
            "/tmp/work kept True True",
            "hello space False False",
            "False False",
        ]
        # The first exec says what was left behind; later ones do not.
        [warning] = [e["data"] for e in ex.events if e["type"] == "warning"]
        assert space["space_id"] in warning and "sock (socket" in warning and "gen (generator" in warning, warning
        assert "processes other than the REPL did not survive" in warning
        assert not [e for e in exec_raw(c, new, "1").events if e["type"] == "warning"]
        # A Space is consumed by its resume.
        assert_json_error(c.get(f"/v1/spaces/{space['space_id']}"), 404)
        assert_json_error(c.post(f"/v1/spaces/{space['space_id']}/resume"), 404)
        assert c.get("/v1/spaces").json() == {"spaces": []}
        # The frozen sandbox's id now points at its successor.
        assert f"resumed as `{new}`" in assert_json_error(c.get(f"/v1/sandboxes/{sid}"), 404)["error"]
        delete_raw(c, new)


def test_the_podflare_sdk_resumes_a_space(srv, c):
    http = c
    client = Client(host=srv.url, timeout=300.0)
    try:
        sb = Sandbox(client=client, egress=False)
        sb.run_code("x = {'answer': 42}\nopen('/root/f', 'w').write('file')")
        space = freeze(http, sb.id)["space_id"]
        back = Sandbox.resume(space, client=client)
        assert back.id != sb.id
        assert back.run_code("print(x['answer'], open('/root/f').read())").stdout.strip() == "42 file"
        back.close()
        sb.close()  # closing the frozen one is harmless, even after its Space was resumed
    finally:
        client.close()


@pytest.mark.parametrize("keep_processes", [True, False])
def test_persistent_sandboxes_hibernate_when_idle_and_at_shutdown(srv, c, keep_processes):
    """A persistent sandbox hibernates at its idle timeout and at a graceful
    shutdown: it keeps its id, shows `hibernated`, is in no Space list, and
    the next call wakes it with its state (every process with
    `keep_processes`, the globals without). DELETE discards it."""
    http = c
    sid = create_raw(http, persistent=True, keep_processes=keep_processes, idle_timeout_seconds=1, egress=False)
    assert http.get(f"/v1/sandboxes/{sid}").json()["persistent"] is True
    py(http, sid, "kept = 'idle'")
    deadline = time.monotonic() + 15
    # Polled closely: a call right after it hibernates wakes it while the
    # old sandbox's teardown may still run (the wake waits for it).
    while (info := http.get(f"/v1/sandboxes/{sid}").json())["state"] != "hibernated":
        assert time.monotonic() < deadline, info
        time.sleep(0.01)
    assert http.get("/v1/spaces").json() == {"spaces": []}
    assert py(http, sid, "print(kept)") == "idle\n"
    woke = http.get(f"/v1/sandboxes/{sid}").json()
    assert (woke["state"], woke["persistent"], woke["keep_processes"]) == ("ready", True, keep_processes), woke
    # Its lifetime went on from where it stood.
    assert woke["expires_at"] == info["expires_at"], (woke, info)

    py(http, sid, "kept = 'shutdown'")
    restart(srv, crash=False)
    with srv.http(timeout=300) as c:
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "hibernated"
        assert py(c, sid, "print(kept)") == "shutdown\n"
        # Hibernating again and deleted: gone for good.
        assert c.post(f"/v1/sandboxes/{sid}/hibernate").json()["state"] == "hibernated"
        assert delete_raw(c, sid) == 204
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
        assert srv.state_dir and not [d for d in os.listdir(os.path.join(srv.state_dir, "spaces")) if d.startswith("sp-")]


def test_a_space_says_what_it_kept_and_why_not_the_processes(srv, c, say):
    """Each Space names its kind, and a `globals` one says why the
    processes were not kept: a sandbox made to fork (not `keep_processes`),
    or no criu here (the tools root every test server is given, and a
    server given none). Processes Spaces: test_process_spaces.py."""
    sid = create_raw(c, egress=False)
    py(c, sid, "x = 1")
    info = freeze(c, sid)
    assert info["kind"] == "globals", info
    why = info["processes_not_kept"]
    assert "keep_processes: false" in why and "zygote" in why and "docs/state.md#why-processes-are-not-kept-yet" in why, why
    listed = c.get(f"/v1/spaces/{info['space_id']}").json()
    assert (listed["kind"], listed["processes_not_kept"]) == ("globals", why)
    assert c.delete(f"/v1/spaces/{info['space_id']}").status_code == 204
    log = srv.log_text()
    assert re.search(r"freezes of keep_processes sandboxes .* make Spaces that keep every process.*criu=criu 4\.", log), log[-2000:]

    # A server with no criu says so, and how to get one.
    bare = start_server(say, "nocriu", args=["--tools-dir", "/nonexistent/forkbox-tools", "--no-warm-pool"], build=False)
    try:
        with bare.http(timeout=120) as b:
            # A persistent sandbox keeps no processes there, and may not ask to.
            sid = create_raw(b, egress=False, persistent=True)
            assert b.get(f"/v1/sandboxes/{sid}").json()["keep_processes"] is False
            why = freeze(b, sid)["processes_not_kept"]
            assert "criu is not installed" in why and "forkbox tools build criu" in why, why
            err = assert_json_error(b.post("/v1/sandboxes", json={"keep_processes": True}), 400)["error"]
            assert "keep_processes needs criu" in err and "criu is not installed" in err, err
    finally:
        stop_and_assert_clean(bare)


def test_spaces_can_be_deleted_and_bad_ids_are_refused(c):
    http = c
    sid = create_raw(http, egress=False)
    py(http, sid, "import time\nt = time.time()")
    # A paused sandbox freezes too.
    assert http.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    space = freeze(http, sid)["space_id"]
    assert http.delete(f"/v1/spaces/{space}").status_code == 204
    assert_json_error(http.delete(f"/v1/spaces/{space}"), 404)
    assert_json_error(http.post(f"/v1/spaces/{space}/resume"), 404)
    # With its Space gone, the frozen sandbox is simply gone.
    assert_json_error(http.get(f"/v1/sandboxes/{sid}"), 404)
    assert_json_error(http.get("/v1/spaces/sp-nosuchspace"), 404)
    assert_json_error(http.get("/v1/spaces/.partial-x"), 400)
    assert_json_error(http.post("/v1/sandboxes/sb-nosuchsandbox/freeze"), 404)
    assert_json_error(http.post(f"/v1/spaces/{space}/resume", json={"bogus": 1}), 400)


def test_a_crash_during_freeze_never_leaves_a_half_space(srv):
    """kill -9 the server at random moments of a freeze, again and again:
    every Space listed afterwards resumes whole, with every byte of a
    200 MB file and the REPL's globals; none is listed half-written."""
    rng = random.Random(7)
    resumed_whole = 0
    for round_no in range(5):
        with srv.http(timeout=300) as c:
            sid = create_raw(c, egress=False)
            py(c, sid, "import hashlib, os\nblob = os.urandom(200 << 20)\nopen('/root/blob', 'wb').write(blob)\n"
                       "digest = hashlib.sha256(blob).hexdigest()\ndel blob\nmarker = 'round-%d'" % round_no)
            digest = py(c, sid, "print(digest)").strip()
        crash_during_freeze(srv, sid, rng.uniform(0.0, 1.5))
        with srv.http(timeout=300) as c:
            for space in c.get("/v1/spaces").json()["spaces"]:
                assert space["sandbox_id"] == sid, space
                new = resume(c, space["space_id"])
                got = py(c, new, "import hashlib\nprint(marker, hashlib.sha256(open('/root/blob','rb').read()).hexdigest() == digest,"
                                 " hashlib.sha256(open('/root/blob','rb').read()).hexdigest() == %r)" % digest)
                assert got == f"round-{round_no} True True\n", got
                resumed_whole += 1
                delete_raw(c, new)
            assert c.get("/v1/spaces").json() == {"spaces": []}
    # Some rounds must have finished their freeze (else the test proved little).
    print(f"{resumed_whole} of 5 crashed freezes had completed their space")


def test_a_full_disk_fails_the_freeze_cleanly(srv, c):
    """507 when the Space does not fit; the sandbox goes on untouched and
    nothing half-written is left."""
    import os
    import subprocess
    spaces = os.path.join(srv.state_dir, "spaces")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", spaces], check=True)
    try:
        sid = create_raw(c, egress=False)
        py(c, sid, "import os\nopen('/root/big', 'wb').write(os.urandom(64 << 20))\nx = 'still here'")
        err = assert_json_error(c.post(f"/v1/sandboxes/{sid}/freeze"), 507)
        assert "no room" in err["error"], err
        assert os.listdir(spaces) == []
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "ready"
        assert py(c, sid, "print(x, os.path.getsize('/root/big'), os.path.exists('/.forkbox-space'))") == "still here 67108864 False\n"
        delete_raw(c, sid)
    finally:
        subprocess.run(["umount", spaces], check=True)
