"""Prometheus metrics at GET /metrics (docs/operations.md#metrics):
OpenMetrics text, route templates as labels, live state read at scrape
time, behind the API's auth."""
from __future__ import annotations

import re

from conftest import start_server
from helpers import create_raw, delete_raw, exec_raw


def scrape(http) -> dict[str, float]:
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    samples = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def get(samples, name, **labels) -> float:
    """The sample `name` whose labels include `labels` (0 if absent)."""
    for key, value in samples.items():
        m = re.fullmatch(r"([^{]+)(?:\{(.*)\})?", key)
        if m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            return value
    return 0.0


def test_counts_latencies_and_live_state(http):
    before = scrape(http)
    sid = create_raw(http, egress=False)
    try:
        assert exec_raw(http, sid, "x = 1").exit_code == 0
        assert exec_raw(http, sid, "true", language="bash").exit_code == 0
        child = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1}).json()["children"][0]
        http.post(f"/v1/sandboxes/{sid}/checkpoints")
        http.post(f"/v1/sandboxes/{child}/pause")
        http.get("/v1/sandboxes/sb-nosuchsandbox")
        assert http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/m.bin"}, content=b"x" * 5000).status_code == 200
        assert len(http.get(f"/v1/sandboxes/{sid}/files", params={"path": "/root/m.bin"}, headers={"range": "bytes=0-999"}).content) == 1000
        after = scrape(http)
        for direction, n in (("in", 5000), ("out", 1000)):
            assert get(after, "forkbox_file_bytes_total", direction=direction) - get(before, "forkbox_file_bytes_total", direction=direction) == n
        # Route templates, not raw paths, label the requests.
        route = "/v1/sandboxes/{id}/exec"
        assert get(after, "forkbox_http_requests_total", method="POST", route=route, status=200) \
            - get(before, "forkbox_http_requests_total", method="POST", route=route, status=200) == 2
        assert get(after, "forkbox_http_requests_total", method="GET", route="/v1/sandboxes/{id}", status=404) >= 1
        assert not [k for k in after if sid in k], "sandbox ids must not become label values"
        for lang in ("python", "bash"):
            assert get(after, "forkbox_exec_seconds_count", kind=lang) - get(before, "forkbox_exec_seconds_count", kind=lang) == 1
        assert get(after, "forkbox_fork_seconds_count") - get(before, "forkbox_fork_seconds_count") == 1
        assert get(after, "forkbox_create_seconds_count", kind="pool") + get(after, "forkbox_create_seconds_count", kind="cold") \
            > get(before, "forkbox_create_seconds_count", kind="pool") + get(before, "forkbox_create_seconds_count", kind="cold")
        live = http.get("/v1/sandboxes").json()["sandboxes"]
        for state in ("ready", "paused"):
            assert get(after, "forkbox_sandboxes", state=state) == sum(1 for s in live if s["state"] == state), state
        assert get(after, "forkbox_sandboxes", state="paused") >= 1
        assert get(after, "forkbox_checkpoints") >= 1
        assert get(after, "forkbox_memory_bytes") > 0
        delete_raw(http, child)
    finally:
        delete_raw(http, sid)


def test_repl_deaths_are_counted(http):
    sid = create_raw(http, egress=False)
    try:
        before = get(scrape(http), "forkbox_repl_restarts_total")
        exec_raw(http, sid, "import os; os._exit(3)")
        assert get(scrape(http), "forkbox_repl_restarts_total") == before + 1
    finally:
        delete_raw(http, sid)
    # Still counted once the sandbox is gone.
    assert get(scrape(http), "forkbox_repl_restarts_total") >= before + 1


def test_metrics_need_the_api_key(say, server):
    srv = start_server(say, "metrics-auth", api_keys=["k1"], build=False)
    try:
        with srv.http() as anon:
            assert anon.get("/metrics").status_code == 401
        with srv.http(api_key="k1") as c:
            r = c.get("/metrics")
            assert r.status_code == 200 and "# TYPE forkbox_http_requests counter" in r.text, r.text[:500]
    finally:
        srv.stop()
        srv.cleanup()
