#!/usr/bin/env python3
"""Debian 13 templates against Debian 12 ones: what bench/run.py and
bench/fork.py measure, on `--debian 13` and `--debian 12` servers side by
side in one run.

    python3 bench/debian.py [--rounds 5]

Two servers (the built-ins of each release built first, e.g. with
`forkbox template build default --debian 12`) run at once on their own
state directories and the same templates directory. In each round, in
turn on each server:
  1. exec round trip of `print(1)` (the lean keep-alive client of run.py);
  2. create → first exec of `import pandas as pd; print(1)`, 300 ms apart
     (an agent's pause; without it each create's first exec races the
     pool's refill after the one before): the warm pool's
     zygote imported pandas, so this is as cheap as `print(1)`; beside it,
     what `import numpy, pandas` costs a fresh interpreter in the same
     sandbox (what every create would pay without the pool);
  3. fork(5) of a parent holding 256 MiB of numpy/pandas data, every child
     checked.
The table is p50 per release and the ratio 13 / 12. Results go to
docs/benchmarks.md (section `debian`). Nothing is asserted: a wrong answer
aborts, timings never do.
"""
from __future__ import annotations

import gc
import json
import sys
import time

from run import Forkbox, Series, Server, bench_args, check, fmt_ms, fmt_ratio, log, run_header, write_section

RELEASES = ("12", "13")
PARENT = ("import numpy as np, pandas as pd\n"
          "a = np.random.random(16 * 1024 * 1024)\n"
          "df = pd.DataFrame({f'c{i}': np.random.random(2 * 1024 * 1024) for i in range(8)})\n"
          "chk = repr((float(a[:4096].sum()), float(df.iloc[:4096].to_numpy().sum())))\nprint(chk)")
CHILD = "print(repr((float(a[:4096].sum()), float(df.iloc[:4096].to_numpy().sum()))) == chk)"
VERSIONS = ("import sys, numpy, pandas; print('%d.%d' % sys.version_info[:2], numpy.__version__, pandas.__version__)")
COLD_IMPORT = ("import subprocess, sys, time\nt = time.perf_counter()\n"
               "subprocess.run([sys.executable, '-c', 'import numpy, pandas'], check=True)\n"
               "print(round((time.perf_counter() - t) * 1000, 3))")


class ReleaseServer(Server):
    """run.py's server, serving the built-ins of one Debian release (built already)."""

    def __init__(self, release: str, *a, **kw):
        super().__init__(*a, **kw)
        self.release = release

    def command(self) -> list[str]:
        return super().command() + ["--debian", self.release, "--no-build-templates"]


def exec_ok(fb: Forkbox, sid: str, code: str, what: str) -> str:
    out, rc = fb.exec(sid, code)
    if rc != 0:
        raise RuntimeError(f"{what}: exit {rc}: {out[-500:]!r}")
    return out.strip()


def one_round(fb: Forkbox, s: dict[str, Series], calls: int, creates: int, forks: int, parent: str, gap: float) -> None:
    sid = fb.create()
    try:
        for _ in range(5):
            fb.exec(sid, "print(1)")
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            out, rc = fb.exec(sid, "print(1)")
            s["exec"].add_ns(time.perf_counter_ns() - t0)
            check(out, rc, "exec")
        s["cold"].samples_ms.append(float(exec_ok(fb, sid, COLD_IMPORT, "a fresh interpreter's import")))
    finally:
        fb.destroy(sid)
    for _ in range(creates):
        # The pool refills a spare after each create (a fork of the zygote,
        # ~10 ms of CPU on a 2-core machine): without a pause, the next
        # create's first exec races it, on this server or the other.
        time.sleep(gap)
        gc.collect()
        t0 = time.perf_counter_ns()
        new = fb.create()
        out, rc = fb.exec(new, "import pandas as pd; print(1)")
        s["create"].add_ns(time.perf_counter_ns() - t0)
        check(out, rc, "create → import pandas")
        fb.destroy(new)
    for _ in range(forks):
        time.sleep(gap)
        t0 = time.perf_counter_ns()
        st, b = fb.request("POST", f"/v1/sandboxes/{parent}/fork", {"n": 5})
        s["fork"].add_ns(time.perf_counter_ns() - t0)
        if st != 200:
            raise RuntimeError(f"fork: HTTP {st}: {b[:300]!r}")
        kids = json.loads(b)["children"]
        for k in kids:
            if exec_ok(fb, k, CHILD, "fork child") != "True":
                raise RuntimeError(f"fork child {k} lost the parent's data")
            fb.destroy(k)


def render(series: dict[str, dict[str, Series]], versions: dict[str, str], args) -> str:
    rows = [("exec", "exec round trip, `print(1)`"),
            ("create", "create → first exec of `import pandas as pd; print(1)` (warm pool)"),
            ("cold", "a fresh `python3 -c 'import numpy, pandas'` in the sandbox (no pool)"),
            ("fork", "fork(5) of a parent holding 256 MiB of numpy/pandas data")]
    out = ["| what (p50, ms) | Debian 12 | Debian 13 | 13 / 12 | n each |", "|---|---:|---:|---:|---:|"]
    for key, label in rows:
        a, b = series["12"][key], series["13"][key]
        out.append(f"| {label} | {fmt_ms(a.p50)} | {fmt_ms(b.p50)} | {fmt_ratio(b.p50, a.p50)} | {b.n} |")
    out.append("")
    for r in RELEASES:
        py, np_, pd_ = versions[r].split()
        out.append(f"- Debian {r}: Python {py}, numpy {np_}, pandas {pd_}.")
    out.append("- Both servers run at once, the releases taking turns in each of "
               f"{args.rounds} rounds, so machine noise hits both alike; creates and forks are "
               f"{args.gap_ms:.0f} ms apart, so that each one's warm-pool refill is not in the next one's time.")
    out.append(f"\nRun: {run_header()}; reproduce with `python3 bench/debian.py --rounds {args.rounds}`.")
    return "\n".join(out)


def main() -> int:
    ap = bench_args(__doc__, "/var/lib/forkbox-bench-debian")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100, help="exec calls per round (default 100)")
    ap.add_argument("--creates", type=int, default=10, help="creates per round (default 10)")
    ap.add_argument("--forks", type=int, default=3, help="fork(5) calls per round (default 3)")
    ap.add_argument("--gap-ms", type=float, default=300, help="pause before each create and fork, as an agent thinks (default 300)")
    ap.add_argument("--ready-timeout", type=float, default=300)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    servers = {r: ReleaseServer(r, args.bin, f"{args.state_dir}-{r}", args.templates_dir, args.ready_timeout)
               for r in RELEASES}
    clients: dict[str, Forkbox] = {}
    parents: dict[str, str] = {}
    series = {r: {k: Series(k, k) for k in ("exec", "create", "cold", "fork")} for r in RELEASES}
    versions: dict[str, str] = {}
    try:
        for r, srv in servers.items():
            srv.start()
            fb = clients[r] = Forkbox(srv.url)
            st, b = fb.request("POST", "/v1/sandboxes", {"ram_mib": 2048})
            if st != 200:
                raise RuntimeError(f"create the parent: HTTP {st}: {b[:300]!r}")
            parents[r] = json.loads(b)["id"]
            exec_ok(fb, parents[r], PARENT, "the fork parent's data")
            versions[r] = exec_ok(fb, parents[r], VERSIONS, "versions")
            log(f"Debian {r}: {versions[r]}")
        for i in range(args.rounds):
            log(f"round {i + 1}/{args.rounds}")
            for r in (RELEASES if i % 2 == 0 else RELEASES[::-1]):
                one_round(clients[r], series[r], args.calls, args.creates, args.forks, parents[r], args.gap_ms / 1000)
    finally:
        for r, fb in clients.items():
            if parents.get(r):
                try:
                    fb.destroy(parents[r])
                except Exception:
                    pass
            fb.close()
        for srv in servers.values():
            srv.stop()
    body = render(series, versions, args)
    print(body)
    if not args.no_docs:
        write_section(args.docs, "debian", "Debian 13 against Debian 12 templates (bench/debian.py)", body)
        log(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
