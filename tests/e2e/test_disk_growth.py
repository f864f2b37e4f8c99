"""The sandbox volume grows with use (docs/operations.md#disk): its image
starts small, allocated (never sparse), and grows a step at a time as
sandboxes write, up to `--volume-gib`, never leaving the host disk less than
`--disk-reserve-gib`. Full, it gives writers ENOSPC and the API a clear 507;
it is never read-only, the server goes on serving, and freed room is used
again."""
from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from conftest import stop_and_assert_clean
from helpers import ForkboxServer, assert_json_error, create_raw, delete_raw, exec_ok, exec_raw, wait_no_leaks
from test_disk_quota import fill  # a sandbox writes until done or refused
from test_faults import small_disk  # noqa: F401  (a fixture: a 3 GiB filesystem of the test's own)

GIB, MIB = 1 << 30, 1 << 20

def image(srv: ForkboxServer) -> tuple[int, int]:
    """The volume image's length and the bytes the disk holds for it."""
    st = os.stat(os.path.join(srv.state_dir, "volume.img"))
    return st.st_size, st.st_blocks * 512


def volume_metrics(c) -> dict[str, int]:
    text = c.get("/metrics").text
    return {k: int(float(v)) for k, v in re.findall(r'^forkbox_volume_bytes\{kind="(\w+)"\} (\S+)$', text, re.M)}


@pytest.fixture
def growing(say, server):
    """A server whose volume starts at 1 GiB and may grow to 3."""
    s = ForkboxServer("growing", ["--volume-initial-gib", "1", "--volume-gib", "3"], build_templates=False, log=say)
    s.start()
    s.wait_ready()
    yield s
    stop_and_assert_clean(s)


def test_the_volume_starts_small_allocated_and_grows_as_sandboxes_write(growing):
    size, held = image(growing)
    assert size == GIB and held >= size, (size, held)
    with growing.http(timeout=300) as c:
        m = volume_metrics(c)
        assert m["max"] == 3 * GIB and m["size"] <= GIB, m
        sid = create_raw(c, rootfs_gb=8)
        try:
            assert fill(c, sid, "/root/a", 1600) == (1600, None)
            size, held = image(growing)
            assert 2 * GIB <= size <= 3 * GIB and held >= size, (size, held)
            assert volume_metrics(c)["size"] > 1600 * MIB
        finally:
            delete_raw(c, sid)


def test_a_full_volume_gives_enospc_and_507_never_read_only_and_room_comes_back(growing):
    with growing.http(timeout=300) as c:
        sid = create_raw(c, rootfs_gb=8)
        try:
            exec_ok(c, sid, "x = 'kept'")
            written, err = fill(c, sid, "/root/big", 4000)
            # Well past the 1 GiB the image started at, short of its 3 GiB
            # cap: btrfs's metadata and the warm pool's hidden sandboxes
            # (spares and two forked ahead of demand) hold the rest.
            assert err == "ENOSPC" and 1800 < written < 3 * 1024, (written, err)
            assert image(growing)[0] == 3 * GIB, "at its cap, not past it"
            # New work is refused clearly; what runs goes on.
            r = c.post("/v1/sandboxes", json={})
            assert "sandbox volume is full" in assert_json_error(r, 507)["error"], r.text
            r = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/upload"}, content=b"x" * (8 * MIB))
            assert_json_error(r, 507)
            assert c.get("/v1/healthz").status_code == 200
            assert exec_ok(c, sid, "print(x)") == "kept\n"
            with open("/proc/mounts") as f:
                opts = [l.split()[3] for l in f if l.split()[1] == os.path.join(os.path.realpath(growing.state_dir), "volume")]
            assert opts and opts[0].startswith("rw,"), opts
            # Room made: files can be written again (btrfs hands freed
            # chunks back within seconds), and creates work.
            assert exec_ok(c, sid, "rm /root/big && sync && echo gone", language="bash") == "gone\n"
            deadline = time.time() + 60
            while exec_raw(c, sid, "echo ok > /root/after", language="bash").exit_code != 0:
                assert time.time() < deadline, "freed room never came back"
                time.sleep(1)
            other = create_raw(c)
            assert exec_ok(c, other, "print('new')") == "new\n"
            delete_raw(c, other)
        finally:
            delete_raw(c, sid)
    assert "panicked" not in open(growing.log_path, errors="replace").read()


def test_growth_leaves_the_host_disk_its_reserve(say, server, small_disk):
    """On a 3 GiB disk of the test's own, with 1 GiB kept in reserve: the
    volume grows until the disk has its reserve left, then stops."""
    srv = ForkboxServer("reserve", ["--volume-initial-gib", "1", "--volume-gib", "64", "--disk-reserve-gib", "1"], build_templates=False, log=say)
    srv.state_dir, srv.log_path = small_disk, small_disk + ".log"
    srv.start()
    try:
        srv.wait_ready()
        with srv.http(timeout=300) as c:
            sid = create_raw(c, rootfs_gb=8)
            written, err = fill(c, sid, "/root/big", 3000)
            assert err == "ENOSPC", (written, err)
            st = os.statvfs(small_disk)
            free = st.f_bavail * st.f_frsize
            assert 900 * MIB < free < 1200 * MIB, free >> 20
            size, held = image(srv)
            assert GIB < size and held >= size, (size, held)
            assert "sandbox volume is full" in assert_json_error(c.post("/v1/sandboxes", json={}), 507)["error"]
            assert "--disk-reserve-gib" in open(srv.log_path, errors="replace").read()
            delete_raw(c, sid)
            assert wait_no_leaks(srv, expect_volume_mounted=True) == []
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.stop()
        shutil.rmtree(os.path.join(small_disk, "volume"), ignore_errors=True)
