"""The floor under an exec's latency on this machine: the same hops as an
exec through forkbox, made by two bare host processes and no sandbox.

    client ──TCP──▶ relay ──Unix socket──▶ repl (exec, stdout captured)
    client ◀──TCP── relay ◀──Unix socket── repl

forkbox's path has the same four wake-ups (client → server thread → REPL
→ server thread → client). Here the relay and the REPL are plain Python
processes (this file, run as `floor.py repl|relay <socket> <slice µs>`) in
the caller's own cgroup, at the default nice, with the same scheduler slice
forkbox gives its REPLs and server threads (`sandbox::REPL_TIME_SLICE`,
where the kernel takes one). Whatever delays them under load delays any
process on the host: bench/noisy.py measures both paths interleaved and
reports how much of forkbox's loaded tail the machine alone already has.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import os
import socket
import struct
import subprocess
import sys
import tempfile

# forkbox's REPL and server threads run with a 300 µs slice (sandbox.rs).
SLICE_US = 300


def set_slice(us: int) -> bool:
    """sched_setattr on this thread, sched_runtime as the slice
    (SCHED_FLAG_RESET_ON_FORK, as forkbox sets it); whether it took."""
    nr = {"x86_64": 314, "aarch64": 274}.get(os.uname().machine)
    if not nr or us <= 0:
        return False
    attr = ctypes.create_string_buffer(struct.pack("=IIQiIQQQII", 56, 0, 1, 0, 0, us * 1000, 0, 0, 0, 0))
    return ctypes.CDLL(None, use_errno=True).syscall(nr, 0, attr, 0) == 0


def read_exact(s: socket.socket, n: int) -> bytes:
    b = bytearray()
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return bytes(b)


def read_frame(s: socket.socket) -> bytes:
    (n,) = struct.unpack(">I", read_exact(s, 4))
    return read_exact(s, n)


def write_frame(s: socket.socket, b: bytes) -> None:
    s.sendall(struct.pack(">I", len(b)) + b)


def serve_repl(path: str) -> None:
    """Run each frame's code; answer with its stdout."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    print("ready", flush=True)
    conn, _ = srv.accept()
    env = {"__name__": "__main__"}
    while True:
        code = read_frame(conn).decode()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, env)
        write_frame(conn, out.getvalue().encode())


def serve_relay(path: str, sliced: bool) -> None:
    """Pass each frame from one TCP client to the REPL and its answer back."""
    repl = socket.socket(socket.AF_UNIX)
    repl.connect(path)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print(srv.getsockname()[1], "sliced" if sliced else "default-slice", flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        write_frame(repl, read_frame(conn))
        write_frame(conn, read_frame(repl))


class Floor:
    """The bare two-process exec path; `exec(code)` returns its stdout."""

    def __init__(self, slice_us: int = SLICE_US):
        self.dir = tempfile.mkdtemp(prefix="forkbox-floor-")
        path = os.path.join(self.dir, "repl.sock")
        self.procs = []
        repl = self._spawn("repl", path, slice_us)
        if repl.stdout.readline().strip() != "ready":
            raise RuntimeError("the floor's REPL did not start")
        relay = self._spawn("relay", path, slice_us)
        port, how = relay.stdout.readline().split()
        self.sliced = how == "sliced"
        self.sock = socket.create_connection(("127.0.0.1", int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _spawn(self, role: str, path: str, slice_us: int) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), role, path, str(slice_us)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def exec(self, code: str) -> str:
        write_frame(self.sock, code.encode())
        try:
            return read_frame(self.sock).decode()
        except EOFError:
            raise RuntimeError("the floor's relay hung up") from None

    def close(self) -> None:
        self.sock.close()
        for p in self.procs:
            p.kill()
            p.wait()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)


if __name__ == "__main__":
    role, sock_path, slice_us = sys.argv[1], sys.argv[2], int(sys.argv[3])
    took = set_slice(slice_us)
    with contextlib.suppress(EOFError):
        serve_repl(sock_path) if role == "repl" else serve_relay(sock_path, took)
