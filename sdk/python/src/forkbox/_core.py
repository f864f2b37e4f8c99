# mypy: disable-error-code="no-any-return"
"""The part of the SDK that does no I/O: configuration, the request each method
makes and how its answer is read, and the assembly of exec events into an
``Execution``. ``Sandbox`` (sync) and ``AsyncSandbox`` (asyncio) are thin
drivers over it.

Every method that is one or more plain request/answer exchanges is written
once, here, as a generator that yields a ``Call`` and receives the parsed
answer; ``_sync.py`` and ``_async.py`` run the generator with their own HTTP
client (``drive`` / ``adrive``). Only what streams (exec events, downloads,
watches, PTY output) is iterated differently by the two.
"""
from __future__ import annotations

import base64
import functools
import inspect
import json
import os
import traceback
import types
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Awaitable, Callable, Concatenate, Dict, Generator, Generic, Iterable, Iterator,
                    List, Mapping, Optional, ParamSpec, Sequence, Tuple, TypeVar, Union)

import httpx

from .errors import ForkboxError, SandboxError, Timeout, error_for_status
from .types import (BuildEvent, Bundle, Checkpoint, EgressPolicy, Event, Execution, ExecutionError, FileInfo,
                    Language, Listing, OutputCallback, PtyRead, PtySessionInfo, SandboxInfo, Space, TemplateInfo,
                    TemplateRecipe)

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_URL = "http://127.0.0.1:7070"
#: Read timeout of ordinary calls (execs, streams and long polls set their own).
DEFAULT_TIMEOUT = 60.0
CHUNK = 1 << 16

R = TypeVar("R")
P = ParamSpec("P")
S = TypeVar("S")


@dataclass(frozen=True)
class Config:
    """Where the server is and how to authenticate: arguments first, then
    ``FORKBOX_URL`` / ``FORKBOX_API_KEY``, then the default local server."""

    url: str
    api_key: Optional[str] = None
    timeout: float = DEFAULT_TIMEOUT
    headers: Tuple[Tuple[str, str], ...] = ()

    @classmethod
    def resolve(cls, url: Optional[str] = None, api_key: Optional[str] = None, *, host: Optional[str] = None,
                timeout: Optional[float] = None, traceparent: Optional[str] = None) -> "Config":
        url = (url or host or os.environ.get("FORKBOX_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key or os.environ.get("FORKBOX_API_KEY") or None
        headers = {"user-agent": "forkbox-python/0.1"}
        if api_key:
            # The same header the podflare SDK sends (docs/api.md#authentication).
            headers["authorization"] = f"Bearer {api_key}"
        if traceparent:
            headers["traceparent"] = traceparent
        return cls(url, api_key, DEFAULT_TIMEOUT if timeout is None else timeout, tuple(headers.items()))

    def client_kwargs(self) -> Dict[str, Any]:
        """Arguments for ``httpx.Client`` / ``httpx.AsyncClient``."""
        return {"base_url": self.url, "headers": dict(self.headers),
                "timeout": httpx.Timeout(self.timeout, connect=10.0)}


def _json(r: httpx.Response) -> Any:
    return r.json() if r.content else None


def _nothing(r: httpx.Response) -> None:
    return None


@dataclass
class Call:
    """One HTTP request and how to read its (successful) answer."""

    method: str
    path: str
    params: Optional[Dict[str, Any]] = None
    json: Any = None
    content: Any = None
    #: Seconds to wait for the answer's bytes; ``None``: no limit; unset: the config's.
    read_timeout: Union[float, None, str] = "default"
    parse: Callable[[httpx.Response], Any] = _json

    def request_kwargs(self, cfg: Config) -> Dict[str, Any]:
        kw: Dict[str, Any] = {"params": self.params}
        if self.json is not None:
            kw["json"] = self.json
        if self.content is not None:
            kw["content"] = self.content
        if self.read_timeout != "default":
            kw["timeout"] = httpx.Timeout(cfg.timeout, connect=10.0, read=self.read_timeout)  # type: ignore[arg-type]
        return kw


def check(r: httpx.Response) -> None:
    """Raise the typed error of an error answer (its body must have been read)."""
    if r.status_code >= 400:
        raise error_for_status(r.status_code, r.text, r.headers)


def transport_error(e: httpx.HTTPError) -> ForkboxError:
    """The SDK's exception for an httpx failure that is not an HTTP status."""
    if isinstance(e, httpx.TimeoutException):
        return Timeout(f"no answer from the forkbox server in time: {e!r}")
    return ForkboxError(f"could not talk to the forkbox server: {e!r}")


Op = Generator[Call, Any, R]


def parse_call(call: Call, r: httpx.Response) -> Any:
    check(r)
    return call.parse(r)


def drive(op: Op[R], send: Callable[[Call], Any]) -> R:
    """Run an operation with a synchronous ``send(call) -> parsed answer``."""
    try:
        call = next(op)
        while True:
            try:
                answer = send(call)
            except ForkboxError as e:
                call = op.throw(e)  # the operation may handle it (exists: 404 → False)
            else:
                call = op.send(answer)
    except StopIteration as stop:
        return stop.value


def sync_op(op: Callable[Concatenate[S, P], Op[R]]) -> Callable[Concatenate[S, P], R]:
    """Make a method of an operation, run with ``self._send`` (a sync client's)."""
    def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return drive(op(self, *args, **kwargs), self._send)  # type: ignore[attr-defined]
    functools.update_wrapper(method, op)
    return method


# ── exec ────────────────────────────────────────────────────────────────

def exec_call(sandbox_id: str, code: str, language: Language, timeout: Optional[float]) -> Call:
    # "chunks": the lines that arrived together come in one event (the
    # server's default is one event per line, for podflare's SDK).
    body: Dict[str, Any] = {"code": code, "language": language, "output": "chunks"}
    if timeout is not None:
        body["timeout_ms"] = max(1, int(timeout * 1000))
    # No read timeout of our own without one: the server ends every exec
    # (at its --exec-timeout-ms at the latest) with an `exit` event.
    return Call("POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body,
                read_timeout=None if timeout is None else timeout + 60.0)


def ndjson_lines(lines: Iterable[str]) -> Iterator[Dict[str, Any]]:
    for line in lines:
        if line.strip():
            yield json.loads(line)


class ExecutionBuilder:
    """Folds an exec's events into an ``Execution``, calling the output callbacks."""

    def __init__(self, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None):
        self.ex = Execution()
        self._out: List[str] = []
        self._err: List[str] = []
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._exited = False

    def add(self, ev: Event) -> None:
        ex = self.ex
        ex.events.append(ev)
        if ev.type in ("stdout", "stderr"):
            (self._out if ev.type == "stdout" else self._err).append(ev.text)
            cb = self._callbacks[ev.type]
            if cb is not None:
                cb(ev.text)
        elif ev.type == "result":
            ex.result = ev.bundle if ev.bundle is not None else {"text/plain": ev.data}
        elif ev.type == "display":
            ex.displays.append(ev.bundle or ({} if ev.data is None else {"text/plain": ev.data}))
        elif ev.type == "error":
            ex.error = ExecutionError(name=ev.ename or "Error",
                                      value=ev.evalue if ev.evalue is not None else str(ev.data or ""),
                                      traceback=list(ev.traceback or []))
        elif ev.type == "warning":
            ex.warnings.append(str(ev.data))
        elif ev.type == "exit":
            ex.exit_code = int(ev.data)
            self._exited = True

    def finish(self) -> Execution:
        ex = self.ex
        ex.stdout, ex.stderr = "".join(self._out), "".join(self._err)
        if not self._exited:
            raise SandboxError("the exec stream ended without an exit event")
        if ex.timed_out:
            raise Timeout(ex.error.value if ex.error else "execution timed out", execution=ex)
        return ex


# ── templates ───────────────────────────────────────────────────────

BuildCallback = Callable[[BuildEvent], None]


def build_call(recipe: Union[TemplateRecipe, Mapping[str, Any]]) -> Call:
    """``POST /v1/templates``. A file given as ``content`` (bytes or text) is sent
    as the server's ``content_b64``. No read timeout: a step may be quiet for
    long (pip), and the server ends every build with ``done`` or ``error``."""
    body = dict(recipe)
    if "files" in body:
        body["files"] = [_recipe_file(f) for f in body["files"]]
    return Call("POST", "/v1/templates", json=body, read_timeout=None)


def _recipe_file(f: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(f)
    if "content" in out:
        out["content_b64"] = base64.b64encode(as_bytes(out.pop("content"))).decode("ascii")
    return out


class TemplateBuild:
    """Follows a build's events, calling ``on_event`` with each; ``finish`` is the
    template of its ``done`` event, or raises ``SandboxError`` with the server's
    message for its ``error`` event."""

    def __init__(self, on_event: Optional[BuildCallback] = None):
        self._on_event = on_event
        self.template: Optional[TemplateInfo] = None
        self.error: Optional[str] = None

    def add(self, ev: BuildEvent) -> None:
        if self._on_event is not None:
            self._on_event(ev)
        if ev.get("type") == "done":
            self.template = ev["template"]
        elif ev.get("type") == "error":
            self.error = str(ev.get("error", "the build failed"))

    def finish(self) -> TemplateInfo:
        if self.error is not None:
            raise SandboxError(self.error)
        if self.template is None:
            raise SandboxError("the build stream ended without a done or error event")
        return self.template


# ── files ───────────────────────────────────────────────────────────────

UploadSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", Any]


def upload_target(path: Any, data: Any, local_path: Any, remote_path: Optional[str]) -> Tuple[str, Any]:
    """(remote path, what to send) for ``upload``, accepting podflare's order too:
    ``upload(local_path_or_bytes, remote_path)``."""
    if remote_path is not None:
        return remote_path, local_path if local_path is not None else data
    if isinstance(data, str):  # podflare: upload(local_path | bytes, remote_path)
        return data, path
    if data is None:
        raise TypeError("upload(path, data): data is missing")
    return os.fspath(path), data


def is_local_file(src: Any) -> bool:
    """Whether an upload source names a local file (a str in podflare's order, or a PathLike)."""
    return isinstance(src, (str, os.PathLike))


def sync_chunks(src: Any) -> Any:
    """An upload body httpx streams: bytes as they are, files in 64 KiB reads."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src)
    if is_local_file(src):
        return _file_chunks(open(src, "rb"), close=True)
    if hasattr(src, "read"):
        return _file_chunks(src, close=False)
    return src  # an iterable of bytes


def _file_chunks(f: Any, close: bool) -> Iterator[bytes]:
    try:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return
            yield chunk.encode() if isinstance(chunk, str) else chunk
    finally:
        if close:
            f.close()


def _flag(v: bool) -> str:
    return "1" if v else "0"


def _mode(mode: Union[int, str, None]) -> Optional[str]:
    """A mode for a query: octal digits (``0o644`` or ``"644"`` → ``"644"``)."""
    if mode is None:
        return None
    return format(mode, "o") if isinstance(mode, int) else mode.removeprefix("0o")


def _listing(r: httpx.Response) -> Listing:
    body = r.json()
    out = Listing(body.get("entries", []))
    out.truncated = bool(body.get("truncated", False))
    return out


def _pty_read(r: httpx.Response) -> PtyRead:
    body = r.json()
    return {"data": base64.b64decode(body.get("data_b64", "")), "seq": body.get("seq", 0),
            "next_seq": body.get("next_seq", 0), "dropped": body.get("dropped", 0),
            "exited": bool(body.get("exited", False)), "exit_code": body.get("exit_code")}


def _pty_sessions(r: httpx.Response) -> List[PtySessionInfo]:
    body = r.json()
    return [PtySessionInfo(pty_id=s.get("pty_id", ""), cmd_label=s.get("cmd_label", ""),
                           created_at_ms=int(s.get("created_at_ms", 0)), exit_code=s.get("exit_code"),
                           cols=s.get("cols"), rows=s.get("rows"))
            for s in (body if isinstance(body, list) else [])]


def checkpoint_id(cp: Union[str, Mapping[str, Any]]) -> str:
    return cp if isinstance(cp, str) else str(cp["checkpoint"])


def create_body(**fields: Any) -> Dict[str, Any]:
    """The JSON of a create or resume: the fields that were given."""
    return {k: v for k, v in fields.items() if v is not None}


def pty_create_body(cmd: Union[str, Sequence[str]], cols: int, rows: int, env: Optional[Mapping[str, str]],
                    cwd: Optional[str], timeout_ms: Optional[int]) -> Dict[str, Any]:
    """The JSON of ``POST /pty``, from podflare's ``pty.create`` arguments."""
    if isinstance(cmd, str):
        body: Dict[str, Any] = {"shellCmd": cmd}
    else:
        if not cmd:
            raise ValueError("cmd list must not be empty")
        body = {"argv": list(cmd)}
    body.update(cols=cols, rows=rows)
    if env:
        body["env"] = [[k, v] for k, v in env.items()]
    if cwd is not None:
        body["cwd"] = cwd
    if timeout_ms:  # podflare's 0 means no limit
        body["timeout_ms"] = timeout_ms
    return body


def as_bytes(data: Union[bytes, str]) -> bytes:
    return data.encode() if isinstance(data, str) else data


@dataclass
class PtyEvents:
    """What a PTY stream said so far: the session id, its exit code, a start error."""

    session_id: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None
    on_data: Optional[Callable[[bytes], None]] = None
    on_exit: Optional[Callable[[int], None]] = None
    received: List[bytes] = field(default_factory=list)

    @staticmethod
    def _call(cb: Optional[Callable[[Any], None]], arg: Any) -> None:
        if cb is None:
            return
        try:
            cb(arg)
        except Exception:  # a callback's bug must not stop the stream (pty_exit still has to come)
            traceback.print_exc()

    def feed(self, ev: Mapping[str, Any]) -> None:
        t = ev.get("type")
        if t == "pty_ready":
            self.session_id = ev.get("session_id")
        elif t == "pty_data":
            chunk = base64.b64decode(ev.get("data_b64", ""))
            self.received.append(chunk)
            self._call(self.on_data, chunk)
        elif t == "pty_exit":
            try:
                self.exit_code = int(ev.get("data", -1))
            except (TypeError, ValueError):
                self.exit_code = -1
            self._call(self.on_exit, self.exit_code)
        elif t == "pty_error":
            self.error = str(ev.get("message") or ev.get("data") or "pty error")

    def ended(self) -> None:
        """The stream closed: whatever was still awaited will not come."""
        if self.exit_code is None:
            self.exit_code = -1
        if self.session_id is None and self.error is None:
            self.error = "the PTY stream ended before pty_ready"

    @property
    def output(self) -> bytes:
        """Everything this handle received, in order."""
        return b"".join(self.received)


class PtyHandleBase:
    """A PTY session (podflare's ``PtyHandle``): ``send_input``, ``resize``,
    ``kill``, ``wait``; plus ``read`` (long poll) and ``output``. For an
    ``AsyncSandbox`` the calls are awaitable."""

    _ns: Any
    _ev: PtyEvents

    @property
    def id(self) -> str:
        """The session id, for ``sandbox.pty.attach(id)`` later, from anywhere."""
        assert self._ev.session_id is not None
        return self._ev.session_id

    @property
    def exit_code(self) -> Optional[int]:
        return self._ev.exit_code

    @property
    def output(self) -> bytes:
        """Every byte this handle has received so far."""
        return self._ev.output

    def send_input(self, data: Union[bytes, str]) -> Any:
        """Keystrokes: bytes (``b"\\x03"`` is Ctrl-C) or text (sent as UTF-8)."""
        return self._ns.input(self.id, data)

    def resize(self, cols: int, rows: int) -> Any:
        """New terminal size; the foreground program gets SIGWINCH."""
        return self._ns.resize(self.id, cols, rows)

    def kill(self) -> Any:
        """SIGKILL every process of the session."""
        return self._ns.kill(self.id)

    def read(self, since_seq: int = 0, max_bytes: int = CHUNK, timeout_ms: int = 10_000) -> Any:
        """Long poll the session's output ring from ``since_seq`` (docs/pty.md)."""
        return self._ns.read(self.id, since_seq, max_bytes, timeout_ms)

    def close(self) -> None:
        """Stop calling the callbacks; the session goes on (``kill`` ends it)."""
        self._ev.on_data = self._ev.on_exit = None


# ── the operations of a sandbox ─────────────────────────────────────────

class SandboxOps:
    """The request/answer operations of a sandbox, as generators (see the module doc).

    A subclass provides ``_send`` (sync) or ``_asend`` (async) and wraps each
    ``_op`` with ``sync_op`` / ``async_op`` under its public name.
    """

    id: str
    _cfg: Config

    def _p(self, *parts: str) -> str:
        return "/".join((f"/v1/sandboxes/{self.id}",) + parts)

    _client: Any
    _pty_class: Any

    def _attach(self, sandbox_id: str, client: Any) -> None:
        self.id = sandbox_id
        self._client = client
        self._cfg = client.cfg
        self._space_id: Optional[str] = None
        self._closed = False
        client._acquire()
        self.pty = self._pty_class(self)
        self.ports = Ports(self)

    @classmethod
    def _new(cls, sandbox_id: str, client: Any) -> "Self":
        """A handle on an existing sandbox, sharing ``client``."""
        sb = cls.__new__(cls)
        sb._attach(sandbox_id, client)
        return sb

    def _wrap(self, sandbox_id: str) -> "Self":
        """Another sandbox on the same server and client (a fork child)."""
        return self._new(sandbox_id, self._client)

    def _op_info(self) -> Op[SandboxInfo]:
        """This sandbox's info (docs/api.md#sandbox-info)."""
        return (yield Call("GET", self._p()))

    def _op_kill(self) -> Op[None]:
        """Destroy the sandbox now (``DELETE``)."""
        yield Call("DELETE", self._p(), parse=_nothing)

    def _op_replay(self) -> Op[List[Event]]:
        """The sandbox's last ≤ 1000 exec events, oldest first."""
        r = yield Call("GET", self._p("replay"), parse=lambda r: r.text)
        return [Event.from_json(o) for o in ndjson_lines(r.splitlines())]

    def _op_fork(self, n: int = 1) -> Op[List["Self"]]:
        """``n`` copy-on-write children with this sandbox's memory and files (docs/fork.md)."""
        if n < 1:
            raise ValueError("fork n must be >= 1")
        ids = yield Call("POST", self._p("fork"), json={"n": n}, read_timeout=120.0)
        return [self._wrap(i) for i in ids["children"]]

    def _op_merge_into(self, winner: "SandboxOps") -> Op[None]:
        """Make this sandbox's id drive ``winner`` (a fork descendant); ``winner``'s id is gone after."""
        if winner.id == self.id:
            raise ValueError("cannot merge a sandbox into itself")
        yield Call("POST", self._p("merge_into", winner.id), parse=_nothing)
        winner._merged_into_parent = True  # type: ignore[attr-defined]

    def _op_diff(self, other: "SandboxOps", paths: Optional[Sequence[str]] = None) -> Op[Dict[str, List[str]]]:
        """Regular files ``added`` / ``removed`` / ``modified`` in ``other`` relative to this
        sandbox, under ``paths`` (default ``/root``, ``/tmp``)."""
        params = {"paths": ",".join(paths)} if paths else None
        return (yield Call("GET", self._p("diff", other.id), params=params, read_timeout=300.0))

    def _op_pause(self) -> Op[SandboxInfo]:
        """Stop every process of the sandbox (cgroup freezer); any call resumes it (docs/state.md)."""
        return (yield Call("POST", self._p("pause")))

    def _op_unpause(self) -> Op[SandboxInfo]:
        return (yield Call("POST", self._p("resume")))

    def _op_get_egress(self) -> Op[EgressPolicy]:
        """The egress policy in force: ``False``, ``True`` or ``{"allow": [...]}`` (docs/network.md)."""
        return (yield Call("GET", self._p("egress")))["egress"]

    def _op_set_egress(self, policy: EgressPolicy) -> Op[EgressPolicy]:
        """Replace the egress policy at runtime; returns the policy in force."""
        return (yield Call("PATCH", self._p("egress"), json={"egress": policy}))["egress"]

    # files (docs/files.md)
    def _files(self, method: str, path: str, **params: Any) -> Call:
        q = {"path": path}
        q.update({k: v for k, v in params.items() if v is not None})
        return Call(method, self._p("files"), params=q)

    def _op_download(self, path: str) -> Op[bytes]:
        """The whole contents of a file (see ``download_stream`` for large ones)."""
        call = self._files("GET", path)
        call.parse = lambda r: r.content
        return (yield call)

    def _op_list(self, path: str = "/root", limit: Optional[int] = None) -> Op[Listing]:
        """A directory's entries (``lstat``), sorted by name; ``.truncated`` if ``limit`` cut it."""
        call = self._files("GET", path, list="1", limit=limit)
        call.parse = _listing
        return (yield call)

    def _op_stat(self, path: str) -> Op[FileInfo]:
        """A file's metadata, symlinks followed."""
        return (yield self._files("GET", path, stat="1"))

    def _op_exists(self, path: str) -> Op[bool]:
        """Whether ``path`` exists (a ``stat`` that answers 404 → False)."""
        call = self._files("GET", path, stat="1")
        call.parse = lambda r: True
        try:
            return (yield call)
        except ForkboxError as e:
            if e.status == 404:
                return False
            raise

    def _op_mkdir(self, path: str, mode: Union[int, str, None] = None) -> Op[FileInfo]:
        """``mkdir -p``; returns the directory's info."""
        return (yield Call("POST", self._p("files", "mkdir"), json=create_body(path=path, mode=_mode(mode))))

    def _op_remove(self, path: str, recursive: bool = False) -> Op[None]:
        """Remove a file, link or empty directory; a whole tree with ``recursive=True``."""
        call = self._files("DELETE", path, recursive=_flag(recursive) if recursive else None)
        call.parse = _nothing
        yield call

    def _op_rename(self, src: str, dst: str, overwrite: bool = False) -> Op[None]:
        """Rename or move ``src`` to ``dst`` (``409`` if ``dst`` exists, unless ``overwrite``)."""
        yield Call("POST", self._p("files", "rename"), json={"from": src, "to": dst, "overwrite": overwrite},
                   parse=_nothing)

    def _op_chmod(self, path: str, mode: Union[int, str]) -> Op[None]:
        """Set permission bits: ``0o755`` or ``"755"``."""
        yield Call("POST", self._p("files", "chmod"), json={"path": path, "mode": _mode(mode)}, parse=_nothing)

    def _watch_call(self, path: str, recursive: bool) -> Call:
        return Call("GET", self._p("files", "watch"), params=create_body(path=path, recursive=None if recursive else "0"),
                    read_timeout=None)

    def _upload_call(self, path: str, body: Any, mode: Union[int, str, None], append: bool, parents: bool) -> Call:
        call = self._files("PUT", path, mode=_mode(mode), append=_flag(append) if append else None,
                           parents=None if parents else "0")
        call.content, call.read_timeout = body, None
        return call

    # checkpoints (undo)
    def _op_checkpoint(self) -> Op[str]:
        """Snapshot memory and files; returns the checkpoint id for ``restore``."""
        return (yield Call("POST", self._p("checkpoints"), json={}, read_timeout=300.0))["checkpoint"]

    def _op_checkpoints(self) -> Op[List[Checkpoint]]:
        """This sandbox's checkpoints, oldest first."""
        return (yield Call("GET", self._p("checkpoints")))["checkpoints"]

    def _op_restore(self, checkpoint: Union[str, Checkpoint]) -> Op[SandboxInfo]:
        """Go back to a checkpoint (it stays, and can be restored again)."""
        return (yield Call("POST", self._p("restore"), json={"checkpoint": checkpoint_id(checkpoint)},
                           read_timeout=300.0))

    def _op_delete_checkpoint(self, checkpoint: Union[str, Checkpoint]) -> Op[None]:
        yield Call("DELETE", self._p("checkpoints", checkpoint_id(checkpoint)), parse=_nothing)

    def _op_freeze(self) -> Op[Space]:
        """Write the sandbox to disk as a Space and stop it; ``Sandbox.resume(space_id)`` brings it back."""
        space = yield Call("POST", self._p("freeze"), read_timeout=600.0)
        self._space_id = space["space_id"]
        return space

    def _op_hibernate(self) -> Op[SandboxInfo]:
        """Send the sandbox to disk keeping its id (``"state": "hibernated"``); the next call wakes it,
        every process as it was for a ``keep_processes`` sandbox (docs/state.md#hibernation)."""
        return (yield Call("POST", self._p("hibernate"), read_timeout=600.0))

    def _op_save_template(self, name: str, description: str = "") -> Op[TemplateInfo]:
        """Save this sandbox's files and REPL state as the template ``name`` (docs/templates.md#saving-a-sandbox);
        new sandboxes of it start where this one is. Saving again under a name replaces it."""
        return (yield Call("POST", self._p("template"), json={"name": name, "description": description},
                           read_timeout=600.0))



class Ports:
    """``sandbox.ports``: reach a service listening inside the sandbox through the
    server's port proxy (docs/network.md#ports), with the API key."""

    def __init__(self, sandbox: Any):
        self._sb = sandbox

    def path(self, port: int, path: str = "") -> str:
        return f"{self._sb._p('ports', str(int(port)))}/{path.lstrip('/')}"

    def url(self, port: int, path: str = "") -> str:
        """The URL of ``http://127.0.0.1:{port}/{path}`` inside the sandbox, from outside it."""
        return self._sb._cfg.url + self.path(port, path)

    def request(self, method: str, port: int, path: str = "", *, raise_for_status: bool = False,
                **kwargs: Any) -> Any:
        """An HTTP request to the service (httpx arguments; an ``httpx.Response``,
        awaitable for an ``AsyncSandbox``). Answers come back as they are, errors
        included, unless ``raise_for_status``: then an error status raises the
        SDK's exception (``ServerError`` for the proxy's 502 "nothing listens")."""
        try:
            r = self._sb._client._http.request(method, self.path(port, path), **kwargs)
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        if inspect.isawaitable(r):
            return self._finish(r, raise_for_status)
        if raise_for_status:
            check(r)
        return r

    @staticmethod
    async def _finish(pending: Awaitable[httpx.Response], raise_for_status: bool) -> httpx.Response:
        try:
            r = await pending
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        if raise_for_status:
            check(r)
        return r


class PtyOps:
    """``sandbox.pty``'s request/answer operations (docs/pty.md); the handles
    and the streams are in ``_sync.py`` / ``_async.py``."""

    _sb: Any

    def __init__(self, sandbox: Any):
        self._sb = sandbox

    def _send(self, call: Call) -> Any:
        return self._sb._send(call)

    async def _asend(self, call: Call) -> Any:
        return await self._sb._asend(call)

    def _create_call(self, cmd: Union[str, Sequence[str]], cols: int, rows: int, env: Optional[Mapping[str, str]],
                     cwd: Optional[str], timeout_ms: Optional[int]) -> Call:
        return Call("POST", self._sb._p("pty"), json=pty_create_body(cmd, cols, rows, env, cwd, timeout_ms),
                    read_timeout=None)

    def _attach_call(self, pty_id: str) -> Call:
        return Call("GET", self._sb._p("pty", pty_id, "attach"), read_timeout=None)

    def _op_list(self) -> Op[List[PtySessionInfo]]:
        return (yield Call("GET", self._sb._p("pty"), parse=_pty_sessions))

    def _op_input(self, pty_id: str, data: Union[bytes, str]) -> Op[None]:
        body = {"data_b64": base64.b64encode(as_bytes(data)).decode("ascii")}
        yield Call("POST", self._sb._p("pty", pty_id, "input"), json=body, parse=_nothing)

    def _op_resize(self, pty_id: str, cols: int, rows: int) -> Op[None]:
        yield Call("POST", self._sb._p("pty", pty_id, "resize"), json={"cols": cols, "rows": rows}, parse=_nothing)

    def _op_kill(self, pty_id: str) -> Op[None]:
        yield Call("POST", self._sb._p("pty", pty_id, "kill"), parse=_nothing)

    def _op_read(self, pty_id: str, since_seq: int = 0, max_bytes: int = CHUNK,
                     timeout_ms: int = 10_000) -> Op[PtyRead]:
        body = {"since_seq": since_seq, "max_bytes": max_bytes, "timeout_ms": timeout_ms}
        return (yield Call("POST", self._sb._p("pty", pty_id, "read"), json=body,
                           read_timeout=timeout_ms / 1000 + 30.0, parse=_pty_read))


class ClientOps:
    """A connection to one server: its config, and the operations that need no
    sandbox (create, list, Spaces). ``Client`` / ``AsyncClient`` add the HTTP
    client. One made by a ``Sandbox`` itself is closed when the last sandbox
    using it (the fork children included) is closed; one you pass is yours."""

    cfg: Config
    _owned: bool = False
    _users: int = 0

    def _acquire(self) -> None:
        self._users += 1

    def _release(self) -> bool:
        """True when this was the last user of a client the SDK made (close it now)."""
        self._users -= 1
        return self._owned and self._users <= 0

    def _op_create(self, **fields: Any) -> Op[SandboxInfo]:
        return (yield Call("POST", "/v1/sandboxes", json=create_body(**fields), read_timeout=600.0))

    def _op_resume_space(self, space_id: str, **fields: Any) -> Op[SandboxInfo]:
        return (yield Call("POST", f"/v1/spaces/{space_id}/resume", json=create_body(**fields), read_timeout=600.0))

    def _op_list_spaces(self) -> Op[List[Space]]:
        """Every Space on the server."""
        return (yield Call("GET", "/v1/spaces"))["spaces"]

    def _op_get_space(self, space_id: str) -> Op[Space]:
        return (yield Call("GET", f"/v1/spaces/{space_id}"))

    def _op_delete_space(self, space_id: str) -> Op[None]:
        """Delete a Space (its files on the server's disk)."""
        yield Call("DELETE", f"/v1/spaces/{space_id}", parse=_nothing)

    def _op_list_sandboxes(self) -> Op[List[SandboxInfo]]:
        """Every live sandbox, oldest first."""
        return (yield Call("GET", "/v1/sandboxes"))["sandboxes"]

    def _op_list_templates(self) -> Op[List[TemplateInfo]]:
        """The built-in templates and your custom ones (docs/templates.md)."""
        return (yield Call("GET", "/v1/templates"))

    def _op_get_template(self, name: str) -> Op[TemplateInfo]:
        """One template: its kind, base, size, recipe, and what uses it (``in_use``)."""
        return (yield Call("GET", f"/v1/templates/{name}"))

    def _op_delete_template(self, name: str, force: bool = False) -> Op[None]:
        """Delete a custom template: ``Conflict`` while sandboxes or Spaces use it, unless
        ``force`` (they keep their files; the name goes at once)."""
        yield Call("DELETE", f"/v1/templates/{name}", params={"force": "true"} if force else None, parse=_nothing)

    def _op_healthz(self) -> Op[bool]:
        """Whether the server is up and its default template ready."""
        try:
            return (yield Call("GET", "/v1/healthz", parse=lambda r: r.text.strip() == "ok"))
        except ForkboxError as e:
            if e.status == 503:
                return False
            raise


class class_or_instance:
    """A method that does one thing called on the class and another on an
    instance: ``Sandbox.resume(space_id)`` (podflare's: a Space comes back as a
    new sandbox) beside ``sandbox.resume()`` (end a pause)."""

    def __init__(self, on_class: Callable[..., Any], on_instance: Callable[..., Any]):
        self.on_class, self.on_instance = on_class, on_instance
        self.__doc__ = f"On the class: {on_class.__doc__}\n\nOn an instance: {on_instance.__doc__}"

    def __get__(self, obj: Any, owner: Any = None) -> Callable[..., Any]:
        return types.MethodType(self.on_class, owner) if obj is None else types.MethodType(self.on_instance, obj)
