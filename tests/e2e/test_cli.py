"""The `forkbox` command line against a live server: run (throwaway and
existing sandboxes, python and bash, stdin, exit codes), ls, rm, help."""
from __future__ import annotations

import os
import subprocess

from helpers import FORKBOX_BIN


def cli(server, *args, stdin=None):
    env = {"FORKBOX_URL": server.url, "PATH": "/usr/bin:/bin"}
    return subprocess.run([FORKBOX_BIN, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


def test_run_in_a_throwaway_sandbox(server, http):
    before = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
    r = cli(server, "run", "import sys\nprint('out'); print('err', file=sys.stderr)\n6 * 7")
    assert (r.returncode, r.stdout, r.stderr) == (0, "out\n42\n", "err\n"), r
    after = {s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]}
    assert after == before, "the throwaway sandbox was not destroyed"


def test_run_exit_codes_bash_and_stdin(server):
    assert cli(server, "run", "raise SystemExit(5)").returncode == 5
    r = cli(server, "run", "-l", "bash", "echo $((6*7)); exit 3")
    assert (r.returncode, r.stdout) == (3, "42\n"), r
    r = cli(server, "run", "-", stdin="print('from stdin')")
    assert (r.returncode, r.stdout) == (0, "from stdin\n"), r


def test_run_ls_and_rm_on_an_existing_sandbox(server, http):
    sid = http.post("/v1/sandboxes", json={}).json()["id"]
    assert cli(server, "run", "-s", sid, "x = 'kept'").returncode == 0
    r = cli(server, "run", "-s", sid, "print(x)")
    assert (r.returncode, r.stdout) == (0, "kept\n"), r
    ls = cli(server, "ls")
    assert ls.returncode == 0 and sid in ls.stdout, ls
    rm = cli(server, "rm", sid)
    assert (rm.returncode, rm.stdout.strip()) == (0, sid), rm
    assert http.get(f"/v1/sandboxes/{sid}").status_code == 404
    again = cli(server, "rm", sid)
    assert again.returncode == 1 and "404" in again.stderr, again


def test_top_shows_cpu_and_memory_busiest_first(server, http):
    hog = http.post("/v1/sandboxes", json={"egress": False}).json()["id"]
    quiet = http.post("/v1/sandboxes", json={"egress": False, "ram_mib": 256}).json()["id"]
    try:
        # A spinning process and 64 MiB written in the hog.
        r = cli(server, "run", "-s", hog, "-l", "bash",
                "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & head -c 64M /dev/zero > /dev/shm/blob")
        assert r.returncode == 0, r
        info = http.get(f"/v1/sandboxes/{hog}").json()
        assert info["memory_bytes"] >= 64 << 20 and info["cpu_seconds"] >= 0, info
        top = cli(server, "top", "--once", "--interval", "1")
        assert top.returncode == 0, top
        rows = {line.split()[0]: line.split() for line in top.stdout.splitlines()[2:]}
        assert list(rows)[0] == hog, top.stdout           # busiest first
        assert float(rows[hog][3]) > 30, top.stdout        # CPU%: one spinning core
        assert float(rows[quiet][3]) < 10, top.stdout
        assert int(rows[hog][4].split("/")[0]) >= 64 and rows[quiet][4].endswith("/256"), top.stdout
        assert cli(server, "top", "--once", "--interval", "0").returncode != 0
    finally:
        http.delete(f"/v1/sandboxes/{hog}")
        http.delete(f"/v1/sandboxes/{quiet}")


def test_errors_and_help(server):
    r = cli(server, "run", "-t", "no-such-template", "1")
    assert r.returncode == 1 and "unknown template" in r.stderr, r
    for args in (["--help"], ["serve", "--help"], ["run", "--help"], ["template", "build", "--help"], ["ls", "--help"], ["rm", "--help"]):
        h = cli(server, *args)
        assert h.returncode == 0 and "Usage" in h.stdout, (args, h)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    # The pipe's read end is closed before the command starts, so its first
    # line meets a broken pipe: it must die of SIGPIPE, as `| head -1`
    # expects, not panic in println! (exit 101, "failed printing to stdout").
    r_fd, w_fd = os.pipe()
    os.close(r_fd)
    try:
        p = subprocess.run([FORKBOX_BIN, "template", "ls", "--state-dir", str(tmp_path)], stdout=w_fd, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(w_fd)
    assert p.returncode == -13, (p.returncode, p.stderr)
    assert "panicked" not in p.stderr, p.stderr
