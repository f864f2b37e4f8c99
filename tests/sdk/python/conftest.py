"""Fixtures of the Python SDK tests: the end-to-end suite's real servers
(tests/e2e/conftest.py, reused as they are) and forkbox SDK sandboxes on them.

The SDK is imported from sdk/python/src (no install needed); the framework
adapters need the packages of tests/requirements.txt.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
E2E = os.path.join(REPO, "tests", "e2e")
sys.path.insert(0, os.path.join(REPO, "sdk", "python", "src"))
sys.path.insert(0, E2E)

for _k in ("FORKBOX_URL", "FORKBOX_API_KEY"):
    os.environ.pop(_k, None)


def _load_e2e_conftest():
    spec = importlib.util.spec_from_file_location("forkbox_e2e_conftest", os.path.join(E2E, "conftest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_e2e = _load_e2e_conftest()
# The e2e suite's fixtures and failure hook, not copies: a session server with
# leak checks at its end, its raw httpx client, progress lines.
say = _e2e.say
server = _e2e.server
http = _e2e.http
pytest_runtest_makereport = _e2e.pytest_runtest_makereport
start_server = _e2e.start_server

import forkbox  # noqa: E402


@pytest.fixture(scope="session")
def url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def client(url):
    with forkbox.Client(url) as c:
        yield c


@pytest.fixture
def sb(url):
    """A fresh forkbox Sandbox on the main server, closed at the end."""
    with forkbox.Sandbox(url=url) as s:
        yield s


@pytest.fixture
def make(url):
    """Factory: make(**Sandbox kwargs) → Sandbox, every one closed at the end."""
    made = []

    def _make(**kwargs):
        kwargs.setdefault("url", url)
        s = forkbox.Sandbox(**kwargs)
        made.append(s)
        return s
    yield _make
    for s in made:
        s.close()


@pytest.fixture(scope="session")
def auth_server(say, server):  # `server` first: the default template is built
    srv = start_server(say, "sdk-auth", api_keys=["sdk-key"], build=False)
    yield srv
    rc = srv.stop()  # as tests/e2e/test_auth.py: the leak check's API calls have no key
    srv.cleanup()
    assert rc == 0, srv.log_tail()
