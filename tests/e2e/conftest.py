"""Fixtures of the end-to-end suite: real forkbox servers on loopback and
podflare SDK sandboxes on them.

Environment:
  FORKBOX_BIN             the server binary (default <repo>/target/debug/forkbox)
  FORKBOX_TEMPLATES_DIR   built templates (default /var/lib/forkbox/templates)
  FORKBOX_E2E_ROOT        where per-server state dirs go (default /var/lib/forkbox-e2e)
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time

# The podflare SDK reads these at import time: keep the host's settings and
# region cache out of the tests (set before any test module imports podflare).
for _k in ("PODFLARE_API_URL", "PODFLARE_HOSTD_URL", "PODFLARE_HOST", "PODFLARE_API_KEY", "PODFLARE_TRACEPARENT"):
    os.environ.pop(_k, None)
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="forkbox-e2e-cache-")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
import pytest  # noqa: E402
from podflare import Client, Sandbox  # noqa: E402

from helpers import (  # noqa: E402
    FORKBOX_BIN, TEMPLATES_DIR, ForkboxServer, create_raw, delete_raw, sweep_dead_runs, wait_for_binary, wait_no_leaks,
)
from upstream_proxy import UpstreamProxy  # noqa: E402

sweep_dead_runs(lambda msg: print(msg, file=sys.__stderr__, flush=True))


@pytest.fixture(scope="session")
def say(request):
    """Print a progress line to the terminal even while output is captured."""
    tr = request.config.pluginmanager.get_plugin("terminalreporter")

    def _say(msg: str) -> None:
        if tr is not None:
            tr.write_line(msg)
        else:
            print(msg, file=sys.__stderr__, flush=True)
    return _say


def default_template_built(say) -> bool:
    """Whether the current `default` recipe is already built in TEMPLATES_DIR."""
    if os.path.basename(os.path.normpath(TEMPLATES_DIR)) != "templates":
        return False
    wait_for_binary(say)
    out = subprocess.run([FORKBOX_BIN, "template", "ls", "--state-dir", os.path.dirname(os.path.normpath(TEMPLATES_DIR))],
                         capture_output=True, text=True, timeout=60)
    for line in out.stdout.splitlines():
        fields = line.split("\t")
        if fields and fields[0] == "default":
            return any(f.startswith("current=") and f != "current=-" for f in fields)
    return False


def start_server(say, name: str, args=(), api_keys=(), build=None) -> ForkboxServer:
    if build is None:
        # Build the templates only when the default one is missing (a fresh
        # machine): then healthz answers 503 with progress until it is ready.
        build = not default_template_built(say)
    return launch(ForkboxServer(name, list(args), list(api_keys), build_templates=build, log=say))


def launch(srv: ForkboxServer) -> ForkboxServer:
    """Start `srv` and wait until it serves (stopping it if it never does)."""
    srv.start()
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


def shutdown_and_check(srv: ForkboxServer) -> list[str]:
    """Destroy what is left, check no process, cgroup or mount leaked, SIGTERM,
    check again. (Leftover files under <state>/run are the business of the
    dedicated leak tests in test_lifecycle.py, not of every session.)"""
    problems = []
    if srv.proc.poll() is None:
        try:
            # With keys, each key sees (and can delete) only its own.
            for key in srv.all_keys() or [None]:
                with srv.http(key) as c:
                    left = c.get("/v1/sandboxes").json()["sandboxes"]
                    for sb in left:
                        c.delete(f"/v1/sandboxes/{sb['id']}")
            problems += [f"while running: {p}" for p in wait_no_leaks(srv, expect_volume_mounted=True, check_run_dir=False)]
        except Exception as e:  # still stop the server below
            problems.append(f"could not clean up through the API: {e!r}")
    else:
        problems.append(f"server died during the tests with status {srv.proc.returncode}")
    rc = srv.stop()
    if rc != 0:
        problems.append(f"server exited with status {rc} after SIGTERM")
    problems += [f"after exit: {p}" for p in wait_no_leaks(srv, expect_volume_mounted=False, check_run_dir=False)]
    return problems


def stop_and_assert_clean(srv: ForkboxServer) -> None:
    """End of a server fixture: stop it, clean up, fail on any leak."""
    problems = shutdown_and_check(srv)
    srv.cleanup()  # the log (<state dir>.log) stays
    assert not problems, f"{srv.name} server leaked:\n" + "\n".join(problems) + "\n--- log ---\n" + srv.log_tail()


@contextlib.contextmanager
def running(s: ForkboxServer):
    """Start `s` (its keys added already); at the end stop it and check for leaks."""
    launch(s)
    try:
        yield s
    finally:
        stop_and_assert_clean(s)


def serve(s: ForkboxServer):
    """For a fixture: `running`, as a generator."""
    with running(s):
        yield s


@pytest.fixture(scope="session")
def server(say):
    """The main server, with default settings."""
    srv = start_server(say, "main")
    yield srv
    stop_and_assert_clean(srv)


@pytest.fixture(scope="module")
def upstream_proxy():
    """An operator's HTTP proxy of the test's own (upstream_proxy.py)."""
    p = UpstreamProxy()
    yield p
    p.close()


@pytest.fixture(scope="module")
def proxied_server(say, server, upstream_proxy):
    """A server whose sandboxes leave only through `upstream_proxy`
    (`--egress-proxy`, docs/network.md#upstream-proxies)."""
    srv = start_server(say, "egress-proxy", ["--egress-proxy", upstream_proxy.url], build=False)
    yield srv
    stop_and_assert_clean(srv)


@pytest.fixture(scope="module")
def proxied_http(proxied_server):
    with proxied_server.http(timeout=300) as c:
        yield c


@pytest.fixture(scope="session")
def small_server(say, server):
    """A second server with small limits: 500 ms interrupt grace, 128 pids."""
    srv = start_server(say, "small", ["--interrupt-grace-ms", "500", "--pids-limit", "128"],
                       build=False)  # `server` is ready, so the default template is built
    yield srv
    stop_and_assert_clean(srv)


@pytest.fixture(scope="session")
def http(server):
    with server.http() as c:
        yield c


@pytest.fixture(scope="session")
def small_http(small_server):
    with small_server.http() as c:
        yield c


@pytest.fixture(scope="session")
def sdk_client(server):
    c = Client(host=server.url, timeout=120.0)
    yield c
    c.close()


def _close(sb) -> None:
    try:
        sb.close()
    except httpx.HTTPStatusError as e:
        if e.response.status_code != 404:  # a test may have destroyed it already
            raise


@pytest.fixture
def sandbox(server, sdk_client):
    """A fresh podflare SDK sandbox on the main server."""
    sb = Sandbox(client=sdk_client)
    if server.cgroup_parent is None:
        server.learn_cgroup_parent(sb.id)
    yield sb
    _close(sb)


@pytest.fixture
def make_sandbox(server, sdk_client):
    """Factory: make_sandbox(**create_kwargs) → podflare Sandbox (closed at the end)."""
    made = []

    def _make(**kwargs):
        sb = Sandbox(client=sdk_client, **kwargs)
        made.append(sb)
        return sb
    yield _make
    for sb in made:
        _close(sb)


@pytest.fixture
def small_sandbox(small_server, small_http):
    """A fresh sandbox id on the small server (raw HTTP)."""
    sid = create_raw(small_http)
    if small_server.cgroup_parent is None:
        small_server.learn_cgroup_parent(sid)
    yield sid
    delete_raw(small_http, sid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for srv in ForkboxServer.registry:
            if srv.proc is not None:
                rep.sections.append((f"forkbox server `{srv.name}` log tail ({srv.log_path})", srv.log_tail(40)))


# ── the python-datasci template (pandas, matplotlib) ──────────────────────

DATASCI_TIMEOUT_S = 20 * 60


def _datasci_state(c) -> dict:
    return {t["name"]: t for t in c.get("/v1/templates").json()}.get("python-datasci") or {}


@pytest.fixture(scope="module")
def datasci(say, server, http):
    """(HTTP client, URL) of a server whose `python-datasci` template is
    ready: the main one if it is, else one started to build it (minutes)."""
    if _datasci_state(http).get("state") == "ready":
        yield http, server.url
        return
    srv = start_server(say, "datasci", build=True)
    try:
        with srv.http() as c:
            deadline = time.monotonic() + DATASCI_TIMEOUT_S
            last = 0.0
            while (t := _datasci_state(c)).get("state") != "ready":
                assert t.get("state") != "failed", f"python-datasci failed to build: {t}"
                assert time.monotonic() < deadline, f"python-datasci not ready after {DATASCI_TIMEOUT_S} s: {t}"
                if time.monotonic() - last > 30:
                    say(f"[forkbox-e2e] waiting for python-datasci: {t.get('state')} {t.get('progress', 0):.0%}")
                    last = time.monotonic()
                time.sleep(2)
            yield c, srv.url
    finally:
        problems = shutdown_and_check(srv)
        srv.cleanup()
        assert not problems, "datasci server leaked:\n" + "\n".join(problems)
