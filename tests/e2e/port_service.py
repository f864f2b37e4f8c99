"""The echo service the port-proxy tests run inside sandboxes (a single
server's, tests/e2e/test_ports.py, and a cluster's gateway's,
tests/cluster/test_clients.py): echoes requests as JSON and misbehaves on
request (stream, hang, cut, garbage, close, WebSocket)."""
from __future__ import annotations

from helpers import exec_raw

# A stdlib-only service run inside the sandboxes: echoes requests as JSON,
# and misbehaves on request (stream, hang, cut, garbage, close, WebSocket).
SERVICE = r'''
import base64, hashlib, http.server, json, socket, sys, time

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, body, ctype="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self):
        p = self.path
        if p.startswith("/ws"):
            return self.websocket()
        if p.startswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                data = f"chunk {i} at {time.time():.3f}\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
            return
        if p.startswith("/hang"):
            time.sleep(3600)
        if p.startswith("/cut"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 1000)
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if p.startswith("/garbage"):
            self.wfile.write(b"this is not HTTP\r\n\r\n")
            self.close_connection = True
            return
        if p.startswith("/close"):
            self.close_connection = True
            return
        if p.startswith("/redirect"):
            return self.send(302, b"", extra=[("Location", "/echo?from=redirect")])
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        try:
            token = open("/root/token").read().strip()
        except OSError:
            token = None
        out = {"method": self.command, "path": p, "headers": {k.lower(): v for k, v in self.headers.items()},
               "body": body.decode("latin-1"), "hostname": socket.gethostname(), "token": token,
               "port": self.server.server_address[1]}
        self.send(201 if p.startswith("/created") else 200, json.dumps(out).encode(), extra=[("X-Service", "echo")])

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = handle_any

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "1234")
        self.end_headers()

    # Minimal RFC 6455 server: echo every text or binary message.
    def websocket(self):
        self.close_connection = True  # no HTTP after the tunnel
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = int.from_bytes(r.read(2), "big")
            elif n == 127:
                n = int.from_bytes(r.read(8), "big")
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.frame(8, data[:2])
                return
            if op == 9:
                self.frame(10, data)
                continue
            if op in (1, 2):
                self.frame(op, data)

    def frame(self, op, data):
        n = len(data)
        head = bytes([0x80 | op]) + (bytes([n]) if n < 126 else bytes([126]) + n.to_bytes(2, "big") if n < 65536 else bytes([127]) + n.to_bytes(8, "big"))
        self.wfile.write(head + data)
        self.wfile.flush()

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

host = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
if ":" in host:
    Server.address_family = socket.AF_INET6
Server((host, int(sys.argv[1])), H).serve_forever()
'''


def ports(sid: str, port, path: str = "") -> str:
    return f"/v1/sandboxes/{sid}/ports/{port}{path}"


def run_bash(http, sid, code):
    ex = exec_raw(http, sid, code, language="bash")
    assert ex.exit_code == 0, (code, ex.stdout, ex.stderr)
    return ex.stdout


def wait_listening(http, sid, port, host="127.0.0.1"):
    code = (f"import socket, time\nfor i in range(400):\n    try:\n        socket.create_connection(({host!r}, {port})).close(); break\n"
            f"    except OSError:\n        time.sleep(0.025)\nelse:\n    raise SystemExit('nothing listens on {port}')")
    ex = exec_raw(http, sid, code)
    assert ex.exit_code == 0, (ex.stdout, ex.stderr)


def start_service(http, sid, port, host="127.0.0.1"):
    """The echo service, in the background in the sandbox."""
    r = http.put(f"/v1/sandboxes/{sid}/files", params={"path": "/root/service.py"}, content=SERVICE.encode())
    assert r.status_code == 200, r.text
    run_bash(http, sid, f"nohup setsid python3 /root/service.py {port} {host} >/tmp/service-{port}.log 2>&1 </dev/null &")
    wait_listening(http, sid, port, host)
