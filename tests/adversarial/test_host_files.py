"""Reading or writing the host's files from inside a sandbox: through
/proc/<pid>/root and /proc/<pid>/cwd, file handles (open_by_handle_at, the
"shocker" escape), symlinks and hard links planted in the upper layer,
chroot, the template under the overlay, and /proc/1/exe (init is the host's
forkbox binary, re-executed)."""
from __future__ import annotations

import glob
import os

import pytest

from adversary import SECRET, bash_python, both, fingerprint, healthy, repl, tree
from helpers import FORKBOX_BIN, TEMPLATES_DIR, delete_raw, exec_ok


def assert_host_untouched(host_dir):
    assert tree(host_dir).keys() == {"secret"}, tree(host_dir)
    with open(f"{host_dir}/secret", "rb") as f:
        assert f.read() == SECRET


@pytest.mark.parametrize("link", ["root", "cwd"])
def test_proc_pid_links_lead_only_into_the_sandbox(http, sid, host_dir, link):
    """Every process's /proc/<pid>/root (or cwd, walked up with ..) is the
    sandbox's own root: the host's path is not there, and init's is closed."""
    up = "" if link == "root" else "/.." * 16
    code = f"""
out = {{}}
for pid in _os.listdir('/proc'):
    if not (pid.isdigit() or pid in ('self', 'thread-self')):
        continue
    base = '/proc/' + pid + '/{link}' + {up!r} + {host_dir!r}
    out[pid] = [attempt(lambda: open(base + '/secret', 'rb').read()),
                attempt(lambda: open(base + '/planted', 'wb').close())]
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert "1" in seen, (where, seen)
        # init is non-dumpable: its links are closed; everything else
        # resolves inside the sandbox, where the host's path does not exist.
        assert seen.pop("1") == ["EACCES", "EACCES"], where
        assert seen and all(r == ["ENOENT", "ENOENT"] for r in seen.values()), (where, seen)
    assert_host_untouched(host_dir)


def test_open_by_handle_at_cannot_open_host_inodes(http, sid):
    """The "shocker" escape: forge a handle for the root inode of the host's
    filesystem and open it. Both handle calls are refused outright."""
    code = """
import struct
out = {}
mount_fd = _os.open('/', _os.O_RDONLY)
# struct file_handle: handle_bytes, handle_type, f_handle. Type 1 is
# FILEID_INO32_GEN (ext4's root is inode 2); 0x4d is btrfs's FILEID_BTRFS_WITHOUT_PARENT.
for kind, raw in ((1, struct.pack('<II', 2, 0)), (0x4d, struct.pack('<QQ', 256, 256) + bytes(4))):
    handle = _ct.create_string_buffer(struct.pack('<Ii', len(raw), kind) + raw)
    out['open_by_handle_at %#x' % kind] = sc(304, mount_fd, handle, _os.O_RDONLY)
buf = _ct.create_string_buffer(8 + 128)
_ct.memmove(buf, struct.pack('<I', 128), 4)
mount_id = _ct.c_int()
out['name_to_handle_at'] = sc(303, -100, b'/etc/passwd', buf, _ct.byref(mount_id), 0)
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)


def test_symlinks_planted_in_the_upper_layer_never_reach_the_host(http, server, new_sandbox, host_dir):
    """Links to the host's path resolve inside the sandbox; and the server,
    which walks the upper layer as the host's root (diff, files API, freeze
    to a Space, resume, destroy), never follows them."""
    sid = new_sandbox()
    other = new_sandbox()
    code = f"""
h = {host_dir!r}
_os.symlink(h + '/secret', '/root/abs-link')
_os.symlink('../' * 16 + h[1:] + '/secret', '/root/rel-link')
_os.symlink(h, '/root/dir-link')
report({{
  'read abs': attempt(lambda: open('/root/abs-link', 'rb').read()),
  'read rel': attempt(lambda: open('/root/rel-link', 'rb').read()),
  'read dir': attempt(lambda: open('/root/dir-link/secret', 'rb').read()),
  'write abs': attempt(lambda: open('/root/abs-link', 'wb').close()),
  'write dir': attempt(lambda: open('/root/dir-link/planted', 'wb').close()),
  'mkdir dir': attempt(lambda: _os.mkdir('/root/dir-link/newdir')),
}})
"""
    seen = repl(http, sid, code)
    assert set(seen.values()) == {"ENOENT"}, seen
    # The server's host-side walks of the layer.
    for path in ("/root/abs-link", "/root/rel-link", "/root/dir-link/secret"):
        r = http.get(f"/v1/sandboxes/{sid}/files", params={"path": path})
        assert r.status_code == 404 and SECRET not in r.content, (path, r.status_code)
    r = http.get(f"/v1/sandboxes/{sid}/diff/{other}", params={"paths": "/root"})
    assert r.status_code == 200 and SECRET not in r.content, r.text
    r = http.post(f"/v1/sandboxes/{sid}/freeze")
    assert r.status_code == 200, r.text
    space = r.json()["space_id"]
    for root, _dirs, names in os.walk(os.path.join(server.state_dir, "spaces", space)):   # links not followed
        for path in (os.path.join(root, n) for n in names):
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    assert SECRET not in f.read(), f"the freeze copied the host's file into {path}"
    r = http.post(f"/v1/spaces/{space}/resume", json={})
    assert r.status_code == 200, r.text
    back = r.json()["id"]
    try:
        assert exec_ok(http, back, "import os; print(os.readlink('/root/abs-link'))").strip() == f"{host_dir}/secret"
        assert repl(http, back, "report(attempt(lambda: open('/root/abs-link').read()))") == "ENOENT"
    finally:
        assert delete_raw(http, back) == 204
    assert_host_untouched(host_dir)


def template_files(rel: str) -> list[str]:
    """The template's copies of a file (every built version of `default`)."""
    found = glob.glob(os.path.join(TEMPLATES_DIR, "default", "*", "rootfs", rel))
    assert found, f"no {rel} in the default template under {TEMPLATES_DIR}"
    return found


def test_hard_links_cannot_leave_the_upper_layer(http, sid):
    """A hard link to a template file, written through, is copied up (the
    template is never written); links to other filesystems (the host's
    device nodes, /dev/shm, /proc) are refused, by path or by a descriptor
    of the host's file (linkat with AT_EMPTY_PATH)."""
    passwd = {p: fingerprint(p) for p in template_files("etc/passwd")}
    code = """
pw = '/root/pw-%d' % _os.getpid()
_os.link('/etc/passwd', pw)
with open(pw, 'a') as f:
    f.write('owned::0:0::/:/bin/sh\\n')
open('/dev/shm/x', 'w').close()
fd = _os.open('/dev/null', _os.O_PATH)
report({
  'appended': open('/etc/passwd').read().count('owned::'),
  'devnull': attempt(_os.link, '/dev/null', '/root/null'),
  'shm': attempt(_os.link, '/dev/shm/x', '/root/x'),
  'proc': attempt(_os.link, '/proc/1/environ', '/root/environ'),
  'empty path': sc(265, fd, b'', -100, b'/root/byfd', 0x1000),   # linkat(AT_EMPTY_PATH)
})
"""
    for where, seen in both(http, sid, code).items():
        assert seen.pop("appended") >= 1, where   # the link and the file are one inode, inside
        assert seen == {"devnull": "EXDEV", "shm": "EXDEV", "proc": "EXDEV", "empty path": "EXDEV"}, (where, seen)
    assert {p: fingerprint(p) for p in passwd} == passwd


def test_the_template_is_never_written_through_the_overlay(http, new_sandbox):
    """Root inside rewrites, chmods and deletes the template's files: each
    change lands in the sandbox's own upper layer; the template on the host
    and the next sandbox see the originals."""
    watched = {p: fingerprint(p) for rel in ("etc/passwd", "usr/bin/bash", "usr/lib/python3.*/os.py", "usr/bin/env")
               for p in template_files(rel)}
    sid = new_sandbox()
    code = """
with open('/etc/passwd', 'w') as f:
    f.write('root::0:0::/root:/bin/sh\\n')
with open(_os.__file__, 'a') as f:
    f.write('\\nraise SystemExit("owned")\\n')
_os.chmod('/usr/bin/bash', 0o6777)
_os.unlink('/usr/bin/env')
report([open('/etc/passwd').read(), oct(_os.stat('/usr/bin/bash').st_mode), _os.path.exists('/usr/bin/env')])
"""
    assert repl(http, sid, code) == ["root::0:0::/root:/bin/sh\n", "0o106777", False]
    assert {p: fingerprint(p) for p in watched} == watched
    fresh = new_sandbox()
    out = exec_ok(http, fresh, "head -c 5 /etc/passwd; stat -c ' %a' /usr/bin/bash; test -e /usr/bin/env && echo ' env'",
                  language="bash")
    assert out.split() == ["root:", "755", "env"], out


def test_chroot_escape_ends_at_the_sandbox_root(http, sid, host_dir):
    """The classic double chroot (chroot into a subdirectory, keep a
    descriptor of the old root, climb above it) is allowed, and climbs no
    further than the sandbox's own root."""
    code = f"""
_os.makedirs('/tmp/jail', exist_ok=True)
old = _os.open('/', _os.O_RDONLY)
_os.chroot('/tmp/jail')
_os.fchdir(old)
for _ in range(64):
    _os.chdir('..')
_os.chroot('.')
report({{'listing': sorted(_os.listdir('/')), 'host': attempt(lambda: open({host_dir!r} + '/secret', 'rb').read()),
         'hostname': open('/etc/hostname').read().strip() if _os.path.exists('/etc/hostname') else None}})
"""
    seen = bash_python(http, sid, code)
    assert seen["host"] == "ENOENT", seen
    assert seen["listing"] == sorted(exec_ok(http, sid, "import os; print(' '.join(os.listdir('/')))").split()), seen
    assert_host_untouched(host_dir)


def test_init_exe_cannot_be_overwritten(http, sid):
    """runc's CVE-2019-5736: init runs the host's forkbox binary; opening
    /proc/1/exe (or its mappings) for writing would rewrite it on the host.
    init is non-dumpable: every way to it is closed."""
    before = fingerprint(FORKBOX_BIN)
    code = """
report({
  'exe write': attempt(lambda: _os.open('/proc/1/exe', _os.O_WRONLY)),
  'exe read': attempt(lambda: _os.open('/proc/1/exe', _os.O_RDONLY)),
  'exe path': attempt(lambda: _os.open('/proc/1/exe', _os.O_PATH)),
  'readlink': attempt(_os.readlink, '/proc/1/exe'),
  'map_files': attempt(_os.listdir, '/proc/1/map_files'),
  'mem': attempt(lambda: _os.open('/proc/1/mem', _os.O_RDWR)),
})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EACCES"}, (where, seen)
    assert fingerprint(FORKBOX_BIN) == before
    assert healthy(http)
