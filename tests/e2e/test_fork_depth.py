"""Unlimited depth: tree search loops and long fork chains keep working, and
memory, processes, mounts and disk stay flat; nothing nests per generation."""
from __future__ import annotations

import os

from helpers import create_raw, delete_raw, exec_raw, host_repl_pid, proc_status, sandbox_cgroup_dirs, sandbox_host_pids


def fork(http, sid: str, n: int) -> list[str]:
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": n})
    assert r.status_code == 200, r.text
    return r.json()["children"]


def shared_mappings(sid: str) -> list[str]:
    """The sandbox REPL's shared mappings (`/proc/<pid>/maps` lines whose
    permissions end in `s`): each is redone, and paid for, by every fork."""
    with open(f"/proc/{host_repl_pid(sid)}/maps") as f:
        return [line.strip() for line in f if line.split()[1].endswith("s")]


def footprint(server, sid: str) -> dict:
    """What one live sandbox costs on the host, and how deep its REPL sits."""
    pids = sandbox_host_pids(sid)
    nspid_depths = sorted({len(proc_status(p).get("NSpid", "").split()) for p in pids})
    memory = 0
    for d in sandbox_cgroup_dirs(sid):
        for name in ("memory.usage_in_bytes", "memory.current"):
            path = os.path.join(d, name)
            if os.path.exists(path):
                memory = int(open(path).read())
    volume = os.path.join(os.path.realpath(server.state_dir), "volume", "sandboxes")
    mounts = 0
    for p in pids:
        try:
            mounts = max(mounts, len(open(f"/proc/{p}/mountinfo").read().splitlines()))
        except OSError:
            pass
    return {"processes": len(pids), "nspid_depths": nspid_depths, "memory": memory,
            "subvolumes": len(os.listdir(volume)), "mounts": mounts, "shared_mappings": len(shared_mappings(sid))}


def test_tree_search_loop_stays_flat(server, http):
    root = create_raw(http)
    exec_raw(http, root, "import random\nbest = 0.0\nhistory = []")
    seen = {}
    # Host resources (cgroups) keep the name of the sandbox that made them:
    # after a merge, root's id drives what was made for the winner.
    made_as = root
    try:
        for step in range(100):
            kids = fork(http, root, 3)
            scores = {}
            for k in kids:
                r = exec_raw(http, k, "trial = random.random()\nhistory.append(trial)\nprint(trial)")
                assert r.exit_code == 0, r
                scores[k] = float(r.stdout)
            winner = max(scores, key=scores.get)
            assert http.post(f"/v1/sandboxes/{root}/merge_into/{winner}").status_code == 204
            made_as = winner
            for k in kids:
                if k != winner:
                    assert delete_raw(http, k) == 204
            if step in (9, 99):
                seen[step] = footprint(server, made_as)
        r = exec_raw(http, root, "print(len(history))")
        assert r.stdout == "100\n", r
        early, late = seen[9], seen[99]
        assert early["processes"] > 0 and early["memory"] > 0, seen
        assert late["processes"] == early["processes"], seen
        assert late["nspid_depths"] == early["nspid_depths"], seen
        assert late["subvolumes"] == early["subvolumes"], seen
        assert late["mounts"] == early["mounts"], seen
        assert late["shared_mappings"] == early["shared_mappings"], seen
        # A REPL that kept 90 more floats may grow a little; per generation
        # structures (a copy of memory per fork, say) would be megabytes.
        assert late["memory"] < early["memory"] + (32 << 20), seen
    finally:
        delete_raw(http, root)


def test_a_chain_of_100_generations(server, http):
    chain = [create_raw(http)]
    exec_raw(http, chain[0], "lineage = [0]")
    try:
        for gen in range(1, 101):
            (kid,) = fork(http, chain[-1], 1)
            r = exec_raw(http, kid, f"lineage.append({gen})\nprint(len(lineage))")
            assert r.stdout == f"{gen + 1}\n", (gen, r)
            chain.append(kid)
        first, last = footprint(server, chain[1]), footprint(server, chain[-1])
        assert last["nspid_depths"] == first["nspid_depths"], (first, last)
        assert last["mounts"] == first["mounts"], (first, last)
        # A child once kept a copy of each ancestor's output journal.
        assert last["shared_mappings"] == first["shared_mappings"], (shared_mappings(chain[1]), shared_mappings(chain[-1]))
        assert exec_raw(http, chain[-1], "print(sum(lineage))").stdout == f"{sum(range(101))}\n"
        assert exec_raw(http, chain[-1], "ls / | wc -l", "bash").exit_code == 0
        # Ancestors are independent of their descendants.
        assert exec_raw(http, chain[50], "print(len(lineage))").stdout == "51\n"
        # Killing the middle of the chain leaves both ends alive.
        for sid in chain[1:100]:
            assert delete_raw(http, sid) == 204
        assert exec_raw(http, chain[-1], "print(len(lineage))").stdout == "101\n"
        assert exec_raw(http, chain[0], "print(len(lineage))").stdout == "1\n"
    finally:
        for sid in (chain[0], chain[-1]):
            delete_raw(http, sid)
