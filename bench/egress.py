#!/usr/bin/env python3
"""egress benchmark: a 100 MB download from an HTTP server in a network
namespace this script creates, by `curl` inside a sandbox (egress on: the
sandbox's packets go through pasta), beside the same download by `curl` on
the host (no forkbox in between), in the same run.

    python3 bench/egress.py [--bin target/release/forkbox] [--reps 5] [--mib 100]

Results go to docs/benchmarks.md between the `bench:egress` markers.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import Forkbox, Server, bench_args, log, run_header, write_section  # noqa: E402

SECTION = "egress"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-egress"


class TestNet:
    """A namespace with an HTTP server, joined to the host by a veth pair."""

    def __init__(self, payload_mib: int):
        n = random.randint(10, 250)
        self.ns, self.host_if = f"fbbench{n}", f"fbbh{n}"
        self.ip = f"10.214.{n}.2"
        self.dir = tempfile.mkdtemp(prefix="forkbox-egress-")
        with open(os.path.join(self.dir, "payload.bin"), "wb") as f:
            f.write(os.urandom(1 << 20) * payload_mib)
        run = lambda *a: subprocess.run(a, check=True)
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", f"fbbn{n}")
        run("ip", "link", "set", f"fbbn{n}", "netns", self.ns)
        run("ip", "addr", "add", f"10.214.{n}.1/24", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        run("ip", "-n", self.ns, "addr", "add", f"{self.ip}/24", "dev", f"fbbn{n}")
        run("ip", "-n", self.ns, "link", "set", f"fbbn{n}", "up")
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        self.server = subprocess.Popen(["ip", "netns", "exec", self.ns, "python3", "-m", "http.server", "8080", "--bind", self.ip,
                                        "--directory", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection((self.ip, 8080), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("the test namespace's HTTP server did not start")

    def close(self):
        self.server.kill()
        self.server.wait()
        subprocess.run(["ip", "link", "del", self.host_if], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


FIRST_SOCKET = """
import socket, time
t = time.perf_counter(); socket.socket().close(); print(time.perf_counter() - t)
"""

SOCKET_COST = """
import socket, time
socket.socket().close()
def each(family, n=20000):
    t = time.perf_counter()
    for _ in range(n):
        socket.socket(family, socket.SOCK_DGRAM).close()
    return (time.perf_counter() - t) / n * 1e6
print(min(each(socket.AF_INET) for _ in range(3)), min(each(socket.AF_UNIX) for _ in range(3)))
"""


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mib", type=int, default=100)
    args = ap.parse_args()
    net = TestNet(args.mib)
    url = f"http://{net.ip}:8080/payload.bin"
    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    srv.start()
    fb = Forkbox(srv.url)
    direct, sandboxed = [], []
    try:
        status, body = fb.request("POST", "/v1/sandboxes", {"egress": True})
        assert status == 200, body
        sid = json.loads(body)["id"]
        # The sandbox's curl reports its own transfer time.
        fetch = f"curl -sf -o /dev/null -w '%{{time_total}} %{{size_download}}' {url}"
        for rep in range(args.reps):
            t = time.perf_counter()
            subprocess.run(["curl", "-sf", "-o", "/dev/null", url], check=True)
            direct.append(time.perf_counter() - t)
            out, code = fb.exec(sid, fetch, "bash")
            if code != 0:
                raise SystemExit(f"curl in the sandbox failed: {out!r}")
            secs, size = out.split()
            if int(float(size)) != args.mib << 20:
                raise SystemExit(f"the sandbox downloaded {size} bytes")
            sandboxed.append(float(secs))
            log(f"rep {rep + 1}: host {direct[-1]:.3f} s, sandbox {sandboxed[-1]:.3f} s")
        fb.destroy(sid)
        # What egress costs a new sandbox: create → first exec done.
        first_exec: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.reps * 2):
            for on in (False, True):
                t = time.perf_counter()
                status, body = fb.request("POST", "/v1/sandboxes", {"egress": on})
                assert status == 200, body
                sid = json.loads(body)["id"]
                out, code = fb.exec(sid, "1")
                first_exec[on].append(time.perf_counter() - t)
                fb.destroy(sid)
                # Steady state: the warm pool refills between creates.
                time.sleep(0.5)
        # The first network socket starts the way out (egress on) and waits
        # for it; with egress off it is made at once (the baseline).
        first_socket: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.reps * 2):
            for on in (False, True):
                status, body = fb.request("POST", "/v1/sandboxes", {"egress": on})
                assert status == 200, body
                sid = json.loads(body)["id"]
                out, code = fb.exec(sid, FIRST_SOCKET)
                assert code == 0, out
                first_socket[on].append(float(out))
                fb.destroy(sid)
                time.sleep(0.5)
        # Every later network socket is one round trip to the shim; unix
        # sockets are not held (the baseline).
        status, body = fb.request("POST", "/v1/sandboxes", {"egress": True})
        sid = json.loads(body)["id"]
        out, code = fb.exec(sid, SOCKET_COST)
        assert code == 0, out
        inet_us, unix_us = (float(v) for v in out.split())
        fb.destroy(sid)
    finally:
        fb.close()
        srv.stop()
        net.close()
    d, s = statistics.median(direct), statistics.median(sandboxed)
    lines = [
        f"{run_header()}; "
        f"a {args.mib} MB download over HTTP from a server in a network namespace made for the benchmark "
        f"(veth to the host), medians of {args.reps} runs, `curl -o /dev/null` on both sides.",
        "",
        "| client | time | throughput | vs host |",
        "|---|---|---|---|",
        f"| `curl` on the host (baseline) | {d:.3f} s | {args.mib / d:,.0f} MiB/s | 1.00× |",
        f"| `curl` in a sandbox, egress on (through pasta) | {s:.3f} s | {args.mib / s:,.0f} MiB/s | {d / s:.2f}× |",
        "",
        "| create → first exec done | p50 |",
        "|---|---|",
        f"| `egress: false` | {statistics.median(first_exec[False]) * 1000:.0f} ms |",
        f"| `egress: true` (nothing of its way out starts yet: it waits for the first network socket) | {statistics.median(first_exec[True]) * 1000:.0f} ms |",
        "",
        "| a new sandbox's first network socket (`socket.socket()`, in the REPL) | p50 | max |",
        "|---|---|---|",
        f"| `egress: false` (not held: the baseline) | {statistics.median(first_socket[False]) * 1000:.2f} ms | {max(first_socket[False]) * 1000:.2f} ms |",
        f"| `egress: true` (held until its way out runs: firewall, pasta, DNS proxy) | {statistics.median(first_socket[True]) * 1000:.1f} ms | {max(first_socket[True]) * 1000:.1f} ms |",
        "",
        "| each later socket (`socket()` + `close()`, best of 3 × 20,000) | time | vs unix |",
        "|---|---|---|",
        f"| `AF_UNIX` (not held: the baseline) | {unix_us:.1f} µs | 1.00× |",
        f"| `AF_INET` (one round trip to the family's shim, which lets it through) | {inet_us:.1f} µs | {inet_us / unix_us:.1f}× |",
        "",
        "pasta copies every byte between the sandbox's tap interface and a host socket in user space; "
        "the firewall in the sandbox's namespace adds one nftables lookup per packet.",
    ]
    write_section(args.docs, SECTION, "egress: a download through pasta vs the host (`bench/egress.py`)", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
