#!/usr/bin/env python3
"""forkbox fork benchmarks: fork latency, memory per idle child and create →
first exec, beside a bare `os.fork()` of a Python process holding the same
data, measured in one run on this machine.

    pip install -r bench/requirements.txt && python3 bench/fork.py

What is measured (see bench/README.md for the details):

1. fork latency: the HTTP round trip of `POST /v1/sandboxes/{id}/fork
   {"n": N}` for N = 1, 5, 32, from (a) a parent REPL with a few small
   variables and (b) a parent REPL holding ~1 GiB of numpy/pandas data
   (a 512 MiB array and a 512 MiB DataFrame, every page written). The
   children are destroyed after each sample, untimed. When the script
   started the server, the server's `fork timings` debug lines split each
   sample into making the members (freeze, snapshot, jails) and the rest
   (the REPL forking itself into them, until every child is ready).
2. baseline: in a plain host `python3` (the bench interpreter) holding the
   same data, `os.fork()` N times in a row until every child has written a
   byte to a pipe. Both run interleaved in rounds; ratios forkbox / bare.
3. extra memory per idle child: after fork(5) of the 1 GiB parent and a
   pause, each child's PSS, USS and page tables (/proc/<pid>/smaps_rollup,
   /proc/<pid>/status) and its cgroup's memory usage, and how much the sum
   of PSS over the whole family grew; the same for a bare os.fork().
4. create → first exec done: `POST /v1/sandboxes` then `print(1)` until
   its exit event (the sandbox is destroyed afterwards, untimed).

It prints a table with ratios and the targets of docs/architecture.md#targets, and writes
the same into docs/benchmarks.md between `<!-- bench:fork:start -->` and
`<!-- bench:fork:end -->` (other sections are left alone). A measurement,
not a test: outputs are checked (a wrong answer aborts the run), timings
never are.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import (  # noqa: E402  (the shared server/client/statistics helpers)
    ANSI, DEFAULT_BIN, DEFAULT_TEMPLATES_DIR, DOCS, Forkbox, Series, Server, check, fmt_ms, fmt_ratio, log, machine, write_section,
)

SECTION = "fork"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-fork"
FORK_NS = (1, 5, 32)
MEM_CHILDREN = 5

# Targets of docs/architecture.md#targets.
TARGET_FORK5_MS = 30.0
TARGET_FORK5_VS_BARE = 3.0
TARGET_FORK32_MS = 150.0
TARGET_CHILD_MIB = 10.0
TARGET_CREATE_MS = 10.0
TARGET_CREATE_P95_MS = 20.0

# The parents' states. Each sets `chk` to a fingerprint of the state and
# prints it; CHECK recomputes it in a child, which must print True.
STATES = {
    "small": {
        "label": "small state (a few variables)",
        "setup": "x = 42\ns = 'hello'\nl = list(range(1000))\nd = {'k': 'v'}\n"
                 "chk = repr((x, s, sum(l), d))\nprint(chk)",
        "check": "print(repr((x, s, sum(l), d)) == chk)",
    },
    "big": {
        "label": "1 GiB of numpy/pandas data",
        # np.random.random writes every element, so every page is touched;
        # the DataFrame's columns are consolidated into one 512 MiB block.
        "setup": "import numpy as np, pandas as pd\n"
                 "a = np.random.random(64 * 1024 * 1024)\n"
                 "df = pd.DataFrame({f'c{i}': np.random.random(8 * 1024 * 1024) for i in range(8)})\n"
                 "nbytes = int(a.nbytes + df.memory_usage(index=False).sum())\n"
                 "chk = repr((float(a[:4096].sum()), float(df.iloc[:4096].to_numpy().sum()), nbytes))\n"
                 "print(chk)",
        "check": "print(repr((float(a[:4096].sum()), float(df.iloc[:4096].to_numpy().sum()), "
                 "int(a.nbytes + df.memory_usage(index=False).sum()))) == chk)",
    },
}
BIG_BYTES = 1 << 30
# Prints which of a template's usual heavy modules a REPL has imported.
HELD_MODULES = ("import sys\nprint(','.join(m for m in ('numpy', 'pandas', 'matplotlib', 'scipy', 'sklearn') "
                "if m in sys.modules))")

# The bare baseline: a host python3 holding the same state, driven over its
# stdin/stdout one JSON line per command.
WORKER = r'''
import gc, json, os, signal, sys, time
mode, setup, preimport = sys.argv[1], sys.argv[2], sys.argv[3]
for name in filter(None, preimport.split(",")):
    __import__(name)  # what the forkbox parent's REPL holds besides its state
out = sys.stdout
sys.stdout = open(os.devnull, "w")  # setup prints its fingerprint; keep the protocol clean
exec(setup)
sys.stdout = out

def rollup(pid):
    r = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            p = line.split()
            if len(p) >= 2 and p[0].endswith(":") and p[1].isdigit():
                r[p[0][:-1]] = int(p[1])
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmPTE:"):
                r["VmPTE"] = int(line.split()[1])
    return r

def fork_n(n, hold=None):
    """fork n children in a row; time until each has written a byte. The
    children then wait (as forkbox's idle children do) until killed."""
    r, w = os.pipe()
    pids = []
    gc.collect()
    t0 = time.perf_counter_ns()
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    os.write(w, b"x")
                    while True:
                        signal.pause()
                finally:
                    os._exit(0)
            pids.append(pid)
        got = 0
        while got < n:
            got += len(os.read(r, n - got))
        ns = time.perf_counter_ns() - t0
        extra = hold(pids) if hold else None
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
    return ns, extra

for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "info":
        v = {"python": sys.version.split()[0]}
        for m in ("numpy", "pandas"):
            if m in sys.modules:
                v[m] = sys.modules[m].__version__
        reply = {"self": rollup(os.getpid()), "versions": v, "chk": chk}
    elif cmd["op"] == "fork":
        reply = {"ns": [fork_n(cmd["n"])[0] for _ in range(cmd["k"])]}
    elif cmd["op"] == "mem":
        before = rollup(os.getpid())
        def hold(pids):
            time.sleep(cmd["wait"])
            return {"parent": rollup(os.getpid()), "children": [rollup(p) for p in pids]}
        _, m = fork_n(cmd["n"], hold)
        m["parent_before"] = before
        reply = m
    else:
        reply = {"error": f"unknown op {cmd['op']!r}"}
    out.write(json.dumps(reply) + "\n")
    out.flush()
'''


class BareWorker:
    """A host python3 holding one of STATES, and the modules `preimport`
    the forkbox parent's REPL holds, forking on request."""

    def __init__(self, state: str, preimport: list[str]):
        try:
            import numpy  # noqa: F401
            import pandas  # noqa: F401
        except ImportError:
            raise SystemExit(f"{sys.executable} lacks numpy/pandas: pip install -r bench/requirements.txt")
        self.preimport = preimport
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, state, STATES[state]["setup"], ",".join(preimport)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self.call(op="info")
        if self.info["chk"] is None:
            raise RuntimeError(f"bare {state} worker: no state")

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bare python3 worker died (exit {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"bare worker: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ── the host's view of a sandbox ───────────────────────────────────────────

def rollup(pid: int) -> dict:
    """smaps_rollup fields (kB) and VmPTE of a process; {} if it is gone."""
    r: dict = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                p = line.split()
                if len(p) >= 2 and p[0].endswith(":") and p[1].isdigit():
                    r[p[0][:-1]] = int(p[1])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmPTE:"):
                    r["VmPTE"] = int(line.split()[1])
    except OSError:
        return {}
    return r


def uss_kib(r: dict) -> int:
    return r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)


def cgroup_file(sid: str, v1_controller: str, name: str) -> str | None:
    """A file of sandbox `sid`'s cgroup: cgroup v1 (/sys/fs/cgroup/<ctl>/forkbox-*/<id>)
    or v2 (/sys/fs/cgroup/forkbox-*/<id>)."""
    for pattern in (f"/sys/fs/cgroup/{v1_controller}/forkbox-*/{sid}/{name}", f"/sys/fs/cgroup/forkbox-*/{sid}/{name}"):
        hits = glob.glob(pattern)
        if hits:
            return hits[0]
    return None


def cgroup_pids(sid: str) -> list[int]:
    path = cgroup_file(sid, "pids", "cgroup.procs")
    if path is None:
        raise RuntimeError(f"no cgroup found for {sid} (is the server on this host?)")
    with open(path) as f:
        return [int(x) for x in f.read().split()]


def cgroup_memory_kib(sid: str) -> float:
    path = cgroup_file(sid, "memory", "memory.usage_in_bytes") or cgroup_file(sid, "memory", "memory.current")
    if path is None:
        return float("nan")
    with open(path) as f:
        return int(f.read()) / 1024


def is_repl(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return os.path.basename(argv[0]).startswith(b"python3") and b"-u" in argv[1:3] and b"-c" in argv[1:4]


def sandboxes_pss_kib(fb: Forkbox) -> int:
    """Σ PSS of every sandbox process but the fork spares' (hollow members
    kept for a family's next fork, which come and go with the refills).
    The parent came from the warm pool's zygote and shares its modules'
    pages with the zygote and every sandbox forked from it: as children
    map those pages too, the family's share of them grows while the pool's
    shrinks, and only a sum over both counts what is new."""
    st, body = fb.request("GET", "/v1/pool")
    spares = set(json.loads(body).get("fork_spares", [])) if st == 200 else set()
    total = 0
    procs = glob.glob("/sys/fs/cgroup/pids/forkbox-*/*/cgroup.procs") or glob.glob("/sys/fs/cgroup/forkbox-*/*/cgroup.procs")
    for path in procs:
        if os.path.basename(os.path.dirname(path)) in spares:
            continue
        try:
            with open(path) as f:
                pids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            continue
        total += sum(rollup(p).get("Pss", 0) for p in pids)
    return total


def repl_pid(sid: str) -> int:
    pids = [p for p in cgroup_pids(sid) if is_repl(p)]
    if len(pids) != 1:
        raise RuntimeError(f"{sid}: expected one REPL process in its cgroup, found {pids}")
    return pids[0]


# ── forkbox ────────────────────────────────────────────────────────────────

class ForkServer(Server):
    """run.py's server, optionally without building missing templates."""

    def __init__(self, *a, build_templates: bool = True, **kw):
        super().__init__(*a, **kw)
        self.build_templates = build_templates

    def command(self) -> list[str]:
        return super().command() + ([] if self.build_templates else ["--no-build-templates"])


def run_ok(fb: Forkbox, sid: str, code: str, what: str) -> str:
    out, rc = fb.exec(sid, code)
    if rc != 0:
        raise RuntimeError(f"{what}: exit {rc}: {out[-500:]!r}")
    return out.strip()


def wait_warm(fb: Forkbox, template: str, timeout: float = 120.0) -> None:
    """Wait until the warm pool has sandboxes of `template` ready, so the
    parents are what a create gives a user (forked from the zygote, its
    modules imported), not a sandbox made the slow way while it warms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st, b = fb.request("GET", "/v1/pool")
        if st == 200 and json.loads(b).get("templates", {}).get(template, {}).get("ready"):
            return
        time.sleep(0.5)
    log(f"the warm pool of {template} is not ready after {timeout:.0f} s; the parents are made the slow way")


def make_parent(fb: Forkbox, state: str, template: str, ram_mib: int) -> tuple[str, str]:
    st, b = fb.request("POST", "/v1/sandboxes", {"template": template, "ram_mib": ram_mib,
                                                 "idle_timeout_seconds": 7200, "timeout_seconds": 7200})
    if st != 200:
        raise RuntimeError(f"create: HTTP {st}: {b[:300]!r}")
    sid = json.loads(b)["id"]
    chk = run_ok(fb, sid, STATES[state]["setup"], f"{state} parent setup")
    return sid, chk


def fork(fb: Forkbox, sid: str, n: int) -> tuple[int, list[str]]:
    t0 = time.perf_counter_ns()
    st, b = fb.request("POST", f"/v1/sandboxes/{sid}/fork", {"n": n})
    ns = time.perf_counter_ns() - t0
    if st != 200:
        raise RuntimeError(f"fork(n={n}): HTTP {st}: {b[:300]!r}")
    children = json.loads(b)["children"]
    if len(children) != n or len(set(children)) != n:
        raise RuntimeError(f"fork(n={n}) answered {children}")
    return ns, children


def check_children(fb: Forkbox, state: str, children: list[str]) -> None:
    for c in children:
        got = run_ok(fb, c, STATES[state]["check"], f"fork child of the {state} parent")
        if got != "True":
            raise RuntimeError(f"fork child {c} of the {state} parent does not hold the parent's state: {got!r}")


def destroy_all(fb: Forkbox, ids: list[str]) -> None:
    for c in ids:
        fb.destroy(c)


def fork_timings(log_text: str) -> dict[str, tuple[float, float]]:
    """First child id → (members_ms, total_ms) from the server's debug line
    `fork timings sandbox=P n=N members_ms=… answered_ms=… total_ms=…` and the info line
    `forked sandbox=P children=[…]` that follows it."""
    pending: dict[str, tuple[float, float]] = {}
    out: dict[str, tuple[float, float]] = {}
    for line in log_text.splitlines():
        line = ANSI.sub("", line)
        if "fork timings" in line:
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            try:
                pending[kv["sandbox"]] = (float(kv["members_ms"]), float(kv["total_ms"]))
            except (KeyError, ValueError):
                pass
        elif " forked " in line:
            m = re.search(r"sandbox=(\S+).*children=\[([^\]]*)\]", line)
            if m and m.group(1) in pending:
                ids = re.findall(r"sb-[a-z2-7]+", m.group(2))
                if ids:
                    out[ids[0]] = pending.pop(m.group(1))
    return out


def create_split(log_text: str, ids: list[str]) -> list[Series]:
    """Server-side timings of the counted creates from the server's
    `created sandbox=… [pool=true] [jail_ms=…] total_ms=…` lines: the create
    handler's total, and how many creates the warm pool served."""
    want = set(ids)
    total = Series("srv_total", "… server log: create handler total")
    jail = Series("srv_jail", "… server log: jail (creates not served by the warm pool)")
    pool = 0
    for line in log_text.splitlines():
        line = ANSI.sub("", line)
        if " created " not in line:
            continue
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        if kv.get("sandbox") not in want or "total_ms" not in kv:
            continue
        try:
            total.samples_ms.append(float(kv["total_ms"]))
            if "jail_ms" in kv:
                jail.samples_ms.append(float(kv["jail_ms"]))
        except ValueError:
            continue
        pool += kv.get("pool") == "true"
    if not total.n:
        return []
    total.label += f" (warm pool served {pool} of {total.n})"
    return [total] + ([jail] if jail.n else [])


# ── the benchmark ──────────────────────────────────────────────────────────

def bench_fork(fb: Forkbox, parents: dict[str, str], workers: dict[str, BareWorker], args) -> tuple[dict, dict]:
    """Forkbox fork(n) and bare fork ×n, interleaved in rounds.
    Returns ({(state, n): Series}, {(state, n): [first child id of each timed sample]})."""
    want = {n: (args.samples_32 if n == 32 else args.samples) for n in FORK_NS}
    fbs = {(s, n): Series(f"fb_{s}_{n}", f"forkbox fork({n}), {STATES[s]['label']}") for s in parents for n in FORK_NS}
    bare = {(s, n): Series(f"bare_{s}_{n}", f"bare os.fork() ×{n}") for s in parents for n in FORK_NS}
    firsts: dict = {k: [] for k in fbs}
    for s, sid in parents.items():
        for n in FORK_NS:
            log(f"warm-up: fork({n}) of the {s} parent ×{args.warmup} (children checked)")
            for _ in range(args.warmup):
                _, children = fork(fb, sid, n)
                check_children(fb, s, children)
                destroy_all(fb, children)
            workers[s].call(op="fork", n=n, k=args.warmup)
    rounds = args.rounds
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        for s, sid in parents.items():
            for n in FORK_NS:
                k = want[n] // rounds + (1 if r < want[n] % rounds else 0)
                for _ in range(k):
                    gc.collect()
                    ns, children = fork(fb, sid, n)
                    fbs[(s, n)].add_ns(ns)
                    firsts[(s, n)].append(children[0])
                    destroy_all(fb, children)  # not timed
                kb = args.bare_samples // rounds + (1 if r < args.bare_samples % rounds else 0)
                for ns in workers[s].call(op="fork", n=n, k=kb)["ns"]:
                    bare[(s, n)].add_ns(ns)
    return {"fb": fbs, "bare": bare}, firsts


def bench_memory(fb: Forkbox, sid: str, worker: BareWorker, wait: float) -> dict:
    """fork(MEM_CHILDREN) of the 1 GiB parent; after `wait` seconds, what the
    idle children cost."""
    n = MEM_CHILDREN
    log(f"memory: fork({n}) of the 1 GiB parent, measured {wait:g} s later")
    family_before = sum(rollup(p).get("Pss", 0) for p in cgroup_pids(sid))
    all_before = sandboxes_pss_kib(fb)
    parent_repl = rollup(repl_pid(sid))
    _, children = fork(fb, sid, n)
    try:
        time.sleep(wait)
        kids = []
        for c in children:
            pids = cgroup_pids(c)
            rp = repl_pid(c)
            r = rollup(rp)
            others = [rollup(p) for p in pids if p != rp]
            kids.append({"pss": r.get("Pss", 0), "uss": uss_kib(r), "pte": r.get("VmPTE", 0),
                         "others_uss": sum(uss_kib(o) for o in others), "others_pss": sum(o.get("Pss", 0) for o in others),
                         "others_n": len(others), "cgroup": cgroup_memory_kib(c)})
        family_after = sum(rollup(p).get("Pss", 0) for p in cgroup_pids(sid))
        family_after += sum(rollup(p).get("Pss", 0) for c in children for p in cgroup_pids(c))
        all_after = sandboxes_pss_kib(fb)
        check_children(fb, "big", children)  # after the measurement: an exec touches memory
    finally:
        destroy_all(fb, children)
    bare = worker.call(op="mem", n=n, wait=wait)
    bare_before = bare["parent_before"].get("Pss", 0)
    bare_after = bare["parent"].get("Pss", 0) + sum(c.get("Pss", 0) for c in bare["children"])

    def mean(xs):
        return sum(xs) / len(xs) / 1024  # kB → MiB

    return {
        "n": n, "wait": wait, "parent": parent_repl, "bare_parent": bare["parent_before"],
        "fb": {
            "pss": mean([k["pss"] for k in kids]),
            "uss": mean([k["uss"] for k in kids]),
            "pte": mean([k["pte"] for k in kids]),
            "others_uss": mean([k["others_uss"] for k in kids]),
            "others_n": kids[0]["others_n"],
            "cgroup": mean([k["cgroup"] for k in kids]),
            "delta_family_pss": (family_after - family_before) / n / 1024,
            "delta_pss": (all_after - all_before) / n / 1024,
        },
        "bare": {
            "pss": mean([c.get("Pss", 0) for c in bare["children"]]),
            "uss": mean([uss_kib(c) for c in bare["children"]]),
            "pte": mean([c.get("VmPTE", 0) for c in bare["children"]]),
            "delta_pss": (bare_after - bare_before) / n / 1024,
        },
    }


def bench_create(fb: Forkbox, creates: int, warmup: int) -> tuple[list[Series], list[str]]:
    total = Series("create", "forkbox `POST /v1/sandboxes` → first `print(1)` exit event")
    post = Series("create_post", "… of which `POST /v1/sandboxes`")
    first = Series("create_exec", "… of which the first exec")
    ids: list[str] = []
    log(f"create → first exec: {warmup} warm-up + {creates} sandboxes")
    for i in range(warmup + creates):
        gc.collect()
        t0 = time.perf_counter_ns()
        sid = fb.create()
        t1 = time.perf_counter_ns()
        out, code = fb.exec(sid, "print(1)")
        t2 = time.perf_counter_ns()
        check(out, code, "forkbox first exec")
        fb.destroy(sid)  # not counted
        if i >= warmup:
            ids.append(sid)
            total.add_ns(t2 - t0)
            post.add_ns(t1 - t0)
            first.add_ns(t2 - t1)
    return [total, post, first], ids


# ── report ─────────────────────────────────────────────────────────────────

def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(lat: dict, split: dict, mem: dict, cr: list[Series], facts: dict, m: dict, args, cmdline: str,
           date: str) -> str:
    L: list[str] = []
    a = L.append
    fbs, bare = lat["fb"], lat["bare"]

    a("### Fork latency (ms)")
    a("")
    a("`POST /v1/sandboxes/{id}/fork {\"n\": N}` round trip, beside a bare `os.fork()` ×N of a host `python3` "
      "holding the same state (until every child has written a byte to a pipe). Ratio = forkbox / bare.")
    a("")
    a("| parent | n | forkbox p50 | forkbox p95 | server: members p50 | server: REPL fork → ready p50 "
      "| bare `os.fork()` ×n p50 | bare p95 | ratio p50 | ratio p95 |")
    a("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (s, n), f in fbs.items():
        b = bare[(s, n)]
        sp = split.get((s, n))
        a(f"| {STATES[s]['label']} | {n} | {fmt_ms(f.p50)} | {fmt_ms(f.pct(95))} "
          f"| {fmt_ms(sp[0].p50) if sp else '–'} | {fmt_ms(sp[1].p50) if sp else '–'} "
          f"| {fmt_ms(b.p50)} | {fmt_ms(b.pct(95))} | {fmt_ratio(f.p50, b.p50)} | {fmt_ratio(f.pct(95), b.pct(95))} |")
    a("")
    fm, bm = mem["fb"], mem["bare"]
    bare_extra = bm["delta_pss"] + bm["pte"]
    fb_extra = fm["delta_pss"] + fm["pte"]
    a(f"### Memory per idle child (fork({mem['n']}) of the 1 GiB parent, {mem['wait']:g} s later, mean per child, MiB)")
    a("")
    a("| what | forkbox child | bare `os.fork()` child |")
    a("|---|---:|---:|")
    a(f"| REPL process PSS (its 1/{mem['n'] + 1} share of the pages it shares with the parent and siblings; not extra memory) "
      f"| {fm['pss']:.1f} | {bm['pss']:.1f} |")
    a(f"| REPL process USS (Private_Clean + Private_Dirty) | {fm['uss']:.2f} | {bm['uss']:.2f} |")
    a(f"| REPL process page tables (VmPTE; kernel memory, in no PSS) | {fm['pte']:.2f} | {bm['pte']:.2f} |")
    a(f"| the child sandbox's other processes ({fm['others_n']}: its `forkbox-init`), USS | {fm['others_uss']:.2f} | – |")
    a(f"| the child's cgroup memory usage | {fm['cgroup']:.2f} | – |")
    a(f"| growth of Σ PSS over the family alone (parent + children, every process of their cgroups) / {mem['n']}: "
      f"also counts the share of the warm pool's pages that moves into the family | {fm['delta_family_pss']:.2f} | – |")
    a(f"| growth of Σ PSS over every sandbox process (the family, and the warm pool whose pages the parent shares; "
      f"not the fork spares) / {mem['n']}; bare: parent + children | {fm['delta_pss']:.2f} | {bm['delta_pss']:.2f} |")
    a(f"| **extra per idle child** = Σ PSS growth / {mem['n']} + page tables | **{fb_extra:.2f}** | {bare_extra:.2f} |")
    a("")
    a("### Create → first exec done (ms)")
    a("")
    a("| what | n | p50 | p95 | mean |")
    a("|---|---:|---:|---:|---:|")
    for s in cr:
        a(f"| {s.label} | {s.n} | {fmt_ms(s.p50)} | {fmt_ms(s.pct(95))} | {fmt_ms(s.mean)} |")
    a("")
    a("### Ratios (forkbox / bare `os.fork()`, same run)")
    a("")
    for s in ("big", "small"):
        for n in (1, 5):
            f, b = fbs[(s, n)], bare[(s, n)]
            a(f"- {STATES[s]['label']}: forkbox fork({n}) p50 / bare fork ×{n} p50 = "
              f"{fmt_ms(f.p50)} / {fmt_ms(b.p50)} ms = {fmt_ratio(f.p50, b.p50)}")
    a("")
    a("### Targets ([architecture.md](architecture.md#targets))")
    a("")
    a("| target | measured | result |")
    a("|---|---:|---|")
    f5, b5 = fbs[("big", 5)], bare[("big", 5)]
    a(f"| fork(5) of a REPL holding 1 GiB, p50 ≤ {TARGET_FORK5_MS:g} ms | {fmt_ms(f5.p50)} ms | {met(f5.p50 <= TARGET_FORK5_MS)} |")
    r5 = f5.p50 / b5.p50 if b5.p50 > 0 else float("inf")
    a(f"| … and within {TARGET_FORK5_VS_BARE:g}× a bare `os.fork()` ×5 of the same data (p50 {fmt_ms(b5.p50)} ms) "
      f"| {r5:.1f}× | {met(r5 <= TARGET_FORK5_VS_BARE)} |")
    for s in ("big", "small"):
        f32 = fbs[(s, 32)]
        a(f"| fork(32) p50 ≤ {TARGET_FORK32_MS:g} ms, {STATES[s]['label']} | {fmt_ms(f32.p50)} ms "
          f"| {met(f32.p50 <= TARGET_FORK32_MS)} |")
    a(f"| extra memory per idle child ≤ {TARGET_CHILD_MIB:g} MB (Σ PSS growth + page tables) | {fb_extra:.2f} MiB "
      f"| {met(fb_extra <= TARGET_CHILD_MIB)} |")
    a(f"| … counted by the child's cgroup alone | {fm['cgroup']:.2f} MiB | {met(fm['cgroup'] <= TARGET_CHILD_MIB)} |")
    c, c95 = cr[0].p50, cr[0].pct(95)
    a(f"| create → first exec p50 ≤ {TARGET_CREATE_MS:g} ms | {fmt_ms(c)} ms | {met(c <= TARGET_CREATE_MS)} |")
    a(f"| create → first exec p95 ≤ {TARGET_CREATE_P95_MS:g} ms | {fmt_ms(c95)} ms | {met(c95 <= TARGET_CREATE_P95_MS)} |")
    a("")
    a("### Reading these numbers")
    a("")
    a("- A fork sample is the HTTP round trip of `POST …/fork` on a keep-alive loopback connection; it answers "
      "once every child's REPL is ready for an exec. The children are destroyed after each sample (not timed).")
    a("- Server split (from the server's `fork timings` debug lines, when the script started the server): "
      "*members* = freezing the parent, snapshotting its files and building each child's jail "
      "(`members_ms`); *REPL fork → ready* = the rest (`total_ms − members_ms`): the parent REPL forking "
      "itself into the children's namespaces and the server waiting for each child's ready message and adopting it.")
    a("- The bare baseline forks a host `python3` holding the same data N times in a row and waits until each "
      "child has written one byte; the children stay alive (paused) until the sample is over, like idle forkbox children.")
    a(f"- The bare `python3` imports what the parent's REPL holds besides its state (the template's zygote imported "
      f"it: {', '.join(facts['small_held']) or 'nothing'}), so both forks copy page tables of the same size: small-state "
      f"parent RSS {facts['small_fb_rss']:.0f} MiB in forkbox, {facts['small_bare_rss']:.0f} MiB bare.")
    a(f"- The 1 GiB parent: forkbox REPL RSS {facts['fb_rss']:.0f} MiB of which {facts['fb_thp']:.0f} MiB in "
      f"transparent huge pages; bare `python3` RSS {facts['bare_rss']:.0f} MiB, {facts['bare_thp']:.0f} MiB in huge "
      "pages (numpy asks for huge pages with madvise; fork copies one page-table entry per 2 MiB huge page, "
      "so huge pages make both forks cheap, and the comparison is only fair when both have them).")
    a("- Memory: PSS divides each shared page among the processes that map it, so a child's PSS is mostly its share "
      "of the parent's data, which the child does not add. What a child adds is its private pages (USS), "
      "its sandbox's other processes, and the page tables fork copied; the Σ PSS growth counts "
      "the first two exactly when it is summed over every process that shares pages with the parent: a pooled "
      "parent shares its modules' pages with the pool's zygote and the sandboxes forked from it, so a sum over "
      "the family alone also counts the share of those pages that moves from the pool into the family. A child's cgroup is charged only for pages the child itself allocates "
      "(shared pages stay charged to the parent's cgroup; page tables made by fork are charged to the forking parent).")
    a("- Noise: forkbox and the baseline run interleaved in rounds; anything else running on the machine inflates every row.")
    a("")
    a("### Run")
    a("")
    a(f"- date: {date}")
    a(f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem']} RAM, Linux {m['kernel']}, {m['os']}; "
      f"1-minute load average {facts['load']:.2f} just before the run (other work on the machine)")
    a(f"- forkbox: commit {m['commit']}, {'server started by the script' if not args.url else 'existing server ' + args.url}, "
      f"template `{args.template}`, parents created with `ram_mib` {args.ram_mib}; in the sandbox: {facts['fb_versions']}")
    a(f"- bare baseline: `{sys.executable}` {facts['bare_versions']}")
    a(f"- fork: per (parent, n) {args.warmup} untimed warm-up forks whose children are checked to hold the parent's "
      f"state, then {args.samples} timed samples for n = 1 and 5 and {args.samples_32} for n = 32; "
      f"{args.bare_samples} bare samples per (state, n); forkbox and bare interleaved in rounds: {args.rounds}")
    a(f"- create: {args.create_warmup} warm-up + {args.creates} sandboxes (each destroyed afterwards, not counted)")
    a(f"- reproduce: `pip install -r bench/requirements.txt && {cmdline}`")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="use this running server on this host (http://host:port) instead of starting one")
    ap.add_argument("--api-key", default=os.environ.get("FORKBOX_BENCH_API_KEY"),
                    help="bearer key for --url (env FORKBOX_BENCH_API_KEY)")
    ap.add_argument("--bin", default=DEFAULT_BIN, help=f"forkbox binary to serve with (default {DEFAULT_BIN})")
    ap.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help=f"server state dir (default {DEFAULT_STATE_DIR})")
    ap.add_argument("--templates-dir", default=DEFAULT_TEMPLATES_DIR,
                    help=f"built templates (default {DEFAULT_TEMPLATES_DIR})")
    ap.add_argument("--no-build-templates", action="store_true",
                    help="start the server with --no-build-templates (the templates must be built already)")
    ap.add_argument("--template", default="default", help="template of the parents (needs numpy and pandas; default: default)")
    ap.add_argument("--ram-mib", type=int, default=4096, help="ram_mib of the parents (default 4096)")
    ap.add_argument("--samples", type=int, default=30, help="timed forks per parent for n = 1 and n = 5 (default 30)")
    ap.add_argument("--samples-32", type=int, default=15, help="timed forks per parent for n = 32 (default 15)")
    ap.add_argument("--bare-samples", type=int, default=100, help="bare os.fork() samples per (state, n) (default 100)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed forks per (parent, n), children checked (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaving rounds (default 5)")
    ap.add_argument("--mem-wait", type=float, default=2.0, help="seconds between fork and the memory reading (default 2)")
    ap.add_argument("--creates", type=int, default=30, help="timed create → first exec iterations (default 30)")
    ap.add_argument("--create-warmup", type=int, default=3, help="untimed create → first exec iterations (default 3)")
    ap.add_argument("--ready-timeout", type=float, default=1800, help="seconds to wait for the server (default 1800)")
    ap.add_argument("--docs", default=DOCS, help=f"markdown file to update (default {DOCS})")
    ap.add_argument("--no-docs", action="store_true", help="print only; do not touch the docs")
    args = ap.parse_args()
    if min(args.samples, args.samples_32, args.bare_samples, args.rounds, args.creates) < 1 or args.warmup < 1:
        ap.error("--samples, --samples-32, --bare-samples, --rounds, --creates and --warmup must be ≥ 1")
    args.rounds = min(args.rounds, args.samples, args.samples_32)

    cmdline = "python3 bench/fork.py" + "".join(
        " " + shlex.quote(x) for x in sys.argv[1:] if not x.startswith("--api-key"))
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    load_start = os.getloadavg()[0]
    workers: dict[str, BareWorker] = {}
    server = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        # The per-fork split is a debug line of the fork module only.
        os.environ.setdefault("RUST_LOG", "info,forkbox_service::fork=debug")
        server = ForkServer(args.bin, args.state_dir, args.templates_dir, args.ready_timeout,
                            build_templates=not args.no_build_templates)
        server.start()
        url = server.url
    parents: dict[str, str] = {}
    fb = None
    try:
        fb = Forkbox(url, args.api_key)
        st, body = fb.healthz()
        if st != 200 or body.strip() != b"ok":
            raise SystemExit(f"{url}/v1/healthz: {st} {body[:200]!r}")
        wait_warm(fb, args.template)
        for s in STATES:
            log(f"parent: {STATES[s]['label']}")
            sid, chk = make_parent(fb, s, args.template, args.ram_mib)
            parents[s] = sid
            # The bare baseline holds the same modules as the parent's REPL
            # (a template's REPL is forked from a zygote that imported them),
            # so both forks copy the same page tables.
            held = [m for m in run_ok(fb, sid, HELD_MODULES, "modules the parent holds").split(",") if m]
            log(f"bare baseline: a host python3 with {STATES[s]['label']} and {', '.join(held) or 'no module'} imported")
            workers[s] = BareWorker(s, held)
            if chk != workers[s].info["chk"] and s == "small":
                raise RuntimeError(f"small state differs: sandbox {chk!r}, host {workers[s].info['chk']!r}")
        small = rollup(repl_pid(parents["small"]))
        big = rollup(repl_pid(parents["big"]))
        if big.get("Rss", 0) * 1024 < BIG_BYTES:
            raise RuntimeError(f"the 1 GiB parent's REPL has only {big.get('Rss', 0)} kB resident")
        fb_versions = run_ok(fb, parents["big"], "import sys; print(f'Python {sys.version.split()[0]}, "
                                                 "numpy {np.__version__}, pandas {pd.__version__}')", "versions")
        lat, firsts = bench_fork(fb, parents, workers, args)
        mem = bench_memory(fb, parents["big"], workers["big"], args.mem_wait)
        for sid in parents.values():
            fb.destroy(sid)
        parents.clear()
        cr, create_ids = bench_create(fb, args.creates, args.create_warmup)
    finally:
        if fb is not None:
            for sid in parents.values():
                try:
                    fb.destroy(sid)
                except Exception as e:  # noqa: BLE001 — cleanup only
                    log(f"destroying {sid}: {e}")
            fb.close()
        for w in workers.values():
            w.close()
        if server is not None:
            server.stop()

    split: dict = {}
    if server is not None:
        text = server.log_tail(n=1 << 30)
        timings = fork_timings(text)
        for key, ids in firsts.items():
            members = Series(f"srv_members_{key}", "members")
            rest = Series(f"srv_rest_{key}", "rest")
            for c in ids:
                if c in timings:
                    snap, total = timings[c]
                    members.samples_ms.append(snap)
                    rest.samples_ms.append(total - snap)
            if members.n:
                split[key] = (members, rest)
        srv = create_split(text, create_ids)
        cr.extend(srv)
    bare_info = workers["big"].info
    bv = bare_info["versions"]
    facts = {
        "fb_rss": mem["parent"].get("Rss", 0) / 1024, "fb_thp": mem["parent"].get("AnonHugePages", 0) / 1024,
        "bare_rss": mem["bare_parent"].get("Rss", 0) / 1024, "bare_thp": mem["bare_parent"].get("AnonHugePages", 0) / 1024,
        "fb_versions": fb_versions, "load": load_start,
        "small_fb_rss": small.get("Rss", 0) / 1024, "small_bare_rss": workers["small"].info["self"].get("Rss", 0) / 1024,
        "small_held": workers["small"].preimport,
        "bare_versions": f"(Python {bv.get('python')}, numpy {bv.get('numpy', '?')}, pandas {bv.get('pandas', '?')})",
    }
    body = render(lat, split, mem, cr, facts, machine(), args, cmdline, date)
    print(body)
    if not args.no_docs:
        write_section(args.docs, SECTION, "Fork: latency, memory per child, create → first exec (`bench/fork.py`)", body)
        log(f"wrote {os.path.relpath(args.docs, os.getcwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
