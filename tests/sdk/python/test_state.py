"""Checkpoints (undo) and Spaces (freeze to disk, resume), against the routes of
docs/state.md. These need the server's checkpoint and Space routes."""
from __future__ import annotations

import time

import pytest

import forkbox
from forkbox import Sandbox


def test_checkpoint_restore_roundtrip(sb):
    sb.run_code("steps = ['start']")
    sb.upload("/root/notes.txt", b"v1")
    cp = sb.checkpoint()
    assert isinstance(cp, str) and cp.startswith("cp-")
    sb.run_code("steps.append('bad idea')")
    sb.upload("/root/notes.txt", b"v2 broken")
    info = sb.restore(cp)
    assert info["id"] == sb.id
    assert sb.run_code("steps").text == "['start']"
    assert sb.download("/root/notes.txt") == b"v1"
    # the checkpoint stays reusable
    sb.run_code("steps.append('again')")
    sb.restore(cp)
    assert sb.run_code("len(steps)").text == "1"


def test_checkpoints_list_and_delete(sb):
    a = sb.checkpoint()
    sb.run_code("x = 1")
    b = sb.checkpoint()
    listed = sb.checkpoints()
    assert [c["checkpoint"] for c in listed] == [a, b]
    assert all(c["sandbox_id"] == sb.id and c["created_at"] for c in listed)
    sb.delete_checkpoint(a)
    assert [c["checkpoint"] for c in sb.checkpoints()] == [b]
    sb.restore(listed[1])  # a Checkpoint dict works as well as its id
    with pytest.raises(forkbox.NotFound):
        sb.restore(a)
    with pytest.raises(forkbox.NotFound):
        sb.delete_checkpoint(a)


def test_freeze_list_resume_spaces(url):
    sb = Sandbox(url=url)
    sb.run_code("kept = {'answer': 42}")
    sb.upload("/root/data.txt", b"on disk")
    space = sb.freeze()
    sid = space["space_id"]
    assert sid.startswith("sp-") and space["sandbox_id"] == sb.id and space["bytes"] > 0
    assert isinstance(space["unsaved"], list)
    assert sb.info()["state"] == "frozen"
    with pytest.raises(forkbox.Conflict):
        sb.run_code("1")
    assert sid in [s["space_id"] for s in Sandbox.list_spaces(url=url)]
    assert sid in [s["space_id"] for s in sb.list_spaces()]
    sb.close()  # a frozen sandbox is not destroyed by close: its Space stays
    back = Sandbox.resume(sid, url=url)
    try:
        assert back.id != sb.id
        assert back.run_code("kept['answer']").text == "42"
        assert back.download("/root/data.txt") == b"on disk"
    finally:
        back.close()
    with pytest.raises(forkbox.NotFound):  # a Space is consumed by its resume
        Sandbox.resume(sid, url=url)


def test_delete_space(url):
    with Sandbox(url=url) as sb:
        space = sb.freeze()
        sb.delete_space()  # the one it was frozen to
        assert space["space_id"] not in [s["space_id"] for s in Sandbox.list_spaces(url=url)]
        with pytest.raises(forkbox.NotFound):
            Sandbox.delete_space(space["space_id"], url=url)


def test_persistent_sandbox_is_accepted(url):
    with Sandbox(url=url, persistent=True) as sb:
        info = sb.info()
        assert info["persistent"] is True and info["keep_processes"] is True  # the test servers have criu


def test_hibernate_keeps_the_id_and_every_process(url):
    """``hibernate()`` sends a ``keep_processes`` sandbox to disk under its id;
    the next call wakes it with its threads running (docs/state.md#hibernation)."""
    with Sandbox(url=url, keep_processes=True) as sb:
        sb.run_code("import threading, time\nn = [0]\n"
                    "threading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()")
        assert sb.hibernate()["state"] == "hibernated"
        assert sb.info()["state"] == "hibernated"
        first = int(sb.run_code("print(n[0])").stdout)
        time.sleep(0.1)
        assert int(sb.run_code("print(n[0])").stdout) > first
        assert sb.info()["state"] == "ready"


def test_async_hibernate(url):
    import asyncio

    async def main():
        async with forkbox.AsyncSandbox(url=url, keep_processes=True) as sb:
            await sb.run_code("kept = 7")
            assert (await sb.hibernate())["state"] == "hibernated"
            assert (await sb.run_code("kept")).text == "7"

    asyncio.run(main())


def test_async_checkpoints(url):
    import asyncio

    async def main():
        async with forkbox.AsyncSandbox(url=url) as sb:
            await sb.run_code("n = 1")
            cp = await sb.checkpoint()
            await sb.run_code("n = 2")
            await sb.restore(cp)
            assert (await sb.run_code("n")).text == "1"
            assert [c["checkpoint"] for c in await sb.checkpoints()] == [cp]
            await sb.delete_checkpoint(cp)
    asyncio.run(main())
