"""Checkpoints (docs/state.md): capture a sandbox's REPL and files, roll
back to them any number of times, list, delete, and the per-sandbox cap."""
from __future__ import annotations

import pytest

from conftest import start_server, stop_and_assert_clean
from helpers import assert_json_error, create_raw, delete_raw, exec_ok, wait_no_leaks


py = exec_ok


def sh(http, sid, code) -> str:
    return exec_ok(http, sid, code, language="bash")


def checkpoint(http, sid) -> str:
    r = http.post(f"/v1/sandboxes/{sid}/checkpoints")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sandbox_id"] == sid and body["checkpoint"].startswith("cp-") and body["created_at"] > 0, body
    return body["checkpoint"]


def restore(http, sid, cp) -> dict:
    r = http.post(f"/v1/sandboxes/{sid}/restore", json={"checkpoint": cp})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def sid(http):
    s = create_raw(http, egress=False)
    yield s
    delete_raw(http, s)


def test_restore_brings_back_variables_imports_and_files(http, sid):
    py(http, sid, "import json, collections\nx = [1, 2, 3]\ncounter = collections.Counter('abca')\n"
                  "def f(n):\n    return n * x[0]\n"
                  "open('/root/keep.txt', 'w').write('original')\nopen('/root/doomed.txt', 'w').write('bye')")
    sh(http, sid, "mkdir -p /root/tree/a && echo leaf > /root/tree/a/leaf && rm /etc/motd")
    cp = checkpoint(http, sid)

    # Mutate everything: variables, imports, files (change, add, remove).
    py(http, sid, "x.append(4); counter['z'] = 9; del f; import fractions; y = 'new'\n"
                  "open('/root/keep.txt', 'w').write('changed')\nimport os; os.remove('/root/doomed.txt')\n"
                  "open('/root/added.txt', 'w').write('added')")
    sh(http, sid, "rm -r /root/tree && echo back > /etc/motd")

    info = restore(http, sid, cp)
    assert info["id"] == sid and info["state"] == "ready"
    assert py(http, sid, "print(x, counter['a'], counter['z'], f(10), 'y' in globals(), 'fractions' in globals(), 'json' in globals())") \
        == "[1, 2, 3] 2 0 10 False False True\n"
    assert sh(http, sid, "cat /root/keep.txt /root/doomed.txt /root/tree/a/leaf; ls /root/added.txt 2>&1; test -e /etc/motd || echo motd-gone") \
        == "originalbyeleaf\nls: cannot access '/root/added.txt': No such file or directory\nmotd-gone\n"


def test_twenty_restores_of_one_checkpoint(http, sid):
    py(http, sid, "n = 0\nopen('/root/n', 'w').write('0')")
    cp = checkpoint(http, sid)
    for i in range(20):
        assert py(http, sid, "n += 1\nopen('/root/n', 'a').write(str(n))\nprint(n, open('/root/n').read())") == "1 01\n", i
        restore(http, sid, cp)
    assert py(http, sid, "print(n, open('/root/n').read())") == "0 0\n"
    # Still listed: a checkpoint is reusable.
    assert [c["checkpoint"] for c in http.get(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoints"]] == [cp]


def test_list_delete_and_errors(http, sid):
    assert http.get(f"/v1/sandboxes/{sid}/checkpoints").json() == {"checkpoints": []}
    py(http, sid, "v = 'one'")
    a = checkpoint(http, sid)
    py(http, sid, "v = 'two'")
    b = checkpoint(http, sid)
    listed = http.get(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoints"]
    assert [c["checkpoint"] for c in listed] == [a, b] and listed[0]["created_at"] <= listed[1]["created_at"]
    # Restoring the older one does not remove the newer one.
    restore(http, sid, a)
    assert py(http, sid, "print(v)") == "one\n"
    restore(http, sid, b)
    assert py(http, sid, "print(v)") == "two\n"

    assert http.delete(f"/v1/sandboxes/{sid}/checkpoints/{a}").status_code == 204
    assert [c["checkpoint"] for c in http.get(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoints"]] == [b]
    assert "no checkpoint" in assert_json_error(http.delete(f"/v1/sandboxes/{sid}/checkpoints/{a}"), 404)["error"]
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/restore", json={"checkpoint": a}), 404)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/restore", json={}), 400)
    assert_json_error(http.post(f"/v1/sandboxes/{sid}/restore", json={"checkpoint": b, "extra": 1}), 400)
    assert_json_error(http.post("/v1/sandboxes/sb-nosuchsandbox/checkpoints"), 404)
    assert_json_error(http.get("/v1/sandboxes/sb-nosuchsandbox/checkpoints"), 404)
    # Another sandbox cannot restore this one's checkpoint.
    other = create_raw(http, egress=False)
    try:
        assert_json_error(http.post(f"/v1/sandboxes/{other}/restore", json={"checkpoint": b}), 404)
    finally:
        delete_raw(http, other)


def test_restore_keeps_settings_egress_and_runs_a_paused_sandbox(http):
    sid = create_raw(http, egress=False, timeout_seconds=1234, ram_mib=256)
    try:
        before = http.get(f"/v1/sandboxes/{sid}").json()
        py(http, sid, "a = 1")
        cp = checkpoint(http, sid)
        assert http.post(f"/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
        # A paused sandbox can be checkpointed, and stays paused.
        cp2 = checkpoint(http, sid)
        assert http.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        info = restore(http, sid, cp)
        for k in ("id", "template", "ram_mib", "egress", "created_at", "expires_at", "timeout_seconds"):
            assert info[k] == before[k], k
        assert info["state"] == "ready"
        assert py(http, sid, "print(a)") == "1\n"
        # The restored sandbox is confined like before: loopback only.
        assert sh(http, sid, "ip -o link | cut -d: -f2; ip route") == " lo\n"
        restore(http, sid, cp2)
        assert py(http, sid, "print(a)") == "1\n"
    finally:
        delete_raw(http, sid)


def test_forks_and_merges_carry_checkpoints_to_the_right_id(http, sid):
    py(http, sid, "v = 'root'")
    cp = checkpoint(http, sid)
    child = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}).json()["children"][0]
    # A fork starts with no checkpoints of its own ...
    assert http.get(f"/v1/sandboxes/{child}/checkpoints").json() == {"checkpoints": []}
    py(http, child, "v = 'child'")
    child_cp = checkpoint(http, child)
    py(http, child, "v = 'child, later'")
    # ... and a merge hands the winner's checkpoints to the parent's id.
    assert http.post(f"/v1/sandboxes/{sid}/merge_into/{child}").status_code == 204
    listed = [c["checkpoint"] for c in http.get(f"/v1/sandboxes/{sid}/checkpoints").json()["checkpoints"]]
    assert listed == [cp, child_cp]
    assert py(http, sid, "print(v)") == "child, later\n"
    restore(http, sid, child_cp)
    assert py(http, sid, "print(v)") == "child\n"
    restore(http, sid, cp)
    assert py(http, sid, "print(v)") == "root\n"


@pytest.fixture(scope="module")
def capped(say, server):
    srv = start_server(say, "checkpoints", ["--max-checkpoints", "2"], build=False)
    yield srv
    stop_and_assert_clean(srv)


def test_the_cap_is_enforced_at_its_edge_and_destroy_frees_checkpoints(capped):
    with capped.http() as http:
        sid = create_raw(http, egress=False)
        a = checkpoint(http, sid)
        checkpoint(http, sid)
        assert "--max-checkpoints" in assert_json_error(http.post(f"/v1/sandboxes/{sid}/checkpoints"), 429)["error"]
        http.delete(f"/v1/sandboxes/{sid}/checkpoints/{a}")
        checkpoint(http, sid)
        assert delete_raw(http, sid) == 204
        # Its checkpoints went with it: nothing of theirs is left.
        live = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
        assert wait_no_leaks(capped, True, live) == []


def test_a_restored_sandbox_gets_its_network_back(http):
    sid = create_raw(http)  # egress on (the server's default)
    try:
        cp = checkpoint(http, sid)
        restore(http, sid, cp)
        assert sh(http, sid, "ip route | grep -c ^default") == "1\n"
        assert http.get(f"/v1/sandboxes/{sid}/egress").json() == {"egress": True}
    finally:
        delete_raw(http, sid)
