"""A TLS-intercepting proxy of the tests' own, as a company network puts in
front of the internet: it ends every TLS connection with a certificate it
makes on the spot, for the name the client asked (SNI) or the address it
dialled, signed by its own CA, and relays what it reads in the clear to the
real server (here: a plain HTTP origin). Clients trust it only if they trust
its CA.

Run inside a network namespace of the test's:
    python3 tls_interceptor.py --ca-cert ca.pem --ca-key ca.key --listen 10.215.7.2:443 --origin 10.215.7.2:8080
It needs `trustme` (tests/requirements.txt)."""
from __future__ import annotations

import argparse
import socket
import ssl
import threading

import trustme

from sockrelay import relay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ca-cert", required=True)
    ap.add_argument("--ca-key", required=True)
    ap.add_argument("--listen", required=True)
    ap.add_argument("--origin", required=True)
    args = ap.parse_args()
    with open(args.ca_cert, "rb") as c, open(args.ca_key, "rb") as k:
        ca = trustme.CA.from_pem(c.read(), k.read())
    host, port = args.listen.rsplit(":", 1)
    origin = args.origin.rsplit(":", 1)
    contexts: dict[str, ssl.SSLContext] = {}
    lock = threading.Lock()

    def context_for(name: str) -> ssl.SSLContext:
        with lock:
            if name not in contexts:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                ca.issue_cert(name).configure_cert(ctx)
                contexts[name] = ctx
            return contexts[name]

    default = context_for(host)

    def on_sni(sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        if name:
            sock.context = context_for(name)

    default.sni_callback = on_sni
    listener = socket.create_server((host, int(port)), reuse_port=False)

    def serve(conn: socket.socket) -> None:
        try:
            tls = default.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()  # the client did not trust us: what the tests look for
            return
        upstream = socket.create_connection((origin[0], int(origin[1])))
        threading.Thread(target=relay, args=(upstream, tls), daemon=True).start()
        relay(tls, upstream)

    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
