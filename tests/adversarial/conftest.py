"""Fixtures of the adversarial suite: the end-to-end suite's live forkbox
servers (tests/e2e/conftest.py and helpers.py, imported, not copied), and
what the attacks need on the host side: a secret the sandboxes must never
reach, and sandboxes made and destroyed through raw HTTP.

Environment: as tests/e2e (FORKBOX_BIN, FORKBOX_TEMPLATES_DIR, FORKBOX_E2E_ROOT).
"""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

E2E_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e")
sys.path.insert(0, E2E_DIR)


def _e2e_conftest():
    """tests/e2e/conftest.py under another module name (two modules called
    `conftest` would collide), loaded once per process."""
    name = "forkbox_e2e_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(E2E_DIR, "conftest.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


e2e = _e2e_conftest()

from helpers import ForkboxServer, create_raw, delete_raw, wait_pool  # noqa: E402
# A directory on the host, at a path no sandbox has, holding `secret`.
from test_files_escape import host_dir  # noqa: E402,F401

# The e2e fixtures this suite uses: the main server, the small one (128
# pids, for the fork bomb), their HTTP clients, their logs on failure.
say = e2e.say
server = e2e.server
http = e2e.http
small_server = e2e.small_server
upstream_proxy = e2e.upstream_proxy
proxied_server = e2e.proxied_server
proxied_http = e2e.proxied_http
small_http = e2e.small_http
pytest_runtest_makereport = e2e.pytest_runtest_makereport


@pytest.fixture(scope="module")
def tenants(say, server):  # `server` first: the default template is built
    """A server with two API keys, `mallory` and `victim`: two tenants, each
    with warm pools of its own."""
    s = ForkboxServer("tenants", build_templates=False, log=say)
    s.add_key("mallory")
    s.add_key("victim")
    yield from e2e.serve(s)


@pytest.fixture(scope="session")
def warm_pool(http):
    """Wait until the `default` template's warm pool is up, so creates are
    forks of its zygote: warm-pool siblings share a family, as in use."""
    wait_pool(http, "default", timeout=300)


@pytest.fixture
def new_sandbox(http, warm_pool):
    """Factory: new_sandbox(**create_body) → sandbox id, destroyed at the end."""
    made = []

    def _new(**body) -> str:
        sid = create_raw(http, **body)
        made.append(sid)
        return sid
    yield _new
    for sid in made:
        delete_raw(http, sid)


@pytest.fixture
def sid(new_sandbox) -> str:
    """One fresh sandbox (from the warm pool) on the main server."""
    return new_sandbox()

