export { Client, DEFAULT_URL, EventStream, type BuildTemplateOptions, type ClientOptions } from "./client.js";
export {
  BadRequestError,
  ConflictError,
  ExecTimeoutError,
  ForkboxError,
  NotFoundError,
  PayloadTooLargeError,
  RateLimitedError,
  ServerError,
  UnauthorizedError,
} from "./errors.js";
export { Execution, type ExecError } from "./execution.js";
export { Files, type DownloadOptions, type UploadOptions } from "./files.js";
export { Pty, PtyHandle, type PtyCreateOptions, type PtyReadOptions, type PtyReadResult } from "./pty.js";
export { Sandbox, type CreateOptions, type LifetimeOptions, type RunOptions } from "./sandbox.js";
export type * from "./types.js";
