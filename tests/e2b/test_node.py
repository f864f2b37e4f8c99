"""The unchanged E2B Node SDKs (`e2b`, `@e2b/code-interpreter` from npm,
pinned in node/package.json) against the same live server: node/sdk.test.mjs
holds the calls; this runs it and fails with its report."""
import os
import subprocess

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")


def test_node_sdks(server):
    assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "e2b")), "run `./dev test` (it installs tests/e2b/node's packages)"
    out = subprocess.run(["node", "--test", "--test-concurrency=1", "--test-reporter=spec", "sdk.test.mjs"],
                         cwd=NODE_DIR, env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-12000:] + out.stderr[-4000:]
