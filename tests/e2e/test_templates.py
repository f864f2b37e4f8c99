"""Templates as the API shows them: a sandbox asked for from a template that
is still building gets 503 with its progress, while ready templates serve."""
from __future__ import annotations

import os
import shutil
import time

import httpx

from helpers import TEMPLATES_DIR, ForkboxServer


def test_a_template_still_building_answers_503_with_progress(say):
    # A templates directory holding only the built `default`: the server
    # starts building `python-datasci` in the background at once.
    tdir = os.path.join("/var/lib/forkbox-e2e", f"templates-{os.getpid()}")
    os.makedirs(tdir, exist_ok=True)
    os.symlink(os.path.join(TEMPLATES_DIR, "default"), os.path.join(tdir, "default"))
    srv = ForkboxServer("building", build_templates=True, log=say)
    srv.templates_dir = tdir
    srv.start()
    try:
        srv.wait_ready()
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            seen = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                r = c.post("/v1/sandboxes", json={"template": "python-datasci"})
                if r.status_code == 503:
                    assert r.headers["retry-after"] == "5"
                    seen = r.json()
                    break
                assert r.status_code != 200, "python-datasci cannot be ready yet"
                time.sleep(0.2)
            assert seen is not None
            assert "python-datasci" in seen["error"]
            assert 0.0 <= seen["progress"] < 1.0
            listed = {t["name"]: t for t in c.get("/v1/templates").json()}
            assert listed["default"]["state"] == "ready"
            assert listed["python-datasci"]["state"] in ("queued", "building")
            # The ready template serves meanwhile.
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 200, r.text
            c.delete(f"/v1/sandboxes/{r.json()['id']}")
    finally:
        assert srv.stop() == 0, srv.log_tail()
        srv.cleanup()
        shutil.rmtree(tdir, ignore_errors=True)
