"""A real forkbox cluster on loopback (deploy/local/cluster.py): a 3-member
etcd cluster, `rclone serve s3`, three nodes and a gateway, shared by the
suite; tests that break parts of it put them back (docs/cluster.md)."""
from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy", "local"))

for _k in ("PODFLARE_API_URL", "PODFLARE_HOSTD_URL", "PODFLARE_HOST", "PODFLARE_API_KEY"):
    os.environ.pop(_k, None)
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="forkbox-cluster-cache-")

import httpx  # noqa: E402
import pytest  # noqa: E402

from cluster import LocalCluster  # noqa: E402
from helpers import FORKBOX_BIN, TEMPLATES_DIR, wait_for_binary  # noqa: E402

DENIED_NET = "10.233.0.0/16"


@pytest.fixture(scope="session")
def say(request):
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    return (lambda m: tr.write_line(m)) if tr is not None else (lambda m: print(m, file=sys.__stderr__, flush=True))


@pytest.fixture(scope="session")
def cluster(say):
    wait_for_binary(say)
    # What an operator would deny (docs/cluster.md#security): here a
    # network of the tests' own (tests/e2e/netns.py's 10.233.*.*).
    c = LocalCluster(FORKBOX_BIN, f"/var/lib/forkbox-cluster-test-{os.getpid()}", TEMPLATES_DIR, node_args=["--cluster-deny", DENIED_NET])
    try:
        c.start(say=say)
    except BaseException:
        for p in [*c.etcd, c.s3, c.gateway, *c.nodes.values()]:
            if p is not None:
                say(f"--- {p.name} ---\n{p.log_tail()}")
        c.stop()
        raise
    yield c
    c.stop()


@pytest.fixture
def http(cluster):
    with httpx.Client(base_url=cluster.url, timeout=120) as h:
        yield h


@pytest.fixture(autouse=True)
def cluster_whole(request):
    """Every test of the cluster starts with all of it up (a test that
    broke a part and failed before putting it back must not fail the
    next); its parts' logs follow a failure."""
    if "cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("cluster")
    cluster.heal()
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for p in [*cluster.etcd, cluster.s3, cluster.gateway, *cluster.nodes.values()]:
            if p is not None:
                print(f"--- {p.name} log ---\n{p.log_tail(60)}", file=sys.__stderr__)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
