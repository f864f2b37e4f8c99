"""Every call goes through the real E2B SDKs; none of this is faked."""
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
