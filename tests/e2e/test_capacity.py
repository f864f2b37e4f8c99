"""Capacity: --max-sandboxes and --max-memory-mib cap creates and forks with
a 429 that names the limit, and a refused request leaves nothing behind."""
from __future__ import annotations

import os

import pytest

from conftest import shutdown_and_check, start_server
from helpers import assert_json_error, cgroup_children, create_raw, delete_raw, exec_raw


@pytest.fixture(scope="module")
def capped(say, server):
    srv = start_server(say, "capped", ["--max-sandboxes", "4", "--max-memory-mib", "300"], build=False)
    yield srv
    problems = shutdown_and_check(srv)
    srv.cleanup()
    assert not problems, "capped server leaked:\n" + "\n".join(problems)


def footprint(srv, http) -> tuple:
    """What the server holds: listed sandboxes, cgroups, subvolumes."""
    listed = sorted(s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"])
    if srv.cgroup_parent is None and listed:
        srv.learn_cgroup_parent(listed[0])
    cgroups = len(cgroup_children(srv.cgroup_parent)) if srv.cgroup_parent else 0
    vol = os.path.join(os.path.realpath(srv.state_dir), "volume", "sandboxes")
    return listed, cgroups, len(os.listdir(vol))


def wait_pool_settled(http):
    """The warm pool refills in the background; let it finish so counts are stable."""
    import time
    for _ in range(100):
        pool = http.get("/v1/pool").json()["templates"]
        if all(len(t["spares"]) >= 2 for t in pool.values()) and pool:
            return
        time.sleep(0.1)


def test_live_sandbox_cap_applies_to_creates_and_forks(capped):
    with capped.http() as http:
        first = create_raw(http)
        try:
            wait_pool_settled(http)
            before = footprint(capped, http)
            r = http.post(f"/v1/sandboxes/{first}/fork", json={"n": 4})
            err = assert_json_error(r, 429)
            assert "limit of 4 live sandboxes" in err["error"], err
            assert r.headers["retry-after"] == "1"
            assert footprint(capped, http) == before
            kids = http.post(f"/v1/sandboxes/{first}/fork", json={"n": 3}).json()["children"]
            assert len(kids) == 3
            assert "live sandboxes" in assert_json_error(http.post("/v1/sandboxes", json={}), 429)["error"]
            assert_json_error(http.post(f"/v1/sandboxes/{kids[0]}/fork", json={"n": 1}), 429)
            for k in kids:
                assert delete_raw(http, k) == 204
            # Room again.
            again = http.post(f"/v1/sandboxes/{first}/fork", json={"n": 1})
            assert again.status_code == 200, again.text
            delete_raw(http, again.json()["children"][0])
        finally:
            delete_raw(http, first)


def test_memory_cap_applies_to_creates_and_forks(capped):
    with capped.http() as http:
        hog = create_raw(http, ram_mib=1024)
        try:
            r = exec_raw(http, hog, "block = bytearray(400 << 20)\nblock[::4096] = b'x' * len(block[::4096])")
            assert r.exit_code == 0, r
            wait_pool_settled(http)
            before = footprint(capped, http)
            err = assert_json_error(http.post(f"/v1/sandboxes/{hog}/fork", json={"n": 1}), 429)
            assert "memory limit" in err["error"] and "--max-memory-mib" in err["error"], err
            assert "memory limit" in assert_json_error(http.post("/v1/sandboxes", json={}), 429)["error"]
            assert footprint(capped, http) == before
            exec_raw(http, hog, "del block\nimport gc; gc.collect()")
        finally:
            delete_raw(http, hog)
        # Freed memory makes room again.
        ok = create_raw(http)
        delete_raw(http, ok)
