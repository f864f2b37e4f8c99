"""Code written for the podflare SDK runs with `from forkbox import ...` in its place."""
from __future__ import annotations

import forkbox

# A podflare-style agent snippet, as in podflare's and forkbox's docs, with
# only the import changed (and the server passed the podflare way, `host=`).
PODFLARE_SNIPPET = '''
from forkbox import Sandbox, Client

client = Client(host=HOST, timeout=120.0)
with Sandbox(client=client) as sb:
    sb.run_code("import json; rows = [{'a': 1}, {'a': 2}, {'a': 3}]")
    r = sb.run_code("print(sum(r['a'] for r in rows))")
    assert r.ok and r.exit_code == 0
    out["sum"] = r.stdout.strip()
    out["err"] = sb.run_code("1/0").exit_code
    out["bash"] = sb.run_code("echo hi from bash", language="bash").stdout.strip()
    out["stream"] = [(ev.type, ev.data) for ev in sb.run_code_stream("print('s')")]
    sb.upload(b"payload", "/root/in.bin")
    out["download"] = sb.download("/root/in.bin")
    kids = sb.fork(n=2)
    kids[0].run_code("rows.append({'a': 10})")
    out["diff"] = sb.diff(kids[0])
    sb.merge_into(kids[0])
    for k in kids:
        k.close()
    out["merged"] = sb.run_code("print(len(rows))").stdout.strip()
    pty = sb.pty.create(cmd="echo from-pty", on_data=lambda b: chunks.append(b))
    out["pty_exit"] = pty.wait(timeout=10)
    out["pty_list"] = [s.pty_id for s in sb.pty.list()] == [pty.id]
    out["replay"] = any(ev.type == "exit" for ev in sb.replay())
client.close()
with Sandbox(host=HOST, egress=False, timeout_seconds=600) as sb:
    out["egress_off"] = sb.run_code("print(1)").stdout.strip()
'''


def test_podflare_snippet_runs_unchanged(url):
    out, chunks = {}, []
    exec(compile(PODFLARE_SNIPPET, "<podflare snippet>", "exec"), {"HOST": url, "out": out, "chunks": chunks})
    assert out["sum"] == "6" and out["err"] == 1 and out["bash"] == "hi from bash"
    assert out["stream"] == [("stdout", "s"), ("exit", 0)]
    assert out["download"] == b"payload"
    assert out["diff"] == {"added": [], "removed": [], "modified": []}  # memory only: no file changed
    assert out["merged"] == "4"
    assert out["pty_exit"] == 0 and b"from-pty" in b"".join(chunks) and out["pty_list"]
    assert out["replay"] and out["egress_off"] == "1"


def test_podflare_names_exist():
    from forkbox.integrations.langchain import PodflareTool
    from forkbox.integrations.openai_agents import forkbox_code_interpreter
    assert forkbox.ExecResult is forkbox.Execution
    assert PodflareTool is not None and forkbox_code_interpreter is not None
    for name in ("run_code", "run_code_stream", "upload", "download", "diff", "fork", "merge_into", "replay",
                 "close", "resume", "pty"):
        assert hasattr(forkbox.Sandbox, name) or name == "pty", name
