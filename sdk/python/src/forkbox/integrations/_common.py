"""What the adapters share: one sandbox kept across a tool's calls, and an
``Execution`` turned into what a model reads (text, and images of displays)."""
from __future__ import annotations

import threading
from typing import Any, List, Optional, Sequence, Tuple

from .._sync import Sandbox
from ..errors import Timeout
from ..types import Execution, Language

TOOL_NAME = "run_code"
TOOL_DESCRIPTION = (
    "Execute code in an isolated forkbox sandbox. language 'python' (default) runs in a persistent REPL: "
    "variables, imports and files survive between calls, and the value of the last expression is shown; "
    "'bash' runs a shell command. Returns stdout, stderr, the result, the error and the exit code; "
    "plots (matplotlib) and display() images come back as images."
)
#: MIME types of a display bundle that models take as images.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


class SandboxSession:
    """A sandbox made on first use (or the one given) and reused by every call."""

    def __init__(self, sandbox: Optional[Sandbox] = None, *, reuse: bool = True, **create_kwargs: Any):
        self._sandbox = sandbox
        self._own = sandbox is None
        self._reuse = reuse
        self._create_kwargs = create_kwargs
        self._lock = threading.Lock()

    @property
    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(**self._create_kwargs)
            return self._sandbox

    def run(self, code: str, language: Language = "python", timeout: Optional[float] = None) -> Execution:
        """Run ``code``; an exec timeout gives the partial execution, not an exception."""
        try:
            try:
                return self.sandbox.run_code(code, language=language, timeout=timeout)
            except Timeout as e:
                if e.execution is None:
                    raise
                return e.execution  # type: ignore[no-any-return]
        finally:
            if not self._reuse:
                self.close()

    def close(self) -> None:
        """Destroy the sandbox if this session made it."""
        with self._lock:
            sb, self._sandbox = self._sandbox, None
        if sb is not None and self._own:
            sb.close()


def describe(ex: Execution) -> str:
    """The text a model reads about a call."""
    parts = []
    if ex.stdout:
        parts.append(f"stdout:\n{ex.stdout}")
    if ex.stderr:
        parts.append(f"stderr:\n{ex.stderr}")
    if ex.text is not None:
        parts.append(f"result:\n{ex.text}")
    for i, bundle in enumerate(ex.displays):
        kinds = ", ".join(sorted(bundle))
        parts.append(f"display {i + 1} ({kinds})" + (f":\n{bundle['text/plain']}" if "text/plain" in bundle else ""))
    if ex.timed_out:
        parts.append(f"timed out: {ex.error.value if ex.error else ''}")
    elif ex.error is not None:
        parts.append(f"error: {ex.error}")
    parts.extend(f"warning: {w}" for w in ex.warnings)
    parts.append(f"exit_code: {ex.exit_code}")
    return "\n".join(parts)


def images(ex: Execution, kinds: Sequence[str] = IMAGE_TYPES) -> List[Tuple[str, str]]:
    """``(mime type, base64 data)`` of every image among the displays and the result,
    of the types in ``kinds`` (the ones the model's API takes)."""
    bundles = ex.displays + ([ex.result] if ex.result else [])
    out = []
    for b in bundles:
        for mime in kinds:
            if isinstance(b.get(mime), str):
                out.append((mime, b[mime]))
                break  # one picture per bundle: its first image type
    return out
