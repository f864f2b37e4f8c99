#!/usr/bin/env python3
"""noisy neighbours: exec latency of a quiet sandbox, alone and beside
sandboxes running CPU, memory and disk hogs, measured in one run.

    python3 bench/noisy.py [--bin target/release/forkbox] [--hogs 10] [--samples 300]

The quiet sandbox runs two calls, `print(1)` and a small computation
(`print(sum(i * i for i in range(20000)))`), interleaved, --samples of each
with --gap-ms between calls (an agent thinks between calls), on one
keep-alive stdlib connection; every answer is checked. Interleaved with
them runs a third call, `print(1)` through a bare path of the same hops
without forkbox (bench/floor.py), so that the report can tell forkbox's
share of a loaded tail from the machine's. Three phases:

1. unloaded: only the quiet sandbox (and the warm pool) on the server;
2. loaded: --hogs more sandboxes, by turns a CPU hog (--cpu-procs processes
   spinning), a memory hog (holds 70% of its cgroup's limit and rewrites
   every page, while allocating and freeing another 20% over and over) and
   a disk hog (rewrites a --disk-mib file in its writable layer in 4 MiB
   blocks, fsync after each); the samples start only once every hog is seen
   burning (its cgroup's CPU time growing, the memory hogs' usage above half
   their limit, the disk hogs' written bytes growing);
3. unloaded again, after the hogs are destroyed (shows the machine's drift).

Target (issue 8): a quiet sandbox's exec latency within 3× of its unloaded
value, read as each call's median (p50); the report holds the p99 to the same
3× as a stricter goal of ours, next to the bare path's tail under the same
load. Ratios are to the lower of phases 1 and 3, so that a hiccup in one does
not flatter them.
Results go to docs/benchmarks.md between the `bench:noisy` markers.
"""
from __future__ import annotations

import gc
import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))

from helpers import proc_status, sandbox_cgroup_dirs, sandbox_host_pids  # noqa: E402
from floor import Floor  # noqa: E402
from run import Forkbox, Series, Server, bench_args, fmt_ms, log, run_header, write_section  # noqa: E402

SECTION = "noisy"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-noisy"
TARGET_RATIO = 3.0

COMPUTE = "print(sum(i * i for i in range(20000)))"
COMPUTE_OUT = str(sum(i * i for i in range(20000)))

# The hogs run as processes of their own inside the hog sandbox (started by
# its REPL with start_new_session), so that they burn more than one core and
# the REPL stays free; they live until the sandbox is destroyed.
CPU_HOG = "while True:\n    pass\n"
MEM_HOG = """
import time
limit = {limit}
held = bytearray(int(limit * 0.70))
churn = int(limit * 0.20)
n = 0
while True:
    n = (n + 1) & 255
    held[::4096] = bytes([n]) * len(held[::4096])   # write every page held
    x = bytearray(churn)                            # fault in 20% more ...
    x[::4096] = bytes([n]) * len(x[::4096])
    del x                                           # ... and give it back
"""
DISK_HOG = """
import os
block = os.urandom(4 << 20)
blocks = {mib} // 4
fd = os.open('/root/disk-hog.bin', os.O_WRONLY | os.O_CREAT, 0o644)
while True:
    os.lseek(fd, 0, os.SEEK_SET)
    for _ in range(blocks):
        os.write(fd, block)
        os.fsync(fd)
"""
START = """
import subprocess, sys
hogs = [subprocess.Popen([sys.executable, '-c', {src!r}], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range({n})]
print(' '.join(str(p.pid) for p in hogs))
"""


def info(fb: Forkbox, sid: str) -> dict:
    import json
    st, b = fb.request("GET", f"/v1/sandboxes/{sid}")
    if st != 200:
        raise RuntimeError(f"GET {sid}: HTTP {st}: {b[:300]!r}")
    return json.loads(b)


def written_bytes(sid: str) -> int:
    """Bytes the sandbox's live processes have written to storage (/proc/<pid>/io)."""
    total = 0
    for pid in sandbox_host_pids(sid):
        try:
            with open(f"/proc/{pid}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create(fb: Forkbox, body: dict) -> str:
    import json
    st, b = fb.request("POST", "/v1/sandboxes", body)
    if st != 200:
        raise RuntimeError(f"create {body}: HTTP {st}: {b[:300]!r}")
    return json.loads(b)["id"]


def measure(fb: Forkbox, sid: str, samples: int, gap_s: float, phase: str, floor: Floor) -> dict[str, Series]:
    """--samples of each call, interleaved, with a pause between calls: two
    through forkbox, and a `print(1)` through the bare path (bench/floor.py)."""
    out = {"print": Series("print", "`print(1)`"), "compute": Series("compute", "`sum(i * i for i in range(20000))`"),
           "floor": Series("floor", "`print(1)`, bare path")}
    calls = [("print", "print(1)", "1", lambda code: fb.exec(sid, code)),
             ("compute", COMPUTE, COMPUTE_OUT, lambda code: fb.exec(sid, code)),
             ("floor", "print(1)", "1", lambda code: (floor.exec(code), 0))]
    gc.collect()
    gc.disable()
    try:
        for i in range(samples):
            for key, code, want, call in calls:
                time.sleep(gap_s)
                t = time.perf_counter_ns()
                got, rc = call(code)
                out[key].add_ns(time.perf_counter_ns() - t)
                if rc != 0 or got.strip() != want:
                    raise SystemExit(f"{phase}: `{code}` ({key}) answered {got!r} exit {rc}")
            if (i + 1) % 100 == 0:
                log(f"{phase}: {i + 1}/{samples}")
    finally:
        gc.enable()
    return out


def start_hogs(fb: Forkbox, n: int, args) -> list[dict]:
    kinds = ["cpu", "mem", "disk"]
    hogs = []
    for i in range(n):
        kind = kinds[i % 3]
        sid = create(fb, {"ram_mib": args.hog_ram_mib, "egress": False})
        if kind == "cpu":
            src, procs = CPU_HOG, args.cpu_procs
        elif kind == "mem":
            src, procs = MEM_HOG.format(limit=args.hog_ram_mib << 20), 1
        else:
            src, procs = DISK_HOG.format(mib=args.disk_mib), 1
        out, rc = fb.exec(sid, START.format(src=src, n=procs))
        if rc != 0 or len(out.split()) != procs:
            raise SystemExit(f"starting the {kind} hog in {sid} failed: {out!r} exit {rc}")
        hogs.append({"id": sid, "kind": kind, "procs": procs})
        log(f"hog {i + 1}/{n}: {kind} in {sid} ({procs} process{'es' if procs > 1 else ''})")
    return hogs


def hog_readings(fb: Forkbox, hogs: list[dict]) -> dict[str, tuple[float, int, int]]:
    """id → (cpu seconds, memory bytes, bytes written)."""
    out = {}
    for h in hogs:
        i = info(fb, h["id"])
        out[h["id"]] = (float(i["cpu_seconds"]), int(i["memory_bytes"]), written_bytes(h["id"]))
    return out


def wait_burning(fb: Forkbox, hogs: list[dict], ram_mib: int, window: float, timeout: float) -> dict:
    """Until, over one window, every hog burns CPU, every memory hog holds more
    than half its limit and every disk hog writes; returns that window's rates."""
    deadline = time.monotonic() + timeout
    while True:
        t0, r0 = time.monotonic(), hog_readings(fb, hogs)
        time.sleep(window)
        t1, r1 = time.monotonic(), hog_readings(fb, hogs)
        dt = t1 - t0
        lazy = []
        for h in hogs:
            sid = h["id"]
            cpu = (r1[sid][0] - r0[sid][0]) / dt
            mem = r1[sid][1]
            disk = (r1[sid][2] - r0[sid][2]) / dt
            h.update(cpu_cores=cpu, memory_mib=mem / 2**20, disk_mib_s=disk / 2**20)
            if cpu <= 0.005:
                lazy.append(f"{h['kind']} {sid}: no CPU")
            if h["kind"] == "mem" and mem < (ram_mib << 20) / 2:
                lazy.append(f"mem {sid}: {mem / 2**20:.0f} MiB")
            if h["kind"] == "disk" and disk <= 0:
                lazy.append(f"disk {sid}: writes nothing")
        total = sum(h["cpu_cores"] for h in hogs)
        if not lazy:
            log(f"hogs burning: {total:.2f} cores in all")
            return {"cores": total}
        if time.monotonic() > deadline:
            raise SystemExit(f"hogs not all burning after {timeout:.0f} s: {lazy}")
        log(f"waiting for the hogs: {lazy[:3]}{' …' if len(lazy) > 3 else ''}")


def cgroup_cpu_weight(sandbox_id: str) -> str:
    """A sandbox's `cpu.shares` (v1) or `cpu.weight` (v2), as written, or
    "idle class" while its cgroup's `cpu.idle` is 1 (its weight is moot then)."""
    for d in sandbox_cgroup_dirs(sandbox_id):
        try:
            with open(os.path.join(d, "cpu.idle")) as f:
                if f.read().strip() == "1":
                    return "idle class"
        except OSError:
            pass
        for name in ("cpu.shares", "cpu.weight"):
            try:
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()
            except OSError:
                pass
    return "?"


def settle(fb: Forkbox, state_dir: str, timeout: float = 120) -> None:
    """Wait until nothing the server or the kernel does in the background
    lands in an unloaded phase: the warm pool is full and no zygote warms
    (`GET /v1/pool`), and btrfs has cleaned the deleted subvolumes up
    (`btrfs subvolume sync`, after the hogs are destroyed)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        st, b = fb.request("GET", "/v1/pool")
        if st != 200:
            raise SystemExit(f"GET /v1/pool: HTTP {st}: {b[:300]!r}")
        info = json.loads(b)
        spares = {t: len(v.get("spares", [])) for t, v in info.get("templates", {}).items()}
        now = (spares, bool(info.get("fork_spares")))
        if now == last and spares and not now[1]:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm pool did not settle in {timeout:.0f} s: {b[:500]!r}")
        last = now
        time.sleep(1.0)
    subprocess.run(["btrfs", "subvolume", "sync", os.path.join(state_dir, "volume")],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
    time.sleep(1.0)


def cpu_facts(server_pid: int, quiet: str, hogs: list[dict]) -> dict:
    """Where the scheduler puts the server and the sandboxes (cgroup cpu
    weights: the quiet sandbox's and the hogs', which the server's CPU
    boost sets apart once the hogs burn)."""
    facts = {"hog_weights": sorted({cgroup_cpu_weight(h["id"]) for h in hogs})}
    try:
        with open(f"/proc/{server_pid}/cgroup") as f:
            lines = f.read().splitlines()
        cpu = [ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] in ("cpu", "cpu,cpuacct", "")]
        facts["server_cgroup"] = cpu[0] if cpu else "?"
    except OSError:
        facts["server_cgroup"] = "?"
    for d in sandbox_cgroup_dirs(quiet):
        if d.startswith("/sys/fs/cgroup/cpu/") or d.startswith("/sys/fs/cgroup/forkbox-"):
            for name in ("cpu.shares", "cpu.weight"):
                for where, path in (("sandbox", d), ("parent", os.path.dirname(d))):
                    try:
                        with open(os.path.join(path, name)) as f:
                            facts[f"{where}_{name}"] = f.read().strip()
                    except OSError:
                        pass
            facts["sandbox_cgroup"] = d
    try:
        facts["server_threads"] = int(proc_status(server_pid).get("Threads", "0"))
    except ValueError:
        pass
    return facts


def runq_wait_ns(pids: list[int]) -> int:
    """Time the threads of `pids` spent runnable but waiting for a CPU
    (/proc/<pid>/task/<tid>/schedstat, second field), in ns."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return total


def observed(fb: Forkbox, srv: Server, quiet: str, args, label: str, floor: Floor) -> dict:
    """The timed calls, and how long the quiet sandbox's processes, the
    server's threads and this client waited for a CPU meanwhile, per call
    through forkbox."""
    who = {"quiet": lambda: sandbox_host_pids(quiet), "server": lambda: [srv.proc.pid], "client": lambda: [os.getpid()]}
    w0 = {k: runq_wait_ns(f()) for k, f in who.items()}
    series = measure(fb, quiet, args.samples, args.gap_ms / 1000, label, floor)
    calls = series["print"].n + series["compute"].n
    waits = {k: (runq_wait_ns(f()) - w0[k]) / calls / 1e6 for k, f in who.items()}
    return {"series": series, "waits": waits}


def post(fb: Forkbox, path: str) -> None:
    st, b = fb.request("POST", path, {})
    if st != 200:
        raise RuntimeError(f"POST {path}: HTTP {st}: {b[:300]!r}")


def loaded_phase(fb: Forkbox, mon: Forkbox, srv: Server, quiet: str, active: list[dict], args, label: str,
                 floor: Floor) -> dict:
    """Measure the quiet sandbox while `active` hogs burn; what they used meanwhile."""
    r0, t0, s0 = hog_readings(mon, active), time.monotonic(), proc_cpu_s(srv.proc.pid)
    log(f"{label}: {args.samples} calls of each kind")
    seen = observed(fb, srv, quiet, args, label, floor)
    r1, t1, s1 = hog_readings(mon, active), time.monotonic(), proc_cpu_s(srv.proc.pid)
    dt = t1 - t0
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    per = {h["id"]: (r1[h["id"]][0] - r0[h["id"]][0]) / dt for h in active}
    if any(c <= 0.005 for c in per.values()):
        raise SystemExit(f"{label}: a hog stopped burning: {[(h['kind'], per[h['id']]) for h in active]}")
    return {
        **seen,
        "cores": sum(per.values()),
        "disk_mib_s": sum(r1[h["id"]][2] - r0[h["id"]][2] for h in active) / dt / 2**20,
        "mem_mib": [r1[h["id"]][1] / 2**20 for h in active if h["kind"] == "mem"],
        "server_cores": (s1 - s0) / dt,
        "seconds": dt,
        "loadavg": load,
    }


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--hogs", type=int, default=10, help="hog sandboxes (default 10: 4 CPU, 3 memory, 3 disk)")
    ap.add_argument("--samples", type=int, default=300, help="timed calls of each kind per phase (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls of each kind first (default 20)")
    ap.add_argument("--gap-ms", type=float, default=20, help="pause before each call (default 20)")
    ap.add_argument("--cpu-procs", type=int, default=4, help="spinning processes per CPU hog (default 4)")
    ap.add_argument("--hog-ram-mib", type=int, default=512, help="memory limit of each hog sandbox (default 512)")
    ap.add_argument("--disk-mib", type=int, default=256, help="size of each disk hog's file (default 256)")
    ap.add_argument("--settle", type=float, default=5, help="seconds of one burn check window (default 5)")
    ap.add_argument("--no-by-kind", action="store_true",
                    help="skip the phases with one kind of hog running (the others paused)")
    ap.add_argument("--serve-args", default="", help="more flags for `forkbox serve`, one string (e.g. '--volume-gib 8')")
    ap.add_argument("--no-docs", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    if args.hogs < 1 or args.samples < 1:
        ap.error("--hogs and --samples must be ≥ 1")
    cmdline = "python3 bench/noisy.py" + "".join(" " + shlex.quote(x) for x in sys.argv[1:])
    gap = args.gap_ms / 1000

    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    base_command = srv.command
    srv.command = lambda: base_command() + shlex.split(args.serve_args)
    srv.start()
    fb = Forkbox(srv.url)
    mon = Forkbox(srv.url)  # GET info, pause and resume of the hogs, on a connection of its own
    floor: Floor | None = None
    hogs: list[dict] = []
    by_kind: dict[str, dict] = {}
    try:
        floor = Floor()  # the same hops without forkbox (bench/floor.py), measured alongside
        quiet = create(fb, {})
        log(f"quiet sandbox {quiet}; warm-up")
        measure(fb, quiet, args.warmup, gap, "warm-up", floor)
        settle(mon, args.state_dir)
        log(f"phase 1, unloaded: {args.samples} calls of each kind")
        before = observed(fb, srv, quiet, args, "unloaded", floor)

        hogs = start_hogs(fb, args.hogs, args)
        burn = wait_burning(mon, hogs, args.hog_ram_mib, args.settle, timeout=120)
        facts = cpu_facts(srv.proc.pid, quiet, hogs)
        loaded = loaded_phase(fb, mon, srv, quiet, hogs, args, f"phase 2, beside {args.hogs} hogs", floor)

        if not args.no_by_kind:
            for kind in ("cpu", "mem", "disk"):
                active = [h for h in hogs if h["kind"] == kind]
                if not active:
                    continue
                for h in hogs:
                    post(mon, f"/v1/sandboxes/{h['id']}/{'resume' if h['kind'] == kind else 'pause'}")
                time.sleep(2)
                by_kind[kind] = loaded_phase(fb, mon, srv, quiet, active, args,
                                             f"beside the {len(active)} {kind} hog(s) alone (the others paused)", floor)

        for h in hogs:
            fb.destroy(h["id"])
        hogs = []
        settle(mon, args.state_dir)
        log(f"phase 3, unloaded again: {args.samples} calls of each kind")
        after = observed(fb, srv, quiet, args, "unloaded again", floor)
        fb.destroy(quiet)
    finally:
        for h in hogs:
            try:
                fb.destroy(h["id"])
            except Exception as e:  # noqa: BLE001 — cleanup only
                log(f"destroying hog {h['id']}: {e}")
        fb.close()
        mon.close()
        if floor is not None:
            floor.close()
        srv.stop()

    body, ok, tail_ok = render(args, before, loaded, after, burn, by_kind, facts, cmdline, floor.sliced)
    print(body)
    if not args.no_docs:
        write_section(args.docs, SECTION, "Noisy neighbours: a quiet sandbox beside hogs (`bench/noisy.py`)", body)
        log(f"wrote {args.docs}")
    log(f"target (medians): {'PASS' if ok else 'MISS'}; p99: {'PASS' if tail_ok else 'MISS'}")
    return 0


def mean_ms(d: dict) -> float:
    xs = [x for key in ("print", "compute") for x in d["series"][key].samples_ms]
    return sum(xs) / len(xs)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


KIND_LABEL = {"cpu": "CPU hogs", "mem": "memory hogs", "disk": "disk hogs"}


def render(args, before, loaded, after, burn, by_kind, facts, cmdline, floor_sliced: bool) -> tuple[str, bool, bool]:
    n_cpu = (args.hogs + 2) // 3
    n_mem = (args.hogs + 1) // 3
    n_disk = args.hogs // 3
    rows, ok, tail_ok = [], True, True

    def unloaded(key: str, q: int) -> float:
        # The lower of the two unloaded phases: a hiccup of the machine in
        # one of them must not make the loaded figures look better.
        return min(before["series"][key].pct(q), after["series"][key].pct(q))

    for key in ("print", "compute"):
        b, l, a = before["series"][key], loaded["series"][key], after["series"][key]
        for q in (50, 99):
            ratio = l.pct(q) / unloaded(key, q)
            verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
            if q == 50:
                ok &= verdict == "PASS"
            else:
                tail_ok &= verdict == "PASS"
            rows.append(f"| {b.label} | p{q} | {fmt_ms(b.pct(q))} | {fmt_ms(l.pct(q))} | {fmt_ms(a.pct(q))} | "
                        f"{ratio:.2f}× | {verdict} |")
    b, l, a = before["series"]["floor"], loaded["series"]["floor"], after["series"]["floor"]
    for q in (50, 99):
        rows.append(f"| {b.label} (no forkbox: the machine's floor) | p{q} | {fmt_ms(b.pct(q))} | {fmt_ms(l.pct(q))} | "
                    f"{fmt_ms(a.pct(q))} | {l.pct(q) / unloaded('floor', q):.2f}× | – |")

    def load_note(d: dict) -> str:
        mem = ", ".join(f"{m:.0f}" for m in d["mem_mib"])
        parts = [f"{d['cores']:.2f} cores"]
        if d["disk_mib_s"] > 0.05:
            parts.append(f"{d['disk_mib_s']:.0f} MiB/s written")
        if mem:
            parts.append(f"memory held {mem} MiB")
        return "; ".join(parts)

    kind_rows = []
    for kind, d in by_kind.items():
        cells = []
        for key in ("print", "compute"):
            for q in (50, 99):
                cells.append(f"{fmt_ms(d['series'][key].pct(q))} ({d['series'][key].pct(q) / unloaded(key, q):.2f}×)")
        cells.append(f"{fmt_ms(d['series']['floor'].pct(99))} ({d['series']['floor'].pct(99) / unloaded('floor', 99):.2f}×)")
        kind_rows.append(f"| {KIND_LABEL[kind]} alone | {' | '.join(cells)} | {load_note(d)} |")
    all_cells = []
    for key in ("print", "compute"):
        for q in (50, 99):
            all_cells.append(f"{fmt_ms(loaded['series'][key].pct(q))} ({loaded['series'][key].pct(q) / unloaded(key, q):.2f}×)")
    all_cells.append(f"{fmt_ms(loaded['series']['floor'].pct(99))} ({loaded['series']['floor'].pct(99) / unloaded('floor', 99):.2f}×)")
    fb_p99, floor_p99 = loaded["series"]["print"].pct(99), loaded["series"]["floor"].pct(99)

    weight_file = "cpu.shares" if "sandbox_cpu.shares" in facts else "cpu.weight"
    lines = [
        f"{run_header()}; one quiet sandbox (default settings) beside {args.hogs} hog sandboxes "
        f"(`ram_mib` {args.hog_ram_mib}, egress off): {plural(n_cpu, 'CPU hog')} ({args.cpu_procs} spinning processes each), "
        f"{plural(n_mem, 'memory hog')} (70% of the limit held and rewritten, 20% more allocated and freed in a loop), "
        f"{plural(n_disk, 'disk hog')} (a {args.disk_mib} MiB file rewritten in 4 MiB blocks, fsync after each). "
        f"{args.samples} calls of each kind per phase, interleaved, {args.gap_ms:g} ms apart, "
        "on one keep-alive stdlib connection; every answer checked.",
        "",
        "| quiet sandbox's exec | | unloaded (ms) | beside the hogs (ms) | unloaded again (ms) | loaded / lower unloaded | ≤ 3× |",
        "|---|---|---:|---:|---:|---:|---|",
        *rows,
        "",
        f"Target (issue 8), a quiet sandbox's exec latency within {TARGET_RATIO:g}× of its unloaded value, as the median "
        f"of both calls against the lower unloaded phase: **{'PASS' if ok else 'MISS'}**. "
        f"Our stricter goal, the p99 within {TARGET_RATIO:g}× as well: **{'PASS' if tail_ok else 'MISS'}** "
        f"(the bare path's own p99 grew {floor_p99 / unloaded('floor', 99):.2f}× under the same load).",
        "",
        f"The bare path (`bench/floor.py`) makes the same four hops as an exec through forkbox (client → TCP → relay "
        f"process → Unix socket → REPL process and back) with two plain Python processes on the host, no sandbox, "
        f"{'the same 300 µs slice' if floor_sliced else 'the default slice'}; its calls were interleaved with the quiet "
        f"sandbox's. Beside the hogs its p99 was {fmt_ms(floor_p99)} ms "
        f"({floor_p99 / unloaded('floor', 99):.2f}× its unloaded p99), against the quiet sandbox's `print(1)` p99 of "
        f"{fmt_ms(fb_p99)} ms ({fb_p99 / unloaded('print', 99):.2f}×): forkbox's loaded tail is "
        f"{fb_p99 / floor_p99:.2f}× what any two processes on this host get under the same load.",
        "",
        f"- During the loaded phase ({loaded['seconds']:.0f} s) the hogs used {loaded['cores']:.2f} cores "
        f"(of {os.cpu_count()}; {burn['cores']:.2f} in the check before it), the disk hogs wrote "
        f"{loaded['disk_mib_s']:.0f} MiB/s, the memory hogs held {', '.join(f'{m:.0f}' for m in loaded['mem_mib']) or '–'} MiB "
        f"(limit {args.hog_ram_mib}); the server process used {loaded['server_cores']:.2f} cores; "
        f"load average {loaded['loadavg']}.",
        f"- CPU weights: the server runs in cpu cgroup `{facts.get('server_cgroup', '?')}` "
        f"({facts.get('server_threads', '?')} threads); the quiet sandbox has "
        f"`{weight_file}` {facts.get('sandbox_' + weight_file, '?')} and the hogs {', '.join(facts['hog_weights'])} "
        f"(no quota; the server's `--cpu-boost` raises the weight of sandboxes using under a quarter of a core "
        "and puts those using more in the idle scheduling class), under its server's "
        f"`forkbox-<instance>` parent (`{weight_file}` {facts.get('parent_' + weight_file, '?')}): "
        "sandboxes split the parent's share by weight whatever their number of processes"
        + (", and (cgroup v1) the parent as a whole weighs as much as one runnable thread of the server's cgroup "
           "(or of any other process in it)." if "parent_cpu.shares" in facts else "."),
    ]
    if kind_rows:
        lines += [
            "",
            "Which hog costs what: the same calls with one kind of hog running and the others paused "
            "(cgroup freezer, `POST …/pause`); ms, and the ratio to the unloaded figure (the lower of the two unloaded phases).",
            "",
            "| beside | `print(1)` p50 | `print(1)` p99 | compute p50 | compute p99 | bare path p99 | what the hogs did |",
            "|---|---:|---:|---:|---:|---:|---|",
            f"| all {args.hogs} hogs | {' | '.join(all_cells)} | {load_note(loaded)} |",
            *kind_rows,
        ]
    phases = [("unloaded", before), (f"all {args.hogs} hogs", loaded)]
    phases += [(f"{KIND_LABEL[k]} alone", d) for k, d in by_kind.items()]
    phases.append(("unloaded again", after))
    lines += [
        "",
        "Where the time goes: CPU run-queue wait (`/proc/<pid>/task/*/schedstat`) per call, ms — time a thread "
        "was runnable but not running.",
        "",
        "| phase | mean exec latency | quiet sandbox's processes | server threads | this client |",
        "|---|---:|---:|---:|---:|",
        *(f"| {name} | {fmt_ms(mean_ms(d))} | {d['waits']['quiet']:.3f} | {d['waits']['server']:.3f} | "
          f"{d['waits']['client']:.3f} |" for name, d in phases),
    ]
    lines += ["", f"Reproduce: `{cmdline}`."]
    return "\n".join(lines), ok, tail_ok


if __name__ == "__main__":
    sys.exit(main())
