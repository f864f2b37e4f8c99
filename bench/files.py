#!/usr/bin/env python3
"""files benchmark: upload and download of a 1 GiB file through the files API
(`PUT`/`GET /v1/sandboxes/{id}/files`, with curl as the client), beside a
plain `cp` of the same file on the same disk, in the same run.

    python3 bench/files.py [--bin target/release/forkbox] [--reps 3] [--mib 1024]

Each upload is checked (sha256 inside the sandbox) once, outside the timing.
Results go to docs/benchmarks.md between the `bench:files` markers.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import Forkbox, Server, bench_args, check, log, run_header, write_section  # noqa: E402

SECTION = "files"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-files"


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()
    if not shutil.which("curl"):
        raise SystemExit("bench/files.py needs curl (apt-get install curl)")
    work = args.state_dir.rstrip("/") + "-data"
    os.makedirs(work, exist_ok=True)
    src, dst = os.path.join(work, "src.bin"), os.path.join(work, "dst.bin")
    log(f"writing {args.mib} MiB of random data to {src}")
    digest = hashlib.sha256()
    with open(src, "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(args.mib):
            chunk = i.to_bytes(8, "little") + block[8:]
            digest.update(chunk)
            f.write(chunk)
    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    srv.start()
    fb = Forkbox(srv.url)
    cp, up, down = [], [], []
    try:
        sid = fb.create()
        url = f"{srv.url}/v1/sandboxes/{sid}/files?path=/root/big.bin"
        for rep in range(args.reps):
            # The same file, the same disk, each from a clean writeback state.
            os.sync()
            cp.append(timed(["cp", src, dst]))
            os.remove(dst)
            fb.request("DELETE", f"/v1/sandboxes/{sid}/files?path=/root/big.bin")
            os.sync()
            up.append(timed(["curl", "-sf", "-X", "PUT", "--upload-file", src, "-H", "Expect:", url, "-o", "/dev/null"]))
            if rep == 0:
                out, code = fb.exec(sid, f"test $(sha256sum /root/big.bin | cut -d' ' -f1) = {digest.hexdigest()} && echo 1", "bash")
                check(out, code, "checksum")
                if out.strip() != "1":
                    raise SystemExit("the uploaded file differs from the source")
            os.sync()
            down.append(timed(["curl", "-sf", url, "-o", "/dev/null"]))
            log(f"rep {rep + 1}: cp {cp[-1]:.2f} s, upload {up[-1]:.2f} s, download {down[-1]:.2f} s")
        fb.destroy(sid)
    finally:
        fb.close()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)

    def mibs(t: float) -> str:
        return f"{args.mib / t:,.0f} MiB/s"
    c, u, d = statistics.median(cp), statistics.median(up), statistics.median(down)
    lines = [
        f"{run_header()}; "
        f"a {args.mib} MiB file of random data, medians of {args.reps} runs, `sync` before each. The client is curl "
        "on loopback; the sandbox's disk is the server's btrfs volume image on the same disk as the `cp`.",
        "",
        "| transfer | time | throughput | vs `cp` on the same disk |",
        "|---|---|---|---|",
        f"| `cp` (baseline) | {c:.2f} s | {mibs(c)} | 1.00× |",
        f"| upload (`PUT .../files`) | {u:.2f} s | {mibs(u)} | {c / u:.2f}× |",
        f"| download (`GET .../files`) | {d:.2f} s | {mibs(d)} | {c / d:.2f}× |",
        "",
        "An upload is a streamed HTTP body written through a bounded queue to a temporary file in the sandbox, "
        "renamed into place at the end; the server holds a few 64 KiB chunks of it at a time "
        "(tests/e2e/test_files.py checks the server's RSS during a 2 GiB round trip). "
        "A download streams 256 KiB reads of the open file. Neither side waits for the disk (no fsync), and on a "
        "shared VM single runs vary by 2-3×: read the ratio as \"about as fast as a local copy\", not as a "
        "precise figure.",
    ]
    write_section(args.docs, SECTION, "files: upload and download vs `cp` (`bench/files.py`)", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
