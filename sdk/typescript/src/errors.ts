/**
 * Typed errors. Every error the server answers with is JSON `{"error": "..."}`
 * and a status code (docs/api.md#errors); each status family has its class so
 * callers can `catch (e) { if (e instanceof NotFoundError) ... }`.
 */
import type { Execution } from "./execution.js";

/** Base class of every error this SDK throws on purpose. */
export class ForkboxError extends Error {
  /** The HTTP status, or `undefined` for errors not answered by the server. */
  readonly status: number | undefined;
  /** The answer's JSON body, when it had one. */
  readonly body: unknown;

  constructor(message: string, status?: number, body?: unknown) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.body = body;
  }
}

/** `400`: a malformed request, a value out of range, a bad path. */
export class BadRequestError extends ForkboxError {}
/** `401`: the server has API keys and this request had no valid one. */
export class UnauthorizedError extends ForkboxError {}
/** `404`: unknown sandbox, file, PTY session, checkpoint, space or route. */
export class NotFoundError extends ForkboxError {}
/** `409`: the request conflicts with the current state (merge of a non-descendant, a non-empty directory, a frozen sandbox...). */
export class ConflictError extends ForkboxError {}
/** `413`: code over 10 MiB, an upload over the server's limit, PTY input over 1 MiB. */
export class PayloadTooLargeError extends ForkboxError {}

/** `429`: a capacity limit (sandboxes, memory, watches, PTY sessions, checkpoints). */
export class RateLimitedError extends ForkboxError {
  /** Seconds from the `Retry-After` header, or `null` when the server did not send one. */
  readonly retryAfter: number | null;

  constructor(message: string, status: number, body: unknown, retryAfter: number | null) {
    super(message, status, body);
    this.retryAfter = retryAfter;
  }
}

/** `5xx`: the server could not do it (a template not ready is `503`, with `progress` in `body`). */
export class ServerError extends ForkboxError {}

/**
 * An exec ran past its `timeoutMs`: the server interrupted it (exit code 124).
 * `execution` holds what it printed until then.
 */
export class ExecTimeoutError extends ForkboxError {
  readonly execution: Execution;

  constructor(message: string, execution: Execution) {
    super(message);
    this.execution = execution;
  }
}

/** The error for a non-2xx answer: its class by status, its message from `{"error"}`. */
export async function errorFromResponse(res: Response): Promise<ForkboxError> {
  const text = await res.text().catch(() => "");
  let body: unknown = text;
  let message = text || res.statusText || `HTTP ${res.status}`;
  try {
    body = JSON.parse(text);
    const e = (body as { error?: unknown }).error;
    if (typeof e === "string") message = e;
  } catch {
    // not JSON: keep the text
  }
  const s = res.status;
  switch (s) {
    case 400:
      return new BadRequestError(message, s, body);
    case 401:
      return new UnauthorizedError(message, s, body);
    case 404:
      return new NotFoundError(message, s, body);
    case 409:
      return new ConflictError(message, s, body);
    case 413:
      return new PayloadTooLargeError(message, s, body);
    case 429: {
      const ra = Number.parseFloat(res.headers.get("retry-after") ?? "");
      return new RateLimitedError(message, s, body, Number.isFinite(ra) ? ra : null);
    }
  }
  return s >= 500 ? new ServerError(message, s, body) : new ForkboxError(message, s, body);
}
