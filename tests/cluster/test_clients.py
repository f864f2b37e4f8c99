"""Every client and every streaming path through a cluster's gateway,
unchanged: forkbox's Python SDK, the MCP server, a PTY session, a watch,
a file's round trip and a WebSocket through the port proxy
(docs/cluster.md#what-a-gateway-does). The podflare and E2B SDKs are
driven in test_cluster.py."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading

import httpx
from websockets.sync.client import connect as ws_connect

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python", "src"))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

import forkbox  # noqa: E402
from helpers import FORKBOX_BIN, create_raw, delete_raw, exec_raw, wait_until  # noqa: E402
from port_service import start_service  # noqa: E402


def test_forkboxs_python_sdk_through_the_gateway(cluster):
    with forkbox.Sandbox(url=cluster.url) as sb:
        assert sb.run_code("x = 6 * 7\nx").text == "42"
        kids = sb.fork(2)
        try:
            assert [k.run_code("print(x + 1)").stdout for k in kids] == ["43\n", "43\n"]
        finally:
            for k in kids:
                k.close()
        data = bytes(range(256)) * 4096
        sb.upload("/root/data.bin", data)
        assert b"".join(sb.download_stream("/root/data.bin")) == data


TS_SDK = os.path.join(HERE, "..", "..", "sdk", "typescript")

TS_SCRIPT = """
import { Sandbox } from "forkbox";
const sb = await Sandbox.create();
try {
  await sb.runCode("x = 41");
  const [kid] = await sb.fork(1);
  const e = await kid.runCode("print(x + 1)");
  await kid.close();
  console.log(JSON.stringify({ out: e.stdout, id: sb.id }));
} finally {
  await sb.close();
}
"""


def test_forkboxs_typescript_sdk_through_the_gateway(cluster, http):
    if not os.path.exists(os.path.join(TS_SDK, "dist", "index.js")):
        subprocess.run(["npm", "run", "build", "--silent"], cwd=TS_SDK, check=True, timeout=300)
    # Run from the SDK's folder, where `forkbox` resolves to it.
    script = os.path.join(TS_SDK, "cluster-gateway-check.mjs")
    with open(script, "w") as f:
        f.write(TS_SCRIPT)
    try:
        out = subprocess.run(["node", script], cwd=TS_SDK, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "FORKBOX_URL": cluster.url})
    finally:
        os.remove(script)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["out"] == "42\n", answer
    assert http.get(f"/v1/sandboxes/{answer['id']}").status_code == 404, "closed through the gateway"


def test_the_mcp_server_through_the_gateway(cluster, http):
    from mcp import Client, StdioServerParameters

    async def go() -> str:
        argv = [FORKBOX_BIN, "mcp", "--url", cluster.url]
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:]), read_timeout_seconds=240) as c:
            r = await c.call_tool("run_python", {"code": "x = 41"})
            assert not r.is_error, r
            r = await c.call_tool("run_python", {"code": "x + 1"})
            text = "\n".join(part.text for part in r.content if part.type == "text")
            assert "result:\n42\n" in text, text
            return text
    text = asyncio.run(asyncio.wait_for(go(), 300))
    sid = text.split("(sandbox ")[1].split(")")[0]
    # The session ended: its sandbox is gone from the cluster.
    wait_until(lambda: http.get(f"/v1/sandboxes/{sid}").status_code == 404, 30, "the MCP session's sandbox outlived it")


def test_a_pty_session_and_a_watch_stream_through_the_gateway(cluster, http):
    sid = create_raw(http)
    try:
        events, watched = [], []
        watching = threading.Event()

        def watch():
            with httpx.Client(base_url=cluster.url, timeout=60) as c:
                with c.stream("GET", f"/v1/sandboxes/{sid}/files/watch", params={"path": "/root"}) as r:
                    for line in r.iter_lines():
                        watched.append(json.loads(line))
                        if watched[-1].get("type") == "ready":
                            watching.set()
                        if any("from-the-pty" in json.dumps(e) for e in watched):
                            return
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        # The watch must be in place before the PTY writes, or the write is missed.
        assert watching.wait(30), watched
        with httpx.Client(base_url=cluster.url, timeout=60) as c:
            with c.stream("POST", f"/v1/sandboxes/{sid}/pty", json={"shellCmd": "bash", "cols": 80, "rows": 24}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                ready = json.loads(next(lines))
                assert ready["type"] == "pty_ready", ready
                pty = ready["session_id"]
                cmd = "echo $((6*7)) > /root/from-the-pty; cat /root/from-the-pty; exit\r"
                r2 = http.post(f"/v1/sandboxes/{sid}/pty/{pty}/input", json={"data_b64": base64.b64encode(cmd.encode()).decode()})
                assert r2.status_code == 204, r2.text
                out = b""
                for line in lines:
                    ev = json.loads(line)
                    events.append(ev)
                    if ev["type"] == "pty_data":
                        out += base64.b64decode(ev["data_b64"])
                    if ev["type"] == "pty_exit":
                        break
        assert b"42" in out, out
        w.join(timeout=30)
        assert any("from-the-pty" in json.dumps(e) for e in watched), watched
    finally:
        delete_raw(http, sid)


def test_a_websocket_through_the_port_proxy_through_the_gateway(cluster, http):
    sid = create_raw(http)
    try:
        start_service(http, sid, 8003)
        url = cluster.url.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/ports/8003/ws"
        with ws_connect(url, open_timeout=10) as ws:
            for msg in ["hello", "x" * 70000]:
                ws.send(msg)
                assert ws.recv(timeout=10) == msg
        assert http.get(f"/v1/sandboxes/{sid}/ports/8003/echo").status_code == 200
        out = exec_raw(http, sid, "print('still served')")
        assert out.stdout == "still served\n"
    finally:
        delete_raw(http, sid)
