"""What the SDK returns: exec events and results, and the server's JSON objects."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, TypedDict, Union


Language = Literal["python", "bash"]
EventType = Literal["stdout", "stderr", "result", "display", "error", "warning", "exit"]
#: A MIME bundle: ``{"text/plain": "...", "image/png": "<base64>", ...}`` (docs/outputs.md).
Bundle = Dict[str, Any]
OutputCallback = Callable[[str], None]


@dataclass
class Event:
    """One event of an exec stream (docs/api.md#events).

    ``type``, ``data``, ``seq`` and ``ts`` are those of podflare's ``Event``;
    the rest are present for the event types that carry them. A stdout or
    stderr event holds the lines that arrived together (``lines`` of them,
    ``\n``-joined in ``data``); ``text`` is their exact text.
    """

    type: EventType
    data: Any
    seq: int
    ts: int
    nl: bool = False
    lines: int = 1
    bundle: Optional[Bundle] = None
    ename: Optional[str] = None
    evalue: Optional[str] = None
    traceback: Optional[List[str]] = None
    b64: Optional[str] = None

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "Event":
        return cls(type=obj["type"], data=obj.get("data"), seq=obj.get("seq", 0), ts=obj.get("ts", 0),
                   nl=bool(obj.get("nl", False)), lines=int(obj.get("lines") or 1), bundle=obj.get("bundle"), ename=obj.get("ename"),
                   evalue=obj.get("evalue"), traceback=obj.get("traceback"), b64=obj.get("b64"))

    @property
    def text(self) -> str:
        """A stdout/stderr event's exact text, with the last line's newline if one followed."""
        return str(self.data) + ("\n" if self.nl else "")

    @property
    def raw(self) -> bytes:
        """A stdout/stderr event's exact bytes (lines that are not UTF-8 come base64)."""
        data = base64.b64decode(self.b64) if self.b64 is not None else str(self.data).encode()
        return data + (b"\n" if self.nl else b"")


@dataclass
class ExecutionError:
    """The error of a call: a Python exception (``name``, ``value``, ``traceback``
    lines) or one of the server's (``TimeoutError``, ``ReplDied``, ``MemoryError``)."""

    name: str
    value: str
    traceback: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.name}: {self.value}" if self.value else self.name


@dataclass
class Execution:
    """The outcome of ``run_code``: everything the call's event stream said."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1
    #: MIME bundle of the last expression's value, or None.
    result: Optional[Bundle] = None
    #: MIME bundles of ``display()`` calls and matplotlib figures, in order.
    displays: List[Bundle] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    #: The server's warnings (a REPL that died before this call, a rebuilt sandbox, a resumed Space).
    warnings: List[str] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> Optional[str]:
        """The ``text/plain`` of the result, as a REPL would echo it."""
        return None if self.result is None else self.result.get("text/plain")

    @property
    def timed_out(self) -> bool:
        return (self.exit_code == 124 and self.error is not None and self.error.name == "TimeoutError"
                and not self.error.traceback)


#: podflare's name for the result of ``run_code``.
ExecResult = Execution

EgressPolicy = Union[bool, Dict[str, List[str]]]


class _SandboxId(TypedDict):
    id: str
    state: str


class SandboxInfo(_SandboxId, total=False):
    """``GET /v1/sandboxes/{id}`` (docs/api.md#sandbox-info)."""

    template: str
    ram_mib: int
    rootfs_gb: int
    timeout_seconds: int
    idle_timeout_seconds: int
    egress: EgressPolicy
    persistent: bool
    keep_processes: bool
    created_at: int
    last_active_at: int
    expires_at: int
    execs: int
    repl_restarts: int
    space_id: str


class FileInfo(TypedDict, total=False):
    """A file's metadata (docs/files.md#fileinfo); ``target`` only for a symlink."""

    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime_ms: int
    uid: int
    gid: int
    target: str


class Listing(List[FileInfo]):
    """The entries of a directory, sorted by name; ``truncated`` when ``limit`` cut it."""

    truncated: bool = False


class WatchEvent(TypedDict, total=False):
    """One change of ``watch`` (docs/files.md#watch-get-fileswatchpathp)."""

    type: Literal["ready", "created", "modified", "removed", "overflow"]
    ts: int
    path: str
    dir: bool


class Checkpoint(TypedDict):
    checkpoint: str
    sandbox_id: str
    created_at: str


class UnsavedItem(TypedDict):
    name: str
    type: str
    reason: str


class Space(TypedDict, total=False):
    """A sandbox frozen to disk. ``freeze()`` answers ``space_id``, ``sandbox_id``,
    ``unsaved`` and ``bytes``; ``list_spaces()`` adds ``template`` and ``created_at``."""

    space_id: str
    sandbox_id: str
    unsaved: List[UnsavedItem]
    bytes: int
    template: str
    created_at: str


class PtyRead(TypedDict):
    """``POST /pty/{pty}/read`` with ``data`` decoded (docs/pty.md#routes)."""

    data: bytes
    seq: int
    next_seq: int
    dropped: int
    exited: bool
    exit_code: Optional[int]


@dataclass
class PtySessionInfo:
    """A PTY session of ``sandbox.pty.list()`` (podflare's fields, plus the size)."""

    pty_id: str
    cmd_label: str
    created_at_ms: int
    exit_code: Optional[int] = None
    cols: Optional[int] = None
    rows: Optional[int] = None


class TemplateLimits(TypedDict, total=False):
    """Defaults a template gives its sandboxes (a create's own arguments win)."""

    ram_mib: int
    rootfs_gb: int
    timeout_seconds: int
    idle_timeout_seconds: int


class TemplateFile(TypedDict, total=False):
    """A file of a recipe: ``path`` and ``content_b64`` (the server's fields), or
    ``content`` (``bytes`` or ``str``), which the SDK sends base64; ``mode`` default ``0o644``."""

    path: str
    content_b64: str
    content: Union[bytes, str]
    mode: int


class TemplateRecipe(TypedDict, total=False):
    """The body of ``build_template`` (docs/templates.md#recipes); only ``name`` is required."""

    name: str
    description: str
    base: str
    apt: List[str]
    pip: List[str]
    files: List[TemplateFile]
    commands: List[str]
    preimport: List[str]
    limits: TemplateLimits
    egress: EgressPolicy


class TemplateUse(TypedDict):
    """What depends on a template: ``delete_template`` is ``Conflict`` while
    ``sandboxes`` or ``spaces`` are not empty, unless forced."""

    sandboxes: List[str]
    spaces: List[str]
    templates: List[str]


class TemplateInfo(TypedDict, total=False):
    """A template, as ``GET /v1/templates/{name}`` shows it (docs/templates.md#managing-templates)."""

    name: str
    #: ``ready``, ``building``, ``queued`` or ``failed`` (built-ins build at the server's start).
    state: str
    progress: float
    error: str
    #: ``builtin``, ``recipe`` or ``saved``.
    kind: Literal["builtin", "recipe", "saved"]
    description: str
    base: str
    #: Unix milliseconds (0 for built-ins).
    created_at: int
    size_bytes: int
    layers: int
    preimport: List[str]
    limits: TemplateLimits
    #: A ``recipe`` template's recipe, file contents left out.
    recipe: TemplateRecipe
    #: A ``saved`` template's sandbox, and the globals it could not keep.
    saved_from: str
    unsaved: List[UnsavedItem]
    in_use: TemplateUse


class BuildEvent(TypedDict, total=False):
    """One event of a template build: ``step`` (``index`` of ``total``, ``step``,
    ``cached``), ``log`` (``stream``, ``text``), then ``done`` (``template``) or
    ``error`` (``error``)."""

    type: Literal["step", "log", "done", "error"]
    index: int
    total: int
    step: str
    cached: bool
    stream: str
    text: str
    template: TemplateInfo
    error: str
