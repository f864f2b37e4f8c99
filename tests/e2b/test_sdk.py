"""Every call goes through the real E2B SDKs; none of this is faked."""
import hashlib
import time

import httpx
import pytest


def test_commands_files_and_lifecycle(server):
    from e2b import CommandExitException, Sandbox

    sb = Sandbox.create(timeout=120, metadata={"suite": "e2b"}, envs={"FOO": "bar"})
    try:
        r = sb.commands.run("echo hi; echo err >&2; echo $FOO; whoami; pwd")
        assert (r.stdout, r.stderr, r.exit_code) == ("hi\nbar\nuser\n/home/user\n", "err\n", 0)
        assert sb.commands.run("whoami", user="root").stdout == "root\n"
        with pytest.raises(CommandExitException) as e:
            sb.commands.run("exit 3")
        assert e.value.exit_code == 3
        sb.files.write("hello.txt", "world")
        assert sb.files.read("hello.txt") == "world"
        assert sb.commands.run("stat -c %U /home/user/hello.txt").stdout == "user\n"
        assert "hello.txt" in [e.name for e in sb.files.list(".")]
        assert sb.files.exists("hello.txt") and not sb.files.exists("nope")
        h = sb.commands.run("sleep 30", background=True)
        assert h.pid in [p.pid for p in sb.commands.list()]
        assert sb.commands.kill(h.pid)
        info = sb.get_info()
        assert info.metadata == {"suite": "e2b"} and info.template_id == "base"
        assert sb.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
    finally:
        sb.kill()
    assert not Sandbox.kill(sb.sandbox_id), "a second kill finds nothing"


def test_a_login_shell_forks_nothing_before_the_command(server):
    """The SDK runs each command as `bash -l -c`. In forkbox's templates the
    login shell's start-up starts no process (Debian's /etc/profile ran
    `id -u` and `run-parts`: docs/templates.md#login-shells), so the
    command's first child gets the pid after the shell's own, in a
    sandbox where nothing else runs. PATH is still root's or the user's."""
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        for user, path in [("user", "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"),
                           ("root", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")]:
            shell, child, seen = sb.commands.run('echo $$; sh -c \'echo $$\'; echo "$PATH"', user=user).stdout.split()
            assert int(child) == int(shell) + 1, f"as {user}, the login shell started {int(child) - int(shell) - 1} processes"
            assert seen == path, (user, seen)
    finally:
        sb.kill()


def test_envd_refuses_calls_without_the_access_token(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=60)
    try:
        r = httpx.post(f"{server.url}/process.Process/List", json={},
                       headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983"})
        assert r.status_code == 401, r.text
        r = httpx.get(f"{server.url}/files", params={"path": "/etc/passwd"},
                      headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": "0" * 64})
        assert r.status_code == 401, r.text
    finally:
        sb.kill()


def test_control_plane_errors_are_e2b_shaped(server):
    r = httpx.get(f"{server.url}/sandboxes/sb-nope", headers={"X-API-KEY": "k"})
    assert r.status_code == 404 and r.json()["code"] == 404 and r.json()["message"]


def test_code_interpreter_on_the_repl(server):
    from e2b_code_interpreter import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        seen = []
        ex = sb.run_code("x = 41\nprint('out')\nx + 1", on_stdout=lambda m: seen.append(m.line))
        assert (ex.text, ex.logs.stdout, seen) == ("42", ["out\n"], ["out\n"])
        assert sb.run_code("x").text == "41", "state persists between calls"
        ex = sb.run_code("1/0")
        assert (ex.error.name, ex.error.value) == ("ZeroDivisionError", "division by zero")
        assert sb.run_code("import os; os.environ['K']", envs={"K": "v"}).text == "'v'"
        assert sb.run_code("import os; os.environ.get('K')").text is None, "per-call env is put back"
        ctx = sb.create_code_context(cwd="/tmp")
        sb.run_code("y = 5", context=ctx)
        assert sb.run_code("import os; (y, os.getcwd())", context=ctx).text == "(5, '/tmp')"
        assert sb.run_code("'y' in globals()").text == "False", "contexts do not share variables"
        ex = sb.run_code("import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.show()")
        assert any(r.png for r in ex.results)
    finally:
        sb.kill()


def test_files_gzip_metadata_watch_and_signed_links(server):
    from e2b import FilesystemEventType, InvalidArgumentException, Sandbox

    sb = Sandbox.create(timeout=120, secure=True)
    try:
        blob = bytes(range(256)) * 4096
        sb.files.write("z/blob.bin", blob, gzip=True)
        assert sb.files.read("z/blob.bin", format="bytes", gzip=True) == blob
        assert sb.commands.run("sha256sum z/blob.bin | cut -c1-16").stdout == hashlib.sha256(blob).hexdigest()[:16] + "\n"

        # Metadata lives in the file's user.e2b.* xattrs, as envd keeps it.
        w = sb.files.write("m.txt", "meta", metadata={"Owner": "agent-7", "run": "42"})
        assert w.metadata == {"owner": "agent-7", "run": "42"}, w
        assert sb.files.get_info("m.txt").metadata == {"owner": "agent-7", "run": "42"}
        assert {e.name: e.metadata for e in sb.files.list(".")}["m.txt"] == {"owner": "agent-7", "run": "42"}
        assert sb.commands.run("getfattr -n user.e2b.run --only-values m.txt 2>/dev/null || "
                               "python3 -c \"import os; print(os.getxattr('m.txt', 'user.e2b.run').decode(), end='')\"").stdout == "42"
        with pytest.raises(InvalidArgumentException):
            sb.files.write("bad.txt", "x", metadata={"k": "v" * 5000})
        assert not sb.files.exists("bad.txt"), "a refused upload writes nothing"

        handle = sb.files.watch_dir("z", include_entry=True)
        sb.files.write("z/new.txt", "12345")
        sb.files.remove("z/blob.bin")
        events = []
        for _ in range(50):
            events += handle.get_new_events()
            if any(e.type == FilesystemEventType.REMOVE for e in events):
                break
            time.sleep(0.1)
        handle.stop()
        created = [e for e in events if e.name == "new.txt" and e.type == FilesystemEventType.CREATE]
        assert created and created[0].entry is not None and created[0].entry.size == 5, events
        assert any(e.name == "blob.bin" and e.type == FilesystemEventType.REMOVE and e.entry is None for e in events), events

        # Signed links: what a browser or curl uses, with no headers at all.
        url = sb.upload_url("up/link.txt")
        assert httpx.post(url, files={"file": ("link.txt", b"via link")}).status_code == 200
        assert httpx.get(sb.download_url("up/link.txt")).text == "via link"
        assert httpx.get(sb.download_url("up/link.txt", use_signature_expiration=60)).text == "via link"
        assert httpx.get(sb.download_url("up/link.txt").replace("link.txt", "other.txt")).status_code == 401
    finally:
        sb.kill()


def test_lifecycle_metrics_fork_snapshot_and_ports(server):
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120)
    try:
        sb.commands.run("echo state > /tmp/state")
        sb.set_timeout(300)
        assert (sb.get_info().end_at - sb.get_info().started_at).total_seconds() > 200
        m = sb.get_metrics()
        assert m and m[0].mem_used > 0 and m[0].cpu_count >= 1, m
        forks = sb.fork(count=2)
        try:
            assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
            forks[0].commands.run("echo child > /tmp/state")
            assert [f.commands.run("cat /tmp/state").stdout for f in forks] == ["child\n", "state\n"]
            assert sb.commands.run("cat /tmp/state").stdout == "state\n", "a child's writes stay its own"
        finally:
            for f in forks:
                if isinstance(f, Sandbox):
                    f.kill()
        snap = sb.create_snapshot()
        try:
            from_snap = Sandbox.create(snap.snapshot_id, timeout=60)
            try:
                assert from_snap.commands.run("cat /tmp/state").stdout == "state\n"
            finally:
                from_snap.kill()
        finally:
            Sandbox.delete_snapshot(snap.snapshot_id)

        sb.commands.run("cd /tmp && echo served > index.html && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)")
        host = sb.get_host(8000)
        assert host == f"8000-{sb.sandbox_id}.{server.url.removeprefix('http://')}", host
        for _ in range(100):
            r = httpx.get(f"{server.url}/index.html", headers={"Host": host})
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.text == "served\n", r.text
        r = httpx.get(f"{server.url}/", headers={"Host": sb.get_host(8001)})
        assert r.status_code == 502 and "port is not open" in r.json()["message"], r.text

        assert sb.pause()
        assert Sandbox.get_info(sb.sandbox_id).state.value == "paused"
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("cat /tmp/state").stdout == "state\n"
        assert again.is_running()
    finally:
        sb.kill()


def test_pty_through_the_sync_sdk(server):
    from e2b import PtySize, Sandbox

    sb = Sandbox.create(timeout=60)
    try:
        got = bytearray()
        pty = sb.pty.create(PtySize(rows=20, cols=70))
        sb.pty.send_stdin(pty.pid, b"stty size; exit\n")
        pty.wait(on_pty=lambda data: got.extend(data))
        assert b"20 70" in got, got
    finally:
        sb.kill()


def test_a_gibibyte_through_files_keeps_the_servers_memory_flat(server):
    from e2b import Sandbox

    from helpers import RssSampler, numbered_mibs

    size, up = 1 << 30, hashlib.sha256()

    sb = Sandbox.create(timeout=600)
    try:
        with RssSampler(server.proc.pid) as rss:
            # An iterable goes out streamed, as application/octet-stream.
            sb.files.write("big.bin", numbered_mibs(size, up), request_timeout=600)
            assert sb.commands.run("sha256sum big.bin | cut -d' ' -f1", timeout=300).stdout.strip() == up.hexdigest()
            down, n = hashlib.sha256(), 0
            for chunk in sb.files.read("big.bin", format="stream", request_timeout=600):
                down.update(chunk)
                n += len(chunk)
            assert (n, down.hexdigest()) == (size, up.hexdigest())
        grew = (rss.peak - rss.before) >> 10
        assert grew < 128, f"the server's RSS grew by {grew} MiB moving 1 GiB each way"
    finally:
        sb.kill()
