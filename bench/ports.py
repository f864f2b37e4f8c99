#!/usr/bin/env python3
"""ports benchmark: the latency the port proxy adds to a small GET, and the
throughput of a 100 MiB download through it, each beside the same request to
the same server run directly on the host's loopback (no forkbox in between),
in the same run.

    python3 bench/ports.py [--bin target/release/forkbox] [--requests 500] [--mib 100] [--reps 5]

The service is the same stdlib `http.server` (HTTP/1.1 keep-alive,
TCP_NODELAY) in the sandbox and on the host. Small GETs go over one
keep-alive connection with the stdlib client, interleaved in rounds, plus
direct GETs on a new connection each (what a fresh connection costs the
service itself, as the proxy opens one per request); downloads use curl. Every answer is
checked (size, and the small file's bytes). Results go to docs/benchmarks.md
between the `bench:ports` markers.
"""
from __future__ import annotations

import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import (Forkbox, NoDelayConnection, Series, Server, bench_args,  # noqa: E402
                 fmt_ms, free_port, log, run_header, write_section)

SECTION = "ports"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-ports"
PORT = 8000
SMALL = b"x" * 1024

# The same service on both sides: static files, keep-alive.
SERVICE = """
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), functools.partial(H, directory=sys.argv[2])).serve_forever()
"""


def wait_port(port: int) -> None:
    import socket
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.025)
    raise SystemExit(f"the host service on port {port} did not start")


def get_series(conn: NoDelayConnection, path: str, series: Series, n: int, headers: dict) -> None:
    for _ in range(n):
        t = time.perf_counter_ns()
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        series.add_ns(time.perf_counter_ns() - t)
        if r.status != 200 or body != SMALL:
            raise SystemExit(f"GET {path}: HTTP {r.status}, {len(body)} bytes")


def fresh_series(port: int, path: str, series: Series, n: int) -> None:
    """GETs on a new connection each (closed after the answer)."""
    for _ in range(n):
        t = time.perf_counter_ns()
        conn = NoDelayConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", path, headers={"Connection": "close"})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        series.add_ns(time.perf_counter_ns() - t)
        if r.status != 200 or body != SMALL:
            raise SystemExit(f"GET {path}: HTTP {r.status}, {len(body)} bytes")


def download(url: str, size: int) -> float:
    t = time.perf_counter()
    out = subprocess.run(["curl", "-sf", url, "-o", "/dev/null", "-w", "%{size_download}"], check=True, capture_output=True, text=True)
    took = time.perf_counter() - t
    if int(out.stdout) != size:
        raise SystemExit(f"{url}: {out.stdout} bytes, expected {size}")
    return took


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not shutil.which("curl"):
        raise SystemExit("bench/ports.py needs curl (apt-get install curl)")
    size = args.mib << 20

    # The host side: the same script, files and port kind, on the host's loopback.
    www = tempfile.mkdtemp(prefix="forkbox-bench-ports-")
    with open(os.path.join(www, "small.txt"), "wb") as f:
        f.write(SMALL)
    with open(os.path.join(www, "big.bin"), "wb") as f:
        for _ in range(args.mib):
            f.write(os.urandom(1 << 20))
    script = os.path.join(www, "service.py")
    with open(script, "w") as f:
        f.write(SERVICE)
    host_port = free_port()
    host_srv = subprocess.Popen([sys.executable, script, str(host_port), www], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    srv.start()
    fb = Forkbox(srv.url)
    small_direct = Series("direct", "direct to the host's loopback")
    small_fresh = Series("fresh", "direct, a new connection per request")
    small_proxy = Series("proxy", "through the port proxy")
    dl_direct, dl_proxy = [], []
    try:
        wait_port(host_port)
        sid = fb.create()
        fb.conn.request("PUT", f"/v1/sandboxes/{sid}/files?path=/root/service.py", body=SERVICE.encode())
        r = fb.conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"upload service.py: HTTP {r.status}")
        out, code = fb.exec(sid, f"mkdir -p /root/www && head -c 1024 /dev/zero | tr '\\0' x > /root/www/small.txt && "
                                 f"head -c {size} /dev/urandom > /root/www/big.bin && "
                                 f"(nohup setsid python3 /root/service.py {PORT} /root/www >/tmp/service.log 2>&1 </dev/null &) && "
                                 f"for i in $(seq 400); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {PORT}))' 2>/dev/null && break; sleep 0.025; done && echo 1",
                            "bash")
        if out.strip() != "1" or code != 0:
            raise SystemExit(f"could not start the service in the sandbox: {out!r} exit {code}")
        proxy_path = f"/v1/sandboxes/{sid}/ports/{PORT}"

        direct = NoDelayConnection("127.0.0.1", host_port, timeout=60)
        via = NoDelayConnection("127.0.0.1", srv.port, timeout=60)
        warm = Series("warm", "")
        get_series(direct, "/small.txt", warm, args.warmup, {})
        get_series(via, proxy_path + "/small.txt", warm, args.warmup, {})
        NoDelayConnection.connects = 0
        per_round = max(1, args.requests // args.rounds)
        for rnd in range(args.rounds):
            get_series(direct, "/small.txt", small_direct, per_round, {})
            get_series(via, proxy_path + "/small.txt", small_proxy, per_round, {})
            fresh_series(host_port, "/small.txt", small_fresh, per_round)
            log(f"round {rnd + 1}/{args.rounds}: direct p50 {small_direct.p50:.3f} ms, proxy p50 {small_proxy.p50:.3f} ms")
        NoDelayConnection.connects -= small_fresh.n
        if NoDelayConnection.connects:
            log(f"warning: the client reconnected {NoDelayConnection.connects} times during the timed calls")
        direct.close()
        via.close()

        for rep in range(args.reps):
            dl_direct.append(download(f"http://127.0.0.1:{host_port}/big.bin", size))
            dl_proxy.append(download(f"{srv.url}{proxy_path}/big.bin", size))
            log(f"rep {rep + 1}: {args.mib} MiB direct {dl_direct[-1]:.3f} s, proxy {dl_proxy[-1]:.3f} s")
        fb.destroy(sid)
    finally:
        fb.close()
        srv.stop()
        host_srv.kill()
        host_srv.wait()
        shutil.rmtree(www, ignore_errors=True)

    d, p = statistics.median(dl_direct), statistics.median(dl_proxy)

    def mibs(t: float) -> str:
        return f"{args.mib / t:,.0f} MiB/s"

    def row(s: Series) -> str:
        return f"| {s.label} | {fmt_ms(s.p50)} | {fmt_ms(s.pct(99))} | {fmt_ms(s.mean)} |"
    lines = [
        f"{run_header()}. "
        f"The service is Python's `http.server` (HTTP/1.1 keep-alive, TCP_NODELAY, the same script) in a sandbox and on the host; "
        f"{small_direct.n} GETs of a 1 KiB file each way over one keep-alive connection (stdlib client, "
        f"{args.rounds} interleaved rounds, {args.warmup} warm-up calls), and {args.reps} downloads of a "
        f"{args.mib} MiB file with curl (median).",
        "",
        "| 1 KiB GET | p50 ms | p99 ms | mean ms |",
        "|---|---|---|---|",
        row(small_direct),
        row(small_fresh),
        row(small_proxy),
        f"| **added by the proxy** (vs keep-alive direct) | **{fmt_ms(small_proxy.p50 - small_direct.p50)}** | "
        f"{fmt_ms(small_proxy.pct(99) - small_direct.pct(99))} | {fmt_ms(small_proxy.mean - small_direct.mean)} |",
        "",
        f"| {args.mib} MiB download | time | throughput | vs direct |",
        "|---|---|---|---|",
        f"| direct to the host's loopback | {d:.3f} s | {mibs(d)} | 1.00× |",
        f"| through the port proxy | {p:.3f} s | {mibs(p)} | {d / p:.2f}× |",
        "",
        "Each proxied request opens a new connection inside the sandbox's network namespace (a short-lived thread "
        "enters it to create the socket), so the added latency is one more HTTP hop on loopback plus a new "
        "connection to the service, which costs the service itself something (`http.server` starts a thread per "
        "connection): the row \"a new connection per request\" shows that part without forkbox. The client's own "
        "connection to forkbox is kept alive. Bodies stream through without being buffered.",
    ]
    write_section(args.docs, SECTION, "ports: a GET and a download through the port proxy vs direct (`bench/ports.py`)", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
