#!/usr/bin/env python3
"""templates benchmark: create → first exec from a saved template that
holds a 500 MiB DataFrame in its REPL, beside creating a sandbox and loading
the same data from a file it already has, measured in one run.

    python3 bench/templates.py [--bin target/release/forkbox] [--reps 10] [--serve-args '--volume-gib 8']

1. Setup: a default sandbox (`ram_mib` --ram-mib 4096) makes a DataFrame
   of --cols 8 random float64 columns × --rows 8,192,000 rows (500 MiB) in
   its REPL and writes the same array to /root/data.npy (`numpy.save`; the
   default template has no pyarrow). It is saved as template `bench-df`
   (`POST /v1/sandboxes/{id}/template`, timed); then `del df` in its REPL
   and it is saved again as `bench-file`: the same file, no DataFrame.
   The sandbox is destroyed; both templates' zygotes must be warm, and no
   zygote still warming, in `GET /v1/pool` before anything is timed.
2. Template: `POST /v1/sandboxes {"template": "bench-df"}` → exec
   `print(len(df), float(df.iloc[-1, 0]))` until its exit event.
3. Baseline: `POST /v1/sandboxes {"template": "bench-file"}` → exec that
   loads /root/data.npy into the same DataFrame and prints the same line;
   then the same load again in that sandbox (`del df` first), timed on
   its own, not in the row: the load with memory the process just freed.
4. Reference: `POST /v1/sandboxes {}` (the default template) → `print(1)`.

The three run interleaved, --reps times each after --warmup untimed rounds,
--gap-s apart (the warm pool refills its spares meanwhile); each sandbox is
destroyed after its sample (not timed). Every answer is checked (a wrong
one aborts the run), timings never are. Both templates are deleted at the
end. Results go to docs/benchmarks.md between the `bench:templates` markers.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import ANSI, Forkbox, Series, Server, bench_args, fmt_ms, fmt_ratio, log, machine, write_section  # noqa: E402

SECTION = "templates"
TITLE = "Templates: a saved 500 MB DataFrame vs loading it (`bench/templates.py`)"
DEFAULT_STATE_DIR = "/var/lib/forkbox-bench-templates"
TPL_DF = "bench-df"
TPL_FILE = "bench-file"
DATA = "/root/data.npy"

SETUP = """\
import os
import numpy as np
import pandas as pd
_a = np.random.default_rng(20261130).random(({rows}, {cols}))
np.save({data!r}, _a)
df = pd.DataFrame(_a, columns=[f'c{{i}}' for i in range({cols})])
del _a
print(len(df), float(df.iloc[-1, 0]), os.path.getsize({data!r}))
"""
USE = "print(len(df), float(df.iloc[-1, 0]))"
LOAD = ("df = pd.DataFrame(np.load({data!r}), columns=[f'c{{i}}' for i in range({cols})])\n"
        "print(len(df), float(df.iloc[-1, 0]))")
# Untimed checks of each template's first sandbox: what it holds.
PROBE = "import os\nprint('df' in globals(), os.path.getsize({data!r}), 'np' in globals(), 'pd' in globals())"


def post(fb: Forkbox, path: str, body: dict) -> dict:
    st, b = fb.request("POST", path, body)
    if st != 200:
        raise SystemExit(f"POST {path}: HTTP {st}: {b[:500]!r}")
    return json.loads(b)


def run_code(fb: Forkbox, sid: str, code: str, want: str, what: str) -> None:
    out, code_ = fb.exec(sid, code)
    if code_ != 0 or out.strip() != want:
        raise SystemExit(f"{what}: expected {want!r} and exit 0, got {out[-500:]!r} exit {code_}")


def wait_zygote(fb: Forkbox, name: str, timeout: float) -> float:
    """Seconds until `GET /v1/pool` shows the template's zygote."""
    t0 = time.perf_counter()
    while True:
        st, b = fb.request("GET", "/v1/pool")
        if st != 200:
            raise SystemExit(f"GET /v1/pool: HTTP {st}: {b[:300]!r}")
        if json.loads(b).get("templates", {}).get(name, {}).get("zygote"):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"the zygote of template {name!r} is not warm after {timeout:.0f} s: {b[:500]!r}")
        time.sleep(0.1)


def wait_settled(fb: Forkbox, timeout: float) -> float:
    """Seconds until no zygote is warming in the background (`GET /v1/pool`
    lists those under `fork_spares`; nothing here forks), so that no
    template's state is being loaded while samples are taken."""
    t0 = time.perf_counter()
    while True:
        st, b = fb.request("GET", "/v1/pool")
        if st != 200:
            raise SystemExit(f"GET /v1/pool: HTTP {st}: {b[:300]!r}")
        if not json.loads(b).get("fork_spares"):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise SystemExit(f"the pool is still warming after {timeout:.0f} s: {b[:500]!r}")
        time.sleep(0.2)


def sample(fb: Forkbox, body: dict, code: str, want: str, what: str, ids: list[str],
           again: str | None = None) -> tuple[float, float, float | None]:
    """create → first exec done; returns (total, create) seconds, and how
    long the exec `again` took after it in the same sandbox; destroys after."""
    t0 = time.perf_counter()
    sid = post(fb, "/v1/sandboxes", body)["id"]
    t1 = time.perf_counter()
    out, code_ = fb.exec(sid, code)
    t2 = time.perf_counter()
    ids.append(sid)
    if code_ != 0 or out.strip() != want:
        raise SystemExit(f"{what} ({sid}): expected {want!r} and exit 0, got {out[-500:]!r} exit {code_}")
    second = None
    if again is not None:
        t3 = time.perf_counter()
        out, code_ = fb.exec(sid, again)
        second = time.perf_counter() - t3
        if code_ != 0 or out.strip() != want:
            raise SystemExit(f"{what} ({sid}), again: expected {want!r} and exit 0, got {out[-500:]!r} exit {code_}")
    fb.destroy(sid)
    return t2 - t0, t1 - t0, second


def server_creates(log_text: str, ids: list[str]) -> tuple[list[float], int]:
    """The create handler's total_ms of these sandboxes (server log), and how many the pool served."""
    want, totals, pooled = set(ids), [], 0
    for line in log_text.splitlines():
        line = ANSI.sub("", line)
        if " created " not in line and not line.rstrip().endswith("created"):
            continue
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        if kv.get("sandbox") in want and "total_ms" in kv:
            totals.append(float(kv["total_ms"]))
            pooled += kv.get("pool") == "true"
    return totals, pooled


def read_log(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def delete_template(fb: Forkbox, name: str, force: bool = False) -> tuple[int, bytes]:
    return fb.request("DELETE", f"/v1/templates/{name}" + ("?force=true" if force else ""))


def main() -> int:
    ap = bench_args(__doc__, DEFAULT_STATE_DIR)
    ap.add_argument("--reps", type=int, default=10, help="timed samples of each measurement (default 10)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    ap.add_argument("--rows", type=int, default=8_192_000, help="DataFrame rows (default 8,192,000: 500 MiB with 8 columns)")
    ap.add_argument("--cols", type=int, default=8)
    ap.add_argument("--ram-mib", type=int, default=4096, help="ram_mib of the setup sandbox (its templates keep it)")
    ap.add_argument("--gap-s", type=float, default=1.0, help="pause between samples (default 1)")
    ap.add_argument("--serve-args", default="", help="more flags for `forkbox serve`, one string (e.g. '--volume-gib 8')")
    ap.add_argument("--no-docs", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be ≥ 1")
    cmdline = "python3 bench/templates.py" + "".join(" " + shlex.quote(x) for x in sys.argv[1:])
    mib = args.rows * args.cols * 8 / 2**20
    m = machine()
    load_start = os.getloadavg()[0]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        bin_date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.stat(args.bin).st_mtime))
    except OSError:
        bin_date = "?"

    srv = Server(args.bin, args.state_dir, args.templates_dir, ready_timeout=1800)
    base_command = srv.command
    srv.command = lambda: base_command() + shlex.split(args.serve_args)
    srv.start()
    fb = Forkbox(srv.url)
    made: list[str] = []  # templates to delete
    live: list[str] = []  # sandboxes to destroy if the run stops early
    res: dict = {}
    series = {k: Series(k, k) for k in ("tpl", "tpl_create", "base", "base_create", "base_again", "plain", "plain_create")}
    ids = {"tpl": [], "base": [], "plain": []}
    notes: list[str] = []
    ok = False
    try:
        # 1. The setup sandbox and the two templates.
        setup = post(fb, "/v1/sandboxes", {"ram_mib": args.ram_mib})["id"]
        live.append(setup)
        log(f"setup sandbox {setup}: {mib:.0f} MiB DataFrame and {DATA}")
        t = time.perf_counter()
        out, code = fb.exec(setup, SETUP.format(rows=args.rows, cols=args.cols, data=DATA))
        res["setup_s"] = time.perf_counter() - t
        parts = out.strip().split()
        if code != 0 or len(parts) != 3 or parts[0] != str(args.rows) or int(parts[2]) < args.rows * args.cols * 8:
            raise SystemExit(f"setup: unexpected answer {out[-500:]!r} exit {code}")
        want = f"{parts[0]} {parts[1]}"
        file_bytes = int(parts[2])
        log(f"setup took {res['setup_s']:.1f} s; expected answer {want!r}")

        for name, prep in ((TPL_DF, None), (TPL_FILE, "del df\nimport gc\ngc.collect()\nprint('df' in globals())")):
            if prep:
                run_code(fb, setup, prep, "False", f"{name}: dropping df")
            t = time.perf_counter()
            info = post(fb, f"/v1/sandboxes/{setup}/template", {"name": name})
            res[f"save_{name}"] = time.perf_counter() - t
            made.append(name)
            res[f"info_{name}"] = info
            if info.get("unsaved"):
                raise SystemExit(f"template {name}: globals not saved: {info['unsaved']}")
            log(f"saved {name} in {res[f'save_{name}']:.2f} s: {info.get('size_bytes', 0) / 2**20:.0f} MiB, "
                f"limits {info.get('limits')}")
            res[f"warm_{name}"] = wait_zygote(fb, name, timeout=600)
            log(f"zygote of {name} warm {res[f'warm_{name}']:.2f} s after the save returned")
        fb.destroy(setup)
        live.remove(setup)
        res["settle_s"] = wait_settled(fb, timeout=300)

        # Untimed: what each template's sandboxes hold.
        probe = PROBE.format(data=DATA)
        for name, has_df in ((TPL_DF, True), (TPL_FILE, False)):
            sid = post(fb, "/v1/sandboxes", {"template": name})["id"]
            live.append(sid)
            run_code(fb, sid, probe, f"{has_df} {file_bytes} True True", f"{name}: probe")
            st, b = fb.request("GET", f"/v1/sandboxes/{sid}")
            got_ram = json.loads(b).get("ram_mib") if st == 200 else None
            if got_ram != args.ram_mib:
                note = f"a sandbox of `{name}` created without `ram_mib` got {got_ram!r}, not the saved sandbox's {args.ram_mib}"
                notes.append(note)
                log(f"note: {note}")
            fb.destroy(sid)
            live.remove(sid)

        # 2-4. Interleaved rounds.
        load_code = LOAD.format(data=DATA, cols=args.cols)
        # After the baseline's sample, the same load once more in the same
        # sandbox (df dropped first): what the load costs with memory the
        # process has just freed, for reference.
        again_code = "del df\n" + load_code
        kinds = (
            ("tpl", {"template": TPL_DF}, USE, want, None),
            ("base", {"template": TPL_FILE}, load_code, want, again_code),
            ("plain", {}, "print(1)", "1", None),
        )
        for rnd in range(args.warmup + args.reps):
            timed_round = rnd >= args.warmup
            for key, body, code, expect, again in kinds:
                time.sleep(args.gap_s)
                scratch: list[str] = []
                total, create, second = sample(fb, body, code, expect, key, ids[key] if timed_round else scratch, again)
                if timed_round:
                    series[key].samples_ms.append(total * 1000)
                    series[key + "_create"].samples_ms.append(create * 1000)
                    if second is not None:
                        series[key + "_again"].samples_ms.append(second * 1000)
            if timed_round:
                log(f"round {rnd - args.warmup + 1}/{args.reps}: template {series['tpl'].samples_ms[-1]:.1f} ms, "
                    f"file {series['base'].samples_ms[-1]:.1f} ms, default {series['plain'].samples_ms[-1]:.1f} ms")

        # 5. The templates go (no sandbox uses them any more: no force).
        for name in list(made):
            st, b = delete_template(fb, name)
            if st != 204:
                raise SystemExit(f"DELETE /v1/templates/{name}: HTTP {st}: {b[:500]!r}")
            made.remove(name)
        st, b = fb.request("GET", "/v1/pool")
        left = [n for n in (TPL_DF, TPL_FILE) if n in json.loads(b).get("templates", {})] if st == 200 else []
        if left:
            notes.append(f"`GET /v1/pool` still showed {left} right after the templates were deleted")
            log(f"note: {notes[-1]}")
        ok = True
    finally:
        for sid in live:
            try:
                fb.destroy(sid)
            except Exception as e:  # noqa: BLE001 - best effort on the way out
                log(f"could not destroy {sid}: {e}")
        for name in made:
            try:
                st, b = delete_template(fb, name, force=True)
                log(f"cleanup: DELETE /v1/templates/{name}?force=true: HTTP {st} {b[:200]!r}")
            except Exception as e:  # noqa: BLE001
                log(f"cleanup: could not delete template {name}: {e}")
        fb.close()
        srv.stop()
        if not ok:
            log(f"server log: {srv.log_path}")

    server_log = read_log(srv.log_path)
    srv_ms = {k: server_creates(server_log, ids[k]) for k in ids}
    bad = [ln for ln in (ANSI.sub("", x) for x in server_log.splitlines())
           if re.search(r"\b(ERROR|WARN)\b|panicked", ln)]

    def row(label: str, key: str) -> str:
        s, c = series[key], series[key + "_create"]
        totals, pooled = srv_ms[key]
        srv_col = (f"{fmt_ms(Series('', '', totals).p50)} ({pooled}/{len(totals)} from the pool)"
                   if totals else "–")
        return (f"| {label} | {fmt_ms(s.p50)} | {fmt_ms(s.pct(90))} | {fmt_ms(c.p50)} | "
                f"{fmt_ms(s.p50 - c.p50)} | {srv_col} |")

    def srv_p50(key: str) -> float:
        return Series("", "", srv_ms[key][0]).p50

    tpl, base, plain, again = series["tpl"], series["base"], series["plain"], series["base_again"]
    base_create = series["base_create"]
    size = {n: res[f"info_{n}"].get("size_bytes", 0) / 2**20 for n in (TPL_DF, TPL_FILE)}
    lines = [
        f"{args.reps} samples of each (after {args.warmup} untimed round{'s' if args.warmup != 1 else ''}), "
        f"the three interleaved, {args.gap_s:g} s apart; ms from the client: `POST /v1/sandboxes` until its answer, "
        "then the first exec until its `exit` event, on one keep-alive stdlib connection; every sandbox is destroyed "
        "after its sample (not timed). Every answer is checked.",
        "",
        "| create → first exec | p50 | p90 | create p50 | first exec p50 | server: create handler p50 |",
        "|---|---:|---:|---:|---:|---|",
        row(f"saved template holding the DataFrame → `{USE}`", "tpl"),
        row("baseline: template with the file only → `np.load` it into the DataFrame, print the same", "base"),
        row("reference: default template → `print(1)`", "plain"),
        f"| reference: the baseline's load again, in the same sandbox right after (`del df` first), exec only | "
        f"{fmt_ms(again.p50)} | {fmt_ms(again.pct(90))} | | {fmt_ms(again.p50)} | |",
        "",
        f"Baseline / template: **{fmt_ratio(base.p50, tpl.p50)}** at p50, {fmt_ratio(base.pct(90), tpl.pct(90))} at p90 "
        f"({fmt_ratio(base_create.p50 + again.p50, tpl.p50)} against the baseline's best case here: its create p50 plus the "
        "repeated load's p50); "
        f"the saved template costs {fmt_ratio(tpl.p50, plain.p50)} a default create → `print(1)` at p50"
        + (f", and its create handler (a fork of the zygote holding the DataFrame) {fmt_ms(srv_p50('tpl') - srv_p50('plain'))} ms "
           f"more than the default template's." if srv_ms["tpl"][0] and srv_ms["plain"][0] else "."),
        "",
        "| setup (untimed above) | time |",
        "|---|---:|",
        f"| make the DataFrame ({args.cols} × {args.rows:,} float64, {mib:.0f} MiB) and `numpy.save` it in the setup sandbox | {res['setup_s']:.2f} s |",
        f"| save `{TPL_DF}` (`POST /v1/sandboxes/{{id}}/template`: pickle the REPL's globals, copy the sandbox's files; "
        f"{size[TPL_DF]:,.0f} MiB of layer) | {res['save_' + TPL_DF]:.2f} s |",
        f"| … until its zygote (which loads the pickled state once) is warm in `GET /v1/pool` | {res['warm_' + TPL_DF]:.2f} s |",
        f"| save `{TPL_FILE}` after `del df` ({size[TPL_FILE]:,.0f} MiB of layer) | {res['save_' + TPL_FILE]:.2f} s |",
        f"| … until its zygote is warm | {res['warm_' + TPL_FILE]:.2f} s |",
        f"| then until no zygote warms in the background any more (`GET /v1/pool`) | {res['settle_s']:.2f} s |",
        "",
        f"A sandbox of the saved template is a fork of a zygote that loaded the {mib:.0f} MiB DataFrame once, when the "
        "template was saved: its first exec finds `df` in memory, shared copy-on-write with the zygote, and pays "
        "nothing for the data until it writes to it. The baseline is the best a fresh sandbox can do without it: "
        f"the same file is already in its template (and in the host's page cache after the first read), numpy and pandas "
        f"are already imported in its REPL, and it still has to read and copy {mib:.0f} MiB into its own memory on every create. "
        + (f"The baseline's first exec varies from one sandbox to the next ({fmt_ms(min(base.samples_ms))} to "
           f"{fmt_ms(max(base.samples_ms))} ms end to end), while the same load repeated in the same sandbox takes "
           f"{fmt_ms(again.p50)} ms at p50: on this machine (a VM) the difference is kernel time spent faulting in fresh "
           "memory for the array (system time in `getrusage`, seen in a separate check), not reading the disk (the file "
           "stays in the host's page cache) nor waiting for a CPU. "
           if base.p50 - base_create.p50 > 2 * again.p50 else
           f"The baseline's first exec ranges from {fmt_ms(min(base.samples_ms))} to {fmt_ms(max(base.samples_ms))} ms "
           f"end to end; the same load repeated in the same sandbox takes {fmt_ms(again.p50)} ms at p50. ")
        + "The saving is paid for once, at save time (the pickle and the zygote's load above), and with disk: the "
        "template keeps the pickled globals beside its files. Both templates keep the setup sandbox's `ram_mib` "
        f"({args.ram_mib}), so every sandbox above except the reference has that limit.",
        "",
        "### Run",
        "",
        f"- date: {date}",
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem']} RAM, Linux {m['kernel']}, {m['os']}; "
        f"1-minute load average {load_start:.2f} just before the run (other work on the machine)",
        f"- forkbox: binary `{args.bin}` (file dated {bin_date}), checkout at commit {m['commit']}; server started by the "
        f"script (`--serve-args {args.serve_args!r}`), "
        f"egress and other create settings left at their defaults",
        f"- server log: {len(bad)} ERROR/WARN/panic line{'s' if len(bad) != 1 else ''}",
        f"- reproduce: `{cmdline}`",
    ] + [f"- note: {n}" for n in notes]
    body = "\n".join(lines)
    print(body)
    for ln in bad[:20]:
        log(f"server log: {ln[:400]}")
    if not args.no_docs:
        write_section(args.docs, SECTION, TITLE, body)
        log(f"wrote the `{SECTION}` section of {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
