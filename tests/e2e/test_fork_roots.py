"""A fork's REPL forks while its children's members are still being given
their roots (docs/fork.md, "Where a fork's time goes"): the shim holds each
child's hand-over, in which it would join its member's namespaces, until
that member's init has moved into the snapshot of the parent's files. A
child never runs in a member whose root is not yet its own."""
from __future__ import annotations

import os
import signal
import threading
import time

from helpers import create_raw, delete_raw, exec_ok, host_repl_pid, sandbox_host_pids, wait_until


def ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def family_spare_init(http, sid: str) -> int | None:
    """The init of a hollow spare member of `sid`'s family (it shares the
    family's user namespace; the warm pool's spares have their own)."""
    family = ns(host_repl_pid(sid), "user")
    for spare in http.get("/v1/pool").json().get("fork_spares", []):
        for pid in sandbox_host_pids(spare):
            try:
                if ns(pid, "user") == family:
                    return pid
            except FileNotFoundError:
                pass
    return None


def test_a_fork_child_joins_its_member_only_once_the_member_has_its_root(http):
    sid = create_raw(http, egress=False)
    exec_ok(http, sid, "x = 42\nopen('/tmp/made-by-parent', 'w').write('parent')")
    # A first fork leaves the family a hollow spare for the next one.
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
    assert r.status_code == 200, r.text
    delete_raw(http, r.json()["children"][0])
    found = []
    wait_until(lambda: found.append(family_spare_init(http, sid)) or found[-1] is not None, 30, "the family kept no hollow spare")
    init = found[-1]
    spare_mnt = ns(init, "mnt")
    repl = host_repl_pid(sid)
    before = set(children_of(repl))
    # Stopped, the spare's init cannot move into its root.
    os.kill(init, signal.SIGSTOP)
    answer = {}
    fork = threading.Thread(target=lambda: answer.update(r=http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}, timeout=120)))
    try:
        fork.start()
        forked = []
        wait_until(lambda: forked.extend(set(children_of(repl)) - before) or forked, 30, "the REPL did not fork")
        # Time enough to join the member's namespaces, were it let.
        time.sleep(1)
        assert fork.is_alive(), "the fork answered before its child's member had its root"
        for child in forked:
            assert ns(child, "mnt") != spare_mnt, "the fork child joined its member's mount namespace before the member had its root"
            assert ns(child, "mnt") == ns(repl, "mnt"), "the fork child left its parent's mount namespace while held"
    finally:
        os.kill(init, signal.SIGCONT)
        fork.join()
    r = answer["r"]
    assert r.status_code == 200, r.text
    child = r.json()["children"][0]
    assert exec_ok(http, child, "print(x, open('/tmp/made-by-parent').read())") == "42 parent\n"
    for s in (child, sid):
        delete_raw(http, s)
