"""`rootfs_gb` is enforced (docs/api.md, docs/state.md): a sandbox's writable
layer is a btrfs subvolume with a simple quota. At the edge: 0.9 GiB fits in
`rootfs_gb: 1`, 1.1 GiB does not, and deleting gives the room back. Fork
children, restored checkpoints and resumed Spaces keep their limit; a fork
child pays only for what it writes itself; neighbours write on; no quota
group outlives its subvolume; a sandbox adopted after a crash keeps its limit.
The image under a loop-mounted volume is read and written with direct I/O."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from conftest import start_server, stop_and_assert_clean
from helpers import create_raw, delete_raw, exec_ok, exec_raw

GIB = 1 << 30

# Write `mib` MiB of incompressible data to `path` in 1 MiB writes, fsync,
# and say how much went in and the error that stopped it, if any.
FILL = """
import os, errno, json
block = os.urandom(1 << 20)
written, err = 0, None
fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
try:
    while written < ({mib} << 20):
        written += os.write(fd, block)
    os.fsync(fd)
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
finally:
    os.close(fd)
print(json.dumps([written >> 20, err]))
"""


def fill(http, sid: str, path: str, mib: int) -> tuple[int, str | None]:
    written, err = json.loads(exec_ok(http, sid, FILL.format(path=path, mib=mib), timeout_ms=180_000))
    return written, err


def assert_stops_at_one_gib(http, sid: str, path: str = "/root/fill") -> None:
    """Writing 1.1 GiB into a `rootfs_gb: 1` sandbox: at least 0.9 GiB goes in
    (nothing else is charged to it), then EDQUOT, at most 1 GiB in all."""
    written, err = fill(http, sid, path, 1126)
    assert err == "EDQUOT" and 900 <= written <= 1024, (written, err)


def sh(http, sid: str, code: str) -> str:
    return exec_ok(http, sid, code, language="bash")


def post_ok(http, path: str, body: dict | None = None) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


@pytest.fixture(scope="module")
def server(say, server):
    """A server of this module's own, whose volume may grow roomy enough for
    several sandboxes filling 1 GiB each (test servers grow to 4 GiB; the
    shared one holds other tests' sandboxes too). Requesting `server` first
    means the default template is built."""
    s = start_server(say, "quota", ["--volume-gib", "10"], build=False)
    # A disk that cannot give the volume room to grow to 10 GiB beside its
    # reserve would fill: ENOSPC would then hide what these tests check.
    st = os.statvfs(s.state_dir)
    reserve = min(max(st.f_blocks * st.f_frsize // 20, GIB), 16 * GIB)  # the server's default
    if st.f_bavail * st.f_frsize < 10 * GIB + reserve:
        stop_and_assert_clean(s)
        pytest.fail(f"the disk under {s.state_dir} has under {(10 * GIB + reserve) / GIB:.0f} GiB free: the quota server's "
                    "volume could not grow to 10 GiB beside the disk's reserve; free some and rerun")
    yield s
    stop_and_assert_clean(s)


@pytest.fixture
def http(server):
    with server.http(timeout=180) as c:
        yield c


@pytest.fixture
def sandboxes(http):
    made = []

    def make(**body) -> str:
        sid = create_raw(http, egress=False, **body)
        made.append(sid)
        return sid
    yield make
    for sid in made:
        delete_raw(http, sid)


def test_rootfs_gb_at_its_edge_and_deleting_frees_it(http, sandboxes):
    sid, neighbour = sandboxes(rootfs_gb=1), sandboxes()
    assert http.get(f"/v1/sandboxes/{sid}").json()["rootfs_gb"] == 1
    assert fill(http, sid, "/root/a", 920) == (920, None)
    written, err = fill(http, sid, "/root/b", 205)
    assert err == "EDQUOT" and written < 205, (written, err)
    # What a program sees: the errno's text, from bash as from Python.
    r = exec_raw(http, sid, "head -c 10M /dev/zero > /root/c", language="bash")
    assert r.exit_code != 0 and "Disk quota exceeded" in r.stderr, r
    # The neighbour writes on, and a deletion gives the room back.
    assert sh(http, neighbour, "head -c 10M /dev/urandom > /root/ten && stat -c %s /root/ten") == "10485760\n"
    sh(http, sid, "rm -f /root/a /root/b /root/c && sync -f /")
    assert_stops_at_one_gib(http, sid)


def test_a_fork_child_pays_for_its_own_writes_and_keeps_the_limit(http, sandboxes):
    parent = sandboxes(rootfs_gb=1)
    assert fill(http, parent, "/root/inherited", 512) == (512, None)
    child = post_ok(http, f"/v1/sandboxes/{parent}/fork", {"n": 1})["children"][0]
    try:
        assert http.get(f"/v1/sandboxes/{child}").json()["rootfs_gb"] == 1
        # The 512 MiB it inherited stay the parent's: the child has its own GiB.
        assert sh(http, child, "stat -c %s /root/inherited") == str(512 << 20) + "\n"
        assert_stops_at_one_gib(http, child)
        # The parent is not charged for what its child wrote.
        written, err = fill(http, parent, "/root/more", 400)
        assert (written, err) == (400, None)
    finally:
        delete_raw(http, child)


def test_a_restored_checkpoint_keeps_the_limit(http, sandboxes):
    sid = sandboxes(rootfs_gb=1)
    sh(http, sid, "echo kept > /root/note")
    cp = post_ok(http, f"/v1/sandboxes/{sid}/checkpoints")["checkpoint"]
    post_ok(http, f"/v1/sandboxes/{sid}/restore", {"checkpoint": cp})
    assert sh(http, sid, "cat /root/note") == "kept\n"
    assert_stops_at_one_gib(http, sid)


def test_a_resumed_space_keeps_the_limit(http, sandboxes):
    sid = sandboxes(rootfs_gb=1)
    sh(http, sid, "head -c 100M /dev/urandom > /root/data")
    space = post_ok(http, f"/v1/sandboxes/{sid}/freeze")["space_id"]
    info = post_ok(http, f"/v1/spaces/{space}/resume", {})
    resumed = info["id"]
    try:
        assert info["rootfs_gb"] == 1
        assert sh(http, resumed, "stat -c %s /root/data") == str(100 << 20) + "\n"
        # The copied files count: about 0.9 GiB more fits, not 1 GiB.
        written, err = fill(http, resumed, "/root/fill", 1126)
        assert err == "EDQUOT" and 800 <= written <= 1024 - 100, (written, err)
    finally:
        delete_raw(http, resumed)


def test_an_adopted_sandbox_keeps_the_limit(say, server):
    """`kill -9` of the server: the next one takes the sandbox back, and its
    quota with it. (`server`: the default template is built.)"""
    s = start_server(say, "quota-restart", build=False)
    try:
        with s.http() as c:
            sid = create_raw(c, egress=False, rootfs_gb=1)
        s.kill()
        s.start()
        s.wait_ready()
        with s.http() as c:
            assert c.get(f"/v1/sandboxes/{sid}").json()["rootfs_gb"] == 1
            assert_stops_at_one_gib(c, sid)
            delete_raw(c, sid)
    finally:
        stop_and_assert_clean(s)


def volume_of(server) -> str:
    return os.path.join(os.path.realpath(server.state_dir), "volume")


def qgroups_and_subvolumes(volume: str) -> tuple[set[int], set[int]]:
    """Level-0 quota groups of sandboxes' subvolumes, and the subvolumes."""
    show = subprocess.run(["btrfs", "qgroup", "show", "--raw", volume], capture_output=True, text=True, check=True).stdout
    groups = {int(line.split()[0].split("/")[1]) for line in show.splitlines() if line.startswith("0/")}
    listed = subprocess.run(["btrfs", "subvolume", "list", volume], capture_output=True, text=True, check=True).stdout
    subvolumes = {int(line.split()[1]) for line in listed.splitlines() if line.startswith("ID ")}
    return groups - {5}, subvolumes


def test_no_quota_group_outlives_its_subvolume(server, http, sandboxes):
    """A fork parent deleted before its child leaves its quota group charged
    with the extents the child still shares; once the child is gone too,
    the server removes it (within its 10 s sweep, after btrfs's cleaner)."""
    parent = sandboxes(rootfs_gb=1)
    sh(http, parent, "head -c 50M /dev/urandom > /root/shared")
    child = post_ok(http, f"/v1/sandboxes/{parent}/fork", {"n": 2})["children"]
    assert delete_raw(http, parent) == 204
    for c in child:
        assert delete_raw(http, c) == 204
    volume = volume_of(server)
    subprocess.run(["btrfs", "subvolume", "sync", volume], check=True, capture_output=True)
    deadline = time.monotonic() + 40
    while True:
        groups, subvolumes = qgroups_and_subvolumes(volume)
        if groups == subvolumes or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert groups == subvolumes, f"quota groups without a subvolume: {sorted(groups - subvolumes)}; " \
                                 f"subvolumes without one: {sorted(subvolumes - groups)}"


def test_the_volumes_loop_device_does_direct_io(server):
    """The image under the volume is read and written with direct I/O, so
    its blocks are not cached twice and a sandbox's fsyncs do not feed the
    host's writeback threads (docs/reliability.md#noisy-neighbours)."""
    image = os.path.realpath(os.path.join(server.state_dir, "volume.img"))
    out = subprocess.run(["losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE,DIO"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if image in line]
    assert len(rows) == 1, out
    name, _, dio = rows[0]
    assert dio == "1", f"{name} backs {image} without direct I/O"
