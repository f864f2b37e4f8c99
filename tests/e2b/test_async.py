"""The async generation of the Python SDKs (`AsyncSandbox` from `e2b` and
`e2b_code_interpreter`): the same server, the same calls, over asyncio."""
import asyncio


def run(coro):
    return asyncio.run(coro)


def test_async_commands_files_pty_and_lifecycle(server):
    from e2b import AsyncSandbox, CommandExitException, PtySize, SandboxQuery

    async def body():
        sb = await AsyncSandbox.create(timeout=120, metadata={"suite": "async"})
        try:
            r = await sb.commands.run("echo $((6*7)); whoami")
            assert (r.stdout, r.exit_code) == ("42\nuser\n", 0)
            try:
                await sb.commands.run("echo no >&2; exit 4")
                raise AssertionError("exit 4 must raise")
            except CommandExitException as e:
                assert (e.exit_code, e.stderr) == (4, "no\n")

            # Concurrent calls on one sandbox do not mix their output.
            outs = await asyncio.gather(*(sb.commands.run(f"sleep 0.2; echo {i}") for i in range(5)))
            assert [o.stdout for o in outs] == [f"{i}\n" for i in range(5)]

            cat = await sb.commands.run("cat", background=True, stdin=True)
            await sb.commands.send_stdin(cat.pid, "via async stdin\n")
            await sb.commands.close_stdin(cat.pid)
            assert (await cat.wait()).stdout == "via async stdin\n"

            await sb.files.write("a/b.txt", b"\x00\x01binary")
            assert await sb.files.read("a/b.txt", format="bytes") == b"\x00\x01binary"
            assert [e.name for e in await sb.files.list("a")] == ["b.txt"]

            got = bytearray()
            pty = await sb.pty.create(PtySize(rows=24, cols=80), on_data=got.extend)
            await sb.pty.send_stdin(pty.pid, b"echo pty-$((1+1))\n")
            for _ in range(100):
                if b"pty-2" in got:
                    break
                await asyncio.sleep(0.05)
            assert b"pty-2" in got
            assert await sb.pty.kill(pty.pid)

            await sb.commands.run("echo before > /tmp/s")
            assert await sb.pause()
            resumed = await AsyncSandbox.connect(sb.sandbox_id)
            assert (await resumed.commands.run("cat /tmp/s")).stdout == "before\n"
            forks = await sb.fork(count=2)
            try:
                assert all(isinstance(f, AsyncSandbox) for f in forks), forks
                assert [(await f.commands.run("cat /tmp/s")).stdout for f in forks] == ["before\n"] * 2
            finally:
                for f in forks:
                    if isinstance(f, AsyncSandbox):
                        await f.kill()
            page = await AsyncSandbox.list(query=SandboxQuery(metadata={"suite": "async"})).next_items()
            assert [s.sandbox_id for s in page] == [sb.sandbox_id]
        finally:
            await sb.kill()

    run(body())


def test_async_code_interpreter(server):
    from e2b import TimeoutException
    from e2b_code_interpreter import AsyncSandbox

    async def body():
        sb = await AsyncSandbox.create(timeout=120)
        try:
            seen = []
            ex = await sb.run_code("import time\nfor i in range(3):\n    print(i, flush=True)\n'done'",
                                   on_stdout=lambda m: seen.append(m.line))
            assert (ex.text, seen) == ("'done'", ["0\n", "1\n", "2\n"])
            ex = await sb.run_code("class M:\n    def _repr_markdown_(self): return '**m**'\nM()")
            assert ex.results[0].markdown == "**m**"
            ctx = await sb.create_code_context()
            await sb.run_code("z = 9", context=ctx)
            assert (await sb.run_code("z", context=ctx)).text == "9"
            assert (await sb.run_code("'z' in globals()")).text == "False"
            try:
                await sb.run_code("import time; time.sleep(60)", timeout=1)
                raise AssertionError("a 1 s timeout must raise")
            except TimeoutException:
                pass
            # The timed-out call was interrupted: were it still sleeping,
            # this call would time out too.
            assert (await sb.run_code("1 + 1", timeout=15)).text == "2"
        finally:
            await sb.kill()

    run(body())
