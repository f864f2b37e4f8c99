"""Typed exceptions: one class per error status of the HTTP API (docs/api.md#errors)."""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional


class ForkboxError(Exception):
    """Base of every error the SDK raises.

    ``status`` is the HTTP status (``None`` when no answer came: a refused
    connection, a stream cut short), ``message`` the server's ``{"error": ...}``
    text, ``body`` the whole decoded JSON answer (``{}`` if it was not JSON).
    """

    def __init__(self, message: str, status: Optional[int] = None, body: Optional[Mapping[str, Any]] = None):
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status = status
        self.message = message
        self.body: Mapping[str, Any] = body or {}


class BadRequest(ForkboxError):
    """400: malformed or out-of-range arguments."""


class Unauthorized(ForkboxError):
    """401: API keys are configured and the request had no valid one."""


class NotFound(ForkboxError):
    """404: unknown sandbox, template, file, checkpoint, space or route."""


class Conflict(ForkboxError):
    """409: the request conflicts with the current state (not a fork descendant,
    a directory that is not empty, input to an exited PTY, exec on a frozen sandbox)."""


class PayloadTooLarge(ForkboxError):
    """413: code, body, upload or PTY input over its limit."""


class RateLimited(ForkboxError):
    """429: a capacity limit (sandboxes, memory, watches, PTYs, checkpoints).

    ``retry_after`` is the ``Retry-After`` header in seconds, if the server sent one.
    """

    def __init__(self, message: str, status: Optional[int] = 429, body: Optional[Mapping[str, Any]] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message, status, body)
        self.retry_after = retry_after


class ServerError(ForkboxError):
    """5xx: the server could not do it (503 while a template builds: ``body["progress"]``)."""


class Timeout(ForkboxError, TimeoutError):
    """An exec ran past its ``timeout`` (``execution`` holds what it printed
    before), or the HTTP client gave up waiting for the server."""

    def __init__(self, message: str, execution: Any = None):
        super().__init__(message)
        self.execution = execution


class SandboxError(ForkboxError):
    """The sandbox reported a failure that is not an HTTP status: an exec
    stream that ended without its ``exit`` event, a PTY that failed to start."""


_BY_STATUS: dict[int, type[ForkboxError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
}


def error_for_status(status: int, text: str, headers: Mapping[str, str]) -> ForkboxError:
    """The exception for an error answer (``text`` is its body)."""
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    message = str(body.get("error") or text or f"HTTP {status}")
    if status == 429:
        return RateLimited(message, status, body, retry_after=_retry_after(headers.get("retry-after")))
    if status >= 500:
        return ServerError(message, status, body)
    return _BY_STATUS.get(status, ForkboxError)(message, status, body)


def _retry_after(value: Optional[str]) -> Optional[float]:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: not sent by forkbox
