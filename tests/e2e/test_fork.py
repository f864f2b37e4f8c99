"""fork(n) and merge_into through the real podflare SDK and raw HTTP: what a
child starts with, what it does not share, randomness, limits, lineage."""
from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest
from podflare import Sandbox

from helpers import assert_json_error, create_raw, delete_raw, exec_raw, sandbox_cgroup_dirs, wait_pool, wait_until


def py(sb, code: str) -> str:
    r = sb.run_code(code)
    assert r.exit_code == 0, (code, r.stdout, r.stderr)
    return r.stdout


STATE_SETUP = r'''
import os, sys, json, collections
numbers = [1, 2, 3]
def square(v):
    return v * v
class Box:
    def __init__(self, v): self.v = v
    def twice(self): return self.v * 2
def make_counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    return inc
counter = make_counter(); counter(); counter()
os.makedirs('/root/work', exist_ok=True)
with open('/root/work/data.txt', 'w') as f:
    f.write('0123456789')
reader = open('/root/work/data.txt')
reader.read(4)
writer = open('/root/work/out.txt', 'w+')
writer.write('parent;'); writer.flush()
appender = open('/root/work/log.txt', 'a')
appender.write('p;'); appender.flush()
os.chdir('/root/work')
os.environ['FORK_MARK'] = 'from-parent'
sys.path.insert(0, '/root/work/lib')
'''

STATE_CHECK = r'''
print(json.dumps({
    "numbers": numbers, "square": square(7), "box": Box(21).twice(), "counter": counter(),
    "reader_pos": reader.tell(), "reader_rest": reader.read(),
    "cwd": os.getcwd(), "env": os.environ.get('FORK_MARK'), "path0": sys.path[0],
    "collections": 'collections' in sys.modules,
}))
'''


def test_sdk_fork_carries_the_repl_state(sandbox):
    py(sandbox, STATE_SETUP)
    children = sandbox.fork(3)
    try:
        assert len(children) == 3 and len({c.id for c in children} | {sandbox.id}) == 4
        for c in children:
            got = json.loads(py(c, STATE_CHECK))
            assert got == {
                "numbers": [1, 2, 3], "square": 49, "box": 42, "counter": 3,
                "reader_pos": 4, "reader_rest": "456789",
                "cwd": "/root/work", "env": "from-parent", "path0": "/root/work/lib", "collections": True,
            }
        # The parent is untouched by the children's reads.
        assert json.loads(py(sandbox, STATE_CHECK))["reader_pos"] == 4
    finally:
        for c in children:
            c.close()


def test_open_files_are_each_members_own_copy(sandbox):
    py(sandbox, STATE_SETUP)
    a, b = sandbox.fork(2)
    try:
        py(a, "writer.write('a;'); writer.flush(); appender.write('a;'); appender.flush()")
        py(b, "writer.write('bb;'); writer.flush()")
        py(sandbox, "writer.write('P;'); writer.flush()")
        read = "print(open('/root/work/out.txt').read(), open('/root/work/log.txt').read(), writer.tell())"
        assert py(a, read).split() == ["parent;a;", "p;a;", "9"]
        assert py(b, read).split() == ["parent;bb;", "p;", "10"]
        assert py(sandbox, read).split() == ["parent;P;", "p;", "9"]
    finally:
        a.close()
        b.close()


def test_memory_and_files_written_after_fork_are_private(sandbox):
    py(sandbox, "shared = {'k': 0}\nopen('/tmp/common', 'w').write('base')")
    a, b = sandbox.fork(2)
    try:
        py(a, "shared['k'] = 'a'\nopen('/tmp/common', 'w').write('a')\nopen('/tmp/only-a', 'w').write('x')")
        py(b, "shared['k'] = 'b'\nimport os\nos.remove('/tmp/common')")
        assert py(a, "import os; print(shared['k'], open('/tmp/common').read(), os.path.exists('/tmp/only-a'))").split() == ["a", "a", "True"]
        assert py(b, "import os; print(shared['k'], os.path.exists('/tmp/common'), os.path.exists('/tmp/only-a'))").split() == ["b", "False", "False"]
        assert py(sandbox, "import os; print(shared['k'], open('/tmp/common').read(), os.path.exists('/tmp/only-a'))").split() == ["0", "base", "False"]
        # bash sees each member's own files too.
        assert a.run_code("cat /tmp/common", language="bash").stdout == "a"
        assert sandbox.run_code("cat /tmp/common", language="bash").stdout == "base"
    finally:
        a.close()
        b.close()


def test_shared_memory_mappings_are_not_shared_after_fork(sandbox):
    py(sandbox, "import mmap\nm = mmap.mmap(-1, 4096)\nm[:4] = b'base'\n"
                "f = open('/root/mapped', 'w+b'); f.write(b'file'); f.flush()\nfm = mmap.mmap(f.fileno(), 4)")
    (child,) = sandbox.fork(1)
    try:
        py(child, "m[:4] = b'kid!'\nfm[:4] = b'KID!'\nfm.flush()")
        assert py(sandbox, "print(bytes(m[:4]), bytes(fm[:4]), open('/root/mapped','rb').read())").split() == ["b'base'", "b'file'", "b'file'"]
        assert py(child, "print(bytes(m[:4]), bytes(fm[:4]), open('/root/mapped','rb').read())").split() == ["b'kid!'", "b'KID!'", "b'KID!'"]
    finally:
        child.close()


def test_children_have_their_own_hostname_and_processes(sandbox):
    py(sandbox, "import subprocess\nbg = subprocess.Popen(['sleep', '300'])")
    (child,) = sandbox.fork(1)
    try:
        assert child.run_code("hostname", language="bash").stdout.strip() == child.id
        # The parent's background process is not carried into the child.
        assert "sleep 300" in sandbox.run_code("ps -eo args", language="bash").stdout
        assert "sleep 300" not in child.run_code("ps -eo args", language="bash").stdout
        # The child's handle on it points at nothing: waiting on it does not hang.
        assert py(child, "print(bg.poll() is None or bg.poll() is not None)").strip() == "True"
    finally:
        child.close()


def test_at_fork_hooks_run_in_the_childs_own_sandbox_and_may_start_threads(sandbox):
    """A hook registered with os.register_at_fork(after_in_child=...) runs
    once the child has joined its own sandbox: it names the child's host,
    binds in the child's network and writes in the child's files. A thread
    it starts used to make every fork fail (a child with two threads cannot
    join a mount namespace)."""
    py(sandbox, r'''
import json, os, socket, threading, time
seen = {}
def hook():
    seen['host'] = os.uname().nodename
    try:
        seen['listener'] = socket.create_server(('127.0.0.1', 7717))
        seen['bound'] = True
    except OSError as e:
        seen['bound'] = str(e)
    with open('/root/hooked', 'w') as f:
        f.write(seen['host'])
    threading.Thread(target=time.sleep, args=(300,), name='hooked', daemon=True).start()
os.register_at_fork(after_in_child=hook)
''')
    children = sandbox.fork(2)
    try:
        for child in children:
            got = json.loads(py(child, "print(json.dumps([seen.get('host'), seen.get('bound'), open('/root/hooked').read(), [t.name for t in threading.enumerate()]]))"))
            assert got[:3] == [child.id, True, child.id], got
            assert "hooked" in got[3], got
        # None of it happened in the parent's sandbox.
        assert py(sandbox, "socket.create_server(('127.0.0.1', 7717)).close()\nprint(seen, os.path.exists('/root/hooked'))").strip() == "{} False"
        (grandchild,) = children[0].fork(1)
        try:
            assert py(grandchild, "print(seen['host'], open('/root/hooked').read())").split() == [grandchild.id] * 2
        finally:
            grandchild.close()
    finally:
        for c in children:
            c.close()


def test_distinct_randomness(sandbox):
    code = ("import random, uuid, secrets, os, numpy\n"
            "print(json.dumps([random.random(), str(uuid.uuid4()), secrets.token_hex(8), os.urandom(8).hex(), numpy.random.random()]))")
    py(sandbox, "import json, random, numpy\nrandom.seed(1234)\nnumpy.random.seed(1234)")
    children = sandbox.fork(3)
    try:
        draws = [json.loads(py(c, code)) for c in children] + [json.loads(py(sandbox, code))]
        for i in range(5):
            values = [d[i] for d in draws]
            assert len(set(values)) == len(values), (i, values)
    finally:
        for c in children:
            c.close()


def test_fork_waits_for_the_running_exec(http):
    sid = create_raw(http)
    try:
        done = {}

        def slow():
            done["r"] = exec_raw(http, sid, "import time\ntime.sleep(1.5)\nfinished = True\nprint('slow done')")
        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.3)
        r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
        assert r.status_code == 200, r.text
        (kid,) = r.json()["children"]
        t.join()
        assert done["r"].stdout == "slow done\n"
        assert exec_raw(http, kid, "print(finished)").stdout == "True\n"
        delete_raw(http, kid)
    finally:
        delete_raw(http, sid)


@pytest.mark.parametrize("body", [{"n": 0}, {"n": 33}, {"n": -1}, {"n": "3"}, {}, {"n": 1, "extra": 1}, [1]])
def test_fork_rejects_bad_n(http, body):
    sid = create_raw(http)
    try:
        before = len(http.get("/v1/sandboxes").json()["sandboxes"])
        assert_json_error(http.post(f"/v1/sandboxes/{sid}/fork", json=body), 400)
        assert len(http.get("/v1/sandboxes").json()["sandboxes"]) == before
    finally:
        delete_raw(http, sid)


def test_fork_of_unknown_sandbox_is_404(http):
    assert_json_error(http.post("/v1/sandboxes/sb-doesnotexist00000000/fork", json={"n": 1}), 404)


def test_fork_32_children(http):
    sid = create_raw(http)
    try:
        exec_raw(http, sid, "value = 'x' * 1000")
        r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 32})
        assert r.status_code == 200, r.text
        kids = r.json()["children"]
        assert len(set(kids)) == 32
        for k in kids[::8]:
            assert exec_raw(http, k, "print(len(value))").stdout == "1000\n"
        for k in kids:
            assert delete_raw(http, k) == 204
    finally:
        delete_raw(http, sid)


def test_children_inherit_template_and_limits(http):
    sid = create_raw(http, ram_mib=300, timeout_seconds=900)
    try:
        (kid,) = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}).json()["children"]
        parent, child = http.get(f"/v1/sandboxes/{sid}").json(), http.get(f"/v1/sandboxes/{kid}").json()
        for key in ("template", "ram_mib", "rootfs_gb", "egress", "timeout_seconds", "idle_timeout_seconds"):
            assert child[key] == parent[key], key
        limits = set()
        for d in sandbox_cgroup_dirs(kid):
            for name in ("memory.limit_in_bytes", "memory.max"):
                try:
                    limits.add(int(open(f"{d}/{name}").read()))
                except (OSError, ValueError):
                    pass
        assert limits == {300 << 20}
        delete_raw(http, kid)
    finally:
        delete_raw(http, sid)


def test_destroying_parent_or_child_leaves_the_others(http):
    sid = create_raw(http)
    exec_raw(http, sid, "v = 'alive'")
    a, b = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2}).json()["children"]
    assert delete_raw(http, sid) == 204
    assert exec_raw(http, a, "print(v)").stdout == "alive\n"
    assert delete_raw(http, a) == 204
    assert exec_raw(http, b, "print(v)").stdout == "alive\n"
    assert exec_raw(http, b, "echo ok", "bash").stdout == "ok\n"
    assert delete_raw(http, b) == 204


def test_a_crash_in_one_member_affects_no_other(http):
    sid = create_raw(http)
    exec_raw(http, sid, "v = 7")
    a, b = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2}).json()["children"]
    try:
        r = exec_raw(http, a, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
        assert r.exit_code == 139, r
        assert exec_raw(http, b, "print(v)").stdout == "7\n"
        assert exec_raw(http, sid, "print(v)").stdout == "7\n"
        # The crashed child gets a fresh REPL and says so.
        r = exec_raw(http, a, "print('v' in dir())")
        assert r.stdout == "False\n" and r.warnings, r
    finally:
        for x in (a, b, sid):
            delete_raw(http, x)


def test_oom_in_one_member_affects_no_other(http):
    sid = create_raw(http, ram_mib=256)
    exec_raw(http, sid, "v = 9")
    a, b = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2}).json()["children"]
    try:
        r = exec_raw(http, a, "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))")
        assert r.exit_code != 0 and any(e.get("ename") == "MemoryError" for e in r.errors), r
        assert exec_raw(http, b, "print(v)").stdout == "9\n"
        assert exec_raw(http, sid, "print(v)").stdout == "9\n"
    finally:
        for x in (a, b, sid):
            delete_raw(http, x)


# ── merge_into ──────────────────────────────────────────────────────────

def test_merge_into_through_the_sdk(sandbox, sdk_client):
    py(sandbox, "state = 'parent'\nopen('/root/who', 'w').write('parent')")
    a, b = sandbox.fork(2)
    py(a, "state = 'winner'\nopen('/root/who', 'w').write('winner')")
    py(b, "state = 'sibling'")
    old_parent_cgroups = sandbox_cgroup_dirs(sandbox.id)
    sandbox.merge_into(a)
    assert py(sandbox, "print(state, open('/root/who').read())").split() == ["winner", "winner"]
    assert sandbox.run_code("cat /root/who", language="bash").stdout == "winner"
    assert py(b, "print(state)").strip() == "sibling"
    # The winner's id is gone; the SDK's close of it is a no-op.
    a.close()
    r = Sandbox._from_id(a.id, client=sdk_client)
    with pytest.raises(Exception):
        r.run_code("print(1)")
    # The parent's old state is freed: its cgroup is gone.
    assert old_parent_cgroups and all(not os.path.exists(d) for d in old_parent_cgroups)
    b.close()


def test_merge_into_http_semantics(http):
    sid = create_raw(http)
    exec_raw(http, sid, "x = 0")
    a, b = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 2}).json()["children"]
    other = create_raw(http)
    try:
        exec_raw(http, a, "x = 'a'")
        assert_json_error(http.post(f"/v1/sandboxes/{sid}/merge_into/{other}"), 409)
        assert_json_error(http.post(f"/v1/sandboxes/{a}/merge_into/{sid}"), 409)    # an ancestor is not a descendant
        assert_json_error(http.post(f"/v1/sandboxes/{a}/merge_into/{b}"), 409)      # siblings
        assert_json_error(http.post(f"/v1/sandboxes/{sid}/merge_into/{sid}"), 400)
        assert_json_error(http.post(f"/v1/sandboxes/{sid}/merge_into/sb-nope0000000000000000"), 404)
        r = http.post(f"/v1/sandboxes/{sid}/merge_into/{a}")
        assert r.status_code == 204, r.text
        assert exec_raw(http, sid, "print(x)").stdout == "a\n"
        assert_json_error(http.get(f"/v1/sandboxes/{a}"), 404)
        assert exec_raw(http, a, "print(1)").status == 404
        assert delete_raw(http, a) == 204          # harmless
        assert exec_raw(http, sid, "print(x)").stdout == "a\n"
        assert exec_raw(http, b, "print(x)").stdout == "0\n"
        ids = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
        assert sid in ids and b in ids and a not in ids
    finally:
        for x in (sid, b, other):
            delete_raw(http, x)


def test_merge_a_grandchild_and_its_children_follow(http):
    sid = create_raw(http)
    (a,) = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}).json()["children"]
    exec_raw(http, a, "depth = 1")
    (a1,) = http.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}).json()["children"]
    exec_raw(http, a1, "depth = 2")
    (a11,) = http.post(f"/v1/sandboxes/{a1}/fork", json={"n": 1}).json()["children"]
    try:
        assert http.post(f"/v1/sandboxes/{sid}/merge_into/{a1}").status_code == 204
        assert exec_raw(http, sid, "print(depth)").stdout == "2\n"
        # a1's child descends from sid now, and can be merged into it.
        assert http.post(f"/v1/sandboxes/{sid}/merge_into/{a11}").status_code == 204
        assert exec_raw(http, sid, "print(depth)").stdout == "2\n"
        assert exec_raw(http, a, "print(depth)").stdout == "1\n"
    finally:
        for x in (sid, a):
            delete_raw(http, x)


# ── the warm pool ───────────────────────────────────────────────────────

def test_a_create_takes_a_sandbox_forked_ahead_of_demand(http):
    """The pool keeps sandboxes the zygote already forked (`ready`), so a
    create waits for no fork. Such a sandbox is new from its create: its
    lifetime, random streams and name are its own, and the time it waited
    in the pool is not counted."""
    wait_until(lambda: len(http.get("/v1/pool").json()["templates"].get("default", {}).get("ready", [])) >= 2,
               300, "no sandboxes forked ahead of demand")
    ready = set(http.get("/v1/pool").json()["templates"]["default"]["ready"])
    time.sleep(3)    # longer than the lifetime asked for below
    started_ms = time.time() * 1000
    a, b = create_raw(http, timeout_seconds=2), create_raw(http, timeout_seconds=2)
    try:
        assert {a, b} <= ready, (a, b, ready)
        info = http.get(f"/v1/sandboxes/{a}").json()
        assert info["created_at"] >= started_ms - 50 and info["expires_at"] == info["created_at"] + 2000, info
        listed = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
        assert {a, b} <= listed
        draw = "import random, numpy, socket\nprint(random.random(), numpy.random.rand(), socket.gethostname())"
        (ra, na, ha), (rb, nb, hb) = (exec_raw(http, s, draw).stdout.split() for s in (a, b))
        assert (ha, hb) == (a, b) and ra != rb and na != nb
        # Its own lifetime: gone 2 s after its create, not after it was forked.
        wait_until(lambda: http.get(f"/v1/sandboxes/{a}").status_code == 404, 30, "the lifetime did not end it")
        # The pool forks more behind the creates.
        wait_until(lambda: len(set(http.get("/v1/pool").json()["templates"]["default"]["ready"]) - ready) >= 1,
                   60, "the pool did not fork new sandboxes ahead of demand")
    finally:
        for s in (a, b):
            http.delete(f"/v1/sandboxes/{s}")


def test_creates_that_queue_for_the_zygote_each_get_their_own_sandbox(server, http):
    """Creates that find no sandbox ready queue for the zygote, which forks
    them several at a time (docs/fork.md#the-warm-pool): 16 at once each
    get a sandbox of their own, whose REPL runs in its own namespaces (its
    hostname, seen by Python and by bash, is its id) and keeps its own
    state."""
    import concurrent.futures as cf

    def one(i):
        with httpx.Client(base_url=server.url, timeout=120) as c:
            sid = create_raw(c)
            try:
                assert exec_raw(c, sid, f"import socket\nmine = {i}\nprint(socket.gethostname())").stdout == f"{sid}\n"
                return sid, exec_raw(c, sid, "print(mine)").stdout, exec_raw(c, sid, "hostname", "bash").stdout
            finally:
                delete_raw(c, sid)

    with cf.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(one, range(16)))
    assert len({sid for sid, _, _ in got}) == 16
    for i, (sid, mine, host) in enumerate(got):
        assert (mine, host) == (f"{i}\n", f"{sid}\n"), (i, sid, mine, host)


def test_overlapping_batches_of_creates_all_fork_from_one_zygote(server, http):
    """The zygote forks the next batch of creates while the last batch's
    children still take their descriptors from the shim, each child by its
    hand-over slot (docs/repl-protocol.md): 40 creates at once all come
    from the zygote. A failed batch (two children given one slot) would
    have made its creates from scratch and retired the zygote."""
    import concurrent.futures as cf

    before = wait_pool(http)

    def one(i):
        with httpx.Client(base_url=server.url, timeout=120) as c:
            sid = create_raw(c)
            return sid, exec_raw(c, sid, "import socket\nprint(socket.gethostname())").stdout

    with cf.ThreadPoolExecutor(40) as pool:
        got = list(pool.map(one, range(40)))
    try:
        assert [out for _, out in got] == [f"{sid}\n" for sid, _ in got]
        after = http.get("/v1/pool").json()["templates"]["default"]
        assert after["zygote"] == before["zygote"], (before, after)
        assert after["served"] == before["served"] + 40, (before, after)
    finally:
        for sid, _ in got:
            delete_raw(http, sid)


def test_created_sandboxes_come_from_the_warm_pool(http):
    pool = {}
    for _ in range(600):
        pool = http.get("/v1/pool").json()["templates"]
        if "default" in pool:
            break
        time.sleep(0.1)
    assert "default" in pool, pool
    served, zygote = pool["default"]["served"], pool["default"]["zygote"]
    sid = create_raw(http)
    try:
        r = exec_raw(http, sid, "import sys\nprint('pandas' in sys.modules, 'numpy' in sys.modules, "
                                "sorted(k for k in globals() if not k.startswith('_')))")
        assert r.stdout == "True True ['sys']\n", r
        after = http.get("/v1/pool").json()["templates"]["default"]
        assert after["served"] > served or after["zygote"] != zygote, (pool, after)
        listed = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
        assert after["zygote"] not in listed and not set(after["spares"]) & listed and not set(after["ready"]) & listed
        assert exec_raw(http, sid, "echo $(hostname) $HOSTNAME", "bash").stdout.split() == [sid, sid]
        assert exec_raw(http, sid, "import os\nprint(os.environ['HOSTNAME'])").stdout == f"{sid}\n"
    finally:
        delete_raw(http, sid)
