"""Sandboxes trust what the host trusts (docs/network.md#host-cas).

A TLS-intercepting proxy of this file's own (tls_interceptor.py, with a
throw-away CA) sits in a network namespace this file makes, in front of a
plain HTTP origin, as a company's proxy sits in front of the internet. A
server given that CA with `--host-cas` has sandboxes whose curl, Python
`ssl`, pip (Debian's and a venv's), Node and git all get through it, and
template builds too; with `--no-host-cas` every one of them refuses the
interceptor's certificate. A CA added to or removed from the host reaches
the next sandbox with no rebuild. Nothing but certificates travels: not a
private key beside one, not the rest of the host's store.

Traffic: loopback, the namespace, and Debian's mirror (a recipe's apt step)."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import trustme
from cryptography import x509

from conftest import start_server, stop_and_assert_clean
from helpers import create_raw, current_rootfs, delete_raw, exec_ok, exec_raw
from netns import NetNs

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_TIMEOUT = 900


def probe_wheel() -> tuple[str, bytes]:
    """A real, installable wheel `forkbox-probe 1.0` (name, bytes)."""
    files = {
        "forkbox_probe/__init__.py": b"MARK = 'probe'\n",
        "forkbox_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: forkbox-probe\nVersion: 1.0\n",
        "forkbox_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: forkbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "forkbox_probe-1.0.dist-info/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("forkbox_probe-1.0.dist-info/RECORD", record)
    return "forkbox_probe-1.0-py3-none-any.whl", buf.getvalue()


@pytest.fixture(scope="module")
def cas(tmp_path_factory):
    """Three throw-away CAs: the interceptor's (1), a second interceptor's
    (2), and one that comes in a file beside a private key (3)."""
    d = tmp_path_factory.mktemp("cas")
    out = {"dir": str(d)}
    for i in (1, 2, 3):
        ca = trustme.CA(organization_name=f"forkbox test CA {i}")
        ca.cert_pem.write_to_path(str(d / f"ca{i}.pem"))
        ca.private_key_pem.write_to_path(str(d / f"ca{i}.key"))
        out[i] = {"cert": str(d / f"ca{i}.pem"), "key": str(d / f"ca{i}.key"), "pem": ca.cert_pem.bytes()}
    return out


@pytest.fixture(scope="module")
def mitm(cas, tmp_path_factory):
    """The namespace: an origin on :8080 (a page, a PEP 503 index with the
    probe wheel, a git repository), behind interceptors on :443 (CA 1) and
    :8443 (CA 2)."""
    www = tmp_path_factory.mktemp("origin")
    (www / "hello.txt").write_text("hello through the interceptor\n")
    name, wheel = probe_wheel()
    (www / "files").mkdir()
    (www / "files" / name).write_bytes(wheel)
    sha = hashlib.sha256(wheel).hexdigest()
    (www / "simple" / "forkbox-probe").mkdir(parents=True)
    (www / "simple" / "forkbox-probe" / "index.html").write_text(f'<a href="../../files/{name}#sha256={sha}">{name}</a>\n')
    work, bare = str(tmp_path_factory.mktemp("work")), str(www / "repo.git")
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *a], check=True, capture_output=True)
    git("init", "-q", work)
    with open(os.path.join(work, "README"), "w") as f:
        f.write("a repository behind the interceptor\n")
    git("-C", work, "add", "README")
    git("-C", work, "commit", "-q", "-m", "one")
    git("clone", "-q", "--bare", work, bare)
    git("-C", bare, "update-server-info")
    with NetNs(215) as net:
        net.http_server(str(www))
        for port, i in ((443, 1), (8443, 2)):
            net.run([sys.executable, os.path.join(HERE, "tls_interceptor.py"), "--ca-cert", cas[i]["cert"], "--ca-key", cas[i]["key"],
                     "--listen", f"{net.ns_ip}:{port}", "--origin", f"{net.ns_ip}:8080"], port)
        yield {"ip": net.ns_ip, "wheel": name, "sha256": sha}


def ca_dir(cas, tmp_path_factory, which=(1, 3)) -> str:
    """A host CA directory as update-ca-certificates reads it: CA 1 in a
    subdirectory, CA 3 in a file that also holds its private key."""
    d = tmp_path_factory.mktemp("host-cas")
    (d / "corp").mkdir()
    if 1 in which:
        (d / "corp" / "proxy.crt").write_bytes(cas[1]["pem"])
    if 3 in which:
        with open(cas[3]["key"], "rb") as k:
            (d / "with-key.crt").write_bytes(k.read() + cas[3]["pem"])
    (d / "ignored.pem").write_bytes(cas[2]["pem"])  # not *.crt: not read
    return str(d)


@pytest.fixture(scope="module")
def trusting(say, server, cas, tmp_path_factory):
    s = start_server(say, "host-cas", ["--host-cas", ca_dir(cas, tmp_path_factory)], build=False)
    yield s
    stop_and_assert_clean(s)


@pytest.fixture(scope="module")
def distrusting(say, server, cas, tmp_path_factory):
    s = start_server(say, "no-host-cas", ["--host-cas", ca_dir(cas, tmp_path_factory), "--no-host-cas"], build=False)
    yield s
    stop_and_assert_clean(s)


def sh(c, sid: str, code: str, timeout_ms: int = 180_000):
    return exec_raw(c, sid, code, language="bash", timeout_ms=timeout_ms)


def template_bundle() -> bytes:
    with open(os.path.join(current_rootfs(), "etc", "ssl", "certs", "ca-certificates.crt"), "rb") as f:
        return f.read()


# pip (24.2 on, Debian 13's 25.1) verifies through truststore, which fails
# on an index named by an IP address ("check_hostname requires
# server_hostname", pypa/pip#12905): pip reaches the interceptor by a name,
# which the sandbox's /etc/hosts gives (the interceptor signs for any name).
INDEX_HOST = "index.forkbox.test"


def clients(ip: str) -> dict[str, str]:
    """Each client's way of fetching from the interceptor (bash)."""
    name = f"(grep -q {INDEX_HOST} /etc/hosts || echo '{ip} {INDEX_HOST}' >> /etc/hosts) && "
    return {
        "curl": f"curl -sS --max-time 20 https://{ip}/hello.txt",
        "python ssl": f"python3 -c \"import urllib.request; print(urllib.request.urlopen('https://{ip}/hello.txt', timeout=20).read().decode(), end='')\"",
        "pip": name + f"pip download --no-deps --no-cache-dir -q --index-url https://{INDEX_HOST}/simple/ -d /tmp/dl forkbox-probe==1.0 "
                      "&& sha256sum /tmp/dl/*.whl",
        "venv pip": name + f"(test -x /tmp/venv/bin/pip || python3 -m venv /tmp/venv) && /tmp/venv/bin/pip download --no-deps --no-cache-dir -q "
                           f"--index-url https://{INDEX_HOST}/simple/ -d /tmp/vdl forkbox-probe==1.0 && sha256sum /tmp/vdl/*.whl",
    }


def test_every_client_trusts_an_added_ca_and_nothing_else_of_the_host_travels(trusting, mitm, cas):
    ip = mitm["ip"]
    with trusting.http(timeout=300) as c:
        sid = create_raw(c, egress={"allow": [f"{ip}/32"]})
        try:
            for name, cmd in clients(ip).items():
                ex = sh(c, sid, cmd)
                assert ex.exit_code == 0, (name, ex)
                if "pip" in name:
                    assert ex.stdout.split()[0] == mitm["sha256"], (name, ex)
                else:
                    assert ex.stdout == "hello through the interceptor\n", (name, ex)
            # The REPL's own ssl, as an agent's code would use it.
            assert exec_ok(c, sid, f"import ssl, socket\nctx = ssl.create_default_context()\n"
                                   f"s = ctx.wrap_socket(socket.create_connection(('{ip}', 443)), server_hostname='{ip}')\n"
                                   "print(dict(rdn[0] for rdn in s.getpeercert()['issuer'])['organizationName'])") == "forkbox test CA 1\n"
            # The bundle: the template's own, then the added CAs, and only them.
            r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/etc/ssl/certs/ca-certificates.crt"})
            assert r.status_code == 200, r.text
            own = template_bundle()
            assert r.content.startswith(own)
            added = x509.load_pem_x509_certificates(r.content[len(own):])
            orgs = sorted(a.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value for a in added)
            assert orgs == ["forkbox test CA 1", "forkbox test CA 3"], orgs
            ex = sh(c, sid, "grep -rl 'PRIVATE KEY' /etc/ssl /usr/local/share/ca-certificates; echo rc=$?; "
                            "ls /usr/local/share/ca-certificates/forkbox-host; cat /etc/ssl/certs/forkbox-host-cas.pem | grep -c BEGIN")
            assert ex.stdout.startswith("rc=1\n") and ex.stdout.strip().endswith("\n2"), ex
            env = exec_ok(c, sid, "env | grep -E '^(SSL_CERT_FILE|REQUESTS_CA_BUNDLE|NODE_EXTRA_CA_CERTS)=' | sort", language="bash")
            assert env == ("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/forkbox-host-cas.pem\nREQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt\n"
                           "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\n"), env
            # update-ca-certificates inside finds the host's CAs again.
            ex = sh(c, sid, "update-ca-certificates --fresh >/dev/null 2>&1; grep -c BEGIN /etc/ssl/certs/ca-certificates.crt; "
                            + clients(ip)["curl"])
            assert ex.exit_code == 0 and ex.stdout.endswith("hello through the interceptor\n"), ex
        finally:
            delete_raw(c, sid)
    log = open(trusting.log_path, errors="replace").read()
    for i in (1, 3):
        assert f"forkbox test CA {i}" in log and "sandboxes trust this host CA" in log, log[-3000:]
    assert "forkbox test CA 2" not in log


def test_without_host_cas_every_client_refuses_the_interceptor(distrusting, mitm):
    ip = mitm["ip"]
    with distrusting.http(timeout=300) as c:
        sid = create_raw(c, egress={"allow": [f"{ip}/32"]})
        try:
            for name, cmd in clients(ip).items():
                ex = sh(c, sid, cmd)
                assert ex.exit_code != 0, (name, ex)
                assert "certificate" in (ex.stdout + ex.stderr).lower() or name.endswith("pip"), (name, ex)
            r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/etc/ssl/certs/ca-certificates.crt"})
            assert r.content == template_bundle()
            assert exec_ok(c, sid, "env | grep -c -E '^(SSL_CERT_FILE|NODE_EXTRA_CA_CERTS)=' || true", language="bash") == "0\n"
        finally:
            delete_raw(c, sid)
    assert "sandboxes trust only their template's CAs (--no-host-cas)" in open(distrusting.log_path, errors="replace").read()


def test_a_change_of_the_hosts_cas_reaches_the_next_sandbox_without_a_rebuild(say, server, mitm, cas, tmp_path_factory):
    ip = mitm["ip"]
    own = ca_dir(cas, tmp_path_factory, which=(1,))
    fetch = lambda c, sid, port: sh(c, sid, f"curl -sS --max-time 20 https://{ip}:{port}/hello.txt").exit_code
    s = start_server(say, "host-cas-change", ["--host-cas", own], build=False)
    try:
        with s.http(timeout=300) as c:
            before = create_raw(c, egress={"allow": [f"{ip}/32"]})
            assert (fetch(c, before, 443), fetch(c, before, 8443)) == (0, 60)
            with open(os.path.join(own, "second.crt"), "wb") as f:
                f.write(cas[2]["pem"])
            after = create_raw(c, egress={"allow": [f"{ip}/32"]})
            assert (fetch(c, after, 443), fetch(c, after, 8443)) == (0, 0)
            # A live sandbox keeps what it started with.
            assert fetch(c, before, 8443) == 60
            os.unlink(os.path.join(own, "corp", "proxy.crt"))
            last = create_raw(c, egress={"allow": [f"{ip}/32"]})
            assert (fetch(c, last, 443), fetch(c, last, 8443)) == (60, 0)
            for sid in (before, after, last):
                delete_raw(c, sid)
    finally:
        stop_and_assert_clean(s)
    log = open(s.log_path, errors="replace").read()
    assert log.count("the host's CAs changed: new sandboxes trust the new set") == 2, log[-3000:]


def build(c, recipe: dict) -> list[dict]:
    events = []
    with c.stream("POST", "/v1/templates", json=recipe, timeout=BUILD_TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.strip():
                events.append(json.loads(line))
    return events


def test_template_builds_node_and_git_trust_the_added_ca(trusting, mitm, cas):
    ip = mitm["ip"]
    recipe = {"name": "tls-tools", "apt": ["nodejs", "git"],
              "commands": [f"curl -sS --max-time 20 https://{ip}/hello.txt > /opt/hello.txt",
                           f"git clone -q https://{ip}/repo.git /opt/repo"]}
    with trusting.http(timeout=BUILD_TIMEOUT) as c:
        events = build(c, recipe)
        assert events[-1]["type"] == "done", events[-5:]
        sid = create_raw(c, template="tls-tools", egress={"allow": [f"{ip}/32"]})
        try:
            out = exec_ok(c, sid, "cat /opt/hello.txt /opt/repo/README", language="bash")
            assert out == "hello through the interceptor\na repository behind the interceptor\n", out
            get = (f"-e \"require('https').get('https://{ip}/hello.txt', r => r.pipe(process.stdout))"
                   ".on('error', e => {{ console.error(e.code); process.exit(3) }})\"")
            # Debian's Node reads the system's bundle; a Node on its own
            # store (`--use-bundled-ca`, as nvm's and nodesource's builds)
            # gets the CA from NODE_EXTRA_CA_CERTS, and fails without it.
            for node in ("node " + get, "node --use-bundled-ca " + get):
                ex = sh(c, sid, node)
                assert ex.exit_code == 0 and ex.stdout == "hello through the interceptor\n", (node, ex)
            ex = sh(c, sid, "env -u NODE_EXTRA_CA_CERTS node --use-bundled-ca " + get)
            assert ex.exit_code == 3 and "UNABLE_TO_VERIFY" in ex.stderr, ex
            ex = sh(c, sid, f"git clone -q https://{ip}/repo.git /tmp/again && cat /tmp/again/README")
            assert ex.exit_code == 0 and ex.stdout == "a repository behind the interceptor\n", ex
        finally:
            delete_raw(c, sid)
        # The built layers hold none of the host's CAs: they come with each
        # new sandbox, from the host as it is then.
        body = cas[1]["pem"].decode().splitlines()[1]
        layers = os.path.join(trusting.state_dir, "custom-templates", "layers")
        assert os.path.isdir(layers)
        found = subprocess.run(["grep", "-rlF", body, layers], capture_output=True, text=True)
        assert found.returncode == 1 and found.stdout == "", found
        assert c.delete("/v1/templates/tls-tools").status_code == 204
