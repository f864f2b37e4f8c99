"""Mounting anything, from the REPL (which holds CAP_SYS_ADMIN in its
family's user namespace: only its seccomp filter stands in the way) and
from what bash runs; unmounting the masks over /proc and /sys; loading
kernel modules; rebooting, kexec and the other host administration calls."""
from __future__ import annotations

import pytest

from adversary import both, sh

MS_BIND, MS_REC, MS_REMOUNT = 0x1000, 0x4000, 0x20

# Each: mount(source, target, fstype, flags, data), what it would give.
MOUNTS = {
    # a writable filesystem of its own (a first step to most escapes)
    "tmpfs": (b"none", b"/mnt", b"tmpfs", 0, None),
    # the root again, to get at what the masks hide under /proc and /sys
    "bind-root": (b"/", b"/mnt", None, MS_BIND | MS_REC, None),
    # sysfs writable (then /sys/kernel/... of the host)
    "remount-sys-rw": (b"sysfs", b"/sys", b"sysfs", MS_REMOUNT, None),
    # a cgroup v1 hierarchy, for its release_agent (CVE-2022-0492)
    "cgroup-release-agent": (b"cgroup", b"/mnt", b"cgroup", 0, b"rdma"),
    # a fresh procfs without the masks (/proc/kcore, /proc/sysrq-trigger ...)
    "unmasked-proc": (b"proc", b"/mnt", b"proc", 0, None),
}


@pytest.mark.parametrize("name", list(MOUNTS))
def test_mount_is_refused(http, sid, name):
    source, target, fstype, flags, data = MOUNTS[name]
    code = f"""
before = len(open('/proc/1/mountinfo').read().splitlines())
rc = lc('mount', {source!r}, {target!r}, {fstype!r}, {flags}, {data!r})
report([rc, len(open('/proc/1/mountinfo').read().splitlines()) - before])
"""
    for where, seen in both(http, sid, code).items():
        assert seen == ["EPERM", 0], (where, seen)
    r = sh(http, sid, "mount --bind / /mnt; mount -t tmpfs none /mnt")
    assert r.exit_code != 0 and "permission denied" in r.stderr, r


def test_new_mount_api_is_refused(http, sid):
    """fsopen/fsmount, open_tree (a detached copy of a mount), move_mount,
    fspick and mount_setattr (clear read-only from /sys)."""
    code = """
attr = _ct.create_string_buffer(32)   # struct mount_attr: clear MOUNT_ATTR_RDONLY
_ct.memmove(attr, (0).to_bytes(8, 'little') + (1).to_bytes(8, 'little'), 16)
report({
  'fsopen': sc(430, b'tmpfs', 0),
  'fspick': sc(433, -100, b'/', 0),
  'open_tree clone': sc(428, -100, b'/', 1 | 0x8000),      # OPEN_TREE_CLONE | AT_RECURSIVE
  'move_mount': sc(429, -100, b'/sys', -100, b'/mnt', 0),
  'fsmount': sc(432, 3, 0, 0),
  'mount_setattr': sc(442, -100, b'/sys', 0, attr, 32),
})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)


def test_masks_cannot_be_unmounted_and_root_cannot_be_pivoted(http, sid):
    """The masks over /proc and /sys stay (unmounting one would uncover the
    host's file under it), and pivot_root is refused."""
    code = """
out = {p: sc(166, p.encode(), 2) for p in ('/proc/timer_list', '/proc/keys', '/proc/acpi', '/sys/firmware', '/sys', '/proc')}
out['pivot_root'] = sc(155, b'/tmp', b'/tmp')
out['timer_list still empty'] = open('/proc/timer_list', 'rb').read() == b''
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert seen.pop("timer_list still empty") is True, where
        assert set(seen.values()) == {"EPERM"}, (where, seen)


def test_kernel_modules_cannot_be_loaded_or_removed(http, sid):
    """init_module with an image in memory, finit_module from a file,
    delete_module: all refused (the host's kernel here has no modules at
    all, so the filter is what is measured)."""
    code = """
image = b'\\x7fELF\\x02\\x01\\x01' + bytes(4089)
with open('/tmp/forkbox.ko', 'wb') as f:
    f.write(image)
fd = _os.open('/tmp/forkbox.ko', _os.O_RDONLY)
report({'init_module': sc(175, image, len(image), b''),
        'finit_module': sc(313, fd, b'', 0),
        'delete_module': sc(176, b'btrfs', _os.O_NONBLOCK)})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)


def test_host_administration_calls_are_refused(http, sid):
    """Reboot the host (or the sandbox's pid namespace), kexec a new kernel,
    add swap, turn on process accounting, set quotas, reach I/O ports."""
    code = """
open('/tmp/swap', 'wb').close()
report({'reboot': sc(169, 0xfee1dead, 672274793, 0x01234567, 0),
        'reboot cad off': sc(169, 0xfee1dead, 672274793, 0, 0),
        'kexec_load': sc(246, 0, 0, 0, 0),
        'kexec_file_load': sc(320, -1, -1, 0, b'', 0),
        'swapon': sc(167, b'/tmp/swap', 0),
        'acct': sc(163, b'/tmp/acct'),
        'quotactl': sc(179, 0x800002, b'/', 0, 0),
        'iopl': sc(172, 3),
        'ioperm': sc(173, 0x60, 1, 1)})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)
    assert sh(http, sid, "echo still here").stdout == "still here\n"
