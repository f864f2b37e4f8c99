"""AsyncSandbox: the same surface, awaited (each test runs its own event loop)."""
from __future__ import annotations

import asyncio
import io

import pytest

import forkbox
from forkbox import AsyncSandbox


def run(coro):
    return asyncio.run(coro)


def test_async_exec_stream_and_errors(url):
    async def main():
        async with AsyncSandbox(url=url) as sb:
            ex = await sb.run_code("x = 2\nprint('hi', end='')\nx * 21")
            assert (ex.stdout, ex.text, ex.exit_code) == ("hi", "42", 0)
            types = [ev.type async for ev in sb.run_code_stream("print(1)\n1/0")]
            assert types[0] == "stdout" and set(types[1:-2]) == {"stderr"} and types[-2:] == ["error", "exit"]
            out = []
            await sb.run_code("print('cb')", on_stdout=out.append)
            assert out == ["cb\n"]
            with pytest.raises(forkbox.Timeout) as info:
                await sb.run_code("import time; time.sleep(20)", timeout=0.5)
            assert info.value.execution.exit_code == 124
            assert (await sb.info())["state"] == "ready"
            sid = sb.id
        with pytest.raises(forkbox.NotFound):
            await AsyncSandbox.connect(sid, url=url)
    run(main())


def test_async_create_fork_merge_diff(url):
    async def main():
        sb = await AsyncSandbox.create(url=url)
        try:
            await sb.run_code("v = 'parent'")
            a, b = await sb.fork(2)
            assert isinstance(a, AsyncSandbox)
            await a.run_code("v = 'a'")
            await a.upload("/root/a.txt", b"a")
            assert await sb.diff(a) == {"added": ["/root/a.txt"], "removed": [], "modified": []}
            await sb.merge_into(a)
            assert (await sb.run_code("v")).text == "'a'"
            await a.close()
            await b.close()
        finally:
            await sb.close()
    run(main())


def test_async_files_and_watch(url, tmp_path):
    async def main():
        async with AsyncSandbox(url=url) as sb:
            async def chunks():
                for part in (b"as", b"ync"):
                    yield part
            await sb.upload("/root/x", chunks())
            await sb.upload("/root/y", io.BytesIO(b"file-like"))
            local = tmp_path / "z"
            local.write_bytes(b"z" * 200_000)
            await sb.upload("/root/z", local)
            await sb.upload(b"podflare order", "/root/p")
            assert await sb.download("/root/x") == b"async"
            assert await sb.download("/root/y") == b"file-like"
            assert b"".join([c async for c in sb.download_stream("/root/z", 65536)]) == b"z" * 200_000
            assert await sb.download("/root/p") == b"podflare order"
            assert await sb.download_to("/root/z", tmp_path / "back") == 200_000
            assert [e["name"] for e in await sb.list("/root") if not e["name"].startswith(".")] == \
                ["p", "x", "y", "z"]
            assert (await sb.stat("/root/x"))["size"] == 5
            await sb.mkdir("/root/d")
            await sb.rename("/root/x", "/root/d/x")
            await sb.chmod("/root/d/x", 0o600)
            assert (await sb.stat("/root/d/x"))["mode"] == 0o600
            await sb.remove("/root/d", recursive=True)
            assert not await sb.exists("/root/d")
            stream = sb.watch("/root")
            assert (await stream.__anext__())["type"] == "ready"
            await sb.upload("/root/new", b"1")
            ev = await asyncio.wait_for(stream.__anext__(), 10)
            assert ev["type"] in ("created", "modified") and ev["path"].startswith("/root/")
            await stream.aclose()
            with pytest.raises(forkbox.NotFound):
                await sb.download("/root/none")
    run(main())


def test_async_pty_egress_ports_pause(url):
    async def main():
        async with AsyncSandbox(url=url, egress=False) as sb:
            got = []
            pty = await sb.pty.create(cmd="bash", on_data=got.append)
            await pty.send_input("echo $((6*7)); exit 3\r")
            assert await pty.wait(10) == 3 and b"42" in pty.output
            assert [s.pty_id for s in await sb.pty.list()] == [pty.id]
            r = await sb.pty.read(pty.id)
            assert b"42" in r["data"]
            end = await pty.read(since_seq=r["next_seq"])
            assert end["data"] == b"" and end["exited"] and end["exit_code"] == 3
            again = await sb.pty.attach(pty.id)
            assert await again.wait(10) == 3 and b"42" in again.output
            assert await sb.get_egress() is False
            assert await sb.set_egress(True) is True
            with pytest.raises(forkbox.ServerError):
                await sb.ports.request("GET", 9, "/", raise_for_status=True)
            assert (await sb.pause())["state"] == "paused"
            assert (await sb.resume())["state"] == "ready"
    run(main())
