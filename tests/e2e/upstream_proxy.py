"""An operator's HTTP proxy, of the tests' own, on the host's loopback: it
wants Basic credentials (407 without them), records every request that
reaches it, and forwards `CONNECT host:port` tunnels and absolute-form
`http://` requests to where they ask. The tests only ever ask it for the
package registries and for network namespaces they made themselves."""
from __future__ import annotations

import base64
import socket
import threading

from sockrelay import relay


def _read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
        if len(head) > 65536:
            break
    return head


# Python for a sandbox's REPL: where (if anywhere) the needles, given in
# base64 so that this code holds none of them, occur in any process's
# environment or command line, or in a file under the usual directories.
FIND_SECRETS = """
import base64, json, os
needles = [base64.b64decode(n) for n in {needles!r}]
found = []
def look(path):
    try:
        with open(path, 'rb') as f:
            data = f.read(4 << 20)
    except OSError:
        return
    if any(n in data for n in needles):
        found.append(path)
for pid in filter(str.isdigit, os.listdir('/proc')):
    for what in ('environ', 'cmdline'):
        look(f'/proc/{{pid}}/{{what}}')
for top in ('/etc', '/root', '/tmp', '/run', '/var/tmp'):
    for d, _, files in os.walk(top):
        for f in files:
            look(os.path.join(d, f))
print(json.dumps(found))
"""


def find_secrets_code(*needles: str) -> str:
    return FIND_SECRETS.format(needles=[base64.b64encode(n.encode()).decode() for n in needles])


class UpstreamProxy:
    def __init__(self, user: str = "fbuser", password: str = "fb-pass!word"):
        self.user, self.password = user, password
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[dict] = []  # {"line", "authorized"}
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The URL for `--egress-proxy`, credentials percent-encoded."""
        from urllib.parse import quote
        return f"http://{quote(self.user, safe='')}:{quote(self.password, safe='')}@127.0.0.1:{self.port}"

    def lines(self) -> list[str]:
        with self._lock:
            return [s["line"] for s in self.seen]

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = _read_head(conn)
            text = head.split(b"\r\n\r\n", 1)[0].decode("latin-1")
            rest = head.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in head else b""
            line, *headers = text.split("\r\n")
            fields = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in headers if ":" in h}
            want = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            authorized = fields.get("proxy-authorization") == want
            with self._lock:
                self.seen.append({"line": line, "authorized": authorized})
            if not authorized:
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"test-upstream\"\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                return
            method, target, _ = line.split(" ", 2)
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up = socket.create_connection((host.strip("[]"), int(port)), timeout=20)
                up.settimeout(None)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                # http://host[:port]/path → the origin, one request, then close.
                hostport, _, path = target.split("://", 1)[1].partition("/")
                host, _, port = hostport.partition(":")
                up = socket.create_connection((host, int(port or 80)), timeout=20)
                up.settimeout(None)
                kept = [h for h in headers if h.split(":", 1)[0].strip().lower() not in ("proxy-authorization", "connection", "proxy-connection")]
                up.sendall(f"{method} /{path} HTTP/1.1\r\n".encode() + "\r\n".join(kept + ["Connection: close"]).encode() + b"\r\n\r\n" + rest)
            threading.Thread(target=relay, args=(up, conn), daemon=True).start()
            relay(conn, up)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
