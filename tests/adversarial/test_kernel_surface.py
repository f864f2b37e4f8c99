"""Kernel interfaces with a history of privilege escalations, each called
from inside with real arguments (the calls the kernel itself would let an
unprivileged user make, so the seccomp filter is what is measured):
keyrings, bpf, userfaultfd, perf_event_open, io_uring, raw and packet
sockets, new namespaces (unshare, clone, setns, climbing the namespace
tree with ioctls), scheduling and OOM priorities that would starve the
host, and btrfs ioctls through the overlay."""
from __future__ import annotations

import pytest

from adversary import bash_python, both, repl, sh


def test_keyrings_are_refused(http, sid):
    """Kernel keyrings are not namespaced: they would let a sandbox see or
    plant keys of others sharing its host uid. /proc/keys is masked."""
    code = """
report({'join session keyring': sc(250, 1, b'forkbox'),
        'add_key': sc(248, b'user', b'k', b'v', 1, -4),
        'request_key': sc(249, b'user', b'k', 0, 0),
        '/proc/keys': open('/proc/keys', 'rb').read().decode()})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"join session keyring": "EPERM", "add_key": "EPERM", "request_key": "EPERM", "/proc/keys": ""}, (where, seen)


def test_bpf_is_refused(http, sid):
    """A socket-filter program (two instructions) and an array map: what
    unprivileged bpf would allow."""
    code = """
import struct
insns = _ct.create_string_buffer(struct.pack('<BBhi', 0xb7, 0, 0, 0) + struct.pack('<BBhi', 0x95, 0, 0, 0))
gpl = _ct.create_string_buffer(b'GPL')
prog = _ct.create_string_buffer(struct.pack('<IIQQ', 1, 2, _ct.addressof(insns), _ct.addressof(gpl)), 128)
amap = _ct.create_string_buffer(struct.pack('<IIII', 2, 4, 4, 1), 128)
report({'BPF_PROG_LOAD': sc(321, 5, prog, 128), 'BPF_MAP_CREATE': sc(321, 0, amap, 128)})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"BPF_PROG_LOAD": "EPERM", "BPF_MAP_CREATE": "EPERM"}, (where, seen)


def test_userfaultfd_is_refused(http, sid):
    """userfaultfd stalls the kernel on a page fault at the attacker's
    choosing (the usual way to win races in kernel exploits)."""
    code = """
report({'user mode only': sc(323, 0o2000000 | 0o4000 | 1), 'any': sc(323, 0o2000000),
        '/dev/userfaultfd': attempt(_os.open, '/dev/userfaultfd', _os.O_RDWR)})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"user mode only": "EPERM", "any": "EPERM", "/dev/userfaultfd": "ENOENT"}, (where, seen)


def test_perf_event_open_is_refused(http, sid):
    """A software CPU clock on itself, user space only: the least a
    perf_event_paranoid host allows."""
    code = """
import struct
attr = _ct.create_string_buffer(struct.pack('<IIQQQQQ', 1, 128, 0, 0, 0, 0, 1 | (1 << 5) | (1 << 6)), 128)
report({'self': sc(298, attr, 0, -1, -1, 0), 'cpu 0': sc(298, attr, -1, 0, -1, 0)})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"self": "EPERM", "cpu 0": "EPERM"}, (where, seen)


def test_io_uring_is_refused(http, sid):
    code = """
params = _ct.create_string_buffer(120)
report({'io_uring_setup': sc(425, 8, params), 'io_uring_register': sc(427, 0, 0, 0, 0), 'io_uring_enter': sc(426, 0, 1, 0, 0, 0, 0)})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"io_uring_setup": "EPERM", "io_uring_register": "EPERM", "io_uring_enter": "EPERM"}, (where, seen)


@pytest.mark.parametrize("family", ["raw-ip", "packet", "vsock"])
def test_raw_packet_and_vsock_sockets_are_refused(http, sid, family):
    """Raw IP sockets (forge packets to the host through the sandbox's way
    out) and packet sockets (sniff, or inject frames on the interface): no
    CAP_NET_RAW. vsock (the hypervisor's channel to this VM's host, where
    there is one): refused by seccomp."""
    kinds = {"raw-ip": "[(2, 3, 1), (2, 3, 255), (2, 3, 6), (10, 3, 58)]",
             "packet": "[(17, 3, 0x0300), (17, 2, 0x0300), (17, 10, 0x0300)]",   # AF_PACKET: RAW, DGRAM, SOCK_PACKET
             "vsock": "[(40, 1, 0), (40, 2, 0), (40, 5, 0)]"}[family]            # AF_VSOCK: STREAM, DGRAM, SEQPACKET
    code = f"""
import socket
report([attempt(lambda: socket.socket(f, t, p).close()) for f, t, p in {kinds}])
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen) == {"EPERM"}, (where, seen)


CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = (
    0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80)


def test_new_user_namespaces_are_refused(http, sid):
    """A user namespace of its own would give full capabilities in it (and
    with them mount, a new network stack, ...): unshare, clone with the
    flag (a child that gets through exits at once), and clone3, whose
    flags the filter cannot read, so it is refused whole (ENOSYS, which
    makes glibc fall back to clone)."""
    code = f"""
r = _libc.syscall(56, {CLONE_NEWUSER} | 17, 0, 0, 0, 0)
if r == 0:
    _os._exit(0)
err = _ename(_ct.get_errno()) if r < 0 else 'ok'
report({{'unshare': sc(272, {CLONE_NEWUSER}), 'clone': err,
        'clone3': sc(435, _ct.create_string_buffer((({CLONE_NEWUSER}).to_bytes(8, 'little')) + bytes(80)), 88)}})
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"unshare": "EPERM", "clone": "EPERM", "clone3": "ENOSYS"}, (where, seen)
    r = sh(http, sid, "unshare -Ur id -u")
    assert r.exit_code != 0 and "Operation not permitted" in r.stderr, r


def test_other_new_namespaces_are_refused(http, sid):
    code = f"""
flags = {{'mnt': {CLONE_NEWNS}, 'net': {CLONE_NEWNET}, 'pid': {CLONE_NEWPID}, 'uts': {CLONE_NEWUTS},
         'ipc': {CLONE_NEWIPC}, 'cgroup': {CLONE_NEWCGROUP}, 'time': {CLONE_NEWTIME}}}
report({{k: sc(272, v) for k, v in flags.items()}})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)


def test_setns_into_other_namespaces_is_refused(http, sid):
    """setns into init's namespaces (closed: init is non-dumpable), into a
    user namespace (any: the filter refuses the type), and with type 0."""
    code = f"""
out = {{}}
for ns in ('user', 'mnt', 'pid', 'net', 'cgroup'):
    out['open /proc/1/ns/' + ns] = attempt(_os.open, '/proc/1/ns/' + ns, _os.O_RDONLY)
import fcntl
if _os.path.exists('/proc/self'):
    user = _os.open('/proc/self/ns/user', _os.O_RDONLY)
else:   # the REPL: its family pid namespace (fd 5) names the user namespace
    user = fcntl.ioctl(5, 0xb701)
out['setns user'] = sc(308, user, {CLONE_NEWUSER})
out['setns any'] = sc(308, user, 0)
out['setns cgroup'] = sc(308, user, {CLONE_NEWCGROUP})
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert seen == {"open /proc/1/ns/user": "EACCES", "open /proc/1/ns/mnt": "EACCES", "open /proc/1/ns/pid": "EACCES",
                        "open /proc/1/ns/net": "EACCES", "open /proc/1/ns/cgroup": "EACCES",
                        "setns user": "EPERM", "setns any": "EPERM", "setns cgroup": "EPERM"}, (where, seen)
    r = sh(http, sid, "nsenter -t 1 -a true")
    assert r.exit_code != 0 and "Permission denied" in r.stderr, r


def test_namespace_ioctls_do_not_climb_to_the_host(http, sid):
    """NS_GET_PARENT / NS_GET_USERNS hand out descriptors of a namespace's
    parent or owner: from the sandbox's namespaces, the host's are out of
    reach. SIOCGSKNS on the REPL's control socket (made by the server in
    the host's network namespace) would hand out the host's network."""
    seen = repl(http, sid, """
import fcntl
userns = fcntl.ioctl(5, 0xb701)
report({'family pid ns parent': attempt(fcntl.ioctl, 5, 0xb702),
        'family user ns parent': attempt(fcntl.ioctl, userns, 0xb702),
        'control socket netns': attempt(fcntl.ioctl, 3, 0x894C)})
""")
    assert seen == {"family pid ns parent": "EPERM", "family user ns parent": "EPERM", "control socket netns": "EPERM"}, seen
    seen = bash_python(http, sid, """
import fcntl
out = {}
for ns in ('pid', 'user', 'net', 'mnt'):
    fd = _os.open('/proc/self/ns/' + ns, _os.O_RDONLY)
    if ns != 'user':
        fd = fcntl.ioctl(fd, 0xb701)      # its owner: the family's user namespace
    out[ns] = attempt(fcntl.ioctl, fd, 0xb702)
report(out)
""")
    assert seen == {"pid": "EPERM", "user": "EPERM", "net": "EPERM", "mnt": "EPERM"}, seen


# Ways to take the host's CPU, disk or memory away from everyone else by
# priority rather than by use; each with what it answers.
PRIORITIES = {
    "realtime-scheduling": ("attempt(_os.sched_setscheduler, 0, _os.SCHED_FIFO, _os.sched_param(50))", "EPERM"),
    "negative-nice": ("attempt(_os.setpriority, _os.PRIO_PROCESS, 0, -20)", "EACCES"),
    "realtime-io-priority": ("sc(251, 1, 0, (1 << 13) | 0)", "EPERM"),
    # Immune to the OOM killer: the host's OOM killer would kill others.
    "oom-immune": ("attempt(lambda: _os.write(_os.open('/proc/self/oom_score_adj' if _os.path.exists('/proc/self') "
                   "else '/proc/1/oom_score_adj', _os.O_WRONLY), b'-1000'))", "EACCES"),
}


@pytest.mark.parametrize("name", list(PRIORITIES))
def test_host_starving_priorities_are_refused(http, sid, name):
    call, expected = PRIORITIES[name]
    for where, seen in both(http, sid, f"report({call})").items():
        assert seen == expected, (where, seen)


def test_btrfs_ioctls_do_not_pass_through_the_overlay(http, sid):
    """The upper layer is a btrfs subvolume of the shared volume; its
    ioctls (create, snapshot or destroy subvolumes, look up inodes, read
    the volume's space) never reach it through the overlay."""
    code = """
import fcntl
out = {}
for path in ('/', '/tmp', '/root'):
    fd = _os.open(path, _os.O_RDONLY)
    for name, req in (('SNAP_CREATE', 0x50009401), ('SUBVOL_CREATE', 0x5000940e), ('SNAP_DESTROY', 0x5000940f),
                      ('SPACE_INFO', 0xc0109414), ('INO_LOOKUP', 0xd0009412), ('QUOTA_CTL', 0xc0109428)):
        out[path + ' ' + name] = attempt(fcntl.ioctl, fd, req, bytearray(4096))
report(out)
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"ENOTTY"}, (where, seen)
