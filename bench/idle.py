#!/usr/bin/env python3
"""forkbox idle footprint: memory of N live, idle sandboxes, beside the
same number of idle local Jupyter kernels and of bare idle `python3`
processes, measured in one run.

    pip install -r bench/requirements.txt && python3 bench/idle.py [--sandboxes 50]

Memory is PSS (proportional set size, /proc/<pid>/smaps_rollup), so pages
shared between processes (the interpreter's binary and libraries) are
counted once across them. For forkbox it sums every process the server
started for its sandboxes (supervisors, reapers, inits, REPLs) plus the
server's own growth. Written to docs/benchmarks.md between the
`<!-- bench:idle:start -->` and `<!-- bench:idle:end -->` markers. A
measurement, not a test: nothing is asserted.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import (  # noqa: E402  (the shared server/client/machine helpers)
    DEFAULT_BIN, DEFAULT_STATE_DIR, DEFAULT_TEMPLATES_DIR, DOCS, Forkbox, Server, host_python, log, machine,
    start_kernel, stop_kernel, write_section,
)

SECTION = "idle"
GIB = 1 << 30


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            out.append(c)
            todo.append(c)
    return out


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def settle() -> None:
    time.sleep(2)


def forkbox_footprint(args) -> dict:
    srv = Server(args.bin, args.state_dir, args.templates_dir, 900)
    srv.start()
    try:
        fb = Forkbox(srv.url)
        sid = fb.create()
        fb.destroy(sid)
        settle()
        server_before = pss_kib(srv.proc.pid)
        avail_before = mem_available_kib()
        ids = []
        t0 = time.monotonic()
        for _ in range(args.sandboxes):
            sid = fb.create()
            out, code = fb.exec(sid, "print(1)")
            assert (out.strip(), code) == ("1", 0)
            ids.append(sid)
        created_s = time.monotonic() - t0
        settle()
        avail_used = max(0, avail_before - mem_available_kib())
        procs = descendants(srv.proc.pid)
        sandboxes_kib = sum(pss_kib(p) for p in procs)
        server_growth = max(0, pss_kib(srv.proc.pid) - server_before)
        # Every sandbox still answers.
        for sid in ids:
            out, code = fb.exec(sid, "print(1)")
            assert (out.strip(), code) == ("1", 0)
        for sid in ids:
            fb.destroy(sid)
        fb.close()
        return {"total_kib": sandboxes_kib + server_growth, "procs": len(procs), "avail_used_kib": avail_used,
                "server_growth_kib": server_growth, "created_s": created_s}
    finally:
        srv.stop()


def python_footprint(n: int) -> int:
    py = host_python()
    procs = [subprocess.Popen([py, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) for _ in range(n)]
    settle()
    total = sum(pss_kib(p.pid) for p in procs)
    for p in procs:
        p.stdin.close()
        p.wait()
    return total


def jupyter_footprint(n: int) -> int:
    kernels = [start_kernel() for _ in range(n)]
    settle()
    total = 0
    for km, _ in kernels:
        pid = km.provisioner.process.pid
        total += pss_kib(pid) + sum(pss_kib(c) for c in descendants(pid))
    for km, kc in kernels:
        stop_kernel(km, kc)
    return total


def render(n: int, fb: dict, py: int, jup: int, jn: int, m: dict) -> str:
    per = fb["total_kib"] / n / 1024
    rows = [
        ("forkbox sandbox (supervisor, reaper, init, idle REPL; server growth included)", per),
        ("local Jupyter kernel (ipykernel), idle", jup / jn / 1024),
        ("bare `python3` process, idle (no isolation, no REPL)", py / n / 1024),
    ]
    out = [f"### {n} idle sandboxes (PSS per sandbox, MiB)", "",
           "| what | MiB each |", "|---|---:|"]
    out += [f"| {w} | {v:.1f} |" for w, v in rows]
    host_per = fb["avail_used_kib"] / n / 1024
    cap = int(24 * GIB / max(fb["avail_used_kib"], fb["total_kib"]) * n / 1024)
    out += ["",
            f"- forkbox: {fb['procs']} processes for {n} sandboxes; the server itself grew by "
            f"{fb['server_growth_kib'] / 1024:.1f} MiB; creating them took {fb['created_s']:.1f} s.",
            f"- ratio forkbox / Jupyter kernel: {per / (jup / jn / 1024):.2f}x; "
            f"forkbox / bare python3: {per / (py / n / 1024):.2f}x.",
            f"- PSS counts user-space memory only. A second estimate: the host's MemAvailable dropped by "
            f"{host_per:.1f} MiB per sandbox; that counts kernel objects too (page tables, namespaces, cgroups, "
            "mounts, overlay and btrfs metadata) but nets out cache the kernel can reclaim, so it is no bound either way.",
            f"- at the larger of the two, 24 GiB holds about {cap} idle sandboxes (target: ≥ 200, [architecture.md](architecture.md#targets)).",
            "",
            f"Run: {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
            f"{m.get('nproc')} CPUs ({m.get('cpu')}), Linux {m.get('kernel')}, commit {m.get('commit')}; reproduce with `python3 bench/idle.py --sandboxes {n}`."]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=50)
    ap.add_argument("--kernels", type=int, default=10, help="Jupyter kernels for the baseline")
    ap.add_argument("--bin", default=DEFAULT_BIN)
    ap.add_argument("--state-dir", default=DEFAULT_STATE_DIR + "-idle")
    ap.add_argument("--templates-dir", default=DEFAULT_TEMPLATES_DIR)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    log(f"forkbox: {args.sandboxes} idle sandboxes")
    fb = forkbox_footprint(args)
    log(f"bare python3: {args.sandboxes} idle processes")
    py = python_footprint(args.sandboxes)
    log(f"Jupyter: {args.kernels} idle kernels")
    jup = jupyter_footprint(args.kernels)
    body = render(args.sandboxes, fb, py, jup, args.kernels, machine())
    print(body)
    if not args.no_write:
        write_section(DOCS, SECTION, "Idle footprint (`bench/idle.py`)", body)
        log(f"wrote {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
