"""The asyncio SDK: ``AsyncClient``, ``AsyncSandbox`` and its ``pty`` over
``httpx.AsyncClient``; the same operations as ``_sync.py`` (from ``_core.py``),
awaited."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from typing import (Any, AsyncIterator, Awaitable, Callable, Concatenate, Coroutine, Dict, List, Mapping, Optional, Sequence,
                    Union)

import httpx

from ._core import (CHUNK, BuildCallback, Call, ClientOps, Config, ExecutionBuilder, Op, P, Ports, PtyEvents,
                    PtyHandleBase, PtyOps, R, S, SandboxOps, TemplateBuild, build_call, check, class_or_instance,
                    exec_call, is_local_file, ndjson_lines, parse_call, transport_error, upload_target)
from .errors import ForkboxError, NotFound, SandboxError, Timeout
from .types import (EgressPolicy, Event, Execution, Language, OutputCallback, Space, TemplateInfo, TemplateRecipe,
                    WatchEvent)


async def adrive(op: Op[R], send: Callable[[Call], Awaitable[Any]]) -> R:
    """``_core.drive`` for an async ``send``."""
    try:
        call = next(op)
        while True:
            try:
                answer = await send(call)
            except ForkboxError as e:
                call = op.throw(e)
            else:
                call = op.send(answer)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def async_op(op: Callable[Concatenate[S, P], Op[R]]) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Make a coroutine method of an operation, run with ``self._asend``."""
    async def method(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await adrive(op(self, *args, **kwargs), self._asend)  # type: ignore[attr-defined]
    functools.update_wrapper(method, op)
    return method


class AsyncClient(ClientOps):
    """``Client`` for asyncio: a connection shared by the ``AsyncSandbox``es made with it."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *, host: Optional[str] = None,
                 timeout: Optional[float] = None, traceparent: Optional[str] = None):
        self.cfg = Config.resolve(url, api_key, host=host, timeout=timeout, traceparent=traceparent)
        self._http = httpx.AsyncClient(**self.cfg.client_kwargs())

    @property
    def host(self) -> str:
        return self.cfg.url

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _asend(self, call: Call) -> Any:
        try:
            r = await self._http.request(call.method, call.path, **call.request_kwargs(self.cfg))
        except httpx.HTTPError as e:
            raise transport_error(e) from e
        return parse_call(call, r)

    @contextlib.asynccontextmanager
    async def _open(self, call: Call) -> AsyncIterator[httpx.Response]:
        try:
            async with self._http.stream(call.method, call.path, **call.request_kwargs(self.cfg)) as r:
                if r.status_code >= 400:
                    await r.aread()
                    check(r)
                yield r
        except httpx.HTTPError as e:
            raise transport_error(e) from e

    async def stream_lines(self, call: Call) -> AsyncIterator[Dict[str, Any]]:
        async with self._open(call) as r:
            async for line in r.aiter_lines():
                for obj in ndjson_lines((line,)):
                    yield obj

    async def stream_bytes(self, call: Call, chunk_size: int = CHUNK) -> AsyncIterator[bytes]:
        async with self._open(call) as r:
            async for chunk in r.aiter_bytes(chunk_size):
                yield chunk

    async def build_template(self, recipe: Union[TemplateRecipe, Mapping[str, Any]],
                             on_event: Optional[BuildCallback] = None) -> TemplateInfo:
        """As ``Client.build_template`` (``on_event`` is a plain function, called in the loop)."""
        build = TemplateBuild(on_event)
        async for ev in self.stream_lines(build_call(recipe)):
            build.add(ev)  # type: ignore[arg-type]
        return build.finish()

    list_sandboxes = async_op(ClientOps._op_list_sandboxes)
    list_templates = async_op(ClientOps._op_list_templates)
    templates = list_templates
    get_template = async_op(ClientOps._op_get_template)
    delete_template = async_op(ClientOps._op_delete_template)
    healthz = async_op(ClientOps._op_healthz)
    list_spaces = async_op(ClientOps._op_list_spaces)
    get_space = async_op(ClientOps._op_get_space)
    delete_space = async_op(ClientOps._op_delete_space)


def _client_for(client: Optional[AsyncClient], url: Optional[str], api_key: Optional[str],
                host: Optional[str] = None, traceparent: Optional[str] = None) -> AsyncClient:
    if client is not None:
        return client
    c = AsyncClient(url, api_key, host=host, traceparent=traceparent)
    c._owned = True
    return c


async def _run_on_client(client: Optional[AsyncClient], url: Optional[str], api_key: Optional[str], op: Any) -> Any:
    c = _client_for(client, url, api_key)
    try:
        return await adrive(op(c), c._asend)
    finally:
        if c is not client:
            await c.close()


async def _async_chunks(src: Any) -> AsyncIterator[bytes]:
    """An upload body for httpx.AsyncClient: files are read 64 KiB at a time in a thread."""
    if hasattr(src, "__aiter__"):
        async for chunk in src:
            yield chunk
        return
    if not (is_local_file(src) or hasattr(src, "read")):
        for chunk in src:  # an iterable of bytes
            yield chunk
        return
    f = await asyncio.to_thread(open, src, "rb") if is_local_file(src) else src
    try:
        while True:
            if inspect.iscoroutinefunction(f.read):  # aiofiles-style objects
                chunk = await f.read(CHUNK)
            else:
                chunk = await asyncio.to_thread(f.read, CHUNK)
            if not chunk:
                return
            yield chunk
    finally:
        if f is not src:
            f.close()


class AsyncPtyHandle(PtyHandleBase):
    """A PTY session whose stream an asyncio task reads; ``send_input`` etc. are awaitable."""

    def __init__(self, ns: "AsyncPtyNamespace", events: AsyncIterator[Dict[str, Any]], on_data: Any, on_exit: Any,
                 session_id: Optional[str] = None):
        self._ns = ns
        self._ev = PtyEvents(session_id=session_id, on_data=on_data, on_exit=on_exit)
        self._failure: Optional[BaseException] = None
        self._ready, self._done = asyncio.Event(), asyncio.Event()
        if session_id is not None:
            self._ready.set()
        self._task = asyncio.create_task(self._consume(events))

    async def _started(self) -> "AsyncPtyHandle":
        try:
            await asyncio.wait_for(self._ready.wait(), 30.0)
        except asyncio.TimeoutError:
            raise Timeout("the PTY did not start within 30 s") from None
        if self._failure is not None:
            raise self._failure
        if self._ev.session_id is None:
            raise SandboxError(f"pty create failed: {self._ev.error}")
        return self

    async def _consume(self, events: AsyncIterator[Dict[str, Any]]) -> None:
        try:
            async for ev in events:
                self._ev.feed(ev)
                if self._ev.session_id is not None:
                    self._ready.set()
                if self._ev.exit_code is not None:
                    self._done.set()
        except Exception as e:
            self._failure = e
        finally:
            self._ev.ended()
            self._ready.set()
            self._done.set()

    async def wait(self, timeout: Optional[float] = None) -> int:
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise Timeout("the PTY session did not exit within the timeout") from None
        return self._ev.exit_code if self._ev.exit_code is not None else -1

    def close(self) -> None:
        super().close()
        self._task.cancel()


class AsyncPtyNamespace(PtyOps):
    """``sandbox.pty`` of an ``AsyncSandbox``."""

    async def create(self, *, cmd: Union[str, Sequence[str]] = "bash", cols: int = 80, rows: int = 24,
                     on_data: Any = None, on_exit: Any = None, env: Optional[Mapping[str, str]] = None,
                     cwd: Optional[str] = None, timeout_ms: Optional[int] = None) -> AsyncPtyHandle:
        call = self._create_call(cmd, cols, rows, env, cwd, timeout_ms)
        return await AsyncPtyHandle(self, self._sb._client.stream_lines(call), on_data, on_exit)._started()

    async def attach(self, pty_id: str, *, on_data: Any = None, on_exit: Any = None) -> AsyncPtyHandle:
        events = self._sb._client.stream_lines(self._attach_call(pty_id))
        return await AsyncPtyHandle(self, events, on_data, on_exit, session_id=pty_id)._started()

    list = async_op(PtyOps._op_list)
    input = async_op(PtyOps._op_input)
    resize = async_op(PtyOps._op_resize)
    kill = async_op(PtyOps._op_kill)
    read = async_op(PtyOps._op_read)


async def _resume_space(cls: type, space_id: str, *, timeout_seconds: Optional[int] = None,
                        idle_timeout_seconds: Optional[int] = None, persistent: Optional[bool] = None,
                        egress: Optional[EgressPolicy] = None, url: Optional[str] = None,
                        api_key: Optional[str] = None, host: Optional[str] = None,
                        client: Optional[AsyncClient] = None) -> "AsyncSandbox":
    """Bring a frozen Space back as a new sandbox (the Space is consumed)."""
    c = _client_for(client, url, api_key, host)
    info = await adrive(c._op_resume_space(space_id, timeout_seconds=timeout_seconds,
                                           idle_timeout_seconds=idle_timeout_seconds, persistent=persistent,
                                           egress=egress), c._asend)
    return cls._new(info["id"], c)  # type: ignore[attr-defined, no-any-return]


async def _resume(self: "AsyncSandbox", space_id: Optional[str] = None, **kwargs: Any) -> Any:
    """Let a paused sandbox go on; with a ``space_id``, as ``AsyncSandbox.resume``."""
    if space_id is not None:
        return await _resume_space(type(self), space_id, client=self._client, **kwargs)
    return await self._unpause()


async def _list_spaces(cls: type, *, url: Optional[str] = None, api_key: Optional[str] = None,
                       client: Optional[AsyncClient] = None) -> List[Space]:
    return await _run_on_client(client, url, api_key, lambda c: c._op_list_spaces())  # type: ignore[no-any-return]


async def _delete_space_cls(cls: type, space_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None,
                            client: Optional[AsyncClient] = None) -> None:
    await _run_on_client(client, url, api_key, lambda c: c._op_delete_space(space_id))


async def _delete_space(self: "AsyncSandbox", space_id: Optional[str] = None) -> None:
    sid = space_id or self._space_id or (await self.info()).get("space_id")
    if not sid:
        raise ValueError("this sandbox has not been frozen: pass a space_id")
    await adrive(self._client._op_delete_space(sid), self._asend)


class AsyncSandbox(SandboxOps):
    """``Sandbox`` for asyncio. ``async with AsyncSandbox(...) as sb:`` creates it on
    entry (or ``sb = await AsyncSandbox.create(...)``) and destroys it on exit;
    every method is awaited, every stream is an async iterator."""

    def __init__(self, template: Optional[str] = None, *, timeout_seconds: Optional[int] = None,
                 idle_timeout_seconds: Optional[int] = None, ram_mib: Optional[int] = None,
                 rootfs_gb: Optional[int] = None, persistent: Optional[bool] = None, keep_processes: Optional[bool] = None,
                 egress: Optional[EgressPolicy] = None, url: Optional[str] = None, api_key: Optional[str] = None,
                 host: Optional[str] = None, client: Optional[AsyncClient] = None,
                 traceparent: Optional[str] = None):
        self.id = None  # type: ignore[assignment]  # set by create()
        self._pending = dict(template=template, timeout_seconds=timeout_seconds,
                             idle_timeout_seconds=idle_timeout_seconds, ram_mib=ram_mib, rootfs_gb=rootfs_gb,
                             persistent=persistent, keep_processes=keep_processes, egress=egress)
        self._client_args = (client, url, api_key, host, traceparent)

    @classmethod
    async def create(cls, template: Optional[str] = None, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox (the arguments are ``AsyncSandbox``'s)."""
        sb = cls(template, **kwargs)
        await sb._create()
        return sb

    async def _create(self) -> None:
        client = self._client_args[0]
        c = _client_for(*self._client_args)
        try:
            info = await adrive(c._op_create(**self._pending), c._asend)
        except BaseException:
            if c is not client:
                await c.close()
            raise
        self._attach(info["id"], c)

    _client: AsyncClient
    pty: AsyncPtyNamespace
    _pty_class = AsyncPtyNamespace

    @classmethod
    async def connect(cls, sandbox_id: str, *, url: Optional[str] = None, api_key: Optional[str] = None,
                      client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        """A handle on an existing sandbox (``NotFound`` if there is none)."""
        sb = cls._new(sandbox_id, _client_for(client, url, api_key))
        try:
            await sb.info()
        except BaseException:
            await sb._release()
            raise
        return sb

    async def _asend(self, call: Call) -> Any:
        return await self._client._asend(call)

    async def __aenter__(self) -> "AsyncSandbox":
        if self.id is None:
            await self._create()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id}>"

    async def _release(self) -> None:
        self._closed = True
        if self._client._release():
            await self._client.close()

    async def close(self) -> None:
        """Destroy the sandbox (as ``Sandbox.close``) and let go of the connection."""
        if self.id is None or self._closed:
            return
        try:
            if not getattr(self, "_merged_into_parent", False) and self._space_id is None:
                try:
                    await self.kill()
                except NotFound:
                    pass
        finally:
            await self._release()

    def run_code_stream(self, code: str, language: Language = "python",
                        timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """The call's events as they arrive."""
        async def events() -> AsyncIterator[Event]:
            async for o in self._client.stream_lines(exec_call(self.id, code, language, timeout)):
                yield Event.from_json(o)
        return events()

    async def run_code(self, code: str, language: Language = "python", timeout: Optional[float] = None, *,
                       on_stdout: Optional[OutputCallback] = None,
                       on_stderr: Optional[OutputCallback] = None) -> Execution:
        """As ``Sandbox.run_code``."""
        b = ExecutionBuilder(on_stdout, on_stderr)
        async for ev in self.run_code_stream(code, language, timeout):
            b.add(ev)
        return b.finish()

    async def upload(self, path: Any = None, data: Any = None, *, mode: Union[int, str, None] = None,
                     append: bool = False, parents: bool = True, local_path: Any = None,
                     remote_path: Optional[str] = None) -> Dict[str, Any]:
        """As ``Sandbox.upload``; ``data`` may also be an async iterable of bytes."""
        remote, src = upload_target(path, data, local_path, remote_path)
        body = bytes(src) if isinstance(src, (bytes, bytearray, memoryview)) else _async_chunks(src)
        return await self._asend(self._upload_call(remote, body, mode, append, parents))  # type: ignore[no-any-return]

    def download_stream(self, path: str, chunk_size: int = CHUNK) -> AsyncIterator[bytes]:
        return self._client.stream_bytes(self._files("GET", path), chunk_size)

    async def download_to(self, path: str, local_path: Any) -> int:
        """Stream a file to a local path or binary file object; returns its size."""
        f = await asyncio.to_thread(open, local_path, "wb") if is_local_file(local_path) else local_path
        try:
            n = 0
            async for chunk in self.download_stream(path):
                await asyncio.to_thread(f.write, chunk)
                n += len(chunk)
            return n
        finally:
            if f is not local_path:
                f.close()

    def watch(self, path: str = "/root", recursive: bool = True) -> AsyncIterator[WatchEvent]:
        return self._client.stream_lines(self._watch_call(path, recursive))  # type: ignore[return-value]

    info = async_op(SandboxOps._op_info)
    kill = async_op(SandboxOps._op_kill)
    replay = async_op(SandboxOps._op_replay)
    fork = async_op(SandboxOps._op_fork)
    merge_into = async_op(SandboxOps._op_merge_into)
    diff = async_op(SandboxOps._op_diff)
    pause = async_op(SandboxOps._op_pause)
    _unpause = async_op(SandboxOps._op_unpause)
    resume = class_or_instance(_resume_space, _resume)
    get_egress = async_op(SandboxOps._op_get_egress)
    set_egress = async_op(SandboxOps._op_set_egress)
    download = async_op(SandboxOps._op_download)
    list = async_op(SandboxOps._op_list)
    stat = async_op(SandboxOps._op_stat)
    exists = async_op(SandboxOps._op_exists)
    mkdir = async_op(SandboxOps._op_mkdir)
    remove = async_op(SandboxOps._op_remove)
    rename = async_op(SandboxOps._op_rename)
    chmod = async_op(SandboxOps._op_chmod)
    checkpoint = async_op(SandboxOps._op_checkpoint)
    checkpoints = async_op(SandboxOps._op_checkpoints)
    restore = async_op(SandboxOps._op_restore)
    delete_checkpoint = async_op(SandboxOps._op_delete_checkpoint)
    freeze = async_op(SandboxOps._op_freeze)
    hibernate = async_op(SandboxOps._op_hibernate)
    save_template = async_op(SandboxOps._op_save_template)
    list_spaces = class_or_instance(_list_spaces, lambda self: self._client.list_spaces())
    delete_space = class_or_instance(_delete_space_cls, _delete_space)
