"""`./dev cluster` (deploy/local/cluster.py) as a user runs it: it serves
through its gateway, and SIGTERM stops every part and leaves nothing
behind: no process, mount, cgroup or file of it."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import httpx

from helpers import FORKBOX_BIN, TEMPLATES_DIR, create_raw, exec_raw, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "deploy", "local", "cluster.py")


def forkbox_cgroups() -> set[str]:
    return set(glob.glob("/sys/fs/cgroup/forkbox-*")) | set(glob.glob("/sys/fs/cgroup/*/forkbox-*"))


def processes_under(root: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if root in cmd and "pytest" not in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def test_the_local_cluster_serves_and_sigterm_leaves_nothing_behind():
    root = f"/var/lib/forkbox-local-cluster-{os.getpid()}"
    gateway = f"127.0.0.1:{free_port()}"
    cgroups_before = forkbox_cgroups()
    proc = subprocess.Popen([sys.executable, SCRIPT, "--bin", FORKBOX_BIN, "--root", root, "--templates-dir", TEMPLATES_DIR,
                             "--nodes", "1", "--gateway", gateway], stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 300
        for line in proc.stderr:
            lines.append(line)
            if "==> ready" in line:
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert any("==> ready" in l for l in lines), "".join(lines)
        with httpx.Client(base_url=f"http://{gateway}", timeout=60) as c:
            sid = create_raw(c)
            assert exec_raw(c, sid, "print('through the gateway')").stdout == "through the gateway\n"
            # Left running: the stop must end it too.
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(root), os.listdir(root)
    assert processes_under(root) == []
    with open("/proc/mounts") as f:
        assert [l for l in f if root in l] == []
    assert forkbox_cgroups() <= cgroups_before, forkbox_cgroups() - cgroups_before
