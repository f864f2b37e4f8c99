#!/usr/bin/env python3
"""restart benchmark: what a server crash costs the sandboxes it leaves,
beside the same server starting with nothing to take back, in the same run.

    python3 bench/restart.py [--bin target/release/forkbox] [--sandboxes 20] [--reps 3]

Each of --sandboxes sandboxes holds a list of 100,000 ints in its REPL. The
server is killed with SIGKILL and started again on the same state
directory; measured: from the start to `GET /v1/healthz` answering ok (every
sandbox adopted by then), and to the first exec's answer. Baseline: the
same kill and start with no sandbox to adopt. Every sandbox's state is
checked after each restart (a wrong answer aborts the run).
Results go to docs/benchmarks.md between the `bench:restart` markers.
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import Forkbox, Server, bench_args, log, run_header, write_section  # noqa: E402

SECTION = "restart"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-restart"


def crash_and_start(srv: Server) -> float:
    """SIGKILL the server, start it again; seconds until it serves."""
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    t = time.perf_counter()
    srv.start()
    return time.perf_counter() - t


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--sandboxes", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    srv.start()
    fb = Forkbox(srv.url)
    serving, first_exec, baseline = [], [], []
    try:
        ids = [fb.create() for _ in range(args.sandboxes)]
        for i, sid in enumerate(ids):
            out, code = fb.exec(sid, f"v = {i}\nbig = list(range(100_000))")
            if code != 0:
                raise SystemExit(f"setup of {sid} failed: {out!r}")
        for rep in range(args.reps):
            fb.close()
            t_serve = crash_and_start(srv)
            fb = Forkbox(srv.url)
            t = time.perf_counter()
            out, code = fb.exec(ids[-1], "print(v, len(big))")
            serving.append(t_serve)
            first_exec.append(t_serve + time.perf_counter() - t)
            for i, sid in enumerate(ids):
                out, code = fb.exec(sid, "print(v, len(big))")
                if code != 0 or out.strip() != f"{i} 100000":
                    raise SystemExit(f"after restart {rep}: {sid} answered {out!r} exit {code}")
            log(f"restart {rep}: serving after {t_serve * 1000:.0f} ms, every sandbox's state intact")
        for sid in ids:
            fb.destroy(sid)
        for rep in range(args.reps):
            fb.close()
            baseline.append(crash_and_start(srv))
            fb = Forkbox(srv.url)
    finally:
        fb.close()
        srv.stop()

    med = statistics.median
    n = args.sandboxes
    per = (med(serving) - med(baseline)) / n
    body = "\n".join([
        f"{run_header()}; {n} sandboxes, each holding a list of 100,000 ints; medians of {args.reps} `kill -9` "
        "and restarts on the same state directory. Every sandbox's state was checked after each restart.",
        "",
        "| restart | until serving | until the first exec's answer |",
        "|---|---|---|",
        f"| with {n} live sandboxes to adopt | {med(serving) * 1000:,.0f} ms | {med(first_exec) * 1000:,.0f} ms |",
        f"| baseline: nothing to adopt | {med(baseline) * 1000:,.0f} ms | |",
        "",
        f"Adoption adds {per * 1000:,.1f} ms per sandbox ({med(serving) / med(baseline):.2f}× the baseline start).",
    ])
    write_section(args.docs, SECTION, "Restart: adopting live sandboxes", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
