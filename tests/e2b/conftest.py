"""The unchanged E2B SDKs (`e2b`, `e2b-code-interpreter` from PyPI) against
a real forkbox server on loopback (docs/e2b.md)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

import pytest  # noqa: E402

from helpers import ForkboxServer  # noqa: E402


@pytest.fixture(scope="session")
def server():
    srv = ForkboxServer("e2b", build_templates=False)
    srv.start()
    srv.wait_ready()
    host = srv.url.removeprefix("http://")
    os.environ.update(E2B_API_KEY="any-key", E2B_API_URL=srv.url, E2B_SANDBOX_URL=srv.url, E2B_DOMAIN=host)
    yield srv
    srv.stop()
