"""A forkbox cluster against the real thing (docs/cluster.md): etcd, an S3
server and three nodes on loopback, driven through the gateway with the
podflare SDK and raw HTTP."""
from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from podflare import Sandbox

from conftest import DENIED_NET
from helpers import FORKBOX_BIN, create_raw, delete_raw, exec_raw, wait_until
from netns import NetNs


def node(http, name: str) -> dict:
    """`name`'s entry in the gateway's node list (its load is at most 2 s old)."""
    return next(n for n in http.get("/v1/cluster/nodes").json()["nodes"] if n["name"] == name)


def info(http, sid: str) -> dict:
    r = http.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def py(http, sid: str, code: str) -> str:
    out = exec_raw(http, sid, code)
    assert out.status == 200 and out.exit_code == 0, out
    return out.stdout


def node_client(cluster, name: str, secret: bool = True) -> httpx.Client:
    headers = {"x-forkbox-cluster": open(cluster.secret_file).read().strip()} if secret else {}
    return httpx.Client(base_url=f"http://127.0.0.1:{cluster.node_ports[name]}", headers=headers, timeout=120)


def create_on(cluster, http, node: str, **body) -> str:
    """A sandbox on `node`: made on that node's API directly (as a gateway
    would), so a test can place it."""
    with node_client(cluster, node) as n:
        return create_raw(n, **body)


def key_cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([FORKBOX_BIN, "key", *args, "--cluster-etcd", cluster.endpoints, "--cluster-prefix", cluster.prefix],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def keyed(cluster):
    """Keys added to the cluster for one test, removed after it (a
    cluster that had a key keeps wanting one: each test that adds keys
    sends them)."""
    made = []

    def add(name: str, **limits) -> str:
        args = ["add", name]
        for flag, v in limits.items():
            args += [f"--{flag.replace('_', '-')}", str(v)]
        out = key_cli(cluster, *args)
        assert out.returncode == 0, out
        made.append(name)
        return out.stdout.strip()
    yield add
    for name in made:
        key_cli(cluster, "remove", name)


def cleanup(http, ids):
    for sid in ids:
        delete_raw(http, sid)


# ── placement and locality ──────────────────────────────────────────────

def test_creates_spread_over_the_nodes_and_each_runs_code(cluster, http):
    """Creates go to the node holding the fewest sandboxes: six creates land
    on all three nodes; every sandbox runs code and says where it lives."""
    ids = []
    try:
        for i in range(6):
            sb = Sandbox(host=cluster.url)
            ids.append(sb.id)
            assert sb.run_code(f"print({i} * 7)").stdout.strip() == str(i * 7)
        nodes = [info(http, sid)["node"] for sid in ids]
        assert set(nodes) == set(cluster.nodes), nodes
        listed = http.get("/v1/sandboxes").json()["sandboxes"]
        assert {s["id"] for s in listed} >= set(ids)
        assert {s["node"] for s in listed if s["id"] in ids} == set(cluster.nodes)
    finally:
        cleanup(http, ids)


def test_forks_stay_on_their_parents_node(cluster, http):
    parent = create_raw(http)
    try:
        py(http, parent, "state = {'k': 41}")
        home = info(http, parent)["node"]
        r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 3})
        assert r.status_code == 200, r.text
        kids = r.json()["children"]
        for k in kids:
            assert info(http, k)["node"] == home
            assert py(http, k, "state['k'] += 1\nprint(state['k'])") == "42\n"
        assert py(http, parent, "print(state['k'])") == "41\n"
        cleanup(http, kids)
    finally:
        cleanup(http, [parent])


# ── Spaces across nodes ─────────────────────────────────────────────────

def test_a_space_frozen_on_one_node_resumes_on_another(cluster, http):
    """Its files and REPL state travel through the object store: frozen on
    node-1, resumed on node-2 (and its bytes then leave the store)."""
    sid = create_on(cluster, http, "node-1")
    py(http, sid, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})\nopen('/root/kept.txt', 'w').write('on node-1')")
    r = http.post(f"/v1/sandboxes/{sid}/freeze")
    assert r.status_code == 200, r.text
    space = r.json()["space_id"]
    spaces = http.get("/v1/spaces").json()["spaces"]
    assert space in [s["space_id"] for s in spaces]
    # Its old id says where it went, as on one server.
    assert info(http, sid)["state"] == "frozen"
    r = http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "print(1)"})
    assert r.status_code == 409 and space in r.json()["error"], r.text
    store = os.path.join(cluster.root, "s3", "forkbox", "store", "spaces")
    assert os.listdir(store) == [f"{space}.tar"]
    with node_client(cluster, "node-2") as n2:
        r = n2.post(f"/v1/spaces/{space}/resume", json={})
        assert r.status_code == 200, r.text
        new = r.json()["id"]
    try:
        assert info(http, new)["node"] == "node-2"
        assert py(http, new, "print(df.a.sum(), open('/root/kept.txt').read())") == "6 on node-1\n"
        assert http.post(f"/v1/spaces/{space}/resume", json={}).status_code == 404, "a Space resumes once"
        # Its bytes left the store (and rclone drops emptied directories).
        assert not os.path.exists(store) or os.listdir(store) == []
    finally:
        cleanup(http, [new])


def test_a_space_resumed_twice_at_once_on_two_nodes_is_resumed_once(cluster, http):
    sid = create_raw(http)
    py(http, sid, "x = 5")
    space = http.post(f"/v1/sandboxes/{sid}/freeze").json()["space_id"]
    results = []

    def resume(node):
        with node_client(cluster, node) as n:
            results.append(n.post(f"/v1/spaces/{space}/resume", json={}))
    threads = [threading.Thread(target=resume, args=(n,)) for n in ("node-1", "node-3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert codes == [200, 404], [(r.status_code, r.text) for r in results]
    new = next(r.json()["id"] for r in results if r.status_code == 200)
    assert py(http, new, "print(x)") == "5\n"
    cleanup(http, [new])


def store_holds(cluster, space: str) -> bool:
    store = os.path.join(cluster.root, "s3", "forkbox", "store", "spaces")
    return os.path.exists(os.path.join(store, f"{space}.tar"))


def hibernate(client, sid: str) -> str:
    """Hibernate `sid` through the gateway; its Space's id."""
    r = client.post(f"/v1/sandboxes/{sid}/hibernate")
    assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
    return r.json()["space_id"]


def test_a_hibernating_sandbox_keeps_its_id_across_the_cluster(cluster, http):
    """Hibernated on node-1, a sandbox is in the object store and on no
    node: the gateway shows it (its info, one list entry, not a Space)
    without waking it; the next call wakes it under its id on node-1, or,
    with node-1 draining, on another node; DELETE discards it."""
    sid = create_on(cluster, http, "node-1")
    secret = ["--url", cluster.url, "--cluster-secret-file", cluster.secret_file]
    undrain = None
    try:
        py(http, sid, "x = 41\nopen('/root/f', 'w').write('kept')")
        space = hibernate(http, sid)
        assert store_holds(cluster, space)
        for _ in range(2):
            got = info(http, sid)
            assert got["state"] == "hibernated" and "node" not in got, got
        listed = [s for s in http.get("/v1/sandboxes").json()["sandboxes"] if s["id"] == sid]
        assert [s["state"] for s in listed] == ["hibernated"], listed
        assert space not in [s["space_id"] for s in http.get("/v1/spaces").json()["spaces"]]
        assert py(http, sid, "x += 1\nprint(x, open('/root/f').read())") == "42 kept\n"
        assert info(http, sid)["node"] == "node-1", "woken where it was frozen"
        assert not store_holds(cluster, space), "a woken sandbox's Space leaves the store"

        space = hibernate(http, sid)
        undrain = subprocess.run([FORKBOX_BIN, "node", "drain", "node-1", *secret], capture_output=True, text=True, timeout=600)
        assert undrain.returncode == 0, undrain
        assert py(http, sid, "x += 1\nprint(x, open('/root/f').read())") == "43 kept\n"
        assert info(http, sid)["node"] != "node-1", "woken on a node that takes work"

        space = hibernate(http, sid)
        assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
        r = http.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 404, r.text
        assert not store_holds(cluster, space)
        assert http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "print(1)"}).status_code == 404
    finally:
        if undrain is not None:
            out = subprocess.run([FORKBOX_BIN, "node", "undrain", "node-1", *secret], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out
            wait_until(lambda: not node(http, "node-1")["draining"], 30, "node-1 did not take work again")
        cleanup(http, [sid])


def test_a_hibernating_sandbox_whose_lifetime_ends_leaves_the_store(cluster, http):
    """No node holds it, and every node looks: one discards it."""
    sid = create_on(cluster, http, "node-3", timeout_seconds=3, persistent=True)
    space = hibernate(http, sid)
    assert store_holds(cluster, space)
    # Within the nodes' 30 s sweep once its 3 s are up.
    wait_until(lambda: http.get(f"/v1/sandboxes/{sid}").status_code == 404, 45, "the hibernating sandbox was not discarded")
    # Its records go first, then its bytes (a record must never name bytes
    # that are gone): the id is unknown a moment before the store is empty.
    wait_until(lambda: not store_holds(cluster, space), 10, "the discarded sandbox's bytes stayed in the store")


def test_another_keys_calls_neither_see_nor_wake_a_hibernating_sandbox(cluster, http, keyed):
    """The store's record of a hibernating id routes calls, and names its
    owner: another key's calls answer as for an unknown id on every node,
    leave it asleep, and cannot delete it."""
    a, b = keyed("sleeper-a"), keyed("sleeper-b")
    ha, hb = ({"Authorization": f"Bearer {k}"} for k in (a, b))
    with httpx.Client(base_url=cluster.url, headers=ha, timeout=120) as ca, httpx.Client(base_url=cluster.url, headers=hb, timeout=120) as cb:
        sid = create_on_keyed(cluster, "node-2", ha)
        try:
            py(ca, sid, "secret = 7")
            space = hibernate(ca, sid)
            for call in (lambda: cb.get(f"/v1/sandboxes/{sid}"), lambda: cb.post(f"/v1/sandboxes/{sid}/exec", json={"code": "print(secret)"}),
                         lambda: cb.delete(f"/v1/sandboxes/{sid}"), lambda: cb.post(f"/v1/spaces/{space}/resume", json={})):
                r = call()
                assert r.status_code == 404, r.text
            for name in cluster.nodes:
                with node_client(cluster, name) as n:
                    r = n.get(f"/v1/sandboxes/{sid}", headers=hb)
                    assert r.status_code == 404, (name, r.text)
            assert sid not in {s["id"] for s in cb.get("/v1/sandboxes").json()["sandboxes"]}
            assert info(ca, sid)["state"] == "hibernated", "still asleep"
            assert store_holds(cluster, space)
            assert py(ca, sid, "print(secret)") == "7\n"
        finally:
            cleanup(ca, [sid])


# ── templates across nodes ──────────────────────────────────────────────

def test_a_template_saved_on_one_node_serves_creates_on_another(cluster, http):
    """Saved on node-1 (its layer and REPL state go to the object store),
    listed through the gateway, and created on node-2, which fetches it;
    deleted through the gateway, it is gone on node-2 too."""
    src = create_on(cluster, http, "node-1")
    try:
        py(http, src, "import json\nweights = {'a': 1}\nopen('/root/model.json', 'w').write(json.dumps(weights))")
        r = http.post(f"/v1/sandboxes/{src}/template", json={"name": "tpl-cluster"})
        assert r.status_code == 200, r.text
    finally:
        cleanup(http, [src])
    assert "tpl-cluster" in [t["name"] for t in http.get("/v1/templates").json()]
    with node_client(cluster, "node-2") as n2:
        new = create_raw(n2, template="tpl-cluster")
        try:
            assert py(n2, new, "print(weights, open('/root/model.json').read())") == "{'a': 1} {\"a\": 1}\n"
            assert n2.get("/v1/templates/tpl-cluster").status_code == 200
        finally:
            cleanup(n2, [new])
        r = http.delete("/v1/templates/tpl-cluster")
        assert r.status_code == 204, r.text
        r = n2.post("/v1/sandboxes", json={"template": "tpl-cluster"})
        assert r.status_code == 404 and "unknown template" in r.json()["error"], r.text
    assert "tpl-cluster" not in [t["name"] for t in http.get("/v1/templates").json()]


# ── quotas ──────────────────────────────────────────────────────────────

def test_a_keys_quota_holds_across_nodes_under_concurrent_creates(cluster, http, keyed):
    """max_sandboxes 3, twelve creates at once through the gateway and
    straight to all three nodes: exactly three are made."""
    key = keyed("quota-a", max_sandboxes=3)
    auth = {"Authorization": f"Bearer {key}"}
    secret = open(cluster.secret_file).read().strip()
    targets = [(cluster.url, {})] * 6 + [(f"http://127.0.0.1:{p}", {"x-forkbox-cluster": secret}) for p in cluster.node_ports.values()] * 2

    def create(target):
        url, extra = target
        return httpx.post(f"{url}/v1/sandboxes", json={}, headers={**auth, **extra}, timeout=120)
    with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
        answers = list(pool.map(create, targets))
    made = [r.json()["id"] for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(made) == 3 and len(refused) == len(targets) - 3, [(r.status_code, r.text[:200]) for r in answers]
    assert "max_sandboxes" in refused[0].json()["error"] and "across the cluster" in refused[0].json()["error"]
    with httpx.Client(base_url=cluster.url, headers=auth, timeout=60) as mine:
        for sid in made:
            assert delete_raw(mine, sid) == 204
        # Room again once they are gone.
        sid = create_raw(mine)
        assert delete_raw(mine, sid) == 204


def test_a_key_sees_only_its_own_sandboxes_on_every_node(cluster, http, keyed):
    a, b = keyed("tenant-a"), keyed("tenant-b")
    ha, hb = ({"Authorization": f"Bearer {k}"} for k in (a, b))
    with httpx.Client(base_url=cluster.url, headers=ha, timeout=60) as ca, httpx.Client(base_url=cluster.url, headers=hb, timeout=60) as cb:
        # One on each node (where the gateway places them is
        # test_creates_spread_over_the_nodes_and_each_runs_code's: here
        # sandboxes other tests left would make it put all three on one).
        mine = [create_on_keyed(cluster, node, ha) for node in ("node-1", "node-2", "node-3")]
        try:
            assert sorted(info(ca, s)["node"] for s in mine) == ["node-1", "node-2", "node-3"]
            assert not {s["id"] for s in cb.get("/v1/sandboxes").json()["sandboxes"]} & set(mine)
            for sid in mine:
                r = cb.get(f"/v1/sandboxes/{sid}")
                assert r.status_code == 404 and r.json()["error"] == f"no sandbox `{sid}`", r.text
                assert cb.post(f"/v1/sandboxes/{sid}/exec", json={"code": "print(1)"}).status_code == 404
                assert cb.delete(f"/v1/sandboxes/{sid}").status_code == 404
            assert http.get("/v1/sandboxes").status_code == 401, "no key, no list"
        finally:
            cleanup(ca, mine)


# ── failures ────────────────────────────────────────────────────────────

def test_a_node_killed_loses_its_sandboxes_only(cluster, http, keyed):
    """kill -9 node-2: its sandboxes answer 404 naming the node once its
    lease runs out, its key's quota is given back, the other nodes and the
    gateway go on; restarted, it serves again."""
    key = keyed("lossy", max_sandboxes=3)
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=cluster.url, headers=auth, timeout=60) as mine:
        doomed = create_on_keyed(cluster, "node-2", auth)
        safe = create_on_keyed(cluster, "node-1", auth)
        extra = create_on_keyed(cluster, "node-3", auth)
        assert mine.post("/v1/sandboxes", json={}).status_code == 429, "the quota is full"
        cluster.nodes["node-2"].kill()
        wait_until(lambda: mine.get(f"/v1/sandboxes/{doomed}").status_code == 404, cluster.lease_seconds + 15, "the lost sandbox still answers")
        r = mine.get(f"/v1/sandboxes/{doomed}")
        assert "node node-2 left" in r.json()["error"], r.text
        assert py(mine, safe, "print('still here')") == "still here\n"
        # Its slot is free again, and creates avoid the dead node.
        new = create_raw(mine)
        assert info(mine, new)["node"] != "node-2"
        cleanup(mine, [safe, extra, new])
    cluster.heal()
    wait_until(lambda: any(n["name"] == "node-2" for n in http.get("/v1/cluster/nodes", headers=auth).json()["nodes"]), 60, "node-2 did not come back")


def create_on_keyed(cluster, node: str, auth: dict) -> str:
    with node_client(cluster, node) as n:
        r = n.post("/v1/sandboxes", json={}, headers=auth)
        assert r.status_code == 200, r.text
        return r.json()["id"]


def test_a_node_restarted_takes_its_sandboxes_back(cluster, http):
    """kill -9 and start again within its lease: its sandboxes are still
    its own, with their state, as a single server's restart keeps them."""
    sid = create_on(cluster, http, "node-3")
    py(http, sid, "survivor = 'yes'")
    cluster.nodes["node-3"].kill()
    cluster.start_node("node-3")
    wait_until(lambda: http.get(f"/v1/sandboxes/{sid}").status_code == 200, 60, "the sandbox did not come back")
    assert py(http, sid, "print(survivor)") == "yes\n"
    assert info(http, sid)["node"] == "node-3"
    cleanup(http, [sid])


def recorded_ids(cluster) -> set[str]:
    keys = cluster.etcdctl("get", "--prefix", "--keys-only", f"{cluster.prefix}/sandboxes/").stdout.split()
    return {k.rsplit("/", 1)[1] for k in keys}


def test_etcd_keeps_serving_without_one_member_and_refuses_clearly_without_two(cluster, http):
    sid = create_raw(http)
    before = recorded_ids(cluster)
    try:
        # The leader goes: the creates that follow at once ride through the
        # election (one whose first rounds split their votes takes seconds).
        leader = cluster.etcd_leader()
        cluster.etcd[leader].kill()
        for _ in range(5):
            s = create_raw(http)
            assert py(http, s, "print(1)") == "1\n"
            assert delete_raw(http, s) == 204
        cluster.etcd[(leader + 1) % len(cluster.etcd)].kill()
        started = time.monotonic()
        r = http.post("/v1/sandboxes", json={})
        assert r.status_code == 503, r.text
        assert "etcd" in r.json()["error"], r.text
        assert time.monotonic() - started < 15, "refused, not left hanging"
        assert http.get(f"/v1/sandboxes/{sid}").status_code == 503
    finally:
        cluster.heal()
    try:
        # Back with its quorum: everything works ...
        wait_until(lambda: http.post(f"/v1/sandboxes/{sid}/exec", json={"code": "print(2)"}).status_code == 200, 30, "no recovery")
        s = create_raw(http)
        cleanup(http, [s])
    finally:
        cleanup(http, [sid])
    # ... and nothing was half made: no record of a sandbox the outage
    # refused appears, even once its write could have been committed late.
    deadline = time.monotonic() + 30
    while (extra := recorded_ids(cluster) - (before - {sid})):
        assert time.monotonic() < deadline, f"sandboxes are still recorded after they were all deleted: {extra}"
        time.sleep(0.2)


def test_a_gateway_restarted_mid_stream_ends_the_stream_cleanly(cluster, http):
    sid = create_raw(http)
    try:
        got, ended = [], []

        def stream():
            try:
                with httpx.Client(base_url=cluster.url, timeout=30) as c:
                    with c.stream("POST", f"/v1/sandboxes/{sid}/exec", json={"code": "import time\nfor i in range(100):\n    print(i, flush=True); time.sleep(0.1)"}) as r:
                        for line in r.iter_lines():
                            got.append(line)
            except httpx.HTTPError as e:
                ended.append(type(e).__name__)
            else:
                ended.append("eof")
        t = threading.Thread(target=stream)
        t.start()
        wait_until(lambda: len(got) >= 5, 30, "no output streamed")
        cluster.gateway.kill()
        t.join(timeout=10)
        assert not t.is_alive(), "the client hung after the gateway died"
        assert ended and len(got) < 100, (ended, len(got))
        cluster.start_gateway()
        assert py(http, sid, "print('after')") == "after\n"
    finally:
        cleanup(http, [sid])


def test_draining_a_node_moves_its_sandboxes_under_their_ids(cluster, http):
    """forkbox node drain: every sandbox of node-1 moves to another node
    under its id with its globals and files, while a client keeps running
    code in one (its calls wait, none fails); node-1 then takes no new
    work, until undrained."""
    ids = [create_on(cluster, http, "node-1") for _ in range(4)]
    secret = ["--url", cluster.url, "--cluster-secret-file", cluster.secret_file]
    try:
        for i, sid in enumerate(ids):
            py(http, sid, f"x = {i}\nopen('/root/f', 'w').write('file {i}')")
        errors, calls, stop = [], [0], threading.Event()

        def busy():
            with httpx.Client(base_url=cluster.url, timeout=180) as c:
                while not stop.is_set():
                    out = exec_raw(c, ids[0], "print(x)")
                    calls[0] += 1
                    if out.status != 200 or out.stdout != "0\n":
                        errors.append(out)
        t = threading.Thread(target=busy)
        t.start()
        try:
            wait_until(lambda: calls[0] >= 3, 30, "the busy client made no call")
            out = subprocess.run([FORKBOX_BIN, "node", "drain", "node-1", *secret], capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out
            moved = {l.split("\t")[0] for l in out.stdout.splitlines() if "\tmoved to " in l}
            assert set(ids) <= moved, out
            before = calls[0]
            wait_until(lambda: calls[0] >= before + 3, 30, "the busy client stopped")
        finally:
            stop.set()
            t.join(timeout=60)
        assert not errors, errors[:3]
        for i, sid in enumerate(ids):
            assert info(http, sid)["node"] != "node-1"
            assert py(http, sid, "print(x, open('/root/f').read())") == f"{i} file {i}\n"
        # A node publishes its load every 2 s.
        wait_until(lambda: node(http, "node-1")["load"]["sandboxes"] == 0, 10, "node-1 still reports sandboxes")
        assert node(http, "node-1")["draining"] is True
        made = [create_raw(http) for _ in range(4)]
        assert all(info(http, s)["node"] != "node-1" for s in made)
        cleanup(http, made)
        assert http.post("/v1/cluster/nodes/node-1/drain").status_code == 401, "draining is the operator's"
    finally:
        out = subprocess.run([FORKBOX_BIN, "node", "undrain", "node-1", *secret], capture_output=True, text=True, timeout=60)
        cleanup(http, ids)
    assert out.returncode == 0, out
    wait_until(lambda: not node(http, "node-1")["draining"], 30, "node-1 did not take work again")


# ── security ────────────────────────────────────────────────────────────

def test_nodes_answer_only_their_gateways(cluster):
    with node_client(cluster, "node-1", secret=False) as n:
        for method, path in [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", "/v1/healthz"), ("POST", "/sandboxes")]:
            r = n.request(method, path, json={} if method == "POST" else None)
            assert r.status_code == 401 and "cluster" in r.json()["error"], (path, r.status_code, r.text)
        r = n.get("/v1/sandboxes", headers={"x-forkbox-cluster": "x" * 64})
        assert r.status_code == 401


def test_a_sandbox_reaches_no_part_of_the_cluster(cluster, http):
    """From inside, with egress on: etcd's members, the S3 server, every
    node's API and the gateway are refused (the firewall blocks the host)."""
    sid = create_raw(http, egress=True)
    ports = [c for c, _ in cluster.etcd_ports] + [p for _, p in cluster.etcd_ports] + [cluster.s3_port]
    ports += list(cluster.node_ports.values()) + [int(cluster.gateway_addr.rpartition(":")[2])]
    probe = """
import socket, errno
def probe(host, port):
    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return 'connected'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
"""
    # Loopback, and every address of the host (where a real cluster's
    # parts would listen).
    hosts = ["127.0.0.1"] + subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    try:
        for h in hosts:
            seen = json.loads(py(http, sid, probe + f"import json\nprint(json.dumps({{p: probe({h!r}, p) for p in {ports}}}))"))
            assert set(seen.values()) <= {"ECONNREFUSED", "ENETUNREACH"}, (h, seen)
    finally:
        cleanup(http, [sid])


def test_networks_the_operator_denies_are_refused_even_to_allow_lists(cluster, http):
    """--cluster-deny (where a real cluster's gateways and services live):
    refused with egress on and when an allow-list names the address, while
    a network not denied stays reachable (so the refusal is the deny's)."""
    assert DENIED_NET == "10.233.0.0/16"
    with NetNs(233) as denied, NetNs(234) as other:
        for ns in (denied, other):
            ns.run([sys.executable, "-m", "http.server", "8080", "--bind", ns.ns_ip], port=8080)
        probe = """
import socket, errno
def probe(host):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, 8080))
        return 'connected'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
"""
        ids = [create_raw(http, egress=True), create_raw(http, egress={"allow": [f"{denied.ns_ip}/32", f"{other.ns_ip}/32"]})]
        try:
            for sid in ids:
                out = py(http, sid, probe + f"print(probe({denied.ns_ip!r}), probe({other.ns_ip!r}))")
                assert out == "ECONNREFUSED connected\n", (sid, out)
        finally:
            cleanup(http, ids)


# ── through the gateway, every API ──────────────────────────────────────

def test_the_e2b_sdk_works_through_the_gateway(cluster, monkeypatch):
    host = cluster.url.removeprefix("http://")
    monkeypatch.setenv("E2B_API_KEY", "any-key")
    monkeypatch.setenv("E2B_API_URL", cluster.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", cluster.url)
    monkeypatch.setenv("E2B_DOMAIN", host)
    from e2b_code_interpreter import Sandbox as E2bSandbox
    sb = E2bSandbox.create(secure=True)
    try:
        assert sb.run_code("6 * 7").text == "42"
        assert sb.commands.run("echo hi").stdout == "hi\n"
        sb.files.write("/tmp/f.txt", "via the gateway")
        assert sb.files.read("/tmp/f.txt") == "via the gateway"
        # Signed links name no sandbox: the node whose sandbox signed one
        # takes it, whichever it is.
        r = httpx.post(sb.upload_url("/tmp/link.txt"), files={"file": ("link.txt", b"via link")})
        assert r.status_code == 200, (r.status_code, r.text)
        assert httpx.get(sb.download_url("/tmp/link.txt")).text == "via link"
        assert httpx.get(sb.download_url("/tmp/link.txt").replace("link.txt", "other.txt")).status_code == 401
    finally:
        sb.kill()


def test_cluster_nodes_lists_each_node_with_its_load(cluster, http):
    sid = create_on(cluster, http, "node-1")
    try:
        wait_until(lambda: node(http, "node-1")["load"]["sandboxes"] >= 1, 10, "node-1's load does not count its sandbox")
        n = node(http, "node-1")
        assert n["draining"] is False and "default" in n["load"]["warm"] and n["load"]["max_sandboxes"] > 0, n
        out = subprocess.run([FORKBOX_BIN, "node", "list", "--url", cluster.url], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "node-1" in out.stdout and "node-3" in out.stdout, out
    finally:
        cleanup(http, [sid])
