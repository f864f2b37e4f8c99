"""GET /v1/sandboxes/{id}/files/watch: NDJSON change events for a directory
tree, whoever made the change (REPL, bash, the files API)."""
from __future__ import annotations

import json
import queue
import socket
import threading
import time

import httpx
import pytest

from helpers import assert_json_error, create_raw, delete_raw, exec_raw


@pytest.fixture
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


class Watch:
    """A watch stream read on a thread; `events` queues what arrives."""

    def __init__(self, server, sid, path, **params):
        self.events: queue.Queue = queue.Queue()
        self.client = httpx.Client(base_url=server.url, timeout=httpx.Timeout(10, read=None))
        self.cm = self.client.stream("GET", f"/v1/sandboxes/{sid}/files/watch", params={"path": path, **params})
        self.resp = self.cm.__enter__()
        assert self.resp.status_code == 200, self.resp.read()
        self.ended = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.events.get(timeout=10)
        assert first["type"] == "ready", first

    def _read(self):
        try:
            for line in self.resp.iter_lines():
                if line.strip():
                    self.events.put(json.loads(line))
        except httpx.HTTPError:
            pass
        self.ended.set()

    def collect(self, until, timeout=10.0) -> list[dict]:
        """Events until `until(events)` holds (or the timeout)."""
        got = []
        deadline = time.time() + timeout
        while not until(got) and time.time() < deadline:
            try:
                got.append(self.events.get(timeout=max(0.01, deadline - time.time())))
            except queue.Empty:
                break
        return got

    def close(self):
        # The reader thread is blocked in recv: shut the socket down under it
        # so the server sees the client go.
        try:
            self.resp.extensions["network_stream"].get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        except (KeyError, AttributeError, OSError):
            pass
        self.ended.wait(5)
        self.cm.__exit__(None, None, None)
        self.client.close()


def has(kind, path):
    return lambda evs: any(e["type"] == kind and e.get("path") == path for e in evs)


def test_changes_by_repl_bash_and_api_are_reported(server, http, sid):
    w = Watch(server, sid, "/root")
    try:
        exec_raw(http, sid, "open('/root/a.txt', 'w').write('1')")
        evs = w.collect(has("modified", "/root/a.txt"))
        assert ("created", "/root/a.txt") in [(e["type"], e.get("path")) for e in evs], evs
        exec_raw(http, sid, "echo more >> /root/a.txt; rm /root/a.txt", language="bash")
        evs = w.collect(has("removed", "/root/a.txt"))
        assert has("removed", "/root/a.txt")(evs), evs
        # New directories are followed, including what was made in them
        # before their watch could be placed.
        exec_raw(http, sid, "import os; os.makedirs('/root/x/y/z'); open('/root/x/y/z/f', 'w').write('f')")
        evs = w.collect(has("created", "/root/x/y/z/f"))
        kinds = {(e["type"], e.get("path"), e.get("dir", False)) for e in evs}
        assert ("created", "/root/x", True) in kinds and ("created", "/root/x/y/z/f", False) in kinds, evs
        exec_raw(http, sid, "open('/root/x/y/z/f', 'a').write('g')")
        assert has("modified", "/root/x/y/z/f")(w.collect(has("modified", "/root/x/y/z/f")))
        # An upload is one `created` for its path, not its temporary file.
        http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/up.bin"}, content=b"u" * 1000)
        evs = w.collect(has("created", "/root/up.bin"))
        assert has("created", "/root/up.bin")(evs), evs
        time.sleep(0.3)
        rest = w.collect(lambda e: False, timeout=0.3)
        assert not any("forkbox-upload" in (e.get("path") or "") for e in evs + rest), evs + rest
        # Renames: removed from the old name, created at the new one.
        http.post(f"/v1/sandboxes/{sid}/files/rename", json={"from": "/root/up.bin", "to": "/root/x/moved.bin"})
        evs = w.collect(has("created", "/root/x/moved.bin"))
        assert has("removed", "/root/up.bin")(evs) and has("created", "/root/x/moved.bin")(evs), evs
        assert all(isinstance(e["ts"], int) for e in evs)
    finally:
        w.close()


def test_non_recursive_watch_and_end_when_the_directory_goes(server, http, sid):
    exec_raw(http, sid, "import os; os.makedirs('/tmp/w/sub')")
    w = Watch(server, sid, "/tmp/w", recursive="0")
    try:
        exec_raw(http, sid, "open('/tmp/w/sub/deep', 'w').write('d'); open('/tmp/w/top', 'w').write('t')")
        evs = w.collect(has("created", "/tmp/w/top"))
        assert has("created", "/tmp/w/top")(evs) and not has("created", "/tmp/w/sub/deep")(evs), evs
        exec_raw(http, sid, "import shutil; shutil.rmtree('/tmp/w')")
        assert w.ended.wait(10), "the stream ends when the watched directory is removed"
    finally:
        w.close()


def test_watch_ends_with_its_sandbox(server, http):
    s = create_raw(http)
    w = Watch(server, s, "/root")
    try:
        delete_raw(http, s)
        assert w.ended.wait(10)
    finally:
        w.close()


def test_watch_limits_and_errors(server, http, sid):
    base = f"/v1/sandboxes/{sid}/files/watch"
    assert_json_error(http.get(base, params={"path": "/root/nope"}), 404)
    exec_raw(http, sid, "open('/root/file', 'w').write('x')")
    assert_json_error(http.get(base, params={"path": "/root/file"}), 409)
    assert_json_error(http.get(base, params={"path": "/proc"}), 400)
    assert_json_error(http.get(base, params={"path": "/root", "recursive": "sometimes"}), 400)
    watches = [Watch(server, sid, "/tmp") for _ in range(8)]
    try:
        assert_json_error(http.get(base, params={"path": "/tmp"}), 429)
        watches.pop().close()
        deadline = time.time() + 5
        while time.time() < deadline:
            w = None
            try:
                w = Watch(server, sid, "/tmp")
                break
            except AssertionError:
                time.sleep(0.3)  # the closed stream's slot is freed within the liveness period
        assert w is not None, "a slot frees when a watch closes"
        watches.append(w)
    finally:
        for w in watches:
            w.close()
