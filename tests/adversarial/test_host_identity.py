"""The host's identity and configuration from inside: its hostname, its
clock, its network interfaces and routes."""
from __future__ import annotations

import os
import socket
import subprocess
import time

from adversary import both, repl, sh
from helpers import exec_ok


def test_hostname_changes_stay_in_the_sandbox(http, new_sandbox):
    """bash and what it runs cannot rename the host they are on; the REPL
    can (it administers its own UTS namespace), and the name changes for
    its sandbox only: not for the host, not for a sibling from the same
    warm-pool family."""
    host = socket.gethostname()
    sid, sibling = new_sandbox(), new_sandbox()
    r = sh(http, sid, "hostname owned-by-bash")
    assert r.exit_code != 0 and "must be root" in r.stderr, r
    code = """
import socket
report({'sethostname': attempt(socket.sethostname, 'forkbox-adv-owned'),
        'setdomainname': lc('setdomainname', b'forkbox-adv', 11),
        'sysctl': attempt(lambda: _os.write(_os.open('/proc/sys/kernel/hostname', _os.O_WRONLY), b'forkbox-adv-sysctl'))})
"""
    seen = both(http, sid, code)
    assert seen["bash"] == {"sethostname": "EPERM", "setdomainname": "EPERM", "sysctl": "EACCES"}, seen
    assert seen["repl"] == {"sethostname": "ok", "setdomainname": "ok", "sysctl": "EACCES"}, seen
    assert exec_ok(http, sid, "hostname", language="bash") == "forkbox-adv-owned\n"
    assert socket.gethostname() == host
    with open("/proc/sys/kernel/hostname") as f:
        assert f.read().strip() == host
    assert exec_ok(http, sibling, "hostname", language="bash") == f"{sibling}\n"


def test_the_clock_cannot_be_set(http, sid):
    """settimeofday, clock_settime, adjtimex and clock_adjtime (there is no
    time namespace: the clock is the host's); the host's clock did not jump."""
    code = """
zero = _ct.create_string_buffer(16)
timex = _ct.create_string_buffer(208)
_ct.memmove(timex, (0x0100 | 0x0001).to_bytes(4, 'little'), 4)   # ADJ_SETOFFSET | ADJ_OFFSET
report({'settimeofday': sc(164, zero, 0), 'clock_settime': sc(227, 0, zero),
        'adjtimex': sc(159, timex), 'clock_adjtime': sc(305, 0, timex)})
"""
    start = time.time()
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)
    r = sh(http, sid, "date -s '2001-01-01 00:00:00'")
    assert r.exit_code != 0 and "Operation not permitted" in r.stderr, r
    assert start <= time.time() < start + 60


def host_interfaces() -> dict[str, str]:
    return {n: open(f"/sys/class/net/{n}/address").read().strip() for n in os.listdir("/sys/class/net")}


def test_the_hosts_interfaces_are_invisible(http, new_sandbox):
    """A sandbox sees its own network namespace: loopback, and with egress
    on one interface of its own (pasta's tap, once it opened a network
    socket: docs/network.md#the-way-out-starts-on-first-use), never the
    host's (their names, hardware addresses, counters)."""
    host = host_interfaces()
    host_macs = {mac for name, mac in host.items() if name != "lo"}
    code = """
import socket
socket.socket().close()
names = sorted(_os.listdir('/sys/class/net'))
report({'names': names, 'if_nameindex': sorted(n for _, n in socket.if_nameindex()),
        'macs': [open('/sys/class/net/%s/address' % n).read().strip() for n in names if n != 'lo'],
        'proc_net_dev': sorted(l.split(':')[0].strip() for l in open('/proc/1/net/dev').read().splitlines()[2:])})
"""
    for egress in (False, True):
        seen = repl(http, new_sandbox(egress=egress), code)
        assert seen["names"] == seen["if_nameindex"] == seen["proc_net_dev"], seen
        assert "lo" in seen["names"] and len(seen["names"]) == (2 if egress else 1), (egress, seen)
        assert not host_macs & set(seen["macs"]), (egress, seen, host)
        assert not {n for n in host if n not in ("lo", "eth0")} & set(seen["names"]), (egress, seen, host)


def host_routes() -> str:
    return subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=True).stdout


def test_routes_links_and_addresses_cannot_be_changed(http, sid):
    """No CAP_NET_ADMIN, not even for the REPL: no route, link or address
    change, by netlink (ip) or by ioctl, in the sandbox's namespace, and
    so none that could reach the host's."""
    before = host_routes()
    r = sh(http, sid, "ip route add 10.99.0.0/16 dev lo; ip link set lo down; ip addr add 10.99.0.1/32 dev lo; "
                      "ip link add forkbox0 type dummy; ip route show; ip -o link show lo")
    assert r.stderr.count("Operation not permitted") == 4, r
    assert "10.99." not in r.stdout and "forkbox0" not in r.stdout and "UP" in r.stdout, r
    code = """
import socket, fcntl, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
report({'SIOCSIFFLAGS lo down': attempt(fcntl.ioctl, s, 0x8914, struct.pack('16sh', b'lo', 0) + bytes(22)),
        'SIOCADDRT': attempt(fcntl.ioctl, s, 0x890B, bytes(120)),
        'SIOCSIFMTU': attempt(fcntl.ioctl, s, 0x8922, struct.pack('16si', b'lo', 1280) + bytes(20))})
"""
    for where, seen in both(http, sid, code).items():
        assert set(seen.values()) == {"EPERM"}, (where, seen)
    assert host_routes() == before
