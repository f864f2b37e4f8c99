"""The files API: streamed upload/download, list, stat, mkdir, remove, rename, chmod, watch."""
from __future__ import annotations

import io
import os
import threading

import pytest

import forkbox


def test_upload_sources(sb, tmp_path):
    assert sb.upload("/root/a.bin", b"\x00\x01abc") == {"path": "/root/a.bin", "bytes": 5}
    assert sb.download("/root/a.bin") == b"\x00\x01abc"
    sb.upload("/root/b.bin", io.BytesIO(b"from a file object"))
    assert sb.download("/root/b.bin") == b"from a file object"
    local = tmp_path / "local.dat"
    local.write_bytes(os.urandom(300_000))
    assert sb.upload("/root/c.dat", local)["bytes"] == 300_000
    assert sb.download("/root/c.dat") == local.read_bytes()
    sb.upload("/root/d.txt", (part for part in [b"it", b"er", b"able"]))
    assert sb.download("/root/d.txt") == b"iterable"
    # visible to the REPL at once
    assert sb.run_code("print(open('/root/d.txt').read())").stdout == "iterable\n"


def test_upload_in_podflares_argument_order(sb, tmp_path):
    sb.upload(b"raw bytes", "/root/p1.txt")                  # podflare: upload(bytes, remote)
    local = tmp_path / "p2.txt"
    local.write_bytes(b"local file")
    sb.upload(str(local), "/root/sub/p2.txt")                # podflare: upload(local_path, remote)
    sb.upload(local_path=str(local), remote_path="/root/p3.txt")
    assert [sb.download(p) for p in ("/root/p1.txt", "/root/sub/p2.txt", "/root/p3.txt")] == \
        [b"raw bytes", b"local file", b"local file"]


def test_upload_options(sb):
    sb.upload("/root/log.txt", b"one\n")
    sb.upload("/root/log.txt", b"two\n", append=True)
    assert sb.download("/root/log.txt") == b"one\ntwo\n"
    sb.upload("/root/script.sh", b"#!/bin/sh\necho run\n", mode=0o755)
    assert sb.stat("/root/script.sh")["mode"] == 0o755
    assert sb.run_code("/root/script.sh", language="bash").stdout == "run\n"
    with pytest.raises(forkbox.NotFound):
        sb.upload("/root/missing/dir/x", b"x", parents=False)
    sb.mkdir("/root/adir")
    with pytest.raises(forkbox.Conflict):
        sb.upload("/root/adir", b"x")


def test_big_download_streams(sb, tmp_path):
    size = 8 * 1024 * 1024 + 123
    sb.run_code(f"open('/root/big', 'wb').write(bytes(range(256)) * ({size} // 256) + b'x' * ({size} % 256))")
    chunks = list(sb.download_stream("/root/big", chunk_size=1 << 20))
    assert len(chunks) > 1 and sum(map(len, chunks)) == size
    out = tmp_path / "big"
    assert sb.download_to("/root/big", out) == size
    assert out.read_bytes() == b"".join(chunks)
    with pytest.raises(forkbox.NotFound):
        next(sb.download_stream("/root/nope"))
    with pytest.raises(forkbox.NotFound):
        sb.download("/root/nope")


def test_list_stat_exists(sb):
    sb.mkdir("/root/l/inner")
    for name in ("b.txt", "a.txt"):
        sb.upload(f"/root/l/{name}", b"12345")
    sb.run_code("import os; os.symlink('a.txt', '/root/l/link')")
    entries = sb.list("/root/l")
    assert [e["name"] for e in entries] == ["a.txt", "b.txt", "inner", "link"]
    assert entries.truncated is False
    by = {e["name"]: e for e in entries}
    assert by["a.txt"]["type"] == "file" and by["a.txt"]["size"] == 5 and by["a.txt"]["path"] == "/root/l/a.txt"
    assert by["inner"]["type"] == "dir" and by["link"]["type"] == "symlink" and by["link"]["target"] == "a.txt"
    cut = sb.list("/root/l", limit=2)
    assert len(cut) == 2 and cut.truncated is True
    st = sb.stat("/root/l/link")  # follows the link
    assert st["type"] == "file" and st["size"] == 5
    assert sb.exists("/root/l/a.txt") and not sb.exists("/root/l/zzz")
    assert [e["name"] for e in sb.list("l")] == [e["name"] for e in entries]  # relative to /root


def test_mkdir_remove_rename_chmod(sb):
    info = sb.mkdir("/root/m/n/o", mode=0o700)
    assert info["type"] == "dir" and info["mode"] == 0o700
    sb.upload("/root/m/n/o/f", b"x")
    with pytest.raises(forkbox.Conflict):
        sb.remove("/root/m")          # not empty
    sb.rename("/root/m/n/o/f", "/root/m/g")
    assert sb.download("/root/m/g") == b"x" and not sb.exists("/root/m/n/o/f")
    sb.upload("/root/m/h", b"h")
    with pytest.raises(forkbox.Conflict):
        sb.rename("/root/m/g", "/root/m/h")
    sb.rename("/root/m/g", "/root/m/h", overwrite=True)
    assert sb.download("/root/m/h") == b"x"
    sb.chmod("/root/m/h", 0o600)
    assert sb.stat("/root/m/h")["mode"] == 0o600
    sb.chmod("/root/m/h", "640")
    assert sb.stat("/root/m/h")["mode"] == 0o640
    sb.remove("/root/m/h")
    assert not sb.exists("/root/m/h")
    sb.remove("/root/m", recursive=True)
    assert not sb.exists("/root/m")
    with pytest.raises(forkbox.BadRequest):
        sb.stat("/proc/1/status")


def test_watch_reports_changes_as_they_happen(sb):
    sb.mkdir("/root/w")
    events = []
    got_ready = threading.Event()
    done = threading.Event()

    def follow():
        stream = sb.watch("/root/w")
        for ev in stream:
            events.append(ev)
            if ev["type"] == "ready":
                got_ready.set()
            if ev["type"] == "removed" and ev.get("path") == "/root/w/f":
                done.set()
                stream.close()
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert got_ready.wait(10)
    sb.run_code("open('/root/w/f', 'w').write('1')")
    sb.remove("/root/w/f")
    assert done.wait(10), events
    kinds = [(e["type"], e.get("path")) for e in events]
    assert kinds[0] == ("ready", None)
    assert ("created", "/root/w/f") in kinds and kinds[-1] == ("removed", "/root/w/f")
