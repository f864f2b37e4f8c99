"""Schemathesis against the live server's `/v1/openapi.json`
(docs/reliability.md#fuzzing): generated requests, valid and invalid, to every
operation; no answer may be a 5xx, and every answer must be one the schema
documents (status code, content type, body).

Two runs, each bounded in examples and time:
  * every operation, with the ids schemathesis makes up (mostly 404s: what
    the routing, the body parsing and the validation answer);
  * the operations on one sandbox, with `{id}` fixed to a live one, so the
    handlers run for real. Left out of that run: the ones that end the
    sandbox (DELETE, merge_into, freeze) and the streams that wait for
    events (watch, pty attach); fork runs with few examples (up to 32
    children a case).
Whatever either run created is deleted at the end.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers import create_raw, delete_raw

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"

# The port proxy is a gateway: 502 (nothing listens on the port) and 504 (the
# port does not answer) are its documented answers about the sandbox's
# server, not failures of forkbox (docs/ports.md).
GATEWAY = """
[[operations]]
include-path-regex = "/ports/"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "504"]
"""


def schemathesis(server, say, label: str, args: list[str], config: str = "", timeout: float = 150) -> None:
    """Run the schemathesis CLI (fail with its report); print its summary."""
    tmp = tempfile.mkdtemp(prefix=f"forkbox-st-{label}-")
    try:
        cfg = os.path.join(tmp, "schemathesis.toml")
        with open(cfg, "w") as f:
            f.write(GATEWAY + config)
        cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", cfg, "run", server.url + "/v1/openapi.json",
               "--checks", CHECKS, "--phases", "examples,coverage,fuzzing", "--workers", "1", "--seed", "1",
               "--generation-database", "none", "--request-timeout", "30", "--no-color", *args]
        # In its own directory: it leaves a `.schemathesis/` where it runs.
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        assert out.returncode == 0, f"schemathesis ({label}) found problems:\n{out.stdout[-20000:]}\n{out.stderr[-4000:]}"
        cases = re.search(r"(\d+) generated", out.stdout)
        ops = re.search(r"Tested: (\d+)", out.stdout)
        summary = f"schemathesis ({label}): {ops and ops[1]} operations, {cases and cases[1]} cases, no failures"
        print(summary)
        say(summary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ids(http, what: str) -> set[str]:
    r = http.get(f"/v1/{what}")
    assert r.status_code == 200, r.text
    key = "space_id" if what == "spaces" else "id"
    return {x[key] for x in r.json()[what]}


@pytest.fixture
def cleanup(http):
    """Delete the sandboxes and spaces made during the test."""
    before = ids(http, "sandboxes"), ids(http, "spaces")
    yield
    for sid in ids(http, "sandboxes") - before[0]:
        assert delete_raw(http, sid) in (204, 404)
    for sid in ids(http, "spaces") - before[1]:
        assert http.delete(f"/v1/spaces/{sid}").status_code in (204, 404)


def test_every_operation(server, say, cleanup):
    schemathesis(server, say, "every operation", ["--max-examples", "20"])


def test_operations_on_a_live_sandbox(server, say, http, cleanup):
    sid = create_raw(http)
    config = f"""
[parameters]
"path.id" = "{sid}"

[[operations]]
include-path-regex = "/fork$"
generation.max-examples = 3
"""
    schemathesis(server, say, "a live sandbox", [
        "--max-examples", "20",
        "--include-path-regex", r"^/v1/sandboxes/\{id\}/",
        "--exclude-path-regex", r"/(merge_into|freeze|files/watch|pty/\{pty\}/attach)",
    ], config=config)
    # It survived it all.
    assert http.get(f"/v1/sandboxes/{sid}").status_code == 200
    assert delete_raw(http, sid) == 204
