#!/usr/bin/env python3
"""criu benchmark: what a freeze that keeps every process will cost on this
machine, measured on a container-shaped tree before forkbox's sandboxes
can be dumped (docs/state.md#the-sandbox-shape-a-process-keeping-space-needs-decided-not-built).

    python3 bench/criu.py [--tools-dir /var/lib/forkbox/tools] [--mib 100,1024] [--reps 3]

The tree: a Python process as init of its own pid, mount, net, uts and ipc
namespaces, pivoted into the default template's root (read-only, a tmpfs
on /tmp), holding --mib MiB of random bytes in memory, with a thread
counting and a `python3 -m http.server` it started with Popen. criu 4.2
from the criu tools root (`forkbox tools build criu`), run pivoted into
that root as the server runs it, writes its images to the state disk.

- freeze: `criu dump` until it returns (the tree is gone, its memory free)
  and its images are synced to disk;
- resume: `criu restore -d` until it returns, and until the restored
  counter writes again (the first sign of life, like a first exec's answer);
- lazy resume: the same images restored with `--lazy-pages` beside a
  `criu lazy-pages` server: until the counter writes, and until every page
  is in.

Beside them, in the same run: writing the same bytes to a file on the same
disk with fsync, and reading them back (what a freeze and a resume must at
least do), and E2B's published pause (about 4 s per GiB) and resume (about
1 s). Every restored tree is checked: the same pid 1, its counter going on,
its http.server child alive. Results go to docs/benchmarks.md (`bench:criu`).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import log, run_header, write_section  # noqa: E402

SECTION = "criu"
WORK = "/var/lib/forkbox-bench-criu"
E2B_PAUSE_S_PER_GIB = 4.0
E2B_RESUME_S = 1.0

TREE = """
import os, subprocess, threading, time
blob = bytearray(os.urandom({mib} << 20))
n = [0]
def tick():
    while True:
        n[0] += 1
        time.sleep(0.002)
threading.Thread(target=tick, daemon=True).start()
server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
log = open('/tmp/log', 'w')
while True:
    log.write(f'{{os.getpid()}} {{n[0]}} {{server.poll()}} {{len(blob)}}\\n'); log.flush()
    time.sleep(0.005)
"""


def newest_root(store: str, name: str, needs: str) -> str:
    roots = [p for p in glob.glob(os.path.join(store, name, "*", "rootfs")) if os.path.exists(os.path.join(p, needs))]
    if not roots:
        raise SystemExit(f"nothing built under {store}/{name} holds {needs}: run `forkbox {'tools' if 'tools' in store else 'template'} build {name}`")
    return max(roots, key=os.path.getmtime)


def criu_argv(tools_root: str, binds: list[tuple[str, str]], *args: str) -> list[str]:
    """criu pivoted into the tools root, with each (host dir, path inside) bound."""
    mounts = "".join(f"mkdir -p $R{inside}; mount --rbind {host} $R{inside}; " for host, inside in binds)
    script = (f"set -e; R={tools_root}; mount --rbind $R $R; mount -t proc proc $R/proc; mount --rbind /sys $R/sys; "
              f"mount --rbind /dev $R/dev; {mounts}cd $R; pivot_root . .; umount -l .; cd /; exec criu \"$@\"")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "criu", *args]


def criu(tools_root: str, binds: list[tuple[str, str]], *args: str) -> None:
    out = subprocess.run(criu_argv(tools_root, binds, *args), capture_output=True, text=True, close_fds=True)
    if out.returncode != 0:
        logged = ""
        if "-o" in args and "-D" in args:
            host_images = next(h for h, inside in binds if inside == args[args.index("-D") + 1])
            try:
                logged = "".join(ln for ln in open(os.path.join(host_images, args[args.index("-o") + 1])) if ln.startswith("Error"))
            except OSError:
                pass
        raise SystemExit(f"criu {args[0]} failed: {out.stderr[-2000:]}{logged[-2000:]}")


def last_line(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/root/tmp/log") as f:
            lines = f.read().splitlines()
        return lines[-1].split() if lines else None
    except OSError:
        return None


def wait(what: str, probe, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = probe()
        if got:
            return got
        time.sleep(0.001)
    raise SystemExit(f"timed out waiting for {what}")


def start_tree(rootfs: str, mountpoint: str, mib: int) -> tuple[subprocess.Popen, int]:
    script = (f"set -e; m={mountpoint}; mount --bind {rootfs} $m; mount -o remount,bind,ro $m; "
              "mount -t tmpfs -o size=64m tmpfs $m/tmp; mount -t proc proc $m/proc; cd $m; pivot_root . .; umount -l .; cd /; "
              "exec setsid python3 -c \"$TREE\" </dev/null >/dev/null 2>&1")
    env = dict(os.environ, TREE=TREE.format(mib=mib))
    outer = subprocess.Popen(["unshare", "--pid", "--mount", "--net", "--uts", "--ipc", "--fork", "--propagation", "private",
                              "sh", "-c", script], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, close_fds=True)

    def tree_pid():
        try:
            with open(f"/proc/{outer.pid}/task/{outer.pid}/children") as f:
                pid = int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            return None
        line = last_line(pid)
        # Ready once the blob is whole and the http.server runs (poll() is None).
        return pid if line and line[2] == "None" and int(line[3]) == mib << 20 else None
    return outer, wait("the tree to start", tree_pid)


def freeze_resume(tools_root: str, rootfs: str, mib: int) -> tuple[float, float, float, float, float, int]:
    """One tree: (dump s, restore s, restore to its next log line s, the same
    lazily, lazily until every page is in s, image bytes)."""
    work = tempfile.mkdtemp(dir=WORK)
    images, mountpoint = os.path.join(work, "images"), os.path.join(work, "tree")
    os.makedirs(images)
    os.makedirs(mountpoint)
    outer, pid = start_tree(rootfs, mountpoint, mib)
    try:
        before = int(wait("a count", lambda: last_line(pid))[1])
        t0 = time.perf_counter()
        criu(tools_root, [(images, "/forkbox/images")], "dump", "-t", str(pid), "-D", "/forkbox/images", "-o", "dump.log",
             "--network-lock", "nftables")
        # A Space is on disk when its freeze answers: the images are synced, as space_store syncs a Space.
        for name in os.listdir(images):
            fd = os.open(os.path.join(images, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        dump_s = time.perf_counter() - t0
        outer.wait(timeout=30)
        size = sum(os.path.getsize(os.path.join(images, f)) for f in os.listdir(images))
        binds = [(images, "/forkbox/images"), (rootfs, "/forkbox/root")]
        restore = ("restore", "-D", "/forkbox/images", "-d", "--root", "/forkbox/root", "--pidfile", "/forkbox/images/pid")
        t0 = time.perf_counter()
        criu(tools_root, binds, *restore, "-o", "restore.log")
        restore_s = time.perf_counter() - t0
        alive_s, restored = alive_since(images, t0)
        check_and_end(restored, before, mib)
        # The same images again, lazily: the tree runs once its state is
        # back, and its memory streams in from a page server (userfaultfd).
        os.remove(os.path.join(images, "pid"))
        t0 = time.perf_counter()
        pages = subprocess.Popen(criu_argv(tools_root, binds, "lazy-pages", "-D", "/forkbox/images", "-o", "lazy.log"), close_fds=True)
        try:
            wait("the page server's socket", lambda: os.path.exists(os.path.join(images, "lazy-pages.socket")))
            criu(tools_root, binds, *restore, "-o", "lazy-restore.log", "--lazy-pages")
            lazy_s, restored = alive_since(images, t0)
            if pages.wait(timeout=120) != 0:
                raise SystemExit("criu lazy-pages failed")
        finally:
            if pages.poll() is None:
                pages.kill()
        all_pages_s = time.perf_counter() - t0
        check_and_end(restored, before, mib)
        return dump_s, restore_s, alive_s, lazy_s, all_pages_s, size
    finally:
        if outer.poll() is None:
            outer.kill()
        subprocess.run(["umount", "-l", mountpoint], stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


def alive_since(images: str, t0: float) -> tuple[float, int]:
    """Seconds from t0 until the restored tree writes again, and its host pid."""
    restored = int(open(os.path.join(images, "pid")).read())
    lines_then = len(open(f"/proc/{restored}/root/tmp/log").read().splitlines())
    wait("the restored tree to write", lambda: len(open(f"/proc/{restored}/root/tmp/log").read().splitlines()) > lines_then)
    return time.perf_counter() - t0, restored


def check_and_end(restored: int, before: int, mib: int) -> None:
    """The restored tree is the one dumped (pid 1, counting past the dump,
    its blob whole, its http.server alive); then it ends."""
    line = wait("a count past the dump", lambda: (ln := last_line(restored)) and int(ln[1]) > before and ln)
    if line[0] != "1" or line[2] != "None" or int(line[3]) != mib << 20:
        raise SystemExit(f"restored tree is not the one dumped: {line}")
    os.kill(restored, 9)
    wait("the restored tree to end", lambda: not os.path.exists(f"/proc/{restored}"))


def bare_write_read(mib: int) -> tuple[float, float]:
    """Write MiB random bytes with fsync, then read them back cold: a freeze's and a resume's floor."""
    path = os.path.join(WORK, "bare.bin")
    data = os.urandom(mib << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass
    read_s = time.perf_counter() - t0
    os.remove(path)
    return write_s, read_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools-dir", default=os.environ.get("FORKBOX_TOOLS_DIR", "/var/lib/forkbox/tools"))
    ap.add_argument("--templates-dir", default=os.environ.get("FORKBOX_TEMPLATES_DIR", "/var/lib/forkbox/templates"))
    ap.add_argument("--mib", default="100,1024")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--docs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks.md"))
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    tools_root = newest_root(a.tools_dir, "criu", "usr/sbin/criu")
    rootfs = newest_root(a.templates_dir, "default", "usr/bin/python3")
    os.makedirs(WORK, exist_ok=True)
    rows = []
    for mib in [int(x) for x in a.mib.split(",")]:
        runs = []
        for i in range(a.reps):
            runs.append(freeze_resume(tools_root, rootfs, mib))
            log(f"{mib} MiB run {i + 1}: dump {runs[-1][0]:.2f} s, restore {runs[-1][1]:.3f} s, alive {runs[-1][2]:.3f} s, "
                f"lazy alive {runs[-1][3]:.3f} s, every page {runs[-1][4]:.3f} s")
        bare = [bare_write_read(mib) for _ in range(a.reps)]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        dump_s, restore_s, alive_s, lazy_s, all_pages_s = (med([r[k] for r in runs]) for k in range(5))
        size_mib = med([r[5] for r in runs]) / (1 << 20)
        write_s, read_s = med([b[0] for b in bare]), med([b[1] for b in bare])
        gib = mib / 1024
        rows.append(f"| {mib} MiB | {size_mib:.0f} MiB | {dump_s:.2f} s ({dump_s / gib:.2f} s/GiB) | {write_s:.2f} s | "
                    f"{dump_s / write_s:.1f}× | {E2B_PAUSE_S_PER_GIB * gib:.1f} s | {restore_s * 1000:.0f} ms | "
                    f"{alive_s * 1000:.0f} ms | {lazy_s * 1000:.0f} ms ({all_pages_s * 1000:.0f} ms) | {read_s * 1000:.0f} ms | "
                    f"{E2B_RESUME_S * 1000:.0f} ms |")
    body = "\n".join([
        f"{run_header()}; criu from the tools root ({os.path.basename(os.path.dirname(tools_root))}), images on the state disk, "
        f"medians of {a.reps} runs. A container-shaped Python tree (pid 1 of its own namespaces, a counting thread, an "
        "http.server child), not yet a forkbox sandbox (docs/state.md#the-sandbox-shape-a-process-keeping-space-needs-decided-not-built).",
        "",
        "| memory | image | freeze (criu dump + fsync) | bare write + fsync | ratio | E2B pause (published) | resume (criu restore) "
        "| resume to first sign of life | lazy resume to first sign of life (every page in) | bare cold read | E2B resume (published) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "Targets (issue: Spaces that keep every process): freeze ≤ 1 s per GiB, resume to the first exec ≤ 300 ms.",
        f"Reproduce: `python3 bench/criu.py --mib {a.mib} --reps {a.reps}`.",
    ])
    print(body)
    if not a.no_docs:
        write_section(a.docs, SECTION, "criu freeze and resume of a process tree (bench/criu.py)", body)
    shutil.rmtree(WORK, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
