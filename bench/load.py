#!/usr/bin/env python3
"""load: many clients creating, running, forking and destroying sandboxes
beside a crowd of live ones, for minutes; every request's latency and
failure, the server's memory over time, and a leak check afterwards.

    python3 bench/load.py [--bin target/release/forkbox] [--live 200] [--clients 50] [--duration 600]

The server is started with room for everything the run holds
(`--max-sandboxes`, `--max-memory-mib` = the host's memory). First --live
sandboxes are created, each holding a little state (a dict with a list of
1,000 ints) and living longer than the run. Then --clients clients, each
with its own HTTP client (httpx, one keep-alive connection), spread over
--client-procs processes, loop until --duration is over:

    create → --execs execs (a running sum in the REPL, one of them a bash
    call; every answer checked) → fork n=--fork-n → one exec in each child
    (it must hold the parent's sum) → destroy the children → destroy

Every request's latency (to the last byte of the answer) is recorded per
route, and every failure (a transport error, an unexpected status, a
wrong answer) with its body. The server's RSS, threads and open files are
sampled every --rss-interval seconds. Afterwards every live sandbox's
state is checked, the server must list nothing else, the live ones are
destroyed, and the host is compared with a snapshot taken before the
server started: processes, cgroups, mounts, namespaces, files under the
state directory (run/, sandbox records, the volume's subvolumes).

Exits 1 if any request failed or anything leaked. Results go to
docs/benchmarks.md (`bench:load`) and docs/reliability.md (`bench:load`).
"""
from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import re
import shlex
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))

import httpx  # noqa: E402

from helpers import (  # noqa: E402  (the e2e suite's leak checks)
    all_pids, leaked_processes, mounts_under, pool_ids, proc_status, sandbox_cgroup_dirs, server_leaks, wait_no_leaks,
)
from run import Forkbox, Server, bench_args, fmt_ms, log, percentile, run_header, write_section  # noqa: E402

SECTION = "load"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-load"
RELIABILITY = os.path.join(REPO, "docs", "reliability.md")

CREATE = "POST /v1/sandboxes"
EXEC_PY = "POST /v1/sandboxes/{id}/exec (python)"
EXEC_BASH = "POST /v1/sandboxes/{id}/exec (bash)"
EXEC_CHILD = "POST /v1/sandboxes/{id}/exec (fork child, first call)"
FORK = "POST /v1/sandboxes/{id}/fork (n=3)"
DELETE_CHILD = "DELETE /v1/sandboxes/{id} (fork child)"
DELETE = "DELETE /v1/sandboxes/{id}"
ROUTES = [CREATE, EXEC_PY, EXEC_BASH, FORK, EXEC_CHILD, DELETE_CHILD, DELETE]


# ── the server ─────────────────────────────────────────────────────────────

class LoadServer(Server):
    """run.Server with extra flags, and what the e2e leak checks
    (tests/e2e/helpers.py) read off a server: its state dir, process,
    cgroup parent and an HTTP client."""

    def __init__(self, *a, extra: list[str], **kw):
        super().__init__(*a, **kw)
        self.extra = extra
        self.state_dir = os.path.realpath(self.state_dir)
        self.cgroup_parent = "forkbox-" + instance_name(self.state_dir)

    def command(self) -> list[str]:
        return super().command() + self.extra

    def all_keys(self) -> list[str]:
        return []  # started without API keys

    def http(self, api_key: str | None = None, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)


def instance_name(state_dir: str) -> str:
    """The server's `forkbox-<instance>` cgroup name: FNV-1a of the canonical
    state dir (crates/jail/src/engine/mod.rs `instance_name`)."""
    h = 0x811C9DC5
    for b in os.fsencode(os.path.realpath(state_dir)):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def host_mem_mib() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) // 1024


# ── one client ─────────────────────────────────────────────────────────────

class Record:
    """Latencies per route and failures, in one client process."""

    def __init__(self):
        self.lat: dict[str, list[float]] = {k: [] for k in ROUTES}
        self.statuses: dict[str, dict[str, int]] = {k: {} for k in ROUTES}
        self.failures: list[dict] = []
        self.failed: dict[str, int] = {k: 0 for k in ROUTES}
        self.iterations = 0
        self.ids: list[str] = []

    def fail(self, key: str, status, detail: str) -> None:
        self.failed[key] += 1
        if len(self.failures) < 200:
            self.failures.append({"route": key, "status": status, "detail": detail[:400], "t": time.time()})


async def request(c: httpx.AsyncClient, rec: Record, key: str, method: str, path: str, body=None,
                  expect: int = 200) -> bytes | None:
    t = time.perf_counter()
    try:
        r = await c.request(method, path, json=body)
        data = r.content
    except httpx.HTTPError as e:
        dt = time.perf_counter() - t
        rec.lat[key].append(dt)
        rec.statuses[key]["error"] = rec.statuses[key].get("error", 0) + 1
        rec.fail(key, None, f"{type(e).__name__} after {dt:.2f} s: {e}")
        return None
    rec.lat[key].append(time.perf_counter() - t)
    rec.statuses[key][str(r.status_code)] = rec.statuses[key].get(str(r.status_code), 0) + 1
    if r.status_code != expect:
        rec.fail(key, r.status_code, data[:400].decode("utf-8", "replace"))
        return None
    return data


def stdout_of(body: bytes) -> tuple[str, int | None]:
    out, code = [], None
    for line in body.splitlines():
        if line.strip():
            ev = json.loads(line)
            if ev["type"] == "stdout":
                out.append(ev["data"] + ("\n" if ev.get("nl") else ""))
            elif ev["type"] == "exit":
                code = ev["data"]
    return "".join(out).strip(), code


async def run_exec(c, rec, key, sid, code, want, language="python") -> bool:
    body = await request(c, rec, key, "POST", f"/v1/sandboxes/{sid}/exec", {"code": code, "language": language})
    if body is None:
        return False
    try:
        out, rc = stdout_of(body)
    except (ValueError, KeyError) as e:
        rec.fail(key, 200, f"unparsable events ({e}): {body[:300]!r}")
        return False
    if rc != 0 or out != want:
        rec.fail(key, 200, f"wrong answer to {code!r}: stdout {out!r}, exit {rc}, events {body[:300]!r}")
        return False
    return True


async def iteration(c: httpx.AsyncClient, rec: Record, execs: int, fork_n: int) -> None:
    body = await request(c, rec, CREATE, "POST", "/v1/sandboxes", {})
    if body is None:
        await asyncio.sleep(0.5)  # do not spin on a failing create
        return
    try:
        sid = json.loads(body)["id"]
    except (ValueError, KeyError, TypeError):
        rec.fail(CREATE, 200, f"no id in {body[:300]!r}")
        return
    rec.ids.append(sid)
    children: list[str] = []
    try:
        total, bash_at = 0, execs // 2
        for k in range(execs):
            if k == bash_at and k > 0:
                ok = await run_exec(c, rec, EXEC_BASH, sid, f"echo $(( {k} * 7 ))", str(k * 7), "bash")
            else:
                total += k
                ok = await run_exec(c, rec, EXEC_PY, sid, f"n = {k}\nprint(n)" if k == 0 else f"n += {k}\nprint(n)",
                                    str(total))
            if not ok:
                return
        body = await request(c, rec, FORK, "POST", f"/v1/sandboxes/{sid}/fork", {"n": fork_n})
        if body is None:
            return
        try:
            children = [str(x) for x in json.loads(body)["children"]]
        except (ValueError, KeyError, TypeError):
            rec.fail(FORK, 200, f"no children in {body[:300]!r}")
            return
        rec.ids += children
        if len(children) != fork_n:
            rec.fail(FORK, 200, f"asked for {fork_n} children, got {body[:300]!r}")
        for ch in children:
            await run_exec(c, rec, EXEC_CHILD, ch, "print(n)", str(total))
    finally:
        for ch in children:
            await request(c, rec, DELETE_CHILD, "DELETE", f"/v1/sandboxes/{ch}", expect=204)
        await request(c, rec, DELETE, "DELETE", f"/v1/sandboxes/{sid}", expect=204)
        rec.iterations += 1


async def client(url: str, rec: Record, start_at: float, deadline: float, args) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=args["request_timeout"], limits=limits) as c:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        while time.time() < deadline:
            await iteration(c, rec, args["execs"], args["fork_n"])


def client_process(url: str, n: int, start_at: float, deadline: float, args: dict, q) -> None:
    """n clients in one asyncio loop; puts its Record's contents on q."""
    rec = Record()

    async def main():
        await asyncio.gather(*(client(url, rec, start_at + i * 0.02, deadline, args) for i in range(n)))
    try:
        asyncio.run(main())
        q.put(rec.__dict__)
    except BaseException as e:  # noqa: BLE001 — report to the parent, then die
        rec.failures.append({"route": "client process", "status": None, "detail": repr(e)[:400], "t": time.time()})
        rec.failed.setdefault("client process", 0)
        rec.failed["client process"] = rec.failed.get("client process", 0) + 1
        q.put(rec.__dict__)
        raise


# ── host views ─────────────────────────────────────────────────────────────

def ns_inodes() -> dict[str, set[int]]:
    """Namespace (type:[inode]) → pids holding it, over every process."""
    out: dict[str, set[int]] = {}
    for pid in all_pids():
        try:
            names = os.listdir(f"/proc/{pid}/ns")
        except OSError:
            continue
        for n in names:
            try:
                out.setdefault(os.readlink(f"/proc/{pid}/ns/{n}"), set()).add(pid)
            except OSError:
                pass
    return out


def nsfs_mounts() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {ln.split()[4] for ln in f if " - nsfs " in ln}


def our_cgroup_dirs(parent: str) -> list[str]:
    return sorted(d for d in [f"/sys/fs/cgroup/{parent}"] +
                  [os.path.join("/sys/fs/cgroup", c, parent) for c in os.listdir("/sys/fs/cgroup")]
                  if os.path.isdir(d))


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def subvolumes(vol: str) -> set[str]:
    p = subprocess.run(["btrfs", "subvolume", "list", "-o", vol], capture_output=True, text=True)
    if p.returncode != 0:
        p = subprocess.run(["btrfs", "subvolume", "list", vol], capture_output=True, text=True)
    return {ln.split(" path ", 1)[1].strip() for ln in p.stdout.splitlines() if " path " in ln}


def snapshot(srv: LoadServer) -> dict:
    """What the host holds that the run could leak, before the server starts."""
    return {
        "leaked_pids": {int(x.split()[1]) for x in leaked_processes(srv)},
        "mounts": set(mounts_under(srv.state_dir)),
        "cgroups": our_cgroup_dirs(srv.cgroup_parent),
        "ns": set(ns_inodes()),
        "nsfs": nsfs_mounts(),
        "files": {d: listdir(os.path.join(srv.state_dir, d)) for d in ("run", "sandboxes", "spaces")},
    }


def server_sample(pid: int) -> tuple[float, int, int, int, int]:
    """(unix time, VmRSS KiB, threads, open fds, RssAnon KiB) of the server."""
    st = proc_status(pid)
    rss = int(st.get("VmRSS", "0 kB").split()[0]) if st else 0
    anon = int(st.get("RssAnon", "0 kB").split()[0]) if st else 0
    threads = int(st.get("Threads", "0")) if st else 0
    return time.time(), rss, threads, len(listdir(f"/proc/{pid}/fd")), anon


class Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple] = []
        self.marks: dict[str, float] = {}
        self.stop_ev = threading.Event()

    def run(self) -> None:
        while not self.stop_ev.is_set():
            self.samples.append(server_sample(self.pid))
            self.stop_ev.wait(self.interval)

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()
        self.samples.append(server_sample(self.pid))

    def between(self, a: str, b: str) -> list[tuple]:
        return [s for s in sorted(self.samples) if self.marks[a] <= s[0] <= self.marks[b]]


def slope_mib_per_min(samples) -> float:
    """Least-squares slope of RSS over time."""
    if len(samples) < 2:
        return float("nan")
    ts = [(s[0] - samples[0][0]) / 60 for s in samples]
    ys = [s[1] / 1024 for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else float("nan")


def tenths(samples) -> str:
    if not samples:
        return "–"
    t0, t1 = samples[0][0], samples[-1][0]
    span = (t1 - t0) / 10 or 1
    buckets: list[list[float]] = [[] for _ in range(10)]
    for s in samples:
        buckets[min(9, int((s[0] - t0) / span))].append(s[1] / 1024)
    return ", ".join(f"{max(b):.0f}" if b else "–" for b in buckets)


def median(xs):
    xs = sorted(xs)
    return percentile(xs, 50)


# ── the run ────────────────────────────────────────────────────────────────

def create_live(fb: Forkbox, n: int, life: int) -> list[str]:
    ids = []
    for i in range(n):
        st, b = fb.request("POST", "/v1/sandboxes", {"timeout_seconds": life, "idle_timeout_seconds": life})
        if st != 200:
            raise SystemExit(f"creating live sandbox {i}: HTTP {st}: {b[:300]!r}")
        sid = json.loads(b)["id"]
        ids.append(sid)
        out, code = fb.exec(sid, f"state = {{'i': {i}, 'data': list(range(1000))}}\nprint(len(state['data']))")
        if code != 0 or out.strip() != "1000":
            raise SystemExit(f"live sandbox {sid}: {out!r} exit {code}")
        if (i + 1) % 50 == 0:
            log(f"{i + 1}/{n} live sandboxes")
    return ids


def check_live(fb: Forkbox, ids: list[str]) -> list[str]:
    bad = []
    for i, sid in enumerate(ids):
        try:
            out, code = fb.exec(sid, "print(state['i'], sum(state['data']))")
        except RuntimeError as e:
            bad.append(f"{sid}: {e}")
            continue
        if code != 0 or out.strip() != f"{i} {sum(range(1000))}":
            bad.append(f"{sid}: {out!r} exit {code}")
    return bad


def wait_pool(fb: Forkbox, timeout: float = 60) -> None:
    """Let the warm pool fill, so that the baseline counts are settled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st, b = fb.request("GET", "/v1/pool")
        t = json.loads(b).get("templates", {}) if st == 200 else {}
        if t and all(len(x.get("spares", [])) >= 2 for x in t.values()):
            return
        time.sleep(0.2)


def log_problems(path: str) -> tuple[dict[str, int], list[str]]:
    """Counts of the server log's ERROR and WARN lines and panics, and the
    first few distinct ones (ids and numbers aside)."""
    counts, first = {"ERROR": 0, "WARN": 0, "panicked": 0}, []
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return counts, first
    seen = set()
    for line in text.splitlines():
        clean = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = re.match(r"\S+\s+(ERROR|WARN)\b", clean)
        kind = m.group(1) if m else ("panicked" if "panicked" in clean else None)
        if kind is None:
            continue
        counts[kind] += 1
        key = re.sub(r"sb-[a-z2-7]{20}|[0-9a-f]{16}|\d+", "#", clean.split(None, 2)[-1])[:160]
        if key not in seen and len(first) < 8:
            seen.add(key)
            first.append(clean.strip()[:300])
    return counts, first


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--live", type=int, default=200, help="background sandboxes that stay live (default 200)")
    ap.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    ap.add_argument("--duration", type=float, default=600, help="seconds the clients loop (default 600)")
    ap.add_argument("--execs", type=int, default=20, help="execs per iteration (default 20)")
    ap.add_argument("--fork-n", type=int, default=3, help="children per fork (default 3)")
    ap.add_argument("--client-procs", type=int, default=2, help="processes the clients are spread over (default 2)")
    ap.add_argument("--request-timeout", type=float, default=120, help="seconds before a request counts as failed")
    ap.add_argument("--rss-interval", type=float, default=5, help="seconds between server samples (default 5)")
    ap.add_argument("--serve-args", default="", help="more flags for `forkbox serve`, one string (e.g. '--volume-gib 8')")
    ap.add_argument("--reliability-docs", default=RELIABILITY)
    ap.add_argument("--no-docs", action="store_true", help="print only; leave the docs alone")
    args = ap.parse_args()
    if args.execs < 2 or args.fork_n < 1 or args.clients < 1 or args.live < 0:
        ap.error("--execs ≥ 2, --fork-n ≥ 1, --clients ≥ 1, --live ≥ 0")
    cmdline = "python3 bench/load.py" + "".join(" " + shlex.quote(x) for x in sys.argv[1:])
    life = int(args.duration) + 3600
    most = args.live + args.clients * (1 + args.fork_n)
    extra = ["--max-sandboxes", str(max(1000, 2 * most)), "--max-memory-mib", str(host_mem_mib()),
             "--max-timeout", str(max(86400, life))] + shlex.split(args.serve_args)
    srv = LoadServer(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800, extra=extra)
    if os.path.isdir(os.path.join(srv.state_dir, "volume")) and mounts_under(os.path.join(srv.state_dir, "volume")):
        raise SystemExit(f"{srv.state_dir}/volume is mounted: is another server using {srv.state_dir}?")
    before = snapshot(srv)
    if before["leaked_pids"]:
        log(f"before the start, {len(before['leaked_pids'])} processes already look leaked (not counted)")
    srv.start()  # run.Server starts a fresh log
    fb = Forkbox(srv.url)
    sampler = Sampler(srv.proc.pid, args.rss_interval)
    sampler.start()
    sampler.mark("ready")
    results: list[dict] = []
    live: list[str] = []
    facts: dict = {"extra": extra}
    problems: list[str] = []
    try:
        wait_pool(fb)
        pool0 = pool_ids(srv)
        vol = os.path.join(srv.state_dir, "volume")
        subvols0 = {p for p in subvolumes(vol) if p.rsplit("/", 1)[-1] not in pool0}
        log(f"creating {args.live} live sandboxes")
        t = time.monotonic()
        live = create_live(fb, args.live, life)
        facts["live_create_s"] = time.monotonic() - t
        if live and sandbox_cgroup_dirs(live[0]):
            learnt = os.path.basename(os.path.dirname(sandbox_cgroup_dirs(live[0])[0]))
            if learnt != srv.cgroup_parent:
                log(f"cgroup parent is {learnt}, not {srv.cgroup_parent} as computed; using {learnt}")
                srv.cgroup_parent = learnt
        sampler.mark("live")

        log(f"{args.clients} clients in {args.client_procs} processes, {args.duration:.0f} s")
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        start_at = time.time() + 3.0
        deadline = start_at + args.duration
        cargs = {"execs": args.execs, "fork_n": args.fork_n, "request_timeout": args.request_timeout}
        per = [args.clients // args.client_procs + (1 if i < args.clients % args.client_procs else 0)
               for i in range(args.client_procs)]
        procs = [ctx.Process(target=client_process, args=(srv.url, n, start_at, deadline, cargs, q), daemon=True)
                 for n in per if n > 0]
        for p in procs:
            p.start()
        time.sleep(max(0.0, start_at - time.time()))
        sampler.mark("loop start")
        next_note = time.time() + 60
        grace = deadline + args.request_timeout * (args.execs + 2 * args.fork_n + 3) + 60
        while len(results) < len(procs):
            try:
                results.append(q.get(timeout=5))
            except Exception:  # queue.Empty
                pass
            if time.time() > next_note and time.time() < deadline:
                s = sampler.samples[-1]
                log(f"{deadline - time.time():.0f} s left; server RSS {s[1] / 1024:.0f} MiB, {s[3]} fds")
                next_note += 60
            if srv.proc.poll() is not None:
                raise SystemExit(f"the server exited with {srv.proc.returncode} during the run:\n{srv.log_tail()}")
            if time.time() > grace:
                raise SystemExit("client processes did not finish")
            if time.time() > deadline and len(results) < len(procs) and all(not p.is_alive() for p in procs):
                try:
                    results.append(q.get(timeout=10))
                except Exception:
                    raise SystemExit("a client process died without reporting")
        for p in procs:
            p.join(30)
        sampler.mark("loop end")
        facts["loop_s"] = sampler.marks["loop end"] - sampler.marks["loop start"]

        log("checking the live sandboxes' state")
        bad = check_live(fb, live)
        problems += [f"live sandbox lost its state: {b}" for b in bad]
        st, b = fb.request("GET", "/v1/sandboxes")
        listed = {s["id"] for s in json.loads(b)["sandboxes"]} if st == 200 else set()
        stray = sorted(listed - set(live))
        if stray:
            problems.append(f"the server lists {len(stray)} sandboxes besides the live ones (the clients' loops "
                            f"end by destroying theirs): {stray[:5]}")
        missing = sorted(set(live) - listed)
        if missing:
            problems.append(f"{len(missing)} live sandboxes are gone: {missing[:5]}")
        if live:
            # Guard against a blind check: told that one live sandbox should be
            # gone, it must see that sandbox's processes and cgroups.
            seen = server_leaks(srv, expect_volume_mounted=True, live_ids=set(live[1:]), check_run_dir=False)
            if not any(live[0] in p for p in seen):
                problems.append(f"the leak check does not see live sandbox {live[0]}: {seen[:3]}")
        sampler.mark("checked")

        log(f"destroying the {len(live)} live sandboxes")
        for sid in sorted(listed | set(live)):
            st, b = fb.request("DELETE", f"/v1/sandboxes/{sid}")
            if st != 204 and sid in live:
                problems.append(f"DELETE {sid}: HTTP {st} {b[:200]!r}")
        live = []
        wait_pool(fb)
        sampler.mark("destroyed")
        time.sleep(min(2.0, args.rss_interval))
        sampler.mark("settled")
        problems += [f"while running: {p}" for p in wait_no_leaks(srv, expect_volume_mounted=True, timeout=30)]
        pool1 = pool_ids(srv)
        subvols1 = {p for p in subvolumes(vol) if p.rsplit("/", 1)[-1] not in pool1}
        if subvols1 - subvols0:
            extra_sv = sorted(subvols1 - subvols0)
            problems.append(f"btrfs subvolumes left: {extra_sv[:5]} ({len(extra_sv)} in all)")
        facts["subvolumes"] = (len(subvols0), len(subvols1), len(pool1))
    finally:
        sampler.stop_ev.set()
        for sid in live:
            try:
                fb.destroy(sid)
            except Exception:  # noqa: BLE001 — cleanup only
                pass
        fb.close()
        srv.stop()
        rc = srv.proc.returncode if srv.proc else None
    if rc != 0:
        problems.append(f"the server exited with status {rc} after SIGTERM")

    # After the server: compare with the snapshot.
    after_leaks = [p for p in wait_no_leaks(srv, expect_volume_mounted=False, timeout=30)
                   if not (p.startswith("pid ") and int(p.split()[1]) in before["leaked_pids"])]
    problems += [f"after exit: {p}" for p in after_leaks]
    cg_left = [d for d in our_cgroup_dirs(srv.cgroup_parent) if d not in before["cgroups"]]
    if cg_left:
        problems.append(f"after exit: cgroup parents left: {cg_left}")
    ns_now = ns_inodes()
    leaked_pids = {int(p.split()[1]) for p in after_leaks if p.startswith("pid ")}
    new_ns = {n: pids for n, pids in ns_now.items() if n not in before["ns"]}
    ours_ns = sorted(n for n, pids in new_ns.items() if pids & leaked_pids)
    if ours_ns:
        problems.append(f"after exit: namespaces held by leaked processes: {ours_ns[:10]} ({len(ours_ns)} in all)")
    nsfs_new = sorted(m for m in nsfs_mounts() - before["nsfs"] if srv.state_dir in m or "forkbox" in m)
    if nsfs_new:
        problems.append(f"after exit: namespace mounts left: {nsfs_new[:10]}")
    for d in ("run", "sandboxes", "spaces"):
        left = sorted(set(listdir(os.path.join(srv.state_dir, d))) - set(before["files"][d]))
        if left:
            problems.append(f"after exit: {srv.state_dir}/{d} holds {left[:5]} ({len(left)} in all)")
    facts["new_ns_elsewhere"] = len(new_ns) - len(ours_ns)
    facts["log"] = log_problems(srv.log_path)

    merged = merge(results)
    requests = sum(len(v) for v in merged["lat"].values())
    failed = sum(merged["failed"].values())
    body_bench, body_rel, rss_ok = render(args, merged, sampler, facts, problems, cmdline)
    print(body_bench)
    if not args.no_docs:
        write_section(args.docs, SECTION, "Load: clients beside live sandboxes, and leaks (`bench/load.py`)", body_bench)
        write_section(args.reliability_docs, SECTION, "Load", body_rel)
        log(f"wrote {args.docs} and {args.reliability_docs}")
    ok = failed == 0 and not problems and requests > 0
    log(f"{requests} requests, {failed} failed, {len(problems)} problems: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def merge(results: list[dict]) -> dict:
    m = {"lat": {k: [] for k in ROUTES}, "statuses": {k: {} for k in ROUTES}, "failed": {}, "failures": [],
         "iterations": 0, "ids": 0}
    for r in results:
        for k, v in r["lat"].items():
            m["lat"].setdefault(k, []).extend(v)
        for k, v in r["statuses"].items():
            for s, n in v.items():
                m["statuses"].setdefault(k, {})[s] = m["statuses"].setdefault(k, {}).get(s, 0) + n
        for k, v in r["failed"].items():
            m["failed"][k] = m["failed"].get(k, 0) + v
        m["failures"] += r["failures"]
        m["iterations"] += r["iterations"]
        m["ids"] += len(r["ids"])
    m["failures"].sort(key=lambda f: f["t"])
    return m


def render(args, m: dict, sampler: Sampler, facts: dict, problems: list[str], cmdline: str) -> tuple[str, str, bool]:
    rows = []
    total = failed_total = 0
    for k in ROUTES:
        xs = sorted(x * 1000 for x in m["lat"].get(k, []))
        failed = m["failed"].get(k, 0)
        total += len(xs)
        failed_total += failed
        if not xs:
            continue
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(m["statuses"][k].items()))
        rows.append(f"| `{k.replace('(n=3)', f'(n={args.fork_n})')}` | {len(xs):,} | {failed} | {fmt_ms(percentile(xs, 50))} | "
                    f"{fmt_ms(percentile(xs, 99))} | {fmt_ms(xs[-1])} | {statuses} |")
    loop = sampler.between("loop start", "loop end")
    rss = [s[1] / 1024 for s in loop]
    fds = [s[3] for s in loop]
    first, last, peak = (rss[0], rss[-1], max(rss)) if rss else (float("nan"),) * 3
    slope = slope_mib_per_min(loop)
    # Flat: the last quarter of the loop holds no more than the second quarter
    # (after the warm-up) plus 10% or 16 MiB, whichever is larger.
    n = len(rss)
    q2 = median(rss[n // 4: n // 2]) if n >= 8 else first
    q4 = median(rss[3 * n // 4:]) if n >= 8 else last
    rss_ok = q4 <= q2 + max(16.0, 0.10 * q2)
    ordered = sorted(sampler.samples)
    marks = {k: next((s for s in ordered if s[0] >= v), ordered[-1]) for k, v in sampler.marks.items()}
    req_s = total / facts["loop_s"] if facts.get("loop_s") else float("nan")
    counts, first_lines = facts["log"]
    leak_line = "none" if not problems else f"**{len(problems)}** (listed below)"
    verdict = "PASS" if failed_total == 0 and not problems else "FAIL"
    head = (f"{run_header()}; {args.live} live sandboxes (each holding a dict with 1,000 ints), {args.clients} clients "
            f"({args.client_procs} processes, one httpx keep-alive connection each) looping create → {args.execs} execs "
            f"(one bash) → fork n={args.fork_n} → one exec per child → destroy children → destroy, for "
            f"{facts.get('loop_s', 0):.0f} s; server flags `{' '.join(facts['extra'])}`.")
    sv0, sv1, pool = facts.get("subvolumes", ("?", "?", "?"))
    lines = [
        head,
        "",
        f"{m['iterations']:,} iterations, {total:,} requests ({req_s:.0f}/s), **{failed_total} failed**; "
        f"{m['ids']:,} sandboxes created and destroyed by the clients; the {args.live} live ones created in "
        f"{facts.get('live_create_s', 0):.1f} s and their state checked afterwards.",
        "",
        "| route | requests | failed | p50 (ms) | p99 (ms) | max (ms) | statuses |",
        "|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        "Server (`/proc/<pid>/status` VmRSS and RssAnon, threads, open fds), sampled every "
        f"{args.rss_interval:g} s:",
        "",
        "| when | RSS (MiB) | of which anonymous | threads | open fds |",
        "|---|---:|---:|---:|---:|",
        *(f"| {label} | {marks[k][1] / 1024:.1f} | {marks[k][4] / 1024:.1f} | {marks[k][2]} | {marks[k][3]} |"
          for k, label in (("ready", "ready, empty"), ("live", f"{args.live} live sandboxes"),
                           ("loop start", "clients start"), ("loop end", "clients done"),
                           ("settled", "everything destroyed")) if k in marks),
        "",
        f"During the loop: RSS first {first:.1f} MiB, last {last:.1f} MiB, max {peak:.1f} MiB, slope "
        f"{slope:+.2f} MiB/min; open fds {min(fds) if fds else '?'}–{max(fds) if fds else '?'}. "
        f"Flat (last quarter's median ≤ second quarter's + max(10%, 16 MiB)): **{'yes' if rss_ok else 'no'}**. "
        f"Highest RSS in each tenth of the loop (MiB): {tenths(loop)}.",
        "",
        f"Leak check against a snapshot taken before the server started (processes of the server's cgroups or "
        f"naming its state dir, sandbox-uid orphans, cgroups under `forkbox-<instance>`, mounts and nsfs mounts, "
        f"namespaces held by leftover processes, `run/`, `sandboxes/`, `spaces/`, the volume's btrfs subvolumes "
        f"({sv0} before, {sv1} after, the warm pool's {pool} aside); while the server ran and after SIGTERM): "
        f"leaks: {leak_line}.",
        "",
        f"Server log during the run: {counts['ERROR']} ERROR, {counts['WARN']} WARN lines, "
        f"{counts['panicked']} panics" + (":" if first_lines else "."),
        *(f"    {ln}" for ln in first_lines),
        "",
        f"Verdict: **{verdict}** (zero failed requests, zero leaks); memory flat: **{'yes' if rss_ok else 'no'}**.",
    ]
    if problems:
        lines += ["", "Problems:", "", *(f"- {p}" for p in problems[:30])]
    if m["failures"]:
        lines += ["", "First failures:", "",
                  *(f"- `{f['route']}` status {f['status']}: {f['detail'][:300]!r}" for f in m["failures"][:10])]
    lines += ["", f"Reproduce: `{cmdline}`."]
    bench = "\n".join(lines)
    rel = "\n".join([
        f"`{cmdline}` (bench/README.md; per-route latencies in [benchmarks.md](benchmarks.md), section Load): "
        f"{args.live} live sandboxes, {args.clients} clients looping create → {args.execs} execs → fork "
        f"n={args.fork_n} → an exec in each child → destroy, for {facts.get('loop_s', 0):.0f} s; then a leak check "
        "against a snapshot of the host taken before the server started. It exits non-zero on any failed request "
        "or leak.",
        "",
        f"Last run: {run_header()}.",
        "",
        "| criterion | result |",
        "|---|---|",
        f"| failed requests (all within the server's limits) | {failed_total} of {total:,} |",
        f"| leaked processes, mounts, cgroups, namespaces, files, subvolumes | {leak_line} |",
        f"| server RSS during the loop | {first:.1f} → {last:.1f} MiB (max {peak:.1f}, slope {slope:+.2f} MiB/min): "
        f"{'flat' if rss_ok else 'not flat'} |",
        f"| server log | {counts['ERROR']} ERROR, {counts['WARN']} WARN, {counts['panicked']} panics |",
        f"| live sandboxes' state afterwards | {'intact' if not any('lost its state' in p for p in problems) else 'LOST'} |",
        "",
        f"Verdict: **{verdict}**.",
    ] + (["", *(f"- {p}" for p in problems[:10])] if problems else []))
    return bench, rel, rss_ok


if __name__ == "__main__":
    sys.exit(main())
