"""Attacks on the E2B front door (docs/e2b.md#access): what one sandbox's
token, a forged Host, a replayed signed link or a hostile message can
reach. Raw HTTP, the way a hostile client would send it, against the
suite's live server; no E2B SDK is needed."""
import base64
import hashlib
import json
import os
import time
import uuid

import httpx
import pytest

from helpers import ForkboxServer

ENVD = "49983"


def create(server, key="any-key", **body):
    r = httpx.post(f"{server.url}/v2/sandboxes", json={"templateID": "base", "timeout": 120, **body},
                   headers={"X-API-KEY": key}, timeout=120)
    assert r.status_code == 201, r.text
    return r.json()


def kill(server, sb, key="any-key"):
    httpx.delete(f"{server.url}/sandboxes/{sb['sandboxID']}", headers={"X-API-KEY": key}, timeout=60)


def envd(server, sb, method, body=None, token=None, **headers):
    """One unary envd RPC, routed by header to sandbox `sb`."""
    h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": ENVD, "Content-Type": "application/json", **headers}
    if token is not None:
        h["X-Access-Token"] = token
    return httpx.post(f"{server.url}/{method}", json=body or {}, headers=h, timeout=60)


def sh(server, sb, script, user="root", pty=False):
    """Run `script` as `user` in sandbox `sb` through Process.Start (on a
    terminal with `pty`); its stdout (the terminal's output with `pty`)."""
    h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": ENVD, "X-Access-Token": sb["envdAccessToken"],
         "Content-Type": "application/connect+json", "Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}
    start = {"process": {"cmd": "/bin/bash", "args": ["-c", script]}}
    if pty:
        start["pty"] = {"size": {"cols": 200, "rows": 50}}
    msg = json.dumps(start).encode()
    r = httpx.post(f"{server.url}/process.Process/Start", content=b"\0" + len(msg).to_bytes(4, "big") + msg,
                   headers=h, timeout=60)
    assert r.status_code == 200, r.text
    out, data = b"", r.content
    while data:
        flags, n = data[0], int.from_bytes(data[1:5], "big")
        frame, data = data[5:5 + n], data[5 + n:]
        if flags & 2:
            assert frame in (b"{}", b""), frame
            break
        ev = json.loads(frame)["event"]
        for stream in ("stdout", "pty"):
            if stream in ev.get("data", {}):
                out += base64.b64decode(ev["data"][stream])
    return out.decode()


def signature(path, operation, user, token, expiration=None):
    text = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration is not None else "")
    return "v1_" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode().rstrip("=")


@pytest.fixture(scope="module")
def pair(server):
    a, b = create(server), create(server)
    yield a, b
    kill(server, a)
    kill(server, b)


def test_one_sandboxs_token_opens_no_other(server, pair):
    a, b = pair
    assert envd(server, a, "process.Process/List", token=a["envdAccessToken"]).status_code == 200
    r = envd(server, b, "process.Process/List", token=a["envdAccessToken"])
    assert r.status_code == 401 and r.json()["code"] == 401, r.text
    # The same through Host routing, and with both routes naming different sandboxes.
    host = server.url.removeprefix("http://")
    r = httpx.post(f"{server.url}/process.Process/List", json={},
                   headers={"Host": f"{ENVD}-{b['sandboxID']}.{host}", "X-Access-Token": a["envdAccessToken"]})
    assert r.status_code == 401, r.text
    r = httpx.post(f"{server.url}/process.Process/List", json={},
                   headers={"Host": f"{ENVD}-{a['sandboxID']}.{host}", "E2b-Sandbox-Id": b["sandboxID"],
                            "X-Access-Token": a["envdAccessToken"]})
    assert r.status_code == 401, "the header routes, and the token must be that sandbox's: " + r.text
    # A made-up sandbox, a token of the right shape, an empty token.
    for sid, tok in ((f"sb-{uuid.uuid4().hex[:12]}", a["envdAccessToken"]), (b["sandboxID"], "0" * 64), (b["sandboxID"], "")):
        r = envd(server, {"sandboxID": sid}, "process.Process/List", token=tok)
        assert r.status_code in (401, 502), r.text


def test_the_code_interpreter_wants_the_token_too(server, pair):
    a, b = pair
    h = {"E2b-Sandbox-Id": b["sandboxID"], "E2b-Sandbox-Port": "49999"}
    r = httpx.post(f"{server.url}/execute", json={"code": "1+1"}, headers={**h, "X-Access-Token": a["envdAccessToken"]})
    assert r.status_code == 401, r.text
    r = httpx.post(f"{server.url}/execute", json={"code": "1+1"}, headers={**h, "X-Access-Token": b["envdAccessToken"]})
    assert r.status_code == 200 and '"2"' in r.text, r.text


def test_signed_links_are_bound_to_path_operation_user_sandbox_and_time(server, pair):
    a, b = pair
    sh(server, a, "echo secret-a > /home/user/a.txt")
    path, tok = "/home/user/a.txt", a["envdAccessToken"]

    def get(params, **headers):
        return httpx.get(f"{server.url}/files", params=params, headers=headers, timeout=30)

    good = {"path": path, "username": "user", "signature": signature(path, "read", "user", tok)}
    assert get(good).text == "secret-a\n", "a link made from a's token reads a's file with no id or token sent"
    assert get(good, **{"E2b-Sandbox-Id": b["sandboxID"]}).status_code == 401, "replayed on another sandbox"
    assert get({**good, "path": "/etc/shadow"}).status_code == 401, "a signature for another path"
    assert get({**good, "username": "root"}).status_code == 401, "a signature for another user"
    r = httpx.post(f"{server.url}/files", params=good, files={"file": ("a.txt", b"overwritten")})
    assert r.status_code == 401, "a read link does not write"
    past = int(time.time()) - 5
    expired = {"path": path, "username": "user", "signature": signature(path, "read", "user", tok, past),
               "signature_expiration": past}
    assert get(expired).status_code == 401, "expired"
    assert get({**expired, "signature_expiration": past + 3600}).status_code == 401, "an expiry moved later"
    later = int(time.time()) + 600
    assert get({**expired, "signature": signature(path, "read", "user", tok, later), "signature_expiration": later}).text == "secret-a\n"
    assert get({"path": path, "signature": "v1_" + "A" * 43}).status_code == 401, "a forged signature"
    assert sh(server, a, "cat /home/user/a.txt") == "secret-a\n"


def test_the_access_token_and_its_secret_are_not_inside(server, pair):
    a, _ = pair
    tok = a["envdAccessToken"]
    # The script holds the token in two halves and pipes it to grep (printf
    # is a builtin), so no argv or environ of this search holds it whole.
    half = len(tok) // 2
    seen = sh(server, a, f"A={tok[:half]}; B={tok[half:]}; env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n'")
    assert tok not in seen, seen[-2000:]
    found = sh(server, a, f"A={tok[:half]}; B={tok[half:]}; printf '%s%s' \"$A\" \"$B\" | "
                          "grep -rslF -D skip -f - / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null | head; "
                          "find / -xdev -name 'e2b-token-secret*' 2>/dev/null")
    assert found == "", f"the token or its secret is in the sandbox's files: {found}"


# Run as user `user` (the SDKs' default): every way back to root, and what
# root's ids or capabilities would open, reported one per line.
REGAIN_ROOT = r"""
import os, ctypes
def status(field):
    return next(l.split()[1:] for l in open("/proc/self/status") if l.startswith(field + ":"))
print("uids:", *os.getresuid()); print("gids:", *os.getresgid())
for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
    print(cap + ":", status(cap)[0])
print("NoNewPrivs:", status("NoNewPrivs")[0], "Seccomp", status("Seccomp")[0])
for name, call in [("setuid", lambda: os.setuid(0)), ("setresuid", lambda: os.setresuid(0, 0, 0)),
                   ("setgid", lambda: os.setgid(0)), ("setgroups", lambda: os.setgroups([0])),
                   ("read /root", lambda: os.listdir("/root")), ("init's environ", lambda: open("/proc/1/environ").read()),
                   ("write /etc", lambda: open("/etc/forkbox-owned", "w")), ("chown", lambda: os.chown(os.path.expanduser("~"), 0, 0))]:
    try:
        call(); print(name + ":", "ALLOWED")
    except OSError as e:
        print(name + ":", "refused", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
# prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SETUID): needs it permitted.
print("ambient raise:", libc.prctl(47, 2, 7, 0, 0), ctypes.get_errno())
"""


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_a_users_command_holds_nothing_of_root(server, pair, pty):
    """The sandbox's init drops a command to its user between fork and exec
    (no setpriv): real, effective and saved ids are the user's, no
    capability is left in any set, and nothing switches back."""
    a, _ = pair
    script = base64.b64encode(REGAIN_ROOT.encode()).decode()
    out = sh(server, a, f"echo {script} | base64 -d > /tmp/regain.py; python3 /tmp/regain.py", user="user", pty=pty).replace("\r", "")
    lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
    assert lines["uids"] == "1000 1000 1000" and lines["gids"] == "1000 1000 1000", out
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(lines[cap], 16) == 0, out
    assert lines["NoNewPrivs"] == "1 Seccomp 2", out
    for name in ("setuid", "setresuid", "setgid", "setgroups", "read /root", "init's environ", "write /etc", "chown"):
        assert lines[name].startswith("refused"), f"{name}: {lines[name]}"
    assert lines["ambient raise"] == "-1 1", out
    # Root's commands in the same sandbox keep root (the check above is the user's).
    assert sh(server, a, "id -u").strip() == "0"


def test_files_through_a_symlink_stay_inside_the_sandbox(server, pair, tmp_path):
    a, _ = pair
    marker = tmp_path / "host-only.txt"
    marker.write_text("host")
    sh(server, a, f"ln -s / /home/user/root; ln -s ../../../../../../.. /home/user/up; ln -s {marker} /home/user/direct")
    h = {"E2b-Sandbox-Id": a["sandboxID"], "E2b-Sandbox-Port": ENVD, "X-Access-Token": a["envdAccessToken"]}
    paths = (f"/home/user/root{marker}", f"/home/user/up{marker}", "/home/user/direct", f"../../../../..{marker}")
    for p in paths:
        r = httpx.get(f"{server.url}/files", params={"path": p}, headers=h)
        assert r.status_code == 404, (p, r.status_code, r.text)
    for p in paths:
        r = httpx.post(f"{server.url}/files", params={"path": p}, content=b"from-the-sandbox",
                       headers={**h, "Content-Type": "application/octet-stream"})
        assert r.status_code == 200, (p, r.status_code, r.text)
    # Every write landed at the path as the sandbox resolves it, in its own
    # root; a symlink written to is replaced, not followed.
    assert sh(server, a, f"cat {marker}; echo; test -L /home/user/direct || cat /home/user/direct") == "from-the-sandbox\nfrom-the-sandbox"
    assert marker.read_text() == "host", "no write through a symlink reached the host"
    assert httpx.get(f"{server.url}/files", params={"path": "/home/user/root/etc/hostname"}, headers=h).text == \
        sh(server, a, "cat /etc/hostname"), "the symlink to / resolves in the sandbox's root"


def test_bad_rpcs_get_connect_errors_and_the_server_keeps_serving(server, pair):
    a, _ = pair
    tok = a["envdAccessToken"]
    r = envd(server, a, "process.Process/Nope", token=tok)
    assert (r.status_code, r.json()["code"]) == (501, "unimplemented"), r.text  # Connect: unimplemented is 501
    r = envd(server, a, "nope.Service/Call", token=tok)
    assert r.json()["code"] == "unimplemented", r.text
    h = {"E2b-Sandbox-Id": a["sandboxID"], "E2b-Sandbox-Port": ENVD, "X-Access-Token": tok, "Content-Type": "application/json"}
    r = httpx.post(f"{server.url}/filesystem.Filesystem/Stat", content=b'{"path": ', headers=h)
    assert (r.status_code, r.json()["code"]) == (400, "invalid_argument"), r.text
    r = httpx.post(f"{server.url}/filesystem.Filesystem/Stat", content=b'{"path": 5}', headers=h)
    assert r.json()["code"] == "invalid_argument", r.text
    big = b'{"path": "' + b"a" * (9 << 20) + b'"}'
    r = httpx.post(f"{server.url}/filesystem.Filesystem/Stat", content=big, headers=h, timeout=60)
    assert r.json()["code"] == "resource_exhausted", r.text[:300]
    r = httpx.post(f"{server.url}/filesystem.Filesystem/Stat", content=b"{}", headers={**h, "Content-Type": "application/proto"})
    assert r.json()["code"] in ("invalid_argument", "unimplemented"), r.text
    # A stream with a lying envelope length, then a truncated one.
    sh_h = {**h, "Content-Type": "application/connect+json"}
    r = httpx.post(f"{server.url}/process.Process/Start", content=b"\0\xff\xff\xff\xff{}", headers=sh_h, timeout=30)
    assert b"resource_exhausted" in r.content or b"invalid_argument" in r.content, r.content[:300]
    r = httpx.post(f"{server.url}/process.Process/Start", content=b"\0\0\0\0\x10{}", headers=sh_h, timeout=30)
    assert b"invalid_argument" in r.content, r.content[:300]
    r = httpx.post(f"{server.url}/v2/sandboxes", content=b"[1,2", headers={"X-API-KEY": "k", "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == 400, r.text
    assert sh(server, a, "echo still") == "still\n"
    assert httpx.get(f"{server.url}/v1/healthz").status_code == 200


def test_private_ports_need_the_traffic_token(server):
    sb = create(server, network={"allowPublicTraffic": False})
    try:
        sh(server, sb, "cd /tmp && echo private > index.html && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)")
        host = server.url.removeprefix("http://")
        h = {"Host": f"8000-{sb['sandboxID']}.{host}"}
        for _ in range(100):
            r = httpx.get(f"{server.url}/index.html", headers={**h, "e2b-traffic-access-token": sb["trafficAccessToken"]})
            if r.status_code == 200:
                break
            time.sleep(0.1)
        assert r.text == "private\n", r.text
        r = httpx.get(f"{server.url}/index.html", headers=h)
        assert r.status_code == 502 and "private" not in r.text, r.text
        other = create(server)
        try:
            r = httpx.get(f"{server.url}/index.html", headers={**h, "e2b-traffic-access-token": other["trafficAccessToken"]})
            assert r.status_code == 502, "another sandbox's token: " + r.text
        finally:
            kill(server, other)
    finally:
        kill(server, sb)


@pytest.fixture(scope="module")
def keyed():
    srv = ForkboxServer("e2b-keys", build_templates=False, api_keys=["key-a-" + uuid.uuid4().hex, "key-b-" + uuid.uuid4().hex])
    srv.start()
    srv.wait_ready()
    yield srv
    srv.stop()


def test_keys_see_and_touch_only_their_own_sandboxes(keyed):
    ka, kb = keyed.api_keys
    r = httpx.post(f"{keyed.url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": "wrong"})
    assert r.status_code == 401 and r.json()["code"] == 401, r.text
    assert httpx.get(f"{keyed.url}/v2/sandboxes", headers={}).status_code == 401
    sb = create(keyed, key=ka)
    try:
        sid = sb["sandboxID"]
        u = keyed.url
        assert httpx.get(f"{u}/sandboxes/{sid}", headers={"X-API-KEY": ka}).status_code == 200
        for method, path in (("GET", f"/sandboxes/{sid}"), ("DELETE", f"/sandboxes/{sid}"), ("POST", f"/sandboxes/{sid}/pause"),
                             ("POST", f"/v2/sandboxes/{sid}/connect"), ("POST", f"/sandboxes/{sid}/timeout"),
                             ("GET", f"/sandboxes/{sid}/metrics"), ("POST", f"/sandboxes/{sid}/fork"),
                             ("POST", f"/sandboxes/{sid}/snapshots")):
            body = {"timeout": 60} if method == "POST" else None
            r = httpx.request(method, u + path, json=body, headers={"X-API-KEY": kb}, timeout=60)
            assert r.status_code == 404 and r.json()["code"] == 404, (method, path, r.status_code, r.text)
        assert sid not in [s["sandboxID"] for s in httpx.get(f"{u}/v2/sandboxes", headers={"X-API-KEY": kb}).json()]
        assert sid in [s["sandboxID"] for s in httpx.get(f"{u}/v2/sandboxes", headers={"X-API-KEY": ka}).json()]
        assert httpx.get(f"{u}/sandboxes/{sid}", headers={"X-API-KEY": ka}).json()["state"] == "running", "b's calls changed nothing"
        assert os.stat(os.path.join(keyed.state_dir, "e2b-token-secret")).st_mode & 0o077 == 0, "the token secret is the server's alone"
    finally:
        kill(keyed, sb, key=ka)
