"""API keys and quotas (docs/operations.md#api-keys): keys are stored
hashed and managed with `forkbox key`; a key sees and touches only its own
sandboxes, checkpoints and Spaces (another key's ids answer 404, exactly as
unknown ones, on every route of the OpenAPI document); per-key limits on
live sandboxes, forks per minute and memory answer 429 with Retry-After;
ownership survives a kill -9 of the server."""
from __future__ import annotations

import json
import os
import re
import stat
import threading

import httpx
import pytest
from podflare import Sandbox

from conftest import serve
from helpers import (ForkboxServer, assert_json_error, create_raw, delete_raw, exec_ok, pooled_sandbox,
                     sandbox_cgroup_dirs, wait_until)

UNKNOWN = {"sb": "sb-" + "z" * 20, "sp": "sp-" + "z" * 20, "cp": "cp-" + "z" * 20}


@pytest.fixture(scope="module")
def srv(say, server):  # `server` first: the default template is built
    s = ForkboxServer("keys", build_templates=False, log=say)
    s.add_key("alice")
    s.add_key("bob")
    yield from serve(s)


def test_keys_file_holds_only_hashes_with_mode_0600(srv):
    path = os.path.join(srv.state_dir, "keys.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    for key in srv.file_keys.values():
        assert key not in text and key[4:] not in text
    listed = srv.key_cli("list")
    assert listed.returncode == 0, listed
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} >= {"alice", "bob"}
    for key in srv.file_keys.values():
        assert key not in listed.stdout + listed.stderr and key[4:] not in listed.stdout
    # `key add` printed the key once, on stdout, and nothing of it elsewhere.
    out = srv.key_cli("add", "once", "--max-sandboxes", "3")
    assert out.returncode == 0, out
    key = out.stdout.strip()
    assert out.stdout.count(key) == 1 and key not in out.stderr and key not in open(path).read()
    assert "once\tcreated=" in srv.key_cli("list").stdout and "max_sandboxes=3" in srv.key_cli("list").stdout
    assert srv.key_cli("add", "once").returncode != 0  # names are unique
    assert srv.key_cli("remove", "once").returncode == 0


def test_a_key_added_works_at_once_and_a_removed_key_gets_401(srv):
    key = srv.add_key("carol")
    with srv.http(key) as c:
        assert c.get("/v1/sandboxes").status_code == 200
        srv.remove_key("carol")
        assert_json_error(c.get("/v1/sandboxes"), 401)
        assert_json_error(c.post("/v1/sandboxes", json={}), 401)
    with srv.http("fbk_" + "0" * 64) as c:
        assert_json_error(c.get("/v1/sandboxes"), 401)


@pytest.fixture(scope="module")
def alices(srv):
    """Alice's things: a sandbox with REPL state, a fork child, a checkpoint,
    a PTY, and a Space (another sandbox, frozen)."""
    a = Sandbox(host=srv.url, api_key=srv.file_keys["alice"])
    a.run_code("x = 42\nopen('/root/a.txt', 'w').write('alice')")
    with srv.http(srv.file_keys["alice"]) as c:
        sb = a.id
        [child] = c.post(f"/v1/sandboxes/{sb}/fork", json={"n": 1}).json()["children"]
        cp = c.post(f"/v1/sandboxes/{sb}/checkpoints").json()["checkpoint"]
        # A PTY session outlives the stream that started it.
        with c.stream("POST", f"/v1/sandboxes/{sb}/pty", json={"argv": ["sleep", "600"]}) as r:
            assert r.status_code == 200, r.read()
            ready = json.loads(next(r.iter_lines()))
        assert ready["type"] == "pty_ready", ready
        pty = ready["session_id"]
        frozen = create_raw(c)
        exec_ok(c, frozen, "y = 'kept'")
        r = c.post(f"/v1/sandboxes/{frozen}/freeze")
        assert r.status_code == 200, r.text
        space = r.json()["space_id"]
    yield {"id": sb, "winner": child, "other": child, "checkpoint": cp, "pty": pty, "space": space, "frozen": frozen, "sdk": a}


BODIES = {
    "/exec": {"code": "x = 0"},
    "/fork": {"n": 1},
    "/files/mkdir": {"path": "/root/bob-was-here"},
    "/files/rename": {"from": "/root/a.txt", "to": "/root/b.txt"},
    "/files/chmod": {"path": "/root/a.txt", "mode": "600"},
    "/egress": {"egress": True},
    "/input": {"data_b64": ""},
    "/resize": {"cols": 80, "rows": 24},
    "/template": {"name": "bobs-copy"},
}


def id_routes(srv) -> list[tuple[str, str]]:
    """(method, path template) of every route of the OpenAPI document that
    takes a sandbox, space or checkpoint id."""
    with srv.http(srv.file_keys["bob"]) as c:
        doc = c.get("/v1/openapi.json").json()
    out = []
    for path, item in doc["paths"].items():
        if "{id}" not in path:
            continue
        for method in item:
            if method in ("get", "post", "put", "delete", "patch"):
                out.append((method.upper(), path))
    return out


def request(c: httpx.Client, method: str, template: str, ids: dict):
    path = template
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    path = path.replace("{port}", "8000").replace("{path}", "x")
    body = next((b for suffix, b in BODIES.items() if template.endswith(suffix)), {})
    if template.endswith("/restore"):
        body = {"checkpoint": ids["checkpoint"]}
    params = {"path": "/root/a.txt"} if "/files" in template else None
    if template.endswith("/files/watch"):
        params = {"path": "/root"}
    content = b"bob" if method == "PUT" else None
    kw = {"params": params}
    if content is not None:
        kw["content"] = content
    elif method in ("POST", "PATCH"):
        kw["json"] = body
    return c.request(method, path, **kw)


def test_another_keys_ids_are_404_on_every_route(srv, alices):
    routes = id_routes(srv)
    assert len(routes) >= 35, routes  # the document really was read
    covered = {t for _, t in routes}
    for needed in ("/ports/{port}/{path}", "/pty/{pty}/attach", "/files/watch", "/merge_into/{winner}", "/diff/{other}",
                   "/checkpoints/{checkpoint}", "/v1/spaces/{id}/resume"):
        assert any(t.endswith(needed) for t in covered), needed
    mine = {k: alices[k] for k in ("winner", "other", "checkpoint", "pty")}
    unknown = {"winner": "sb-" + "y" * 20, "other": "sb-" + "y" * 20, "checkpoint": UNKNOWN["cp"], "pty": "pty-zzzz"}
    with srv.http(srv.file_keys["bob"], timeout=30) as bob:
        for method, template in routes:
            space = template.startswith("/v1/spaces/")
            theirs = dict(mine, id=alices["space"] if space else alices["id"])
            nobody = dict(unknown, id=UNKNOWN["sp"] if space else UNKNOWN["sb"])
            r = request(bob, method, template, theirs)
            body = assert_json_error(r, 404)
            # Exactly what an unknown id gets, but for the id itself.
            r2 = request(bob, method, template, nobody)
            assert r2.status_code == 404, (method, template, r2.text)
            assert body["error"].replace(theirs["id"], nobody["id"]) == r2.json()["error"], (method, template, body, r2.text)
        # Two-id routes check both: Bob's own sandbox with Alice's as the other.
        own = create_raw(bob)
        assert_json_error(bob.post(f"/v1/sandboxes/{own}/merge_into/{alices['winner']}"), 404)
        assert_json_error(bob.get(f"/v1/sandboxes/{own}/diff/{alices['other']}"), 404)
        assert_json_error(bob.get(f"/v1/sandboxes/{alices['id']}/diff/{own}"), 404)
        # Alice's frozen sandbox is not "frozen" to Bob: unknown.
        r = bob.get(f"/v1/sandboxes/{alices['frozen']}")
        assert_json_error(r, 404)
        assert r.json()["error"] == f"no sandbox `{alices['frozen']}`"
        # Lists show only Bob's.
        ids = {s["id"] for s in bob.get("/v1/sandboxes").json()["sandboxes"]}
        assert ids == {own}
        assert bob.get("/v1/spaces").json()["spaces"] == []
        assert bob.delete(f"/v1/sandboxes/{own}").status_code == 204
    # Alice's things are untouched.
    a = alices["sdk"]
    assert a.run_code("print(x, open('/root/a.txt').read())").stdout.strip() == "42 alice"
    with srv.http(srv.file_keys["alice"]) as c:
        assert c.get(f"/v1/sandboxes/{alices['winner']}").status_code == 200
        assert [cp["checkpoint"] for cp in c.get(f"/v1/sandboxes/{alices['id']}/checkpoints").json()["checkpoints"]] == [alices["checkpoint"]]
        assert c.get(f"/v1/spaces/{alices['space']}").status_code == 200
        assert alices["pty"] in c.get(f"/v1/sandboxes/{alices['id']}/pty").text
        listed = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert {alices["id"], alices["winner"]} <= listed
        assert [s["space_id"] for s in c.get("/v1/spaces").json()["spaces"]] == [alices["space"]]
        r = c.get(f"/v1/sandboxes/{alices['frozen']}")  # to Alice it is frozen
        assert r.status_code == 200 and r.json()["state"] == "frozen", r.text


def test_ownership_survives_a_kill_9(srv, alices):
    srv.kill()
    srv.start()
    srv.wait_ready()
    with srv.http(srv.file_keys["bob"]) as bob:
        assert_json_error(bob.post(f"/v1/sandboxes/{alices['id']}/exec", json={"code": "x = 0"}), 404)
        assert_json_error(bob.get(f"/v1/spaces/{alices['space']}"), 404)
        assert bob.get("/v1/sandboxes").json()["sandboxes"] == []
    with srv.http(srv.file_keys["alice"]) as c:
        assert exec_ok(c, alices["id"], "print(x)").strip() == "42"
        assert exec_ok(c, alices["winner"], "print(x)").strip() == "42"
        r = c.post(f"/v1/spaces/{alices['space']}/resume", json={})
        assert r.status_code == 200, r.text
        resumed = r.json()["id"]
        assert exec_ok(c, resumed, "print(y)").strip() == "kept"
    with srv.http(srv.file_keys["bob"]) as bob:
        assert_json_error(bob.get(f"/v1/sandboxes/{resumed}"), 404)


# ── quotas ─────────────────────────────────────────────────────────────

FLAG_KEY = "flag-key-1"


@pytest.fixture(scope="module")
def qsrv(say, server):
    s = ForkboxServer("quota", ["--key-max-sandboxes", "1"], api_keys=[FLAG_KEY], build_templates=False, log=say)
    s.add_key("few", max_sandboxes=3)
    s.add_key("forker", forks_per_minute=3)
    s.add_key("mem", max_memory_mib=320)
    s.add_key("race", max_sandboxes=3)
    yield from serve(s)


def assert_quota(r: httpx.Response, limit: str, max_retry: int = 1) -> dict:
    body = assert_json_error(r, 429)
    assert limit in body["error"], body
    retry = int(r.headers["retry-after"])
    assert 1 <= retry <= max_retry, r.headers
    return body


def live_ids(c) -> set[str]:
    return {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}


def test_max_sandboxes_at_the_edge(qsrv):
    with qsrv.http(qsrv.file_keys["few"]) as c:
        a = create_raw(c)
        [child] = c.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}).json()["children"]  # children count
        create_raw(c)
        body = assert_quota(c.post("/v1/sandboxes", json={}), "max_sandboxes")
        assert "has 3" in body["error"], body
        assert_quota(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}), "max_sandboxes")
        assert len(live_ids(c)) == 3
        assert c.delete(f"/v1/sandboxes/{child}").status_code == 204
        create_raw(c)
        assert_quota(c.post("/v1/sandboxes", json={}), "max_sandboxes")
    # The --api-key key has the --key-* defaults: one sandbox.
    with qsrv.http(FLAG_KEY) as c:
        create_raw(c)
        assert_quota(c.post("/v1/sandboxes", json={}), "max_sandboxes")


def test_forks_per_minute_refuse_a_fork_whole(qsrv):
    with qsrv.http(qsrv.file_keys["forker"]) as c:
        a = create_raw(c)
        assert len(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 2}).json()["children"]) == 2
        before = live_ids(c)
        body = assert_quota(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 2}), "forks_per_minute", max_retry=60)
        assert "forked 2" in body["error"], body
        assert live_ids(c) == before  # nothing of the refused fork exists
        assert len(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}).json()["children"]) == 1  # 3: the edge
        assert_quota(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}), "forks_per_minute", max_retry=60)
        # Destroying children does not give forks back: the limit is a rate.
        for sb in before - {a}:
            assert c.delete(f"/v1/sandboxes/{sb}").status_code == 204
        assert_quota(c.post(f"/v1/sandboxes/{a}/fork", json={"n": 1}), "forks_per_minute", max_retry=60)
        # Creates are not forks.
        create_raw(c)


def test_memory_is_the_sum_of_ram_limits(qsrv):
    with qsrv.http(qsrv.file_keys["mem"]) as c:
        big = create_raw(c, ram_mib=256)
        small = create_raw(c, ram_mib=64)  # 320: the edge
        body = assert_quota(c.post("/v1/sandboxes", json={"ram_mib": 64}), "max_memory_mib")
        assert "320 MiB" in body["error"], body
        assert_quota(c.post(f"/v1/sandboxes/{small}/fork", json={"n": 1}), "max_memory_mib")
        assert c.delete(f"/v1/sandboxes/{small}").status_code == 204
        assert_quota(c.post(f"/v1/sandboxes/{big}/fork", json={"n": 1}), "max_memory_mib")  # 256 + 256
        create_raw(c, ram_mib=64)  # 320 again
        assert len(live_ids(c)) == 2


def test_concurrent_creates_at_the_edge_never_overshoot(qsrv):
    key = qsrv.file_keys["race"]
    statuses: list[int] = []
    lock = threading.Lock()

    def create():
        with qsrv.http(key, timeout=120) as c:
            r = c.post("/v1/sandboxes", json={})
            with lock:
                statuses.append(r.status_code)
            if r.status_code == 429:
                assert "retry-after" in r.headers

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429], statuses
    with qsrv.http(key) as c:
        assert len(live_ids(c)) == 3


def test_refusals_are_counted_by_limit(qsrv):
    with qsrv.http(FLAG_KEY) as c:
        text = c.get("/metrics").text
    counts = {m[0]: float(m[1]) for m in re.findall(r'forkbox_quota_refusals_total\{limit="(\w+)"\} (\S+)', text)}
    assert counts.get("max_sandboxes", 0) >= 3 and counts.get("forks_per_minute", 0) >= 3 and counts.get("max_memory_mib", 0) >= 2, counts


# ── warm pools per key (docs/fork.md#warm-pool) ─────────────────────────

def uid_base(c, sid: str) -> int:
    """The host uid that root of the sandbox's family is."""
    return int(exec_ok(c, sid, "cat /proc/self/uid_map", language="bash").split()[1])


def test_each_key_forks_its_sandboxes_from_warm_zygotes_of_its_own(srv):
    """Members of one family share what the kernel counts per user, so no
    family serves two keys; a server with keys warms nothing until a key
    creates (an owner-less pool would serve no one)."""
    newcomer = srv.add_key("newcomer")
    try:
        with srv.http(newcomer) as c:
            assert c.get("/v1/pool").json()["templates"] == {}
    finally:
        srv.remove_key("newcomer")
    with srv.http(srv.file_keys["alice"]) as a, srv.http(srv.file_keys["bob"]) as b:
        mine, theirs = pooled_sandbox(a), pooled_sandbox(b)
        try:
            pa, pb = (c.get("/v1/pool").json()["templates"]["default"] for c in (a, b))
            assert not {pa["zygote"], *pa["spares"], *pa["ready"]} & {pb["zygote"], *pb["spares"], *pb["ready"]}, (pa, pb)
            assert uid_base(a, mine) != uid_base(b, theirs), "one family serves two keys"
            # A sibling from the same key's pool is in the same family.
            sibling = create_raw(a)
            assert uid_base(a, sibling) == uid_base(a, mine)
            delete_raw(a, sibling)
        finally:
            delete_raw(a, mine)
            delete_raw(b, theirs)


POOL_IDLE_S = 20


@pytest.fixture(scope="module")
def idle_srv(say, server):  # `server` first: the default template is built
    s = ForkboxServer("pool-idle", args=["--pool-idle-seconds", str(POOL_IDLE_S)], build_templates=False, log=say)
    s.add_key("erin")
    s.add_key("frank")
    yield from serve(s)


def zygote_gone(zygote: str) -> bool:
    return not sandbox_cgroup_dirs(zygote)


def test_a_keys_pool_is_let_go_once_idle_and_its_sandboxes_live_on(idle_srv):
    with idle_srv.http(idle_srv.file_keys["erin"]) as c:
        sid = pooled_sandbox(c)
        zygote = c.get("/v1/pool").json()["templates"]["default"]["zygote"]
        assert not zygote_gone(zygote)
        wait_until(lambda: c.get("/v1/pool").json()["templates"] == {} and zygote_gone(zygote),
                 POOL_IDLE_S + 30, "the idle pool was not let go")
        assert exec_ok(c, sid, "print(1)") == "1\n"
        # The next create makes a new pool.
        again = pooled_sandbox(c)
        assert c.get("/v1/pool").json()["templates"]["default"]["zygote"] != zygote
        for x in (sid, again):
            delete_raw(c, x)


def test_a_removed_keys_pool_is_let_go_at_once(idle_srv):
    with idle_srv.http(idle_srv.file_keys["frank"]) as c:
        delete_raw(c, pooled_sandbox(c))
        zygote = c.get("/v1/pool").json()["templates"]["default"]["zygote"]
    idle_srv.remove_key("frank")
    # Well before the pool would go for being idle.
    wait_until(lambda: zygote_gone(zygote), POOL_IDLE_S / 2, "a removed key's pool outlived it")


@pytest.fixture(scope="module")
def one_pool_srv(say, server):  # `server` first: the default template is built
    s = ForkboxServer("one-pool", args=["--max-warm-pools", "1"], build_templates=False, log=say)
    s.add_key("gina")
    s.add_key("hank")
    yield from serve(s)


def test_past_max_warm_pools_the_least_recently_used_goes(one_pool_srv):
    """Warm pools are hidden from the memory cap and, with keys, as many
    as the keys in use: `--max-warm-pools` bounds them."""
    with one_pool_srv.http(one_pool_srv.file_keys["gina"]) as g, one_pool_srv.http(one_pool_srv.file_keys["hank"]) as h:
        mine = pooled_sandbox(g)
        zygote = g.get("/v1/pool").json()["templates"]["default"]["zygote"]
        theirs = pooled_sandbox(h)
        wait_until(lambda: g.get("/v1/pool").json()["templates"] == {} and zygote_gone(zygote), 30,
                   "the least recently used pool was kept past --max-warm-pools")
        assert list(h.get("/v1/pool").json()["templates"]) == ["default"]
        # What it made lives on, and its next create warms it a pool again.
        assert exec_ok(g, mine, "print(1)") == "1\n"
        again = pooled_sandbox(g)
        for c, x in ((g, mine), (h, theirs), (g, again)):
            delete_raw(c, x)
