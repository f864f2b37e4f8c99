#!/usr/bin/env python3
"""cluster benchmark: what the gateway adds to an exec and to a create,
beside the same calls straight to the node (with the cluster secret) in
the same run, and how long draining a node of 20 sandboxes takes, on a
local cluster (deploy/local/cluster.py: 3 etcd members, rclone serve s3,
3 nodes, a gateway).

    python3 bench/cluster.py [--bin target/release/forkbox] [--calls 500] [--creates 40] [--drain 20]

Execs of `print(1)` go to one sandbox over one keep-alive connection each
way (stdlib client), interleaved in rounds. Creates through the gateway
are placed by it; the direct ones go to one node. Results go to
docs/benchmarks.md between the `bench:cluster` markers.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "deploy", "local"))

from cluster import LocalCluster  # noqa: E402
from run import Forkbox, Series, bench_args, fmt_ms, fmt_ratio, log, run_header, write_section  # noqa: E402

SECTION = "cluster"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-cluster"


class NodeClient(Forkbox):
    """Straight to a node: it wants the cluster secret."""

    def __init__(self, url: str, secret: str):
        super().__init__(url)
        self.headers["x-forkbox-cluster"] = secret


def timed_exec(fb: Forkbox, sid: str, series: Series) -> None:
    t = time.perf_counter_ns()
    out, code = fb.exec(sid, "print(1)")
    series.add_ns(time.perf_counter_ns() - t)
    if out.strip() != "1" or code != 0:
        raise SystemExit(f"exec: {out!r} exit {code}")


def timed_create(fb: Forkbox, series: Series) -> str:
    t = time.perf_counter_ns()
    sid = fb.create()
    series.add_ns(time.perf_counter_ns() - t)
    return sid


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--creates", type=int, default=40)
    ap.add_argument("--drain", type=int, default=20)
    args = ap.parse_args()
    cluster = LocalCluster(os.path.abspath(args.bin), args.state_dir, args.templates_dir, lease_seconds=10)
    cluster.start(say=log)
    secret = open(cluster.secret_file).read().strip()
    node = "node-1"
    node_url = f"http://127.0.0.1:{cluster.node_ports[node]}"
    gw, direct = Forkbox(cluster.url), NodeClient(node_url, secret)
    ex_gw, ex_direct = Series("gw", "exec `print(1)` through the gateway"), Series("direct", "exec `print(1)` straight to the node")
    cr_gw, cr_direct = Series("cgw", "create through the gateway (placed by it)"), Series("cdirect", "create straight to a node")
    drain_s = float("nan")
    moved = failed = 0
    try:
        sid = direct.create()
        warm = Series("warm", "")
        for _ in range(args.warmup):
            timed_exec(gw, sid, warm)
            timed_exec(direct, sid, warm)
        per_round = max(1, args.calls // args.rounds)
        for rnd in range(args.rounds):
            for _ in range(per_round):
                timed_exec(direct, sid, ex_direct)
                timed_exec(gw, sid, ex_gw)
            log(f"round {rnd + 1}/{args.rounds}: exec direct p50 {ex_direct.p50:.3f} ms, via gateway p50 {ex_gw.p50:.3f} ms")
        direct.destroy(sid)
        made = []
        for i in range(args.creates):
            made.append((direct, timed_create(direct, cr_direct)))
            made.append((gw, timed_create(gw, cr_gw)))
            if len(made) >= 20:
                for fb, s in made:
                    fb.destroy(s)
                made = []
        for fb, s in made:
            fb.destroy(s)
        log(f"creates: direct p50 {cr_direct.p50:.2f} ms, via gateway p50 {cr_gw.p50:.2f} ms")
        # A node of `--drain` sandboxes, each holding a little state.
        victims = [direct.create() for _ in range(args.drain)]
        for s in victims:
            out, code = direct.exec(s, "x = list(range(1000))\nprint(1)")
            if out.strip() != "1":
                raise SystemExit(f"could not set up a sandbox to drain: {out!r}")
        t = time.perf_counter()
        out = subprocess.run([args.bin, "node", "drain", node, "--url", cluster.url, "--cluster-secret-file", cluster.secret_file],
                             capture_output=True, text=True, timeout=1200)
        drain_s = time.perf_counter() - t
        moved = sum("moved to" in line for line in out.stdout.splitlines())
        failed = sum("not moved" in line for line in out.stdout.splitlines())
        log(f"drained {moved} sandboxes ({failed} not moved) in {drain_s:.2f} s")
        for s in victims:
            if moved:
                out_, code_ = gw.exec(s, "print(len(x))")
                if out_.strip() != "1000":
                    raise SystemExit(f"a drained sandbox lost its state: {out_!r}")
                gw.destroy(s)
    finally:
        gw.close()
        direct.close()
        cluster.stop()

    def row(s: Series) -> str:
        return f"| {s.label} | {s.n} | {fmt_ms(s.p50)} | {fmt_ms(s.pct(99))} | {fmt_ms(s.mean)} |"
    lines = [
        f"{run_header()}; a local cluster of 3 etcd members, `rclone serve s3`, 3 nodes and a gateway on one machine "
        f"(deploy/local/cluster.py). Execs of `print(1)` on one sandbox over one keep-alive connection each way, "
        f"{args.rounds} interleaved rounds after {args.warmup} warm-up calls; creates alternate between the two.",
        "",
        "| what | n | p50 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|---:|",
        row(ex_direct),
        row(ex_gw),
        f"| **added by the gateway to an exec** | | **{fmt_ms(ex_gw.p50 - ex_direct.p50)}** | {fmt_ms(ex_gw.pct(99) - ex_direct.pct(99))} | "
        f"{fmt_ms(ex_gw.mean - ex_direct.mean)} |",
        row(cr_direct),
        row(cr_gw),
        f"| **added by the gateway to a create** | | **{fmt_ms(cr_gw.p50 - cr_direct.p50)}** | {fmt_ms(cr_gw.pct(99) - cr_direct.pct(99))} | "
        f"{fmt_ms(cr_gw.mean - cr_direct.mean)} |",
        "",
        f"- exec through the gateway / straight: {fmt_ratio(ex_gw.p50, ex_direct.p50)} (p50), {fmt_ratio(ex_gw.pct(99), ex_direct.pct(99))} (p99).",
        f"- draining a node of {args.drain} sandboxes (frozen to the S3 server, resumed on the two others under their ids, "
        f"4 at a time): **{drain_s:.2f} s** ({moved} moved, {failed} not); "
        f"{drain_s / max(moved, 1) * 1000:.0f} ms per sandbox.",
        "",
        "The gateway adds one loopback HTTP hop and an etcd read of the sandbox's record (a transaction of three gets) "
        "to each call; a create also reads the body to place it. The direct creates all go to one node, whose warm "
        "pool refills behind each; the gateway spreads its creates over the three, each with its pool ready, which is "
        "why its creates can be faster than one node's. Every process of the cluster shares the same 2 cores, so the "
        "numbers include their contention.",
    ]
    write_section(args.docs, SECTION, "Cluster: the gateway's cost, and draining a node (`bench/cluster.py`)", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
