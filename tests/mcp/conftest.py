"""Fixtures of the MCP tests: the end-to-end suite's live forkbox server
(tests/e2e/conftest.py and helpers.py, imported, not copied), and `forkbox mcp`
processes driven by the official `mcp` Python client SDK.

Environment: as tests/e2e (FORKBOX_BIN, FORKBOX_TEMPLATES_DIR, FORKBOX_E2E_ROOT).
"""
from __future__ import annotations

import importlib.util
import os
import sys

E2E_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e")
sys.path.insert(0, E2E_DIR)

# tests/e2e/conftest.py under another module name (two modules called `conftest` would collide).
_spec = importlib.util.spec_from_file_location("forkbox_e2e_conftest", os.path.join(E2E_DIR, "conftest.py"))
e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = e2e
_spec.loader.exec_module(e2e)

import pytest  # noqa: E402

from helpers import FORKBOX_BIN  # noqa: E402

# The e2e fixtures this suite uses: one server per session, its log on failure.
say = e2e.say
server = e2e.server
http = e2e.http
pytest_runtest_makereport = e2e.pytest_runtest_makereport


@pytest.fixture
def no_sandboxes_left(http):
    """Each test starts and ends with no live sandbox: every MCP session it
    opened must have destroyed the sandboxes it made when it ended."""
    def live() -> list[str]:
        return [s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]]
    for sid in live():  # what an earlier failed test may have left
        http.delete(f"/v1/sandboxes/{sid}")
    yield live
    left = live()
    for sid in left:
        http.delete(f"/v1/sandboxes/{sid}")
    assert not left, f"sandboxes left after the MCP sessions ended: {left}"


@pytest.fixture
def mcp_command(server):
    """argv of `forkbox mcp` against the live server (extra args appended)."""
    def _cmd(*extra: str) -> list[str]:
        return [FORKBOX_BIN, "mcp", "--url", server.url, *extra]
    return _cmd
