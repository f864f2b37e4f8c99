"""Network namespaces of the tests' own, joined to the host by a veth pair:
somewhere a sandbox may connect to that is neither the host nor anyone
else's machine. Tests only ever send traffic to these, to loopback and to
the package registries."""
from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import threading
import time


def wait_listening(ip: str, port: int, timeout: float = 15) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


class NetNs:
    """Namespace `fbtest<N>`: the host side has 10.<net>.N.1 (and
    169.254.<net>.N, a link-local host address), the namespace 10.<net>.N.2."""

    def __init__(self, net: int):
        n = random.randint(10, 250)
        self.ns, self.host_if, self.ns_if = f"fbt{net}n{n}", f"fbh{net}n{n}", f"fbn{net}n{n}"
        self.host_ip, self.ns_ip, self.link_local = f"10.{net}.{n}.1", f"10.{net}.{n}.2", f"169.254.{net}.{n}"
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "NetNs":
        run = lambda *a: subprocess.run(a, check=True)
        run("ip", "netns", "add", self.ns)
        try:
            run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            run("ip", "link", "set", self.ns_if, "netns", self.ns)
            run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            run("ip", "addr", "add", f"{self.link_local}/32", "dev", self.host_if)
            run("ip", "link", "set", self.host_if, "up")
            run("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/24", "dev", self.ns_if)
            run("ip", "-n", self.ns, "link", "set", self.ns_if, "up")
            run("ip", "-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def run(self, argv: list[str], port: int | None = None, **kw) -> subprocess.Popen:
        """Start `argv` inside the namespace (stopped on exit); wait until
        `port` on the namespace's address accepts connections."""
        p = subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], stdout=kw.pop("stdout", subprocess.DEVNULL),
                             stderr=kw.pop("stderr", subprocess.DEVNULL), **kw)
        self.procs.append(p)
        if port is not None:
            wait_listening(self.ns_ip, port)
        return p

    def http_server(self, directory: str, port: int = 8080) -> subprocess.Popen:
        return self.run([sys.executable, "-m", "http.server", str(port), "--bind", self.ns_ip, "--directory", directory], port)

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            with contextlib.suppress(Exception):
                p.wait(10)
        subprocess.run(["ip", "link", "del", self.host_if], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)


class HostListener:
    """A TCP listener on the host's addresses that records who reached it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                c, addr = self.sock.accept()
                self.accepted.append(addr)
                c.close()
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()
