"""A fork's REPL forks while its children's members are still being given
their roots (docs/fork.md, "Where a fork's time goes"): the shim holds each
child's hand-over, in which it would join its member's namespaces, until
that member's init has moved into the snapshot of the parent's files. A
child never runs in a member whose root is not yet its own (the attack
that makes the parent's snapshot slow to get in first is in
tests/adversarial/test_processes.py)."""
from __future__ import annotations

import os
import signal
import threading
import time

from helpers import children_of, delete_raw, exec_ok, host_repl_pid, ns, parent_with_a_hollow_spare, wait_until


def test_a_fork_child_joins_its_member_only_once_the_member_has_its_root(http):
    sid, init = parent_with_a_hollow_spare(http, "x = 42\nopen('/tmp/made-by-parent', 'w').write('parent')")
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

