"""The files API runs as the host's root: every way a path could leave the
sandbox's own filesystem is tried here, from the API and from inside the
sandbox (symlinks it plants, swapped while the API walks them). Nothing may
read or write the host, another sandbox, or the sandbox's /proc, /sys and
/dev (through which the host's root could reach the kernel)."""
from __future__ import annotations

import os
import shutil
import threading
import time
import uuid

import pytest

from helpers import assert_json_error, create_raw, delete_raw, exec_ok

SECRET = b"host secret, never to be read"


@pytest.fixture
def host_dir():
    """A directory on the host, at a path that does not exist in sandboxes."""
    d = f"/tmp/forkbox-escape-{uuid.uuid4().hex[:10]}"
    os.makedirs(d)
    with open(f"{d}/secret", "wb") as f:
        f.write(SECRET)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


def files(sid):
    return f"/v1/sandboxes/{sid}/files"


py = exec_ok


def assert_host_untouched(host_dir):
    assert sorted(os.listdir(host_dir)) == ["secret"], os.listdir(host_dir)
    with open(f"{host_dir}/secret", "rb") as f:
        assert f.read() == SECRET


def test_dotdot_and_absolute_symlinks_stay_inside(http, sid, host_dir):
    name = os.path.basename(host_dir)
    for path in (f"../../../../../..{host_dir}/secret", f"/..{host_dir}/secret", f"{host_dir}/../{name}/secret",
                 f"/root/../../../../{host_dir}/secret"):
        r = http.get(files(sid), params={"path": path})
        assert r.status_code == 404 and SECRET not in r.content, (path, r.status_code)
    # Links planted inside the sandbox: absolute, relative, and to a directory.
    py(http, sid, f"""
import os
os.symlink('{host_dir}/secret', '/tmp/abs')
os.symlink('../../../../../../../..{host_dir}/secret', '/tmp/rel')
os.symlink('{host_dir}', '/tmp/dirlink')
os.symlink('/', '/tmp/rootlink')
""")
    for path in ("/tmp/abs", "/tmp/rel", "/tmp/dirlink/secret", f"/tmp/rootlink/..{host_dir}/secret"):
        r = http.get(files(sid), params={"path": path})
        assert r.status_code == 404 and SECRET not in r.content, (path, r.status_code, r.text)
    # Writes through them land in the sandbox, never on the host (the same
    # path made inside the sandbox is where they go).
    py(http, sid, f"import os; os.makedirs('{host_dir}')")
    assert http.put(files(sid), params={"path": "/tmp/dirlink/planted"}, content=b"p").status_code == 200
    assert http.put(files(sid), params={"path": "/tmp/abs"}, content=b"replaces the link").status_code == 200
    assert http.put(files(sid), params={"path": "/tmp/rel", "append": "1"}, content=b"x").status_code == 400
    assert_host_untouched(host_dir)
    assert py(http, sid, f"import os; print(os.path.islink('/tmp/abs'), open('{host_dir}/planted').read())") == "False p\n"
    # mkdir, rename, chmod and remove through the links stay inside too.
    assert http.post(f"{files(sid)}/mkdir", json={"path": "/tmp/dirlink/newdir"}).status_code == 200
    assert http.post(f"{files(sid)}/chmod", json={"path": "/tmp/dirlink", "mode": 0o777}).status_code == 204
    assert http.post(f"{files(sid)}/rename", json={"from": "/tmp/dirlink/planted", "to": "/tmp/rootlink/tmp/moved"}).status_code == 204
    assert http.delete(files(sid), params={"path": "/tmp/dirlink/newdir"}).status_code == 204
    assert_host_untouched(host_dir)
    assert oct(os.stat(host_dir).st_mode & 0o777) != "0o777"


@pytest.mark.parametrize("path", ["/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/proc/1/environ", "/proc/self/root/etc/passwd",
                                  "/sys/kernel/notes", "/dev/null", "/dev/shm/x", "/dev/pts/ptmx", "/proc/1/root/etc/passwd"])
def test_special_filesystems_are_out_of_reach(http, sid, path):
    for r in (http.get(files(sid), params={"path": path}),
              http.put(files(sid), params={"path": path}, content=b"b"),
              http.put(files(sid), params={"path": path, "append": "1"}, content=b"b"),
              http.delete(files(sid), params={"path": path}),
              http.post(f"{files(sid)}/chmod", json={"path": path, "mode": 0o777})):
        assert r.status_code == 400, (path, r.request.method, r.status_code, r.text)
        assert "another filesystem" in r.json()["error"] or "magic link" in r.json()["error"], r.text


def test_links_into_proc_are_refused(http, sid):
    py(http, sid, "import os; os.symlink('/proc/self/root', '/tmp/selfroot'); os.symlink('/proc', '/tmp/proclink')")
    for path in ("/tmp/selfroot/etc/passwd", "/tmp/proclink/sysrq-trigger", "/tmp/proclink/1/root/etc/hostname"):
        r = http.put(files(sid), params={"path": path}, content=b"b")
        assert r.status_code == 400, (path, r.text)
        assert http.get(files(sid), params={"path": path}).status_code == 400


def test_fifos_and_devices_do_not_hang_or_open(http, sid):
    py(http, sid, "import os; os.mkfifo('/tmp/fifo')")
    t0 = time.time()
    r = http.get(files(sid), params={"path": "/tmp/fifo"})
    assert r.status_code == 400 and "not a regular file" in r.json()["error"]
    assert time.time() - t0 < 5
    assert http.put(files(sid), params={"path": "/tmp/fifo", "append": "1"}, content=b"x").status_code == 400
    # Replacing it atomically is fine (it is just a path).
    assert http.put(files(sid), params={"path": "/tmp/fifo"}, content=b"x").status_code == 200


def test_another_sandbox_is_unreachable(http, sid):
    other = create_raw(http)
    try:
        marker = uuid.uuid4().hex
        py(http, other, f"open('/root/{marker}', 'w').write('other sandbox')")
        for path in (f"/root/{marker}", f"/../../{other}/root/{marker}", f"/proc/1/root/root/{marker}"):
            r = http.get(files(sid), params={"path": path})
            assert r.status_code in (400, 404) and b"other sandbox" not in r.content, (path, r.text)
        assert http.get(files(other), params={"path": f"/root/{marker}"}).content == b"other sandbox"
    finally:
        delete_raw(http, other)


def test_symlink_swapped_during_requests(http, sid, host_dir, server):
    """The sandbox flips /tmp/flip between a real directory and a link to
    the host path while the API reads and writes through it."""
    py(http, sid, f"""
import os, threading
os.makedirs('/tmp/real')
open('/tmp/real/secret', 'w').write('sandbox file')
def flip():
    while True:
        try:
            os.symlink('{host_dir}', '/tmp/flip.new'); os.rename('/tmp/flip.new', '/tmp/flip')
            os.symlink('/tmp/real', '/tmp/flip.new'); os.rename('/tmp/flip.new', '/tmp/flip')
        except OSError:
            pass
threading.Thread(target=flip, daemon=True).start()
""")
    seen = set()
    stop = time.time() + 4
    n = 0
    failures = []

    def hammer():
        nonlocal n
        try:
            with server.http() as c:
                while time.time() < stop:
                    r = c.get(files(sid), params={"path": "/tmp/flip/secret"})
                    seen.add((r.status_code, r.content[:40]))
                    for r in (c.put(files(sid), params={"path": "/tmp/flip/written"}, content=b"w"),
                              c.post(f"{files(sid)}/mkdir", json={"path": "/tmp/flip/d"})):
                        assert r.status_code in (200, 404, 409), r.text
                    n += 1
        except Exception as e:  # reported below, not lost in the thread
            failures.append(repr(e))
    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert n > 20
    assert {code for code, _ in seen} <= {200, 404}, seen
    assert all(SECRET not in content for _, content in seen), seen
    assert_host_untouched(host_dir)
