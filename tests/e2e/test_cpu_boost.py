"""Interactive CPU boost (src/cpu_boost.rs, docs/reliability.md#noisy-neighbours):
a sandbox using under a quarter of a core weighs --cpu-boost times more
than one burning CPU, which runs in the idle scheduling class; it loses the
boost within a tick of starting to burn, and gets it back after a second of
calm. Read from the cgroups themselves. And a REPL's short scheduler slice,
which what it starts does not inherit, and which the server's threads have."""
from __future__ import annotations

import glob
import os
import subprocess
import time

import pytest

from conftest import serve
from helpers import FORKBOX_BIN, ForkboxServer, create_raw, delete_raw, exec_ok
from test_metrics import get, scrape

BASE = 100
BOOST = 2  # the default --cpu-boost


CPU_ROOT = "/sys/fs/cgroup/cpu" if os.path.isdir("/sys/fs/cgroup/cpu") else "/sys/fs/cgroup"  # v1, or v2


def cpu_file(sandbox_id: str, name: str) -> str:
    """A file of the sandbox's cgroup in the cpu hierarchy, read."""
    (path,) = glob.glob(f"{CPU_ROOT}/forkbox-*/{sandbox_id}/{name}")
    return open(path).read().strip()


def cpu_weight(sandbox_id: str) -> int:
    """The sandbox's CPU weight as the server sets it (100 = an ordinary group)."""
    if CPU_ROOT.endswith("/cpu"):
        return -(-int(cpu_file(sandbox_id, "cpu.shares")) * 100 // 1024)
    return int(cpu_file(sandbox_id, "cpu.weight"))


def cpu_idle(sandbox_id: str) -> bool:
    """Whether the sandbox's cgroup is in the idle scheduling class (`cpu.idle`)."""
    return cpu_file(sandbox_id, "cpu.idle") == "1"


def wait_for(read, sandbox_id: str, want, timeout: float = 5.0) -> float:
    """Seconds until `read(sandbox_id)` is `want`; fails after `timeout`."""
    start = time.monotonic()
    while (got := read(sandbox_id)) != want:
        assert time.monotonic() - start < timeout, f"{sandbox_id}: {read.__name__} is {got}, expected {want}"
        time.sleep(0.05)
    return time.monotonic() - start


def wait_weight(sandbox_id: str, want: int) -> float:
    return wait_for(cpu_weight, sandbox_id, want)


def wait_idle(sandbox_id: str, want: bool) -> float:
    return wait_for(cpu_idle, sandbox_id, want)


START_HOG = ("import subprocess, sys\n"
             "hog = subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n")


def test_a_quiet_sandbox_outweighs_a_busy_one_until_the_busy_one_calms_down(http):
    quiet, busy = create_raw(http), create_raw(http)
    try:
        # Both start quiet: boosted within a tick or two.
        wait_weight(quiet, BASE * BOOST)
        wait_weight(busy, BASE * BOOST)
        assert (cpu_idle(quiet), cpu_idle(busy)) == (False, False)
        exec_ok(http, busy, START_HOG)
        took = wait_idle(busy, True)
        assert took < 2, f"the hog kept its boost for {took:.1f} s"
        # It stays in the idle class while it burns; the quiet one stays boosted.
        time.sleep(1.5)
        assert (cpu_idle(busy), cpu_idle(quiet), cpu_weight(quiet)) == (True, False, BASE * BOOST)
        assert get(scrape(http), "forkbox_cpu_boosted_sandboxes") >= 1
        exec_ok(http, busy, "hog.kill(); hog.wait()")
        # Boosted again, and out of the idle class, only after a second of calm.
        t0 = time.monotonic()
        wait_weight(busy, BASE * BOOST)
        assert time.monotonic() - t0 >= 0.9, "the boost came back before a second of calm"
        assert not cpu_idle(busy)
    finally:
        delete_raw(http, quiet)
        delete_raw(http, busy)


def test_the_zygote_outweighs_every_sandbox(http):
    """Creates that find nothing ready wait for the zygote's fork, and it
    runs no user code: its cgroup has the most weight there is, so under
    load (bench/load.py) it is not one busy cgroup among fifty
    (docs/fork.md#the-warm-pool). A sandbox created from it does not
    inherit that."""
    zygote = None
    for _ in range(600):
        zygote = http.get("/v1/pool").json()["templates"].get("default", {}).get("zygote")
        if zygote:
            break
        time.sleep(0.1)
    assert zygote, "no default zygote"
    assert cpu_weight(zygote) == 10_000
    sid = create_raw(http)
    child = None
    try:
        assert cpu_weight(sid) in (BASE, BASE * BOOST)
        # Its members were set up at the supervisors' weight: a fork child
        # is back at a sandbox's before its REPL arrives.
        r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
        assert r.status_code == 200, r.text
        child = r.json()["children"][0]
        assert cpu_weight(child) in (BASE, BASE * BOOST)
    finally:
        for s in (child, sid):
            if s:
                delete_raw(http, s)


def supervisors_of(server_pid: int) -> list[int]:
    """The families' supervisors (`forkbox __shim`) the server started."""
    found = []
    for p in subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True, text=True).stdout.split():
        try:
            argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        except FileNotFoundError:
            continue
        if len(argv) > 1 and argv[1] == b"__shim":
            found.append(int(p))
    return found


def cpu_cgroup_of(pid: int) -> str:
    """The process's cgroup in the cpu hierarchy (v1) or the unified one (v2)."""
    for line in open(f"/proc/{pid}/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or (controllers == "" and not CPU_ROOT.endswith("/cpu")):
            return path
    raise AssertionError(f"no cpu cgroup for {pid}")


def test_the_families_supervisors_run_in_a_cgroup_of_their_own_beside_the_sandboxes(http, server):
    """Every create, fork, exec and destroy goes through a family's
    supervisor: among the sandboxes' groups it queued behind the busy ones
    it serves (bench/load.py). Its cgroup sits beside the sandboxes' parent
    (so it is never taken for a sandbox's), at an ordinary weight: the
    supervisors together weigh as much as all the sandboxes together
    (the most weight there is cost bench/churn.py a fifth of its rate)."""
    sid = create_raw(http)
    try:
        shims = supervisors_of(server.proc.pid)
        assert shims, "no family supervisor found"
        groups = {cpu_cgroup_of(p) for p in shims}
        assert len(groups) == 1, groups
        (group,) = groups
        assert group.startswith("/forkbox-") and group.endswith(".supervisors"), group
        if CPU_ROOT.endswith("/cpu"):
            assert open(f"{CPU_ROOT}{group}/cpu.shares").read().strip() == "1024"
        else:
            assert open(f"{CPU_ROOT}{group}/cpu.weight").read().strip() == "100"
        # The sandbox itself is not in it.
        procs = open(glob.glob(f"{CPU_ROOT}/forkbox-*/{sid}/cgroup.procs")[0]).read().split()
        assert procs and all(cpu_cgroup_of(int(p)).endswith(f"/{sid}") for p in procs)
    finally:
        delete_raw(http, sid)


def test_short_lived_processes_count_as_busy(http):
    """The CPU counter includes processes that have exited (v1 cpuacct, v2
    cpu.stat): a loop of brief compilers-like children loses the boost too."""
    sid = create_raw(http)
    try:
        wait_weight(sid, BASE * BOOST)
        # Each child burns ~10-30 ms of CPU and exits; none lives through a tick.
        exec_ok(http, sid, "import subprocess\n"
                           "loop = subprocess.Popen(['bash', '-c', 'while :; do python3 -c \"sum(range(300000))\"; done'],"
                           " start_new_session=True)\n")
        wait_idle(sid, True)
        exec_ok(http, sid, "import os, signal; os.killpg(loop.pid, signal.SIGKILL); loop.wait()")
    finally:
        delete_raw(http, sid)


@pytest.fixture(scope="module")
def unboosted(say, server):
    yield from serve(ForkboxServer("no-boost", ["--cpu-boost", "1"], build_templates=False, log=say))


def test_cpu_boost_1_leaves_every_weight_as_created(unboosted):
    """Nothing revises a weight here: a sandbox and a fork child are at a
    sandbox's weight, though their members were set up at the supervisors'."""
    with unboosted.http() as c:
        sid, hog = create_raw(c), create_raw(c)
        r = c.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
        assert r.status_code == 200, r.text
        child = r.json()["children"][0]
        try:
            exec_ok(c, hog, START_HOG)
            time.sleep(1.0)
            assert [cpu_weight(s) for s in (sid, child, hog)] == [BASE, BASE, BASE]
            assert [cpu_idle(s) for s in (sid, hog)] == [False, False], "a hog went to the idle class"
            assert get(scrape(c), "forkbox_cpu_boosted_sandboxes") == 0
        finally:
            for s in (child, sid, hog):
                delete_raw(c, s)


@pytest.mark.parametrize("value", ["0", "101", "x"])
def test_an_out_of_range_cpu_boost_is_refused_at_start(value):
    r = subprocess.run([FORKBOX_BIN, "serve", "--cpu-boost", value],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--cpu-boost" in r.stderr, r.stderr


SLICE_NS = 300_000

# On purpose: a kernel without EEVDF slices (< 6.6) shows none to check.
needs_slices = pytest.mark.skipif(
    not os.path.exists("/proc/self/sched") or "se.slice" not in open("/proc/self/sched").read(),
    reason="this kernel shows no scheduler slice (/proc/<pid>/sched without se.slice)")


def host_slice_of(sched_file: str) -> int:
    with open(sched_file) as f:
        return int(next(line for line in f if line.startswith("se.slice")).split(":")[1])


def live_slices(sched_files: dict) -> dict:
    """The slices of those threads or processes (key: its sched file) that
    are still there: an idle blocking thread, or a short-lived child of the
    server, may exit between listing and reading."""
    out = {}
    for key, path in sched_files.items():
        try:
            out[key] = host_slice_of(path)
        except FileNotFoundError:
            pass
    return out


def host_slice(pid: int) -> int:
    return host_slice_of(f"/proc/{pid}/sched")


def processes_of(sandbox_id: str) -> dict[str, list[int]]:
    """Host pids of the sandbox's processes by name, from every process's
    /proc/<pid>/cgroup (whatever the hierarchy)."""
    out: dict[str, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                if f"/{sandbox_id}\n" not in f.read():
                    continue
            with open(f"/proc/{pid}/comm") as f:
                out.setdefault(f.read().strip(), []).append(int(pid))
        except OSError:
            pass
    return out


def repl_and_child_slices(http, sid: str) -> tuple[int, int]:
    """The REPL's scheduler slice, and that of a process it starts (read
    on the host: the sandbox's /proc hides `sched`)."""
    exec_ok(http, sid, "import subprocess\n_sleeper = subprocess.Popen(['sleep', '60'])")
    try:
        deadline = time.monotonic() + 10
        while True:
            by_comm = processes_of(sid)
            if len(by_comm.get("python3", ())) == 1 and len(by_comm.get("sleep", ())) == 1:
                break
            assert time.monotonic() < deadline, by_comm
            time.sleep(0.05)
        (repl,), (sleeper,) = by_comm["python3"], by_comm["sleep"]
        return host_slice(repl), host_slice(sleeper)
    finally:
        exec_ok(http, sid, "_sleeper.kill(); _sleeper.wait()")


@needs_slices
def test_a_repl_runs_with_a_short_slice_that_what_it_starts_does_not_inherit(http):
    """A waking REPL preempts hogs started from other REPLs (docs/reliability.md#noisy-neighbours):
    made fresh, from the warm pool, and forked, every REPL has the short slice; its children the default."""
    sid = create_raw(http)
    child = None
    try:
        r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
        assert r.status_code == 200, r.text
        child = r.json()["children"][0]
        for who in (sid, child):
            repl, started = repl_and_child_slices(http, who)
            assert repl == SLICE_NS and started != SLICE_NS, (who, repl, started)
    finally:
        for s in (child, sid):
            if s:
                delete_raw(http, s)


@needs_slices
def test_the_servers_threads_run_with_the_short_slice_and_what_it_starts_does_not(server):
    """An exec wakes a server thread for the request and again for the
    REPL's answer: each wake-up preempts hogs as the REPL's does
    (src/lib.rs `runtime`). The shims it starts get the default slice back."""
    pid = server.proc.pid
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            threads[int(tid)] = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        except FileNotFoundError:
            pass  # an idle blocking thread that exited
    workers = [t for t, name in threads.items() if name.startswith("tokio-rt")]
    slices = live_slices({t: f"/proc/{pid}/task/{t}/sched" for t in [pid, *workers]})
    assert pid in slices and len(slices) >= 3, (threads, slices)
    assert set(slices.values()) == {SLICE_NS}, slices
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    started = live_slices({p: f"/proc/{p}/sched" for p in children})
    assert started and SLICE_NS not in started.values(), started