"""The kernel's interfaces to the host from inside a sandbox: device nodes
(made with mknod, or looked for in /dev), /sys, the host-wide sysctls under
/proc/sys (core_pattern and modprobe are classic container escapes: the
host's kernel runs what they name, as the host's root), and root's
capabilities against files that belong to the host."""
from __future__ import annotations

import os

import pytest

from adversary import both

# char/block nodes of the host, by what an attacker wants from them.
DEVICES = {
    # Every block device of the host (read and write its disks), from /sys/block/*/dev.
    "block-devices": None,
    # Physical memory and I/O ports.
    "memory": [("c", 1, 1, "/dev/mem"), ("c", 1, 2, "/dev/kmem"), ("c", 1, 4, "/dev/port")],
    # The kernel's log: read it, or forge entries in it.
    "kmsg": [("c", 1, 11, "/dev/kmsg")],
    # Control nodes: btrfs (scan, remove devices of the volume), loop
    # (attach images), fuse (a filesystem the host would serve), kvm.
    "control": [("c", 10, 234, "/dev/btrfs-control"), ("c", 10, 237, "/dev/loop-control"),
                ("c", 10, 229, "/dev/fuse"), ("c", 10, 232, "/dev/kvm")],
}


@pytest.mark.parametrize("kind", list(DEVICES))
def test_host_device_nodes_cannot_be_made_or_found(http, sid, kind):
    """No such node exists in the sandbox's /dev, and mknod of one (in the
    upper layer, or in /dev/shm) fails: no CAP_MKNOD, and a user namespace
    may not create devices anyway."""
    code = f"""
import glob
nodes = {DEVICES[kind]!r}
if nodes is None:
    nodes = []
    for dev in glob.glob('/sys/block/*/dev'):
        major, minor = map(int, open(dev).read().split(':'))
        nodes.append(('b', major, minor, '/dev/' + dev.split('/')[3]))
out = {{}}
for t, major, minor, path in nodes:
    mode = (0o60600 if t == 'b' else 0o20600)
    out[path] = [attempt(_os.stat, path)] + [
        attempt(_os.mknod, d + '/node-%d-%d' % (major, minor), mode, _os.makedev(major, minor))
        for d in ('/tmp', '/dev/shm')]
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert seen, (where, "no device to try")
        for path, results in seen.items():
            assert results == ["ENOENT", "EPERM", "EPERM"], (where, path, results)


def test_kernel_log_is_closed(http, sid):
    """The kernel log by its other doors: /proc/kmsg, syslog(2), dmesg."""
    code = """
report({'proc kmsg': attempt(lambda: open('/proc/kmsg', 'rb').read(1)),
        'syslog read all': sc(103, 3, _ct.create_string_buffer(4096), 4096),
        'syslog clear': sc(103, 5, 0, 0)})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"proc kmsg": "EACCES", "syslog read all": "EPERM", "syslog clear": "EPERM"}, (where, seen)


def test_terminal_injection_fails(http, sid):
    """Keystrokes pushed into a terminal (TIOCSTI, TIOCLINUX) are refused on
    the sandbox's own pseudo-terminal, and /dev/tty, bound from the host,
    is no terminal of the host's: the sandbox has no controlling one."""
    code = """
import fcntl, pty
master, slave = pty.openpty()
report({'dev tty': attempt(_os.open, '/dev/tty', _os.O_RDWR),
        'TIOCSTI': attempt(fcntl.ioctl, slave, 0x5412, b'x'),
        'TIOCLINUX': attempt(fcntl.ioctl, slave, 0x541C, b'\\x0b')})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"dev tty": "ENXIO", "TIOCSTI": "EPERM", "TIOCLINUX": "EPERM"}, (where, seen)


def host_value(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:   # absent, or write-only (drop_caches)
        return None


# /sys files that change the host, with a harmless value to write: what the
# host has now (or nothing the kernel would accept), so even a hole writes
# nothing new. sysfs is mounted read-only: EROFS before any permission check.
SYSFS = {
    "transparent-hugepages": "/sys/kernel/mm/transparent_hugepage/enabled",
    "disk-queue": "/sys/block/vda/queue/read_ahead_kb",
    "suspend-the-host": "/sys/power/state",
    "own-loopback-mtu": "/sys/class/net/lo/mtu",
}


@pytest.mark.parametrize("name", list(SYSFS))
def test_sysfs_is_read_only(http, sid, name):
    path = SYSFS[name]
    before = host_value(path)
    assert before is not None or name == "own-loopback-mtu", f"{path} is not on this host"
    value = {"suspend-the-host": "forkbox-not-a-state\n"}.get(name, (before or "65536\n").replace("[", "").split()[0] + "\n")
    code = f"report(attempt(lambda: open({path!r}, 'w').write({value!r})))"
    for where, seen in both(http, sid, code).items():
        assert seen == "EROFS", (where, seen)
    assert host_value(path) == before


# Host-wide sysctls, and the value an attacker would write. kernel.modprobe
# does not exist on kernels without modules (ENOENT, as on the host).
SYSCTLS = {
    "core_pattern": ("kernel/core_pattern", "|/tmp/forkbox-adv-pwn %p"),
    "modprobe": ("kernel/modprobe", "/tmp/forkbox-adv-pwn"),
    "drop_caches": ("vm/drop_caches", "3"),
    "randomize_va_space": ("kernel/randomize_va_space", "0"),
    "panic_on_oops": ("kernel/panic_on_oops", "1"),
    "ip_forward-namespaced": ("net/ipv4/ip_forward", "1"),
}


@pytest.mark.parametrize("name", list(SYSCTLS))
def test_host_sysctls_cannot_be_written(http, sid, name):
    rel, value = SYSCTLS[name]
    path = f"/proc/sys/{rel}"
    before = host_value(path)
    expected = "EACCES" if os.path.exists(path) else "ENOENT"
    code = f"report(attempt(lambda: open({path!r}, 'w').write({value!r})))"
    try:
        for where, seen in both(http, sid, code).items():
            assert seen == expected, (where, seen)
        assert host_value(path) == before
    finally:
        if before is not None and host_value(path) != before:   # a hole: put the host back
            with open(path, "w") as f:
                f.write(before)


def test_root_capabilities_do_not_apply_to_host_owned_files(http, sid):
    """Root inside holds CAP_CHOWN, CAP_FOWNER and CAP_DAC_OVERRIDE, in its
    own user namespace only: on the host's files (the device nodes bound
    into /dev, /proc/sys) they grant nothing."""
    code = """
report({'chown': attempt(_os.chown, '/dev/null', 0, 0),
        'chmod': attempt(_os.chmod, '/dev/null', 0o777),
        'utime': attempt(_os.utime, '/dev/zero', (0, 0)),
        'read write-only drop_caches': attempt(lambda: open('/proc/sys/vm/drop_caches').read()),
        'write read-only core_pattern': attempt(lambda: open('/proc/sys/kernel/core_pattern', 'w').write('core'))})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"chown": "EPERM", "chmod": "EPERM", "utime": "EPERM",
                        "read write-only drop_caches": "EACCES", "write read-only core_pattern": "EACCES"}, (where, seen)
    assert oct(os.stat("/dev/null").st_mode & 0o777) == "0o666" and os.stat("/dev/null").st_uid == 0
