"""The synchronous SDK: ``Client``, ``Sandbox`` and ``sandbox.pty`` over ``httpx.Client``.

The requests and the reading of their answers are in ``_core.py``; this
module sends them and iterates the streams.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from ._core import (CHUNK, BuildCallback, Call, ClientOps, Config, ExecutionBuilder, Op, Ports, PtyEvents,
                    PtyHandleBase, PtyOps, SandboxOps, TemplateBuild, build_call, check, class_or_instance, drive,
                    exec_call, is_local_file, ndjson_lines, parse_call, sync_chunks, sync_op, transport_error,
                    upload_target)
from .errors import NotFound, SandboxError, Timeout
from .types import (EgressPolicy, Event, Execution, Language, OutputCallback, SandboxInfo, Space, TemplateInfo,
                    TemplateRecipe, WatchEvent)


class Client(ClientOps):
    """A connection to a forkbox server, shared by the sandboxes made with it
    (podflare's ``Client``: ``Sandbox(client=Client(host=..., timeout=...))``).

    ``url`` (or podflare's ``host``) defaults to ``FORKBOX_URL``, then
    ``http://127.0.0.1:7070``; ``api_key`` to ``FORKBOX_API_KEY``; ``timeout``
    is the read timeout of ordinary calls in seconds (execs wait as long as
    the server runs them).
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, host: Optional[str] = None,
                 timeout: Optional[float] = None, traceparent: Optional[str] = None):
        self.cfg = Config.resolve(url, api_key, host=host, timeout=timeout, traceparent=traceparent)
        self._http = httpx.Client(**self.cfg.client_kwargs())

    @property
    def host(self) -> str:
        return self.cfg.url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, call: Call) -> Any:
        try:
            r = self._http.request(call.method, call.path, **call.request_kwargs(self.cfg))
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        return parse_call(call, r)

    @contextlib.contextmanager
    def _open(self, call: Call) -> Iterator[httpx.Response]:
        try:
            with self._http.stream(call.method, call.path, **call.request_kwargs(self.cfg)) as r:
                if r.status_code >= 400:
                    r.read()
                    check(r)
                yield r
        except httpx.HTTPError as e:
            raise transport_error(e) from e

    def stream_lines(self, call: Call) -> Iterator[Dict[str, Any]]:
        """The NDJSON objects of a streamed answer, as they arrive."""
        with self._open(call) as r:
            yield from ndjson_lines(r.iter_lines())

    def stream_bytes(self, call: Call, chunk_size: int = CHUNK) -> Iterator[bytes]:
        with self._open(call) as r:
            yield from r.iter_bytes(chunk_size)

    def build_template(self, recipe: Union[TemplateRecipe, Mapping[str, Any]],
                       on_event: Optional[BuildCallback] = None) -> TemplateInfo:
        """Build a template from a recipe (docs/templates.md#recipes), calling
        ``on_event`` with each event of the build as it comes (``step``, ``log``,
        ``done``). Returns the template; a failed build raises ``SandboxError``
        with the server's message (a bad recipe: ``BadRequest`` before anything runs)."""
        build = TemplateBuild(on_event)
        for ev in self.stream_lines(build_call(recipe)):
            build.add(ev)  # type: ignore[arg-type]
        return build.finish()

    list_sandboxes = sync_op(ClientOps._op_list_sandboxes)
    list_templates = sync_op(ClientOps._op_list_templates)
    templates = list_templates
    get_template = sync_op(ClientOps._op_get_template)
    delete_template = sync_op(ClientOps._op_delete_template)
    healthz = sync_op(ClientOps._op_healthz)
    list_spaces = sync_op(ClientOps._op_list_spaces)
    get_space = sync_op(ClientOps._op_get_space)
    delete_space = sync_op(ClientOps._op_delete_space)


def _owned(client: Client) -> Client:
    client._owned = True
    return client


def _client_for(client: Optional[Client], url: Optional[str], api_key: Optional[str], host: Optional[str] = None,
                traceparent: Optional[str] = None) -> Client:
    return client if client is not None else _owned(Client(url, api_key, host=host, traceparent=traceparent))


def _run_on_client(client: Optional[Client], url: Optional[str], api_key: Optional[str], op: Any) -> Any:
    """Run a client operation on ``client``, or on a client made for it and closed after."""
    c = _client_for(client, url, api_key)
    try:
        return drive(op(c), c._send)
    finally:
        if c is not client:
            c.close()


class PtyHandle(PtyHandleBase):
    """A PTY session whose stream a background thread reads (podflare's ``PtyHandle``)."""

    def __init__(self, ns: "PtyNamespace", events: Iterator[Dict[str, Any]], on_data: Any, on_exit: Any,
                 session_id: Optional[str] = None):
        self._ns = ns
        self._ev = PtyEvents(session_id=session_id, on_data=on_data, on_exit=on_exit)
        self._failure: Optional[BaseException] = None
        self._ready, self._done = threading.Event(), threading.Event()
        if session_id is not None:
            self._ready.set()
        self._thread = threading.Thread(target=self._consume, args=(events,), daemon=True, name="forkbox-pty")
        self._thread.start()
        if not self._ready.wait(30.0):
            raise Timeout("the PTY did not start within 30 s")
        if self._failure is not None:
            raise self._failure
        if self._ev.session_id is None:
            raise SandboxError(f"pty create failed: {self._ev.error}")

    def _consume(self, events: Iterator[Dict[str, Any]]) -> None:
        try:
            for ev in events:
                self._ev.feed(ev)
                if self._ev.session_id is not None:
                    self._ready.set()
                if self._ev.exit_code is not None:
                    self._done.set()
        except BaseException as e:  # surfaced by the constructor (create) or wait()
            self._failure = e
        finally:
            self._ev.ended()
            self._ready.set()
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the command exits; its exit code (``-1`` if the stream broke first)."""
        if not self._done.wait(timeout):
            raise Timeout("the PTY session did not exit within the timeout")
        return self._ev.exit_code if self._ev.exit_code is not None else -1


class PtyNamespace(PtyOps):
    """``sandbox.pty`` (podflare's API, plus ``read``/``input``/``resize``/``kill`` by id)."""

    def create(self, *, cmd: Union[str, Sequence[str]] = "bash", cols: int = 80, rows: int = 24,
               on_data: Any = None, on_exit: Any = None, env: Optional[Mapping[str, str]] = None,
               cwd: Optional[str] = None, timeout_ms: Optional[int] = None) -> PtyHandle:
        """Start ``cmd`` on a new terminal: a ``str`` under ``bash -lc``, a list executed as is."""
        call = self._create_call(cmd, cols, rows, env, cwd, timeout_ms)
        return PtyHandle(self, self._sb._client.stream_lines(call), on_data, on_exit)

    def attach(self, pty_id: str, *, on_data: Any = None, on_exit: Any = None) -> PtyHandle:
        """Follow a session: its output ring first (up to 1 MiB), then live."""
        return PtyHandle(self, self._sb._client.stream_lines(self._attach_call(pty_id)), on_data, on_exit,
                         session_id=pty_id)

    list = sync_op(PtyOps._op_list)
    input = sync_op(PtyOps._op_input)
    resize = sync_op(PtyOps._op_resize)
    kill = sync_op(PtyOps._op_kill)
    read = sync_op(PtyOps._op_read)


def _resume_space(cls: type, space_id: str, *, timeout_seconds: Optional[int] = None,
                  idle_timeout_seconds: Optional[int] = None, persistent: Optional[bool] = None,
                  egress: Optional[EgressPolicy] = None, url: Optional[str] = None, api_key: Optional[str] = None,
                  host: Optional[str] = None, client: Optional[Client] = None, **_podflare: Any) -> "Sandbox":
    """Bring a frozen Space back as a new sandbox (the Space is consumed)."""
    c = _client_for(client, url, api_key, host)
    info = drive(c._op_resume_space(space_id, timeout_seconds=timeout_seconds,
                                    idle_timeout_seconds=idle_timeout_seconds, persistent=persistent,
                                    egress=egress), c._send)
    return cls._new(info["id"], c)  # type: ignore[attr-defined, no-any-return]


def _resume(self: "Sandbox", space_id: Optional[str] = None, **kwargs: Any) -> Any:
    """Let a paused sandbox go on (``POST /resume``); with a ``space_id``, as ``Sandbox.resume``."""
    if space_id is not None:
        return _resume_space(type(self), space_id, client=self._client, **kwargs)
    return self._unpause()


def _list_spaces(cls: type, *, url: Optional[str] = None, api_key: Optional[str] = None,
                 client: Optional[Client] = None) -> List[Space]:
    """Every Space on the server."""
    return _run_on_client(client, url, api_key, lambda c: c._op_list_spaces())  # type: ignore[no-any-return]


def _delete_space_cls(cls: type, space_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None,
                      client: Optional[Client] = None) -> None:
    """Delete a Space."""
    _run_on_client(client, url, api_key, lambda c: c._op_delete_space(space_id))


def _delete_space(self: "Sandbox", space_id: Optional[str] = None) -> None:
    """Delete a Space; without an id, the one this sandbox was frozen to."""
    sid = space_id or self._space_id or self.info().get("space_id")
    if not sid:
        raise ValueError("this sandbox has not been frozen: pass a space_id")
    drive(self._client._op_delete_space(sid), self._send)


class Sandbox(SandboxOps):
    """A forkbox sandbox: a persistent Python REPL and bash in an isolated Linux
    environment. ``Sandbox(...)`` creates one; use it as a context manager, or
    ``close()`` it.

    Arguments as podflare's: ``template`` (``"default"``, ``"python-datasci"``, or one
    of yours: ``save_template``, ``Client.build_template``),
    ``timeout_seconds``, ``idle_timeout_seconds``, ``ram_mib``, ``rootfs_gb``,
    ``persistent``, ``egress`` (``True``, ``False`` or ``{"allow": [...]}``);
    forkbox's own: ``keep_processes`` (freezes and hibernation keep every process;
    default: ``persistent``, when the server has criu);
    the server: ``url`` (or ``host``), ``api_key``, or a shared ``client``.
    """

    def __init__(self, template: Optional[str] = None, *, timeout_seconds: Optional[int] = None,
                 idle_timeout_seconds: Optional[int] = None, ram_mib: Optional[int] = None,
                 rootfs_gb: Optional[int] = None, persistent: Optional[bool] = None, keep_processes: Optional[bool] = None,
                 egress: Optional[EgressPolicy] = None, url: Optional[str] = None, api_key: Optional[str] = None,
                 host: Optional[str] = None, client: Optional[Client] = None, traceparent: Optional[str] = None,
                 region: Optional[str] = None):
        c = _client_for(client, url, api_key, host, traceparent)
        try:
            info = drive(c._op_create(template=template, timeout_seconds=timeout_seconds,
                                      idle_timeout_seconds=idle_timeout_seconds, ram_mib=ram_mib,
                                      rootfs_gb=rootfs_gb, persistent=persistent, keep_processes=keep_processes, egress=egress), c._send)
        except BaseException:
            if c is not client:
                c.close()
            raise
        self._attach(info["id"], c)

    _client: Client
    pty: PtyNamespace
    _pty_class = PtyNamespace

    @classmethod
    def connect(cls, sandbox_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None,
                client: Optional[Client] = None) -> "Sandbox":
        """A handle on an existing sandbox (``NotFound`` if there is none)."""
        c = _client_for(client, url, api_key)
        sb = cls._new(sandbox_id, c)
        try:
            sb.info()
        except BaseException:
            sb._closed = True
            if c._release():
                c.close()
            raise
        return sb

    def _send(self, call: Call) -> Any:
        return self._client._send(call)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} at {self._cfg.url}>"

    def close(self) -> None:
        """Destroy the sandbox (not if it was merged into its parent or frozen,
        nor twice; one already gone is fine) and let go of the connection."""
        if self._closed:
            return
        self._closed = True
        try:
            if not getattr(self, "_merged_into_parent", False) and self._space_id is None:
                try:
                    self.kill()
                except NotFound:
                    pass
        finally:
            if self._client._release():
                self._client.close()

    # exec
    def run_code_stream(self, code: str, language: Language = "python",
                        timeout: Optional[float] = None) -> Iterator[Event]:
        """The call's events as they arrive (stdout, stderr, result, display, error, warning, exit)."""
        return (Event.from_json(o) for o in self._client.stream_lines(exec_call(self.id, code, language, timeout)))

    def run_code(self, code: str, language: Language = "python", timeout: Optional[float] = None, *,
                 on_stdout: Optional[OutputCallback] = None,
                 on_stderr: Optional[OutputCallback] = None) -> Execution:
        """Run ``code`` in the REPL (``python``) or ``bash -c`` and wait for it.

        Raises ``Timeout`` if it runs past ``timeout`` seconds (the partial
        result is ``e.execution``). A Python exception is not raised: it is
        ``execution.error`` with exit code 1.
        """
        b = ExecutionBuilder(on_stdout, on_stderr)
        for ev in self.run_code_stream(code, language, timeout):
            b.add(ev)
        return b.finish()

    # files
    def upload(self, path: Any = None, data: Any = None, *, mode: Union[int, str, None] = None, append: bool = False,
               parents: bool = True, local_path: Any = None, remote_path: Optional[str] = None) -> Dict[str, Any]:
        """Write ``data`` (bytes, a binary file object, a local ``pathlib.Path``,
        or an iterable of bytes) to ``path`` in the sandbox, streamed; atomic
        unless ``append``. podflare's order works too: ``upload(local_path_or_bytes, remote_path)``.
        Returns ``{"path", "bytes"}``."""
        remote, src = upload_target(path, data, local_path, remote_path)
        return self._send(self._upload_call(remote, sync_chunks(src), mode, append, parents))  # type: ignore[no-any-return]

    def download_stream(self, path: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        """A file's bytes in chunks, as they come (for files too big for memory)."""
        return self._client.stream_bytes(self._files("GET", path), chunk_size)

    def download_to(self, path: str, local_path: Any) -> int:
        """Stream a file to a local path or binary file object; returns its size."""
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open(local_path, "wb")) if is_local_file(local_path) else local_path
            n = 0
            for chunk in self.download_stream(path):
                f.write(chunk)
                n += len(chunk)
            return n

    def watch(self, path: str = "/root", recursive: bool = True) -> Iterator[WatchEvent]:
        """Changes under ``path`` as they happen, after a first ``ready`` event."""
        return self._client.stream_lines(self._watch_call(path, recursive))  # type: ignore[return-value]

    info = sync_op(SandboxOps._op_info)
    kill = sync_op(SandboxOps._op_kill)
    replay = sync_op(SandboxOps._op_replay)
    fork = sync_op(SandboxOps._op_fork)
    merge_into = sync_op(SandboxOps._op_merge_into)
    diff = sync_op(SandboxOps._op_diff)
    pause = sync_op(SandboxOps._op_pause)
    _unpause = sync_op(SandboxOps._op_unpause)
    resume = class_or_instance(_resume_space, _resume)
    get_egress = sync_op(SandboxOps._op_get_egress)
    set_egress = sync_op(SandboxOps._op_set_egress)
    download = sync_op(SandboxOps._op_download)
    list = sync_op(SandboxOps._op_list)
    stat = sync_op(SandboxOps._op_stat)
    exists = sync_op(SandboxOps._op_exists)
    mkdir = sync_op(SandboxOps._op_mkdir)
    remove = sync_op(SandboxOps._op_remove)
    rename = sync_op(SandboxOps._op_rename)
    chmod = sync_op(SandboxOps._op_chmod)
    checkpoint = sync_op(SandboxOps._op_checkpoint)
    checkpoints = sync_op(SandboxOps._op_checkpoints)
    restore = sync_op(SandboxOps._op_restore)
    delete_checkpoint = sync_op(SandboxOps._op_delete_checkpoint)
    freeze = sync_op(SandboxOps._op_freeze)
    hibernate = sync_op(SandboxOps._op_hibernate)
    save_template = sync_op(SandboxOps._op_save_template)
    list_spaces = class_or_instance(_list_spaces, lambda self: self._client.list_spaces())
    delete_space = class_or_instance(_delete_space_cls, _delete_space)
