#!/usr/bin/env python3
"""A forkbox cluster on one machine, for trying it and for tests/cluster
(docs/cluster.md#a-local-cluster): a 3-member etcd cluster, an S3 server
(`rclone serve s3` over a local directory), N nodes (`forkbox serve
--cluster-…`, each with its own state directory) and a gateway.

    python3 deploy/local/cluster.py --bin target/release/forkbox [--gateway 127.0.0.1:7070]

runs until SIGTERM or SIGINT, then stops everything and removes what it
made. `LocalCluster` is the same thing as a Python object (the tests
kill and restart its parts).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ETCD_MEMBERS = 3
S3_ACCESS, S3_SECRET = "forkbox-local", "forkbox-local-secret"
BUCKET = "forkbox"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_tcp(port: int, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


class Proc:
    """One child process with its log file."""

    def __init__(self, name: str, cmd: list[str], log: str, env: dict | None = None):
        self.name, self.cmd, self.log_path, self.env = name, cmd, log, env
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Proc":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, then SIGKILL after `timeout`."""
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


class LocalCluster:
    def __init__(self, bin: str, root: str, templates_dir: str, nodes: int = 3, gateway: str | None = None,
                 node_args: list[str] | None = None, lease_seconds: int = 4):
        self.bin, self.root, self.templates_dir = bin, root, templates_dir
        self.node_count, self.node_args, self.lease_seconds = nodes, list(node_args or []), lease_seconds
        host, _, port = (gateway or f"127.0.0.1:{free_port()}").rpartition(":")
        self.gateway_addr = f"{host}:{port}"
        self.url = f"http://{self.gateway_addr}"
        self.prefix = "/forkbox-local"
        self.etcd_ports = [(free_port(), free_port()) for _ in range(ETCD_MEMBERS)]
        self.etcd: list[Proc] = []
        self.s3_port = free_port()
        self.s3: Proc | None = None
        self.nodes: dict[str, Proc] = {}
        self.node_ports: dict[str, int] = {}
        self.gateway: Proc | None = None
        self.secret_file = os.path.join(root, "secret")

    # ── settings every forkbox process of the cluster gets ─────────────
    @property
    def endpoints(self) -> str:
        return ",".join(f"http://127.0.0.1:{c}" for c, _ in self.etcd_ports)

    def env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "FORKBOX_CLUSTER_ETCD": self.endpoints,
            "FORKBOX_CLUSTER_PREFIX": self.prefix,
            "FORKBOX_CLUSTER_SECRET_FILE": self.secret_file,
            "FORKBOX_CLUSTER_STORE": f"s3://{BUCKET}/store",
            "AWS_ACCESS_KEY_ID": S3_ACCESS,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_ENDPOINT": f"http://127.0.0.1:{self.s3_port}",
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
        })
        return env

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # ── the parts ──────────────────────────────────────────────────────
    def etcd_member(self, i: int) -> Proc:
        client, peer = self.etcd_ports[i]
        initial = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, (_, p) in enumerate(self.etcd_ports))
        cmd = ["etcd", "--name", f"m{i}", "--data-dir", self.path(f"etcd-m{i}"),
               "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
               "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
               "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", f"forkbox-{os.getpid()}",
               "--heartbeat-interval", "100", "--election-timeout", "1000", "--log-level", "warn"]
        return Proc(f"etcd-m{i}", cmd, self.path(f"etcd-m{i}.log"))

    def start_etcd(self, i: int) -> None:
        p = self.etcd_member(i).start()
        if i < len(self.etcd):
            self.etcd[i] = p
        else:
            self.etcd.append(p)

    def start_s3(self) -> None:
        os.makedirs(self.path("s3"), mode=0o700, exist_ok=True)
        os.makedirs(self.path("s3", BUCKET), exist_ok=True)
        cmd = ["rclone", "serve", "s3", "--addr", f"127.0.0.1:{self.s3_port}", "--auth-key", f"{S3_ACCESS},{S3_SECRET}",
               "--config", "/dev/null", self.path("s3")]
        self.s3 = Proc("s3", cmd, self.path("s3.log")).start()
        wait_tcp(self.s3_port, 30, "rclone serve s3", self.s3.proc)

    def node_cmd(self, name: str) -> list[str]:
        port = self.node_ports[name]
        return [self.bin, "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", self.path(name),
                "--templates-dir", self.templates_dir, "--no-build-templates",
                "--node-name", name, "--cluster-lease-seconds", str(self.lease_seconds), *self.node_args]

    def start_node(self, name: str) -> None:
        self.node_ports.setdefault(name, free_port())
        self.nodes[name] = Proc(name, self.node_cmd(name), self.path(f"{name}.log"), self.env()).start()

    def start_gateway(self) -> None:
        cmd = [self.bin, "gateway", "--listen", self.gateway_addr]
        self.gateway = Proc("gateway", cmd, self.path("gateway.log"), self.env()).start()
        wait_tcp(int(self.gateway_addr.rpartition(":")[2]), 60, "the gateway", self.gateway.proc)

    # ── all of it ──────────────────────────────────────────────────────
    def start(self, say=lambda m: None) -> "LocalCluster":
        shutil.rmtree(self.root, ignore_errors=True)
        # Traversable: sandboxes' own ids reach their roots under the nodes'
        # state directories. What is secret (the secret, the store's
        # bytes, etcd's data) is 0700/0600 below it.
        os.makedirs(self.root, mode=0o755)
        with open(os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        say(f"starting a 3-member etcd cluster on ports {[c for c, _ in self.etcd_ports]}")
        for i in range(ETCD_MEMBERS):
            self.start_etcd(i)
        for i, (client, _) in enumerate(self.etcd_ports):
            wait_tcp(client, 60, f"etcd member m{i}", self.etcd[i].proc)
        self.wait_etcd_quorum(60)
        say(f"starting rclone serve s3 on port {self.s3_port}")
        self.start_s3()
        for i in range(self.node_count):
            self.start_node(f"node-{i + 1}")
        say(f"starting {self.node_count} nodes ({', '.join(self.nodes)})")
        self.start_gateway()
        self.wait_nodes(self.node_count, 300)
        say(f"gateway on {self.url}")
        return self

    def wait_etcd_quorum(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = subprocess.run(["etcdctl", "--endpoints", self.endpoints, "endpoint", "health", "--cluster"],
                               capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("etcd did not become healthy")

    def get(self, path: str, timeout: float = 10) -> tuple[int, dict | list | None]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, None
        except OSError:
            return 0, None

    def wait_nodes(self, n: int, timeout: float, warm: bool = True) -> None:
        """Until `n` nodes are members (etcd says so), with `warm` each with
        a warm pool of `default` (the gateway says so; before any key)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in list(self.nodes.values()) + [self.gateway]:
                if p is not None and p.proc.poll() is not None and p.proc.returncode not in (0, -9):
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.log_tail()}")
            if warm:
                status, body = self.get("/v1/cluster/nodes")
                if status == 200 and len([x for x in body["nodes"] if "default" in x["load"]["warm"]]) >= n:
                    return
            else:
                members = self.etcdctl("get", "--prefix", "--keys-only", f"{self.prefix}/nodes/").stdout.split()
                if len(members) >= n:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"{n} nodes did not join within {timeout:.0f} s:\n" + "\n".join(p.log_tail() for p in self.nodes.values()))

    def heal(self) -> None:
        """Start whatever part is down again (tests that break parts)."""
        for i, p in enumerate(self.etcd):
            if not p.alive():
                self.start_etcd(i)
        self.wait_etcd_quorum(60)
        if self.s3 is not None and not self.s3.alive():
            self.start_s3()
        down = [n for n, p in self.nodes.items() if not p.alive()]
        for n in down:
            self.start_node(n)
        if self.gateway is not None and not self.gateway.alive():
            self.start_gateway()
        if down:
            # Members again (a node of a cluster with keys warms no pool
            # before a key's first create).
            self.wait_nodes(self.node_count, 300, warm=False)

    def etcdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["etcdctl", "--endpoints", self.endpoints, *args], capture_output=True, text=True,
                              env={**os.environ, "ETCDCTL_API": "3"}, timeout=30)

    def etcd_leader(self) -> int:
        """The index of the etcd member that leads now (tests that kill it
        make the cluster go through an election)."""
        r = self.etcdctl("endpoint", "status", "--write-out", "json")
        for entry in json.loads(r.stdout or "[]"):
            status = entry["Status"]
            if status["header"]["member_id"] == status["leader"]:
                port = int(entry["Endpoint"].rpartition(":")[2])
                return [c for c, _ in self.etcd_ports].index(port)
        raise RuntimeError(f"no etcd member leads: {r.stdout} {r.stderr}")

    def stop(self) -> None:
        """Everything stopped, gracefully (nodes destroy their sandboxes),
        and everything it made removed."""
        if self.gateway:
            self.gateway.stop()
        for p in self.nodes.values():
            p.stop(timeout=120)
        if self.s3:
            self.s3.stop()
        for p in self.etcd:
            p.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the forkbox binary")
    ap.add_argument("--root", default="/var/lib/forkbox-cluster", help="where the cluster's state goes (removed at the end)")
    ap.add_argument("--templates-dir", default="/var/lib/forkbox/templates")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gateway", default="127.0.0.1:7070", help="the gateway's address")
    args = ap.parse_args()
    for tool in ("etcd", "etcdctl", "rclone"):
        if shutil.which(tool) is None:
            print(f"{tool} not found (./dev cluster installs it)", file=sys.stderr)
            return 1
    cluster = LocalCluster(os.path.abspath(args.bin), args.root, args.templates_dir, args.nodes, args.gateway, lease_seconds=10)
    def interrupted(*_):
        raise KeyboardInterrupt
    # SIGTERM as Ctrl-C: whatever is starting stops, and all of it is removed.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        cluster.start(say=lambda m: print(f"==> {m}", file=sys.stderr, flush=True))
        print(f"==> ready: PODFLARE_API_URL={cluster.url}; cluster secret in {cluster.secret_file}; "
              f"FORKBOX_CLUSTER_ETCD={cluster.endpoints} FORKBOX_CLUSTER_PREFIX={cluster.prefix}", file=sys.stderr, flush=True)
        while True:
            down = [p for p in [*cluster.etcd, cluster.s3, cluster.gateway, *cluster.nodes.values()] if p is not None and not p.alive()]
            if down:
                print(f"==> {down[0].name} exited ({down[0].proc.returncode}); stopping\n{down[0].log_tail()}", file=sys.stderr, flush=True)
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("==> stopping the cluster", file=sys.stderr, flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
