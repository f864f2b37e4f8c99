"""E2B's pause on disk (docs/e2b.md#pause): a sandbox created to pause
(`lifecycle.on_timeout: pause`) keeps every process when it pauses, at the
end of its lifetime or on `pause()`, and frees its memory: it hibernates
under its id. E2B's SDK sees `paused` (info and lists, without waking it),
and `connect` brings it back with its processes, files, metadata and
environment. A sandbox not made to pause is paused in memory, as before."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))

from helpers import sandbox_host_pids  # noqa: E402


def wait_paused(sandbox_cls, sid: str):
    for _ in range(300):
        if sandbox_cls.get_info(sid).state.value == "paused":
            return
        time.sleep(0.1)
    raise AssertionError(f"{sid} never paused")


def test_a_sandbox_made_to_pause_hibernates_at_its_timeout_and_connect_wakes_it(server):
    from e2b import Sandbox, SandboxQuery, SandboxState

    sb = Sandbox.create(timeout=4, lifecycle={"on_timeout": "pause"}, metadata={"run": "hibernates"}, envs={"FOO": "bar"})
    sid = sb.sandbox_id
    # As E2B's default user, uid 1000, beside one of root's.
    sb.commands.run("sleep 1000", background=True)
    sb.commands.run("sleep 1001", background=True, user="root")
    sb.commands.run("echo kept > /tmp/k")
    sleepers = "ps -o uid=,pid=,args= -C sleep"
    # A background command is reported started once forked, before it
    # execs (as `sleep`, after it dropped to uid 1000).
    for _ in range(50):
        sleeper = sb.commands.run(sleepers).stdout
        if len(sleeper.splitlines()) == 2:
            break
        time.sleep(0.1)
    assert [line.split()[0] for line in sleeper.splitlines()] == ["1000", "0"], sleeper
    wait_paused(Sandbox, sid)
    # On disk: no process of it left on the host; seen as paused, not woken.
    for _ in range(100):
        if not sandbox_host_pids(sid):
            break
        time.sleep(0.1)
    assert sandbox_host_pids(sid) == [], "a hibernating sandbox holds no process"
    info = Sandbox.get_info(sid)
    assert (info.state, info.metadata) == (SandboxState.PAUSED, {"run": "hibernates"}), info
    listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"run": "hibernates"})).next_items()
    assert [s.sandbox_id for s in listed] == [sid]
    assert sandbox_host_pids(sid) == [], "looking at it does not wake it"

    again = Sandbox.connect(sid, timeout=60)
    try:
        assert again.commands.run(sleepers).stdout == sleeper, "the same processes, as the same users, not new ones"
        assert again.commands.run("cat /tmp/k; echo $FOO").stdout == "kept\nbar\n"
        info = Sandbox.get_info(sid)
        assert (info.state, info.metadata) == (SandboxState.RUNNING, {"run": "hibernates"}), info
        # pause() hibernates it too; connect wakes it again.
        assert again.pause()
        assert Sandbox.get_info(sid).state == SandboxState.PAUSED and sandbox_host_pids(sid) == []
        third = Sandbox.connect(sid, timeout=60)
        assert third.commands.run(sleepers).stdout == sleeper
    finally:
        Sandbox.kill(sid)
    assert not Sandbox.kill(sid), "killed, its hibernation included"


# Holds an established TCP connection to itself, which criu does not dump.
CONNECTED = ("python3 -c \"import socket, time; l = socket.create_server(('127.0.0.1', 9100)); "
             "c = socket.create_connection(('127.0.0.1', 9100)); a = l.accept(); time.sleep(1000)\"")


def test_a_sandbox_whose_processes_cannot_all_be_kept_pauses_in_memory(server):
    """A process criu cannot dump (an established TCP connection): the
    pause keeps it by pausing in memory instead."""
    from e2b import Sandbox, SandboxState

    sb = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        sb.commands.run(CONNECTED, background=True)
        sleeper = sb.commands.run("sleep 0.5; pgrep -f create_server").stdout
        assert sleeper.strip(), "the connected process runs"
        assert sb.pause()
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
        assert sandbox_host_pids(sb.sandbox_id), "paused in memory: its processes stay"
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("pgrep -f create_server").stdout == sleeper
    finally:
        sb.kill()


def test_a_sandbox_not_made_to_pause_pauses_in_memory(server):
    from e2b import Sandbox, SandboxState

    sb = Sandbox.create(timeout=60)
    try:
        sb.commands.run("sleep 1000", background=True)
        assert sb.pause()
        assert Sandbox.get_info(sb.sandbox_id).state == SandboxState.PAUSED
        assert sandbox_host_pids(sb.sandbox_id), "paused in memory: its processes stay"
        again = Sandbox.connect(sb.sandbox_id)
        assert again.commands.run("pgrep -c -f 'sleep 1000'").stdout == "1\n"
    finally:
        sb.kill()
