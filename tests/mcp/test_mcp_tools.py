"""`forkbox mcp` over stdio, driven by the official `mcp` Python client SDK,
against a live forkbox server: every tool, the lazy default sandbox, images
as image content, errors as tool errors."""
from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib

from mcp import Client, StdioServerParameters

from helpers import free_port

TOOLS = {"create_sandbox", "run_python", "run_bash", "fork", "diff", "merge_into", "checkpoint", "restore",
         "upload", "download", "destroy_sandbox"}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def stdio(argv: list[str]) -> Client:
    return Client(StdioServerParameters(command=argv[0], args=argv[1:]), read_timeout_seconds=240)


def text(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def images(result) -> list:
    return [c for c in result.content if c.type == "image"]


def data(result) -> dict:
    """A tool's JSON answer (create_sandbox, fork, diff, ...)."""
    assert not result.is_error, text(result)
    return json.loads(text(result))


async def call(client: Client, tool: str, **args):
    return await client.call_tool(tool, args)


def real_png(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG, built from its chunks (no imaging library needed)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    raw = b"".join(b"\x00" + bytes([200, 30, 30]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", png[:16]
    length, kind = struct.unpack(">I4s", png[8:16])
    assert kind == b"IHDR" and length == 13
    body = png[16:29]
    assert struct.unpack(">I", png[29:33])[0] == zlib.crc32(b"IHDR" + body), "IHDR CRC"
    return struct.unpack(">II", body[:8])


def test_tools_are_listed_with_schemas_and_descriptions(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == TOOLS
            for t in tools.values():
                assert t.description and len(t.description) > 40, t
                assert t.input_schema["type"] == "object", t.input_schema
            assert tools["run_python"].input_schema["required"] == ["code"]
            assert "sandbox_id" in tools["run_python"].input_schema["properties"]
            assert tools["run_bash"].input_schema["required"] == ["command"]
            assert set(tools["merge_into"].input_schema["required"]) == {"winner_sandbox_id"}
            assert set(tools["restore"].input_schema["required"]) == {"checkpoint"}
            assert "default sandbox" in c.instructions
            # Listing tools creates nothing.
            assert no_sandboxes_left() == []
    run(go())


def test_default_sandbox_is_made_on_first_use_kept_and_destroyed_at_the_end(mcp_command, no_sandboxes_left, http):
    async def go():
        async with stdio(mcp_command()) as c:
            await c.list_tools()
            assert no_sandboxes_left() == []
            r = await call(c, "run_python", code="x = 41")
            assert not r.is_error, text(r)
            live = no_sandboxes_left()
            assert len(live) == 1, live
            assert f"(sandbox {live[0]})" in text(r)
            r = await call(c, "run_python", code="x + 1")
            assert not r.is_error and "result:\n42\n" in text(r), text(r)
            r = await call(c, "run_bash", command="hostname")
            assert f"stdout:\n{live[0]}\n" in text(r), text(r)
            assert no_sandboxes_left() == live  # still one
            return live[0]
    sid = run(go())
    # The session ended (the client closed stdin): its default sandbox is gone.
    assert http.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_concurrent_first_calls_share_one_default(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            rs = await asyncio.gather(*(call(c, "run_bash", command="hostname") for _ in range(4)))
            assert len({text(r).split("stdout:\n")[1].split("\n")[0] for r in rs}) == 1, [text(r) for r in rs]
            assert len(no_sandboxes_left()) == 1
    run(go())


def test_run_python_returns_stdout_stderr_result_and_errors(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            r = await call(c, "run_python", code="import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7")
            assert not r.is_error
            t = text(r)
            assert t.startswith("stdout:\nout\nstderr:\nerr\nresult:\n42\nexit code: 0"), t
            r = await call(c, "run_python", code="def f():\n    return 1 / 0\nf()")
            assert r.is_error
            t = text(r)
            assert "Traceback" in t and "error:\nZeroDivisionError: division by zero" in t and "exit code: 1" in t, t
            # The REPL goes on, state intact.
            r = await call(c, "run_python", code="f.__name__")
            assert not r.is_error and "result:\n'f'" in text(r)
            r = await call(c, "run_python", code="import time; time.sleep(5)", timeout_ms=300)
            assert r.is_error and "exit code: 124" in text(r), text(r)
    run(go())


def test_run_bash(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            r = await call(c, "run_bash", command="echo hi; echo oops >&2; pwd")
            assert not r.is_error and text(r).startswith("stdout:\nhi\n/root\nstderr:\noops\nexit code: 0"), text(r)
            r = await call(c, "run_bash", command="exit 3")
            assert r.is_error and "exit code: 3" in text(r)
    run(go())


def test_display_of_a_png_comes_back_as_image_content(mcp_command, no_sandboxes_left):
    png = real_png(3, 2)
    code = (f"import base64\nclass Pic:\n    def _repr_png_(self):\n        return base64.b64decode({base64.b64encode(png).decode()!r})\n"
            "    def __repr__(self):\n        return '<Pic 3x2>'\n"
            "display(Pic())\nprint('after')\nPic()")

    async def go():
        async with stdio(mcp_command()) as c:
            r = await call(c, "run_python", code=code)
            assert not r.is_error, text(r)
            imgs = images(r)
            assert len(imgs) == 2, r.content  # the display and the result
            for img in imgs:
                assert img.mime_type == "image/png"
                assert base64.b64decode(img.data) == png
                assert png_size(base64.b64decode(img.data)) == (3, 2)
            assert "display:\n<Pic 3x2>" in text(r) and "result:\n<Pic 3x2>" in text(r), text(r)
    run(go())


def test_create_sandbox_and_sandbox_id(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            first = data(await call(c, "create_sandbox"))
            assert first["default"] is True  # the first one becomes the default
            second = data(await call(c, "create_sandbox", ram_mib=512, egress=False))
            assert second["default"] is False and second["sandbox_id"] != first["sandbox_id"]
            await call(c, "run_python", code="who = 'default'")
            await call(c, "run_python", code="who = 'second'", sandbox_id=second["sandbox_id"])
            r = await call(c, "run_python", code="who")
            assert "result:\n'default'" in text(r) and f"(sandbox {first['sandbox_id']})" in text(r), text(r)
            r = await call(c, "run_python", code="who", sandbox_id=second["sandbox_id"])
            assert "result:\n'second'" in text(r)
            third = data(await call(c, "create_sandbox", make_default=True))
            assert third["default"] is True
            r = await call(c, "run_python", code="'who' in globals()")
            assert "result:\nFalse" in text(r) and f"(sandbox {third['sandbox_id']})" in text(r), text(r)
            assert sorted(no_sandboxes_left()) == sorted([first["sandbox_id"], second["sandbox_id"], third["sandbox_id"]])
    run(go())


def test_fork_diff_merge_into(mcp_command, no_sandboxes_left, http):
    async def go():
        async with stdio(mcp_command()) as c:
            await call(c, "run_python", code="x = 1\nopen('/root/shared.txt', 'w').write('base')")
            forked = data(await call(c, "fork", n=2))
            parent, kids = forked["sandbox_id"], forked["children"]
            assert len(kids) == 2
            for i, k in enumerate(kids):
                r = await call(c, "run_python", code=f"x += {10 * (i + 1)}\nopen('/root/shared.txt', 'w').write('kid{i}')\n"
                                                      f"open('/root/new{i}.txt', 'w').write('n')\nx", sandbox_id=k)
                assert f"result:\n{1 + 10 * (i + 1)}" in text(r), text(r)
            d = data(await call(c, "diff", other_sandbox_id=kids[1]))
            assert d["sandbox_id"] == parent
            assert d["added"] == ["/root/new1.txt"] and d["modified"] == ["/root/shared.txt"] and d["removed"] == []
            d = data(await call(c, "diff", sandbox_id=kids[0], other_sandbox_id=kids[1], paths=["/root"]))
            assert d["added"] == ["/root/new1.txt"] and d["removed"] == ["/root/new0.txt"]
            m = data(await call(c, "merge_into", winner_sandbox_id=kids[1]))
            assert m == {"sandbox_id": parent, "merged": kids[1]}
            r = await call(c, "run_python", code="x, open('/root/shared.txt').read()")
            assert "result:\n(21, 'kid1')" in text(r) and f"(sandbox {parent})" in text(r), text(r)
            # The winner's id is gone: a tool error with the server's message.
            r = await call(c, "run_python", code="1", sandbox_id=kids[1])
            assert r.is_error and "HTTP 404" in text(r), text(r)
            assert sorted(no_sandboxes_left()) == sorted([parent, kids[0]])
            return parent, kids
    parent, kids = run(go())
    for sid in [parent, *kids]:
        assert http.get(f"/v1/sandboxes/{sid}").status_code == 404


def test_upload_and_download(mcp_command, no_sandboxes_left):
    blob = bytes(range(256)) * 4
    png = real_png(5, 4)

    async def go():
        async with stdio(mcp_command()) as c:
            up = data(await call(c, "upload", path="notes/a.txt", content="héllo\nworld\n"))
            assert up["path"] == "/root/notes/a.txt" and up["bytes"] == len("héllo\nworld\n".encode())
            r = await call(c, "run_bash", command="cat /root/notes/a.txt")
            assert "stdout:\nhéllo\nworld\n" in text(r)
            r = await call(c, "download", path="/root/notes/a.txt")
            assert not r.is_error and text(r) == "héllo\nworld\n"
            data(await call(c, "upload", path="/tmp/blob.bin", content=base64.b64encode(blob).decode(), encoding="base64"))
            r = await call(c, "run_python", code="import hashlib; hashlib.sha256(open('/tmp/blob.bin','rb').read()).hexdigest()")
            import hashlib
            assert hashlib.sha256(blob).hexdigest() in text(r)
            r = await call(c, "download", path="/tmp/blob.bin")
            assert "binary (1024 bytes)" in text(r) and base64.b64encode(blob).decode() in text(r), text(r)
            data(await call(c, "upload", path="pic.png", content=base64.b64encode(png).decode(), encoding="base64"))
            r = await call(c, "download", path="pic.png")
            assert [i.mime_type for i in images(r)] == ["image/png"] and base64.b64decode(images(r)[0].data) == png
            await call(c, "run_bash", command="seq 1 100000 > /root/big.txt")
            r = await call(c, "download", path="big.txt", max_bytes=10)
            assert text(r).startswith("1\n2\n3\n4\n5\n") and "only the first 10 of 588895 bytes" in text(r), text(r)
            r = await call(c, "run_bash", command="touch /root/empty")
            r = await call(c, "download", path="empty")
            assert not r.is_error and text(r) == "", text(r)
    run(go())


def test_destroy_sandbox_then_a_fresh_default(mcp_command, no_sandboxes_left, http):
    async def go():
        async with stdio(mcp_command()) as c:
            r = await call(c, "destroy_sandbox")
            assert r.is_error and "no default sandbox" in text(r)
            await call(c, "run_python", code="keep = 1")
            [first] = no_sandboxes_left()
            d = data(await call(c, "destroy_sandbox"))
            assert d == {"destroyed": first, "was_default": True}
            assert http.get(f"/v1/sandboxes/{first}").status_code == 404
            r = await call(c, "run_python", code="'keep' in globals()")
            assert "result:\nFalse" in text(r)
            [second] = no_sandboxes_left()
            assert second != first
            other = data(await call(c, "create_sandbox"))["sandbox_id"]
            assert data(await call(c, "destroy_sandbox", sandbox_id=other)) == {"destroyed": other, "was_default": False}
            assert no_sandboxes_left() == [second]
    run(go())


def test_server_errors_are_tool_errors_with_the_server_message(mcp_command, no_sandboxes_left):
    async def go():
        async with stdio(mcp_command()) as c:
            r = await call(c, "run_python", code="1", sandbox_id="sb-doesnotexist")
            assert r.is_error and "HTTP 404" in text(r) and "sb-doesnotexist" in text(r), text(r)
            r = await call(c, "fork", n=99)
            assert r.is_error and "HTTP 400" in text(r) and "99" in text(r), text(r)
            r = await call(c, "create_sandbox", ram_mib=1)
            assert r.is_error and "ram_mib must be between 64 and" in text(r), text(r)
            r = await call(c, "create_sandbox", template="nope")
            assert r.is_error and "HTTP 404" in text(r), text(r)
            r = await call(c, "merge_into", winner_sandbox_id="sb-doesnotexist")
            assert r.is_error and "HTTP 404" in text(r)
            r = await call(c, "upload", path="x", content="%%%", encoding="base64")
            assert r.is_error and "not valid base64" in text(r)
            r = await call(c, "download", path="/root/missing")
            assert r.is_error and "HTTP 404" in text(r), text(r)
            r = await call(c, "download", path="/proc/self/status")
            assert r.is_error and "HTTP 400" in text(r), text(r)
            r = await call(c, "restore", checkpoint="cp-doesnotexist")
            assert r.is_error and "HTTP 404" in text(r), text(r)
            # Arguments that do not fit the schema: a tool error the model can read.
            r = await call(c, "run_python", timeout_ms=5)
            assert r.is_error and "missing field `code`" in text(r), text(r)
            # After all that the session works, in the one default sandbox it made.
            r = await call(c, "run_python", code="2 + 2")
            assert not r.is_error and "result:\n4" in text(r)
            assert len(no_sandboxes_left()) == 1
    run(go())


def test_an_unreachable_server_is_a_tool_error_not_a_crash(server):
    url = f"http://127.0.0.1:{free_port()}"
    from helpers import FORKBOX_BIN

    async def go():
        async with stdio([FORKBOX_BIN, "mcp", "--url", url]) as c:
            r = await call(c, "run_python", code="1")
            assert r.is_error and f"cannot reach the forkbox server at {url}" in text(r), text(r)
            r = await call(c, "run_bash", command="true")  # still serving
            assert r.is_error and "cannot reach" in text(r)
    run(go())


def test_default_sandbox_gone_elsewhere_is_reported_and_replaced(mcp_command, no_sandboxes_left, http):
    async def go():
        async with stdio(mcp_command()) as c:
            await call(c, "run_python", code="y = 1")
            [sid] = no_sandboxes_left()
            assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
            r = await call(c, "run_python", code="y")
            assert r.is_error and f"default sandbox {sid} no longer exists" in text(r), text(r)
            r = await call(c, "run_python", code="'y' in globals()")
            assert not r.is_error and "result:\nFalse" in text(r)
            assert no_sandboxes_left() not in ([], [sid])
    run(go())


def test_template_option(mcp_command, no_sandboxes_left, http):
    async def go():
        async with stdio(mcp_command("--template", "nope")) as c:
            r = await call(c, "run_python", code="1")
            assert r.is_error and "HTTP 404" in text(r) and "nope" in text(r), text(r)
        async with stdio(mcp_command("--template", "default")) as c:
            await call(c, "run_python", code="1")
            [sid] = no_sandboxes_left()
            assert http.get(f"/v1/sandboxes/{sid}").json()["template"] == "default"
    run(go())


def test_checkpoint_and_restore(mcp_command, no_sandboxes_left):
    """Needs the checkpoint routes of issue 4 (POST …/checkpoints, POST …/restore)."""
    async def go():
        async with stdio(mcp_command()) as c:
            await call(c, "run_python", code="state = ['before']\nopen('/root/f.txt', 'w').write('before')")
            cp = data(await call(c, "checkpoint"))
            assert cp["checkpoint"].startswith("cp-") and cp["sandbox_id"] == no_sandboxes_left()[0], cp
            await call(c, "run_python", code="state.append('after')\nopen('/root/f.txt', 'w').write('after')")
            for _ in range(2):  # a checkpoint stays usable
                restored = data(await call(c, "restore", checkpoint=cp["checkpoint"]))
                assert restored["restored"] == cp["checkpoint"]
                r = await call(c, "run_python", code="state, open('/root/f.txt').read()")
                assert "result:\n(['before'], 'before')" in text(r), text(r)
                await call(c, "run_python", code="state.append('again')")
    run(go())
