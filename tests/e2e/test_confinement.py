"""What confines a sandbox's processes, checked from inside: no_new_privs,
seccomp, the capability sets, the masked /proc files, /dev, the IPC
namespace, the init's protections, and the REPL's own narrower rules."""
from __future__ import annotations

import os

from helpers import sandbox_cgroup_dirs


def sh(sb, cmd):
    r = sb.run_code(cmd, language="bash")
    assert r.exit_code == 0, (cmd, r)
    return r.stdout


def py(sb, code):
    r = sb.run_code(code)
    assert r.exit_code == 0, (code, r)
    return r.stdout


def test_processes_run_with_no_new_privs_seccomp_and_no_sys_admin(sandbox):
    status = dict(line.split(":\t", 1) for line in sh(sandbox, "cat /proc/self/status").splitlines() if ":\t" in line)
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"
    eff = int(status["CapEff"], 16)
    bnd = int(status["CapBnd"], 16)
    for cap in (21, 19, 16, 13, 12):  # SYS_ADMIN, SYS_PTRACE, SYS_MODULE, NET_RAW, NET_ADMIN
        assert not eff & (1 << cap) and not bnd & (1 << cap), cap
    assert eff & (1 << 0) and eff & (1 << 1)  # CHOWN, DAC_OVERRIDE kept


def test_host_kernel_interfaces_are_masked(sandbox):
    out = sh(sandbox, "for f in /proc/kcore /proc/keys /proc/timer_list /proc/sysrq-trigger /proc/latency_stats; do "
                      "[ -e $f ] && echo \"$f $(head -c 64 $f 2>/dev/null | wc -c)\"; done; "
                      "for d in /proc/acpi /proc/scsi /proc/driver /sys/firmware; do [ -d $d ] && ls -A $d | wc -l; done; true")
    lines = out.splitlines()
    files = [l for l in lines if l.startswith("/proc")]
    assert files, out
    for line in files:
        assert line.endswith(" 0"), f"{line}: readable host data"
    for count in (l for l in lines if not l.startswith("/proc")):
        assert count == "0", f"a masked directory shows entries: {out}"


def test_dev_holds_only_harmless_nodes(sandbox):
    names = set(sh(sandbox, "ls -A /dev").split())
    assert {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd"} <= names
    assert not names & {"sda", "vda", "mem", "kmem", "port", "kmsg", "loop0", "loop-control", "btrfs-control", "kvm"}
    assert sh(sandbox, "echo hi > /dev/null && head -c 4 /dev/urandom | wc -c").strip() == "4"


def test_sysv_ipc_is_private_to_each_sandbox(make_sandbox):
    a, b = make_sandbox(), make_sandbox()
    key = py(a, """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
shmid = libc.shmget(0x4242, 4096, 0o1666)
print(shmid >= 0)
""")
    assert key.strip() == "True"
    assert "0x00004242" in sh(a, "ipcs -m")
    assert "0x00004242" not in sh(b, "ipcs -m")


def host_can_lower_oom_scores() -> bool:
    """CAP_SYS_RESOURCE (24): some hosts (e.g. this CI's VM) withhold it from root."""
    with open("/proc/self/status") as f:
        eff = next(int(l.split()[1], 16) for l in f if l.startswith("CapEff:"))
    return bool(eff & (1 << 24))


def test_init_is_protected_from_the_sandbox(sandbox):
    out = sh(sandbox, "cat /proc/1/oom_score_adj; readlink -v /proc/1/exe 2>&1; "
                      "kill -9 1; sleep 0.2; ps -o comm= -p 1")
    lines = out.splitlines()
    # The OOM killer must pick user processes, not init, where the host lets
    # the server say so.
    assert lines[0] == ("-1000" if host_can_lower_oom_scores() else "0")
    assert "Permission denied" in lines[1]
    assert lines[-1] == "forkbox-init", "init died from a kill inside its own namespace"


def init_fds(sandbox_id: str) -> dict[str, str]:
    """What the sandbox's init holds open, read from the host."""
    for d in sandbox_cgroup_dirs(sandbox_id):
        with open(os.path.join(d, "cgroup.procs")) as f:
            for pid in f.read().split():
                with open(f"/proc/{pid}/comm") as c:
                    if c.read().strip() == "forkbox-init":
                        return {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    raise AssertionError(f"no init found for {sandbox_id}")


def test_init_keeps_nothing_of_the_compiled_policy_the_shim_hands_it(sandbox):
    """Each member's init reads the seccomp programs the shim compiled
    once from a sealed memfd (crates/jail/src/shim/sealed_policy.rs), then
    closes it: the init of a sandbox from the warm pool and of a fork
    child hold no such descriptor, and their processes are confined by
    what it carried."""
    (child,) = sandbox.fork(1)
    try:
        for sb in (sandbox, child):
            held = init_fds(sb.id)
            assert not [t for t in held.values() if "memfd:" in t], held
            status = sh(sb, "grep Seccomp: /proc/self/status")
            assert status.split() == ["Seccomp:", "2"], status
            assert "denied" in py(sb, "import ctypes, os\nprint('denied' if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0 else 'allowed')")
    finally:
        child.close()


def test_the_repl_may_setns_only_with_an_explicit_namespace_type(sandbox):
    out = py(sandbox, """
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
# pidfd_open is denied to the REPL (a pidfd would open other namespaces).
try:
    os.pidfd_open(1)
    print('pidfd allowed')
except PermissionError:
    print('pidfd denied')
# setns needs an explicit pid, mount, net, uts or ipc type (a fork child
# enters its new sandbox with them); "any type" (0) and a user namespace are
# refused by seccomp (EPERM) before the kernel looks at the descriptor.
for kind in (0, 0x10000000, 0x02000000):  # any, CLONE_NEWUSER, CLONE_NEWCGROUP
    r = libc.setns(5, kind)
    print(r, ctypes.get_errno() == errno.EPERM)
# An allowed type with a descriptor of another kind is the kernel's EINVAL.
r = libc.setns(5, 0x40000000)  # fd 5 is a pid namespace, not a network one
print(r, ctypes.get_errno() == errno.EINVAL)
# CAP_SYS_ADMIN is not in the bounding set: nothing the REPL runs gets it.
print(libc.prctl(23, 21, 0, 0, 0))  # PR_CAPBSET_READ, CAP_SYS_ADMIN
""")
    assert out.split() == ["pidfd", "denied"] + ["-1", "True"] * 4 + ["0"]
