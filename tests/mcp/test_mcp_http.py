"""`forkbox mcp --http`: the streamable HTTP transport, through the official
`mcp` Python client SDK, against a live forkbox server."""
from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time

from mcp import Client

from helpers import FORKBOX_BIN, free_port


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def text(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"forkbox mcp --http exited with {proc.returncode}: {proc.stderr.read()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"forkbox mcp --http not listening on {port} after {timeout} s")


def wait_for(cond, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_streamable_http_transport(server, no_sandboxes_left):
    port = free_port()
    proc = subprocess.Popen([FORKBOX_BIN, "mcp", "--url", server.url, "--http", f"127.0.0.1:{port}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_listening(port, proc)

        async def go():
            # Stateless clients (protocol 2026-07-28, no sessions) share this process's default sandbox.
            async with Client(url) as c:
                assert {t.name for t in (await c.list_tools()).tools} >= {"run_python", "fork", "checkpoint"}
                assert no_sandboxes_left() == []
                r = await c.call_tool("run_python", {"code": "x = 'stateless'\nprint('hi')"})
                assert not r.is_error and text(r).startswith("stdout:\nhi\n"), text(r)
            [shared] = no_sandboxes_left()
            async with Client(url) as c:
                r = await c.call_tool("run_python", {"code": "x"})
                assert "result:\n'stateless'" in text(r) and f"(sandbox {shared})" in text(r), text(r)
                r = await c.call_tool("run_python", {"code": "1", "sandbox_id": "sb-doesnotexist"})
                assert r.is_error and "HTTP 404" in text(r)

            # Clients that open a session (the initialize handshake) get one default sandbox each,
            # destroyed when the session ends.
            async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
                await a.call_tool("run_python", {"code": "who = 'a'"})
                r = await b.call_tool("run_python", {"code": "'who' in globals()"})
                assert "result:\nFalse" in text(r), text(r)
                r = await a.call_tool("run_python", {"code": "who"})
                assert "result:\n'a'" in text(r)
                forked = await a.call_tool("fork", {"n": 1})
                assert not forked.is_error, text(forked)
                assert len(no_sandboxes_left()) == 4  # shared, a's default and its child, b's default
            wait_for(lambda: no_sandboxes_left() == [shared])
        run(go())
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        err = proc.stderr.read()
    assert rc == 0, err
    # Stopping the MCP server destroyed the stateless clients' default sandbox.
    assert no_sandboxes_left() == [], err


def test_http_refuses_a_non_loopback_address(server):
    r = subprocess.run([FORKBOX_BIN, "mcp", "--url", server.url, "--http", f"0.0.0.0:{free_port()}"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "beyond loopback" in r.stderr, r.stderr
