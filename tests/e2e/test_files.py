"""The files API (docs/files.md): streaming upload and download with Range,
list, stat, mkdir -p, remove, rename, chmod; atomic writes; the size limit at
its edge; a 2 GB round trip with the server's memory sampled; and the podflare
SDK's own upload/download still working beside it."""
from __future__ import annotations

import hashlib
import os
import threading
import time

import httpx
import pytest

from helpers import RssSampler, assert_json_error, create_raw, delete_raw, exec_ok, exec_raw, numbered_mibs


def files(sid: str) -> str:
    return f"/v1/sandboxes/{sid}/files"


def put(http, sid, path, data, **params):
    return http.put(files(sid), params={"path": path, **params}, content=data)


def get(http, sid, path, **params):
    return http.get(files(sid), params={"path": path, **params})


py = exec_ok


@pytest.fixture
def sid(http):
    s = create_raw(http)
    yield s
    delete_raw(http, s)


def test_round_trip_and_visibility_both_ways(http, sid):
    r = put(http, sid, "/root/data/hello.bin", b"\x00\x01hello\xff")
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "/root/data/hello.bin", "bytes": 8}
    # The REPL and bash see the file at once, owned by the sandbox's root.
    assert py(http, sid, "import os; st = os.stat('/root/data/hello.bin'); print(open('/root/data/hello.bin','rb').read(), st.st_uid, st.st_gid, oct(st.st_mode & 0o777))") \
        == "b'\\x00\\x01hello\\xff' 0 0 0o644\n"
    assert exec_raw(http, sid, "stat -c '%U %F' /root/data /root/data/hello.bin", language="bash").stdout == "root directory\nroot regular file\n"
    # And the API sees what the REPL writes; relative paths start at /root.
    py(http, sid, "open('/root/from_repl.txt', 'w').write('from the repl')")
    r = get(http, sid, "from_repl.txt")
    assert r.status_code == 200 and r.content == b"from the repl"
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["accept-ranges"] == "bytes"


def test_ranges(http, sid):
    data = bytes(range(256)) * 4
    put(http, sid, "/tmp/r.bin", data)

    def ranged(h):
        return http.get(files(sid), params={"path": "/tmp/r.bin"}, headers={"Range": h})
    r = ranged("bytes=10-19")
    assert r.status_code == 206 and r.content == data[10:20]
    assert r.headers["content-range"] == f"bytes 10-19/{len(data)}"
    r = ranged("bytes=1000-")
    assert r.status_code == 206 and r.content == data[1000:]
    r = ranged("bytes=-5")
    assert r.status_code == 206 and r.content == data[-5:]
    r = ranged("bytes=1023-5000")
    assert r.status_code == 206 and r.content == data[1023:]
    r = ranged(f"bytes={len(data)}-")
    assert_json_error(r, 416)
    assert r.headers["content-range"] == f"bytes */{len(data)}"
    # Several ranges, or nonsense: the whole file (RFC 9110 allows ignoring).
    for h in ("bytes=0-1,5-6", "lines=1-2", "bytes=9-3"):
        r = ranged(h)
        assert r.status_code == 200 and r.content == data, h


def test_list_stat_and_limit(http, sid):
    py(http, sid, r"""
import os
os.makedirs('/tmp/l/sub')
open('/tmp/l/b.txt', 'w').write('12345')
open('/tmp/l/a.txt', 'w').write('1')
os.chmod('/tmp/l/a.txt', 0o600)
os.symlink('/etc/hostname', '/tmp/l/link')
""")
    r = get(http, sid, "/tmp/l", list="1")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["path"] == "/tmp/l" and body["truncated"] is False
    by_name = {e["name"]: e for e in body["entries"]}
    assert [e["name"] for e in body["entries"]] == ["a.txt", "b.txt", "link", "sub"]
    assert by_name["a.txt"]["mode"] == 0o600 and by_name["a.txt"]["size"] == 1 and by_name["a.txt"]["type"] == "file"
    assert by_name["b.txt"]["size"] == 5 and by_name["b.txt"]["path"] == "/tmp/l/b.txt"
    assert by_name["link"]["type"] == "symlink" and by_name["link"]["target"] == "/etc/hostname"
    assert by_name["sub"]["type"] == "dir"
    assert abs(by_name["b.txt"]["mtime_ms"] / 1000 - time.time()) < 120
    assert by_name["b.txt"]["uid"] == 0
    # limit at its edges
    r = get(http, sid, "/tmp/l", list="1", limit="2")
    assert [e["name"] for e in r.json()["entries"]] == ["a.txt", "b.txt"] and r.json()["truncated"] is True
    assert get(http, sid, "/tmp/l", list="1", limit="4").json()["truncated"] is False
    assert_json_error(get(http, sid, "/tmp/l", list="1", limit="0"), 400)
    assert_json_error(get(http, sid, "/tmp/l", list="1", limit="100001"), 400)
    assert get(http, sid, "/tmp/l", list="1", limit="100000").status_code == 200
    # stat follows symlinks (inside the sandbox)
    st = get(http, sid, "/tmp/l/link", stat="1").json()
    assert st["type"] == "file" and st["path"] == "/tmp/l/link"
    assert_json_error(get(http, sid, "/tmp/l/missing", stat="1"), 404)
    # reading a directory or listing a file is a clear error
    assert "list" in assert_json_error(get(http, sid, "/tmp/l"), 409)["error"]
    assert_json_error(get(http, sid, "/tmp/l/a.txt", list="1"), 409)
    assert_json_error(get(http, sid, "/tmp/l", list="maybe"), 400)


def test_mkdir_remove_rename_chmod(http, sid):
    base = files(sid)
    r = http.post(f"{base}/mkdir", json={"path": "/tmp/m/a/b", "mode": "750"})
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "dir" and r.json()["mode"] == 0o750
    assert http.post(f"{base}/mkdir", json={"path": "/tmp/m/a/b"}).status_code == 200, "mkdir -p of an existing dir is fine"
    assert_json_error(http.post(f"{base}/mkdir", json={"path": "/tmp/m/a/b", "mode": "99"}), 400)
    assert_json_error(http.post(f"{base}/mkdir", json={"path": "/tmp/m/a/b", "mode": 0o17777}), 400)
    put(http, sid, "/tmp/m/a/b/f", b"x")
    assert_json_error(http.post(f"{base}/mkdir", json={"path": "/tmp/m/a/b/f/g"}), 409)
    assert py(http, sid, "import os; print(oct(os.stat('/tmp/m/a/b').st_mode & 0o777), os.stat('/tmp/m/a').st_uid)") == "0o750 0\n"

    # chmod: octal string or number
    assert http.post(f"{base}/chmod", json={"path": "/tmp/m/a/b/f", "mode": "0o700"}).status_code == 204
    assert get(http, sid, "/tmp/m/a/b/f", stat="1").json()["mode"] == 0o700
    assert http.post(f"{base}/chmod", json={"path": "/tmp/m/a/b/f", "mode": 0o640}).status_code == 204
    assert py(http, sid, "import os; print(oct(os.stat('/tmp/m/a/b/f').st_mode & 0o777))") == "0o640\n"
    assert_json_error(http.post(f"{base}/chmod", json={"path": "/tmp/m/nope", "mode": 0o640}), 404)

    # rename: no replacing unless asked; not into itself
    put(http, sid, "/tmp/m/other", b"y")
    assert_json_error(http.post(f"{base}/rename", json={"from": "/tmp/m/other", "to": "/tmp/m/a/b/f"}), 409)
    assert http.post(f"{base}/rename", json={"from": "/tmp/m/other", "to": "/tmp/m/a/b/f", "overwrite": True}).status_code == 204
    assert get(http, sid, "/tmp/m/a/b/f").content == b"y"
    assert_json_error(http.post(f"{base}/rename", json={"from": "/tmp/m/a", "to": "/tmp/m/a/b/c"}), 400)
    assert_json_error(http.post(f"{base}/rename", json={"from": "/tmp/m/missing", "to": "/tmp/m/z"}), 404)
    assert http.post(f"{base}/rename", json={"from": "/tmp/m/a", "to": "/tmp/m/moved"}).status_code == 204
    assert py(http, sid, "import os; print(sorted(os.listdir('/tmp/m')), os.path.exists('/tmp/m/moved/b/f'))") == "['moved'] True\n"

    # remove: files, empty dirs; trees only when asked
    assert_json_error(http.delete(base, params={"path": "/tmp/m/moved"}), 409)
    assert http.delete(base, params={"path": "/tmp/m/moved/b/f"}).status_code == 204
    assert http.delete(base, params={"path": "/tmp/m/moved", "recursive": "1"}).status_code == 204
    assert_json_error(http.delete(base, params={"path": "/tmp/m/moved"}), 404)
    assert_json_error(http.delete(base, params={"path": "/", "recursive": "1"}), 400)
    assert_json_error(http.delete(base, params={"path": "/.."}), 400)
    assert py(http, sid, "import os; print(os.listdir('/tmp/m'))") == "[]\n"


def test_writes_keep_mode_and_owner_of_what_they_replace_and_append(http, sid):
    py(http, sid, "open('/tmp/k', 'w').write('old'); import os; os.chmod('/tmp/k', 0o751); os.chown('/tmp/k', 1000, 1000)")
    assert put(http, sid, "/tmp/k", b"new").status_code == 200
    assert py(http, sid, "import os; st = os.stat('/tmp/k'); print(oct(st.st_mode & 0o777), st.st_uid, st.st_gid, open('/tmp/k').read())") == "0o751 1000 1000 new\n"
    assert put(http, sid, "/tmp/k", b"+more", append="1").status_code == 200
    assert get(http, sid, "/tmp/k").content == b"new+more"
    assert put(http, sid, "/tmp/fresh", b"z", mode="600").status_code == 200
    assert get(http, sid, "/tmp/fresh", stat="1").json()["mode"] == 0o600
    assert_json_error(put(http, sid, "/tmp/fresh", b"z", mode="8"), 400)
    # Parents are made unless told not to.
    assert_json_error(put(http, sid, "/tmp/no/such/dir/f", b"z", parents="0"), 404)
    assert put(http, sid, "/tmp/no/such/dir/f", b"z").status_code == 200
    assert_json_error(put(http, sid, "/tmp/no", b"z"), 409)  # a directory


def test_writes_are_atomic_and_failed_uploads_leave_nothing(server, http, sid):
    put(http, sid, "/tmp/atomic", b"old contents")
    gate = threading.Event()
    seen_during = []

    def body():
        yield b"A" * 65536
        gate.wait(10)
        yield b"B" * 65536

    def upload():
        with server.http() as c:
            seen_during.append(c.put(files(sid), params={"path": "/tmp/atomic"}, content=body()).status_code)
    t = threading.Thread(target=upload)
    t.start()
    time.sleep(0.5)
    # Mid-upload the path still holds the old file, complete.
    assert py(http, sid, "print(open('/tmp/atomic').read())") == "old contents\n"
    gate.set()
    t.join(15)
    assert seen_during == [200]
    assert py(http, sid, "d = open('/tmp/atomic').read(); print(len(d), d[0], d[-1])") == "131072 A B\n"

    # A client that goes away mid-upload: the old file stays, no temp file.
    import socket
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"PUT {files(sid)}?path=/tmp/atomic HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".encode() + b"C" * 100000)
    time.sleep(0.3)
    s.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        left = py(http, sid, "import os; print(sorted(os.listdir('/tmp')))")
        if "forkbox-upload" not in left:
            break
        time.sleep(0.1)
    assert "forkbox-upload" not in left, left
    assert py(http, sid, "d = open('/tmp/atomic').read(); print(len(d))") == "131072\n"


def test_bad_requests(http, sid):
    assert_json_error(http.get(files(sid)), 400)  # no path
    assert_json_error(get(http, sid, ""), 400)
    assert_json_error(get(http, sid, "/tmp/a\x00b"), 400)
    assert_json_error(get(http, sid, "/" + "a/" * 2100), 400)
    assert_json_error(get(http, sid, "/" + "n" * 256), 400)
    assert_json_error(get(http, sid, "/tmp/none"), 404)
    assert_json_error(http.get(files("sb-nosuchsandbox"), params={"path": "/tmp"}), 404)
    assert_json_error(http.post(f"{files(sid)}/mkdir", json={"path": "/tmp/x", "bogus": 1}), 400)
    assert_json_error(http.post(f"{files(sid)}/rename", json=["/a", "/b"]), 400)
    assert_json_error(http.post(f"{files(sid)}/chmod", json={"path": "/tmp"}), 400)
    assert_json_error(put(http, sid, "/tmp/x", b"", append="perhaps"), 400)


def test_upload_limit_at_its_edge(say):
    from conftest import start_server
    srv = start_server(say, "files-limit", ["--max-file-mib", "1"], build=False)
    try:
        with srv.http() as c:
            s = create_raw(c)
            limit = 1 << 20
            assert put(c, s, "/tmp/exact", os.urandom(limit)).status_code == 200
            assert_json_error(put(c, s, "/tmp/over", b"x" * (limit + 1)), 413)
            # Without a Content-Length the count is kept while streaming.

            def chunks():
                for _ in range(17):
                    yield b"y" * 65536
            assert_json_error(put(c, s, "/tmp/over", chunks()), 413)
            out = exec_raw(c, s, "import os; print(os.path.getsize('/tmp/exact'), os.path.exists('/tmp/over'), [n for n in os.listdir('/tmp') if 'upload' in n])").stdout
            assert out == f"{limit} False []\n"
            delete_raw(c, s)
    finally:
        srv.stop()
        srv.cleanup()


def test_two_gigabytes_round_trip_with_flat_server_memory(server, http, sid, say):
    size = 2 << 30
    rss = RssSampler(server.proc.pid)
    up = hashlib.sha256()
    try:
        with rss:
            t0 = time.time()
            with httpx.Client(base_url=server.url, timeout=600) as c:
                r = c.put(files(sid), params={"path": "/root/big.bin"}, content=numbered_mibs(size, up), headers={"Content-Length": str(size)})
            assert r.status_code == 200, r.text
            assert r.json()["bytes"] == size
            say(f"    uploaded 2 GiB in {time.time() - t0:.1f} s")
            inside = exec_raw(http, sid, "sha256sum /root/big.bin | cut -d' ' -f1", language="bash").stdout.strip()
            assert inside == up.hexdigest()
            down = hashlib.sha256()
            n = 0
            t0 = time.time()
            with httpx.Client(base_url=server.url, timeout=600) as c:
                with c.stream("GET", files(sid), params={"path": "/root/big.bin"}) as resp:
                    assert resp.status_code == 200
                    assert int(resp.headers["content-length"]) == size
                    for chunk in resp.iter_raw(1 << 20):
                        down.update(chunk)
                        n += len(chunk)
            say(f"    downloaded 2 GiB in {time.time() - t0:.1f} s")
            assert n == size and down.hexdigest() == up.hexdigest()
    finally:
        http.delete(files(sid), params={"path": "/root/big.bin"})
    before, peak = rss.before, rss.peak
    say(f"    server RSS: {before // 1024} MiB before, peak {peak // 1024} MiB during ({len(rss.samples)} samples)")
    assert peak - before < 128 * 1024, f"server RSS grew by {(peak - before) // 1024} MiB during a 2 GiB transfer"


def test_podflare_sdk_upload_download_still_work(sandbox, http):
    data = os.urandom(100_000)
    sandbox.upload(data, "/tmp/via-sdk.bin")
    assert sandbox.download("/tmp/via-sdk.bin") == data
    r = http.get(files(sandbox.id), params={"path": "/tmp/via-sdk.bin"})
    assert r.content == data
    http.put(files(sandbox.id), params={"path": "/tmp/via-api.bin"}, content=data[::-1])
    assert sandbox.download("/tmp/via-api.bin") == data[::-1]
