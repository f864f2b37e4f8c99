"""Shared helpers of the end-to-end suite: a real forkbox server process,
raw HTTP exec calls, and host-side inspection (processes, cgroups, mounts).

Nothing here mocks the server: every helper talks to a live `forkbox serve`
over loopback or reads the host's /proc and /sys.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORKBOX_BIN = os.environ.get("FORKBOX_BIN", os.path.join(REPO, "target", "debug", "forkbox"))
TEMPLATES_DIR = os.environ.get("FORKBOX_TEMPLATES_DIR", "/var/lib/forkbox/templates")
# Tools roots (`forkbox tools build criu`), which every test server uses.
TOOLS_DIR = os.environ.get("FORKBOX_TOOLS_DIR", "/var/lib/forkbox/tools")
# Not /tmp: it may be a tmpfs, and the server keeps a (sparse) volume image here.
E2E_ROOT = os.environ.get("FORKBOX_E2E_ROOT", "/var/lib/forkbox-e2e")

# Host ids of sandbox processes start here (crates/jail/src/ids.rs).
SANDBOX_UID_BASE = 1 << 28
# Generous: a fresh machine must first build the default template.
READY_TIMEOUT_S = float(os.environ.get("FORKBOX_E2E_READY_TIMEOUT", 15 * 60))

MIB = 1024 * 1024
MAX_CODE_BYTES = 10 * MIB


# `<name>-<pid of the pytest that made it>[-<8 hex>]` under E2E_ROOT.
_RUN_DIR = re.compile(r"^.+?-(\d+)(?:-[0-9a-f]{8})?$")


def sweep_dead_runs(say=lambda msg: None) -> None:
    """Remove the state directories of test runs that died (a killed CI, a
    lost machine): each keeps its volume image mounted, gigabytes a fresh
    run then lacks. Only directories whose pytest is gone are touched."""
    try:
        entries = os.listdir(E2E_ROOT)
    except FileNotFoundError:
        return
    for entry in entries:
        path = os.path.join(E2E_ROOT, entry)
        m = _RUN_DIR.match(entry)
        if not m or not os.path.isdir(path) or os.path.exists(f"/proc/{m.group(1)}"):
            continue
        points = {line.split()[4].replace("\\040", " ") for line in mounts_under(path)}
        for mnt in sorted((p for p in points if p == path or p.startswith(path + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mnt], check=False)
        if mounts_under(path):
            say(f"[forkbox-e2e] {path}, left by a run that died, is still in use: kept")
            continue
        shutil.rmtree(path, ignore_errors=True)
        say(f"[forkbox-e2e] removed {path}, left by a run that died")


def current_rootfs(name: str = "default") -> str:
    """The rootfs of built-in `name`'s current version in TEMPLATES_DIR
    (others, e.g. another Debian's, may be built beside it)."""
    out = subprocess.run([FORKBOX_BIN, "template", "ls", "--state-dir", os.path.dirname(os.path.normpath(TEMPLATES_DIR))],
                         capture_output=True, text=True, timeout=60, check=True)
    for line in out.stdout.splitlines():
        fields = line.split("\t")
        if fields[0] == name:
            [key] = [f.split("=", 1)[1] for f in fields if f.startswith("current=")]
            assert key != "-", f"{name} is not built in {TEMPLATES_DIR}"
            return os.path.join(TEMPLATES_DIR, name, key, "rootfs")
    raise AssertionError(f"no built-in {name}: {out.stdout}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_mounted(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == path:
                return True
    return False


def mounts_under(path: str) -> list[str]:
    """Mount points (from the host's mountinfo) at or below `path`."""
    path = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mp = fields[4].replace("\\040", " ")
            src = fields[fields.index("-") + 2] if "-" in fields else ""
            if mp == path or mp.startswith(path + "/") or src.startswith(path + "/"):
                out.append(line.strip())
    return out


class ForkboxServer:
    """One `forkbox serve` process on a free loopback port with its own state dir."""

    registry: list["ForkboxServer"] = []  # every server started, for failure logs

    def __init__(self, name: str, args: list[str] | None = None, api_keys: list[str] | None = None,
                 listen_host: str = "127.0.0.1", build_templates: bool = True, log=None):
        self.name = name
        self.args = list(args or [])
        self.api_keys = list(api_keys or [])
        self.listen_host = listen_host
        self.build_templates = build_templates
        self.templates_dir = TEMPLATES_DIR
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        os.makedirs(E2E_ROOT, exist_ok=True)
        self.state_dir = os.path.join(E2E_ROOT, f"{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.log_path = self.state_dir + ".log"
        self.proc: subprocess.Popen | None = None
        self._log_file = None
        self._say = log or (lambda msg: None)
        # The `forkbox-<instance>` cgroup parent, learnt from a live sandbox.
        self.cgroup_parent: str | None = None
        # Keys added to <state>/keys.json with `forkbox key add`: name → key.
        self.file_keys: dict[str, str] = {}

    # ── keys (docs/operations.md#api-keys) ─────────────────────────────
    def key_cli(self, *args: str) -> subprocess.CompletedProcess:
        os.makedirs(self.state_dir, exist_ok=True)
        return subprocess.run([FORKBOX_BIN, "key", *args, "--state-dir", self.state_dir],
                              capture_output=True, text=True, timeout=60)

    def add_key(self, name: str, max_sandboxes: int | None = None, forks_per_minute: int | None = None,
                max_memory_mib: int | None = None) -> str:
        """`forkbox key add` (before or while the server runs); returns the key it printed."""
        args = ["add", name]
        for flag, v in (("--max-sandboxes", max_sandboxes), ("--forks-per-minute", forks_per_minute),
                        ("--max-memory-mib", max_memory_mib)):
            if v is not None:
                args += [flag, str(v)]
        out = self.key_cli(*args)
        assert out.returncode == 0, out
        key = out.stdout.strip()
        assert key and "\n" not in key, out
        self.file_keys[name] = key
        return key

    def remove_key(self, name: str) -> None:
        out = self.key_cli("remove", name)
        assert out.returncode == 0, out
        self.file_keys.pop(name, None)

    def all_keys(self) -> list[str]:
        """Every key the server accepts (each sees only its own sandboxes)."""
        return self.api_keys + list(self.file_keys.values())

    # ── process ────────────────────────────────────────────────────────
    def command(self) -> list[str]:
        cmd = [FORKBOX_BIN, "serve", "--listen", f"{self.listen_host}:{self.port}",
               "--state-dir", self.state_dir, "--templates-dir", self.templates_dir]
        if not any(a.startswith("--tools-dir") for a in self.args):
            cmd += ["--tools-dir", TOOLS_DIR]
        for k in self.api_keys:
            cmd += ["--api-key", k]
        if not self.build_templates:
            cmd.append("--no-build-templates")
        if not any(a.startswith("--volume-gib") for a in self.args):
            # The volume image is allocated in full: keep test servers small.
            cmd += ["--volume-gib", "4"]
        return cmd + self.args

    def start(self) -> "ForkboxServer":
        """Start (or, after `kill`/`stop`, restart) on the same state dir."""
        wait_for_binary(self._say)
        os.makedirs(self.state_dir, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        for k in ("FORKBOX_API_KEYS", "FORKBOX_LISTEN", "FORKBOX_STATE_DIR", "FORKBOX_TEMPLATES_DIR", "FORKBOX_TOOLS_DIR"):
            env.pop(k, None)
        self.proc = subprocess.Popen(self.command(), stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        ForkboxServer.registry.append(self)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait for `GET /v1/healthz` → 200 `ok`, reporting build progress."""
        deadline = time.monotonic() + timeout
        last_note = ""
        last_print = 0.0
        with httpx.Client(timeout=5.0) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"forkbox server {self.name} exited with {self.proc.returncode} "
                                       f"before becoming ready:\n{self.log_tail()}")
                try:
                    r = c.get(self.url + "/v1/healthz")
                    if r.status_code == 200 and r.text.strip() == "ok":
                        return
                    note = f"healthz {r.status_code}"
                    if r.status_code == 503:
                        try:
                            body = r.json()
                            note = f"{body.get('error')} (progress {body.get('progress')})"
                        except ValueError:
                            note = r.text[:200]
                except httpx.TransportError:
                    note = "not listening yet"
                now = time.monotonic()
                if note != last_note or now - last_print > 30:
                    if note != "not listening yet" or now - last_print > 30:
                        self._say(f"[forkbox-e2e] waiting for server {self.name}: {note}")
                    last_note, last_print = note, now
                if now > deadline:
                    raise RuntimeError(f"forkbox server {self.name} not ready after {timeout:.0f} s "
                                       f"({note}):\n{self.log_tail()}")
                time.sleep(0.1 if note == "not listening yet" else 1.0)

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to clean up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        """Remove the state directory (only after the server is gone)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        vol = os.path.join(self.state_dir, "volume")
        if os.path.isdir(vol) and is_mounted(vol):
            # A bug the tests report; do not recurse into a mounted volume.
            subprocess.run(["umount", "-l", vol], check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def log_text(self) -> str:
        """The whole log, without the terminal colours tracing adds."""
        with open(self.log_path, "rb") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode("utf-8", "replace"))

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError:
            return "(no log)"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    # ── HTTP ───────────────────────────────────────────────────────────
    def http(self, api_key: str | None = None, timeout: float = 60.0) -> httpx.Client:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    # ── host-side views ────────────────────────────────────────────────
    def learn_cgroup_parent(self, sandbox_id: str) -> str:
        dirs = sandbox_cgroup_dirs(sandbox_id)
        assert dirs, f"no cgroup directory for live sandbox {sandbox_id}"
        parent = os.path.basename(os.path.dirname(dirs[0]))
        assert parent.startswith("forkbox-"), dirs
        self.cgroup_parent = parent
        return parent


_binary_lock = threading.Lock()


def wait_for_binary(say, timeout: float = 30 * 60) -> None:
    """The lead rebuilds the binary; wait until it exists (and stops changing)."""
    with _binary_lock:
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                st1 = os.stat(FORKBOX_BIN)
                if os.access(FORKBOX_BIN, os.X_OK):
                    time.sleep(0.2)
                    st2 = os.stat(FORKBOX_BIN)
                    if (st1.st_size, st1.st_mtime_ns) == (st2.st_size, st2.st_mtime_ns):
                        return
            except FileNotFoundError:
                pass
            if not announced:
                say(f"[forkbox-e2e] waiting for {FORKBOX_BIN} to exist")
                announced = True
            if time.monotonic() > deadline:
                raise RuntimeError(f"{FORKBOX_BIN} did not appear")
            time.sleep(5)


# ── exec over raw HTTP ──────────────────────────────────────────────────

@dataclass
class Exec:
    events: list[dict]
    status: int = 200
    arrivals: list[float] = field(default_factory=list)  # monotonic arrival time per event

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    def text(self, kind: str) -> str:
        """Exact text of a stream, rebuilt with the `nl` flags."""
        return "".join(e["data"] + ("\n" if e.get("nl") else "") for e in self.of(kind))

    @property
    def stdout(self) -> str:
        return self.text("stdout")

    @property
    def stderr(self) -> str:
        return self.text("stderr")

    @property
    def exit_code(self) -> int:
        assert self.events and self.events[-1]["type"] == "exit", f"last event is not exit: {self.events[-3:]}"
        return self.events[-1]["data"]

    @property
    def errors(self) -> list[dict]:
        return self.of("error")

    @property
    def warnings(self) -> list[dict]:
        return self.of("warning")

    @property
    def results(self) -> list[dict]:
        return self.of("result")

    def __repr__(self) -> str:  # short, for assertion messages
        evs = self.events if len(self.events) < 30 else self.events[:12] + [{"...": len(self.events)}] + self.events[-12:]
        return f"Exec(status={self.status}, events={json.dumps(evs)[:4000]})"


def exec_raw(client: httpx.Client, sandbox_id: str, code: str, language: str | None = "python",
             timeout_ms: int | None = None, output: str | None = None) -> Exec:
    body: dict = {"code": code}
    if language is not None:
        body["language"] = language
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    if output is not None:
        body["output"] = output
    events, arrivals = [], []
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body) as r:
        if r.status_code != 200:
            r.read()
            return Exec(events=[{"type": "http_error", "data": r.text}], status=r.status_code)
        assert r.headers["content-type"].startswith("application/x-ndjson"), r.headers
        for line in r.iter_lines():
            if not line.strip():
                continue
            events.append(json.loads(line))
            arrivals.append(time.monotonic())
    return Exec(events=events, status=200, arrivals=arrivals)


def exec_ok(client: httpx.Client, sandbox_id: str, code: str, language: str = "python",
            timeout_ms: int | None = None) -> str:
    """Run `code`, assert it exited 0 (showing its events if not), return its stdout."""
    ex = exec_raw(client, sandbox_id, code, language, timeout_ms)
    assert ex.exit_code == 0, (code, ex.events)
    return ex.stdout


def create_raw(client: httpx.Client, **body) -> str:
    r = client.post("/v1/sandboxes", json=body)
    assert r.status_code == 200, (r.status_code, r.text)
    data = r.json()
    assert data["state"] == "ready" and data["id"], data
    return data["id"]


def freeze(http: httpx.Client, sid: str) -> dict:
    """Freeze `sid` into a Space; its answer (docs/state.md)."""
    r = http.post(f"/v1/sandboxes/{sid}/freeze")
    assert r.status_code == 200, r.text
    return r.json()


def resume(http: httpx.Client, space_id: str, **body) -> str:
    """Resume a Space into a new sandbox; its id."""
    r = http.post(f"/v1/spaces/{space_id}/resume", json=body)
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["state"] == "ready", info
    return info["id"]


def crash_during_freeze(srv: "ForkboxServer", sid: str, after: float, until=None) -> None:
    """Start freezing `sid`, kill -9 the server `after` seconds later (or,
    with `until`, as soon as `until()` holds, polled for at most `after`
    seconds), and start it again (the freeze's request dies with it)."""
    started = threading.Event()

    def freeze_in_background():
        started.set()
        try:
            with srv.http(timeout=300) as c:
                c.post(f"/v1/sandboxes/{sid}/freeze")
        except httpx.HTTPError:
            pass  # the server died under it: that is the point

    t = threading.Thread(target=freeze_in_background)
    t.start()
    started.wait()
    if until is None:
        time.sleep(after)
    else:
        wait_until(until, after, "the moment to crash came", every=0.001)
    srv.kill()
    srv.start()
    srv.wait_ready()
    t.join(60)


def wait_until(ok, timeout: float, what: str, every: float = 0.1) -> None:
    """Poll `ok()` every `every` seconds until it holds; fail with `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what} (after {timeout:.0f} s)"
        time.sleep(every)


def wait_pool(client: httpx.Client, template: str = "default", timeout: float = 300) -> dict:
    """Until the caller's warm pool of `template` has spares (GET /v1/pool
    shows each key its own); that pool's entry."""
    deadline = time.monotonic() + timeout
    while True:
        pool = client.get("/v1/pool").json()["templates"].get(template) or {}
        if pool.get("spares"):
            return pool
        assert time.monotonic() < deadline, f"no warm pool of {template}: {client.get('/v1/pool').text}"
        time.sleep(0.1)


def pooled_sandbox(client: httpx.Client, template: str = "default") -> str:
    """A sandbox forked from the caller's own warm zygote of `template`
    (with keys, a key's first create is what makes its pool)."""
    if template not in client.get("/v1/pool").json()["templates"]:
        delete_raw(client, create_raw(client, template=template))
    tries = []
    for _ in range(5):
        before = wait_pool(client, template)
        sid = create_raw(client, template=template)
        after = client.get("/v1/pool").json()["templates"][template]
        if after["zygote"] != before["zygote"] or after["served"] > before["served"]:
            return sid
        # Made the slow way: the pool was replacing a zygote whose family
        # died (an earlier test kills supervisors) between the two looks.
        delete_raw(client, sid)
        tries.append((before, after))
    raise AssertionError(f"no create came from the pool: {tries}")


def delete_raw(client: httpx.Client, sandbox_id: str) -> int:
    return client.delete(f"/v1/sandboxes/{sandbox_id}").status_code


def wait_gone(client: httpx.Client, sandbox_id: str, timeout: float) -> float:
    """Poll until GET info is 404; returns when (monotonic) it was first seen gone."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/sandboxes/{sandbox_id}")
        if r.status_code == 404:
            return time.monotonic()
        assert r.status_code == 200, (r.status_code, r.text)
        if time.monotonic() > deadline:
            raise AssertionError(f"sandbox {sandbox_id} still exists after {timeout} s: {r.text}")
        time.sleep(0.1)


def numbered_mibs(size: int, digest):
    """`size` bytes of random data, one MiB at a time, fed to `digest` as
    they go out. Each MiB differs (its index in front), so a reordered or
    repeated chunk cannot pass the checksum."""
    block = os.urandom(1 << 20)
    for i in range(size >> 20):
        chunk = i.to_bytes(8, "little") + block[8:]
        digest.update(chunk)
        yield chunk


def rss_kib(pid: int) -> int:
    """A process's resident memory (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class RssSampler:
    """Samples a process's RSS every 50 ms while in its `with` block:
    `.before` at the start, `.peak` over the block (for "memory stays flat")."""

    def __init__(self, pid: int):
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(rss_kib(self.pid))
            time.sleep(0.05)

    def __enter__(self) -> "RssSampler":
        self.before = rss_kib(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        return max(self.samples, default=self.before)


def assert_json_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    return body


# ── host-side inspection ────────────────────────────────────────────────

def sandbox_cgroup_dirs(sandbox_id: str) -> list[str]:
    """Cgroup directories of one sandbox on v1 (per controller) or v2."""
    return sorted(glob.glob(f"/sys/fs/cgroup/*/forkbox-*/{sandbox_id}")
                  + glob.glob(f"/sys/fs/cgroup/forkbox-*/{sandbox_id}"))


def cgroup_children(parent: str) -> list[str]:
    """Child cgroup dirs under every hierarchy's `parent` (e.g. forkbox-1a2b3c4d)."""
    out = []
    for base in glob.glob(f"/sys/fs/cgroup/*/{parent}") + glob.glob(f"/sys/fs/cgroup/{parent}"):
        try:
            out += [os.path.join(base, d) for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))]
        except FileNotFoundError:
            pass
    return sorted(out)


def sandbox_host_pids(sandbox_id: str) -> list[int]:
    """Host pids of every process in the sandbox's pids cgroup."""
    dirs = sandbox_cgroup_dirs(sandbox_id)
    pick = [d for d in dirs if d.startswith("/sys/fs/cgroup/pids/")] or \
        [d for d in dirs if d.startswith("/sys/fs/cgroup/forkbox-")]
    for d in pick:
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return []
    return []


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def host_repl_pid(sid: str) -> int:
    """The host pid of the sandbox's REPL."""
    for pid in sandbox_host_pids(sid):
        if "forkbox_repl" in " ".join(proc_cmdline(pid)):
            return pid
    raise AssertionError(f"no REPL among the processes of {sid}")


def proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def fd_links(pids: list[int]) -> list[str]:
    """Where every descriptor of `pids` leads (as host root sees it)."""
    links = []
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                links.append(f"{pid}: {os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except (FileNotFoundError, ProcessLookupError):
            pass
    return links


def lazy_daemons() -> list[int]:
    """Host pids of criu lazy-pages daemons (docs/state.md#lazy-resume):
    the `lazy-pages` command itself, not a `restore --lazy-pages` nor the
    helpers and tasks that restore forks, which carry its command line."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and "lazy-pages" in proc_cmdline(int(name)):
            found.append(int(name))
    return found


class Watch:
    """Calls `look` every 2 ms in a thread until the block ends, and keeps
    what it returned: `with Watch(lazy_daemons) as seen: ...`."""

    def __init__(self, look):
        self.look, self.seen, self.stop = look, [], threading.Event()

    def __enter__(self) -> list:
        def run():
            while not self.stop.is_set():
                self.seen.extend(self.look())
                time.sleep(0.002)
        self.thread = threading.Thread(target=run)
        self.thread.start()
        return self.seen

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()


def proc_cgroups(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def uids(pid: int) -> list[int]:
    st = proc_status(pid)
    return [int(x) for x in st.get("Uid", "").split()] if st else []


def sandbox_uid_processes() -> list[int]:
    """Host pids running with any uid in the sandbox range (≥ 2^28)."""
    out = []
    for pid in all_pids():
        u = uids(pid)
        if u and any(x >= SANDBOX_UID_BASE for x in u):
            out.append(pid)
    return out


def families_with_members(live_ids) -> set[int]:
    """Pids of supervisors (`__shim`) and reapers of families that still have
    a live member: a family outlives the sandbox it was named after (a fork
    parent, a retired warm-pool zygote) while its other members live."""
    parent_of = {}
    for pid in all_pids():
        st = proc_status(pid)
        if st:
            parent_of[pid] = int(st.get("PPid", "0") or 0)
    keep = set()
    for pid, ppid in parent_of.items():
        cg = proc_cgroups(pid)
        if any(f"/{sid}\n" in cg + "\n" for sid in live_ids):
            # Walk up to the shim: init → reaper → shim (a REPL's parent is the shim).
            p = ppid
            while p > 1 and p in parent_of:
                if "__shim" in " ".join(proc_cmdline(p)):
                    keep.add(p)
                    keep.update(q for q, pp in parent_of.items() if pp == p and "__shim" in " ".join(proc_cmdline(q)))
                    # Reached from an init, `p` is the reaper: its parent
                    # is the supervisor.
                    if "__shim" in " ".join(proc_cmdline(parent_of.get(p, 0))):
                        keep.add(parent_of[p])
                    break
                p = parent_of[p]
    return keep


def is_family_reaper(pid: int) -> bool:
    ppid = int(proc_status(pid).get("PPid", "0") or 0)
    return ppid > 0 and "__shim" in proc_cmdline(ppid)


def is_fork_zombie(pid: int) -> bool:
    """A forked REPL that exited and waits for its parent REPL (which reaps
    its fork children at its next call, docs/fork.md)."""
    st = proc_status(pid)
    ppid = int(st.get("PPid", "0") or 0)
    return st.get("State", "").startswith("Z") and ppid > 0 and any("forkbox_repl" in a for a in proc_cmdline(ppid))


def leaked_processes(server: ForkboxServer, live_ids=frozenset()) -> list[str]:
    """Processes that belong to `server` (in its cgroup parent, or with its
    state dir on the command line) but to none of `live_ids`, and processes
    running as a sandbox uid outside every forkbox cgroup."""
    leaks = []
    me = os.getpid()
    live_families = families_with_members(live_ids)
    for pid in all_pids():
        if pid == me or (server.proc is not None and pid == server.proc.pid):
            continue
        cmd = proc_cmdline(pid)
        cg = proc_cgroups(pid)
        u = uids(pid)
        if not u:
            continue  # gone meanwhile
        high = any(x >= SANDBOX_UID_BASE for x in u)
        in_parent = bool(server.cgroup_parent) and f"/{server.cgroup_parent}/" in cg
        mentions_state = any(server.state_dir in a for a in cmd)
        ours = in_parent or mentions_state
        if ours and any(f"/{sid}" in cg or any(f"/{sid}" in a for a in cmd) for sid in live_ids):
            continue
        if pid in live_families:
            continue
        # A family's reaper (pid 1 of its pid namespace) runs as the family's
        # uid outside any cgroup, as a child of its shim: the shim is what
        # the checks above judge.
        orphan_sandbox_uid = high and "/forkbox-" not in cg and not is_family_reaper(pid) and not is_fork_zombie(pid)
        if ours or orphan_sandbox_uid:
            leaks.append(f"pid {pid} uid {u} cmd {' '.join(cmd)[:200]!r} cgroup {cg.strip()[:300]!r}")
    return leaks


def pool_ids(server: ForkboxServer) -> set[str]:
    """Ids of the warm pool's hidden sandboxes (GET /v1/pool, as each key:
    each sees its own key's zygotes), if the server runs."""
    if server.proc is None or server.proc.poll() is not None:
        return set()
    ids = set()
    for key in server.all_keys() or [None]:
        try:
            with server.http(key) as c:
                r = c.get("/v1/pool")
        except httpx.HTTPError:
            continue
        if r.status_code != 200:
            continue
        ids.update(r.json().get("fork_spares", []))
        for t in r.json()["templates"].values():
            ids.add(t["zygote"])
            ids.update(t["spares"])
            ids.update(t["ready"])
    return ids


def server_leaks(server: ForkboxServer, expect_volume_mounted: bool, live_ids=frozenset(),
                 check_run_dir: bool = True) -> list[str]:
    """Everything a server should have freed, but for the sandboxes `live_ids`
    (and the warm pool's hidden zygotes and spares, while it runs)."""
    live_ids = set(live_ids) | pool_ids(server)
    problems = leaked_processes(server, live_ids)
    if server.cgroup_parent:
        kids = [k for k in cgroup_children(server.cgroup_parent) if os.path.basename(k) not in live_ids]
        if kids:
            problems.append(f"cgroups left under {server.cgroup_parent}: {kids[:10]} ({len(kids)} in all)")
    vol = os.path.join(os.path.realpath(server.state_dir), "volume")
    for m in mounts_under(server.state_dir):
        mp = m.split()[4]
        if mp == vol and expect_volume_mounted:
            continue
        if expect_volume_mounted and "/custom-templates/layers/" in mp:
            continue  # custom templates' stacks, mounted while the server runs
        if mp == os.path.realpath(server.state_dir):
            continue  # the state directory may be a filesystem of its own
        problems.append(f"mount left: {m}")
    if expect_volume_mounted:
        sandboxes = os.path.join(vol, "sandboxes")
        left = [x for x in (os.listdir(sandboxes) if os.path.isdir(sandboxes) else []) if x not in live_ids]
        if left:
            problems.append(f"{sandboxes} not empty: {left[:10]} ({len(left)} in all)")
    elif os.path.isdir(vol) and is_mounted(vol):
        problems.append(f"volume still mounted: {vol}")
    run = os.path.join(server.state_dir, "run")
    # A family is named after its first member, which may be gone while
    # others live (a retired zygote's family after a restart).
    families = {json.loads(proc_cmdline(p)[2]).get("family") for p in families_with_members(live_ids)
                if len(proc_cmdline(p)) > 2 and proc_cmdline(p)[2].startswith("{")}
    left = [x for x in (os.listdir(run) if os.path.isdir(run) else []) if x not in live_ids and x not in families]
    if left and check_run_dir:
        problems.append(f"{run} not empty: {left[:10]}")
    return problems


def wait_no_leaks(server: ForkboxServer, expect_volume_mounted: bool, live_ids=frozenset(),
                  timeout: float = 10.0, check_run_dir: bool = True) -> list[str]:
    """Give asynchronous teardown a moment; return what is still leaked."""
    deadline = time.monotonic() + timeout
    while True:
        problems = server_leaks(server, expect_volume_mounted, live_ids, check_run_dir)
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.2)


# A small wheel that no template ships, by a pinned version, with the
# SHA-256 PyPI publishes for it: getting it proves the network (and TLS
# through whatever the host's network does to it), not the template.
WHEEL = "iniconfig==2.0.0"
WHEEL_FILE = "iniconfig-2.0.0-py3-none-any.whl"
WHEEL_SHA256 = "b6a85871a79d2e3b22d2d1b94ac2824226a63c6b741c88f7ae975f18b6778374"
# Download it, print its hash, install it from the file and import it.
FETCH_WHEEL = (f"rm -rf /tmp/wheel && pip download --no-deps --no-cache-dir --quiet --dest /tmp/wheel '{WHEEL}' "
               f"&& sha256sum /tmp/wheel/{WHEEL_FILE} && pip install --no-deps --no-index --quiet /tmp/wheel/{WHEEL_FILE} "
               "&& python3 -c 'import iniconfig; print(\"imported\", iniconfig.__name__)'")


def assert_wheel_absent(http, sid) -> None:
    """The premise: the template does not have it already."""
    out = exec_raw(http, sid, "import iniconfig")
    assert out.exit_code == 1 and "ModuleNotFoundError" in out.stderr, out


def assert_fetches_wheel(http, sid) -> None:
    ex = exec_raw(http, sid, FETCH_WHEEL, language="bash", timeout_ms=240_000)
    assert ex.exit_code == 0, ex
    lines = ex.stdout.split("\n")
    assert lines[0].split()[0] == WHEEL_SHA256, ex
    assert "imported iniconfig" in ex.stdout, ex


def pastas(state_dir: str) -> dict[str, int]:
    """The sandboxes whose pasta runs, by id, with its pid: pasta is the
    process started with `--pid <run dir>/<id>.pasta.pid`."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        for a, b in zip(args, args[1:]):
            if a == b"--pid" and b.startswith(state_dir.encode()) and b.endswith(b".pasta.pid"):
                found[os.path.basename(b.decode())[: -len(".pasta.pid")]] = int(pid)
    return found


# --- a fork's members (test_fork_roots.py, adversarial test_processes.py) ---

def ns(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def root_of(pid: int) -> tuple[int, int]:
    """(device, inode) of the process's root directory."""
    st = os.stat(f"/proc/{pid}/root/")
    return st.st_dev, st.st_ino


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def family_spare_init(http, sid: str) -> int | None:
    """The init of a hollow spare member of `sid`'s family (it shares the
    family's user namespace; the warm pool's spares have their own)."""
    family = ns(host_repl_pid(sid), "user")
    for spare in http.get("/v1/pool").json().get("fork_spares", []):
        for pid in sandbox_host_pids(spare):
            try:
                if ns(pid, "user") == family:
                    return pid
            except FileNotFoundError:
                pass
    return None


def parent_with_a_hollow_spare(http, code: str) -> tuple[str, int]:
    """A sandbox that ran `code`, and the init of the hollow spare its
    family keeps for the next fork (a first fork leaves one)."""
    sid = create_raw(http, egress=False)
    exec_ok(http, sid, code)
    r = http.post(f"/v1/sandboxes/{sid}/fork", json={"n": 1})
    assert r.status_code == 200, r.text
    delete_raw(http, r.json()["children"][0])
    found = []
    wait_until(lambda: found.append(family_spare_init(http, sid)) or found[-1] is not None, 30, "the family kept no hollow spare")
    return sid, found[-1]
