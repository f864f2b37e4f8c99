"""Structured logs (docs/operations.md#logs): with --log-format json every
line is a JSON object; every line a request causes carries its request id
(the client's X-Request-Id, or a fresh one echoed back) and the trace id of
its W3C traceparent."""
from __future__ import annotations

import json
import time

import pytest

from conftest import start_server, stop_and_assert_clean
from helpers import delete_raw, exec_raw

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def srv(say, server):
    s = start_server(say, "jsonlogs", ["--log-format", "json"], build=False)
    yield s
    stop_and_assert_clean(s)


def log_lines(srv) -> list[dict]:
    with open(srv.log_path, "rb") as f:
        raw = f.read().decode()
    return [json.loads(line) for line in raw.splitlines() if line.startswith("{")]


def wait_for(srv, pred, timeout=5.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in log_lines(srv) if pred(line)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_every_line_is_json_and_requests_carry_their_ids(srv):
    with srv.http() as c:
        r = c.post("/v1/sandboxes", json={"egress": False}, headers={"traceparent": TRACEPARENT, "x-request-id": "agent-42"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "agent-42"
        sid = r.json()["id"]
        # The sandbox's own log line ran inside the request: it has both ids.
        [created] = wait_for(srv, lambda l: l["fields"].get("message") == "created" and l["fields"].get("sandbox") == sid)
        assert created["span"]["request_id"] == "agent-42" and created["span"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert created["span"]["route"] == "/v1/sandboxes" and created["level"] == "INFO"

        # Without an id, the server makes one and says which.
        r = c.post(f"/v1/sandboxes/{sid}/pause")
        made = r.headers["x-request-id"]
        assert len(made) == 16 and int(made, 16) >= 0
        [done] = wait_for(srv, lambda l: l["fields"].get("message") == "request" and l.get("span", {}).get("request_id") == made)
        assert done["fields"]["status"] == 200 and done["span"]["route"] == "/v1/sandboxes/{id}/pause"
        assert done["span"]["trace_id"] == ""

        # A malformed traceparent or request id is not taken.
        r = c.get(f"/v1/sandboxes/{sid}", headers={"traceparent": "00-zz-00f067aa0ba902b7-01", "x-request-id": "bad id with spaces"})
        bad = r.headers["x-request-id"]
        assert bad != "bad id with spaces"
        [line] = wait_for(srv, lambda l: l.get("span", {}).get("request_id") == bad)
        assert line["span"]["trace_id"] == ""
        assert exec_raw(c, sid, "print(1)").exit_code == 0
        delete_raw(c, sid)
    lines = log_lines(srv)
    with open(srv.log_path, "rb") as f:
        text_lines = [line for line in f.read().decode().splitlines() if line.strip()]
    # Every line (but what helpers outside the server wrote) is JSON.
    assert len(lines) == len([t for t in text_lines if not t.startswith("forkbox shim")]), text_lines[:5]
