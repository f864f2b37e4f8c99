/**
 * Wire types: the JSON the server answers with, field for field as
 * docs/api.md, docs/files.md, docs/pty.md and docs/state.md describe it.
 */

/** `false` (loopback only), `true` (the internet) or an allow-list of domains and CIDRs (docs/network.md). */
export type Egress = boolean | { allow: string[] };

/** `GET /v1/sandboxes/{id}`. Times are unix milliseconds. */
export interface SandboxInfo {
  id: string;
  /** `ready`, `running`, `paused`, `hibernated` after `hibernate()`, or `frozen` after `freeze()`. */
  state: string;
  template: string;
  ram_mib: number;
  rootfs_gb: number;
  egress: Egress;
  persistent: boolean;
  /** Its freezes keep every process (`keepProcesses`). */
  keep_processes: boolean;
  created_at: number;
  last_active_at: number;
  expires_at: number;
  timeout_seconds: number;
  idle_timeout_seconds: number;
  execs: number;
  repl_restarts: number;
  /** Set once the sandbox is frozen. */
  space_id?: string;
}

/** A MIME bundle: `text/plain`, `text/html`, `image/png` (base64), `application/json` (a value), ... */
export type MimeBundle = Record<string, unknown>;

interface EventBase {
  /** Position in this exec's stream, from 0. */
  seq: number;
  /** Server time, unix milliseconds. */
  ts: number;
}

export interface OutputEvent extends EventBase {
  type: "stdout" | "stderr";
  /**
   * The lines that arrived together, `\n`-joined, without the last one's
   * newline (or a piece of a line over 64 KiB).
   */
  data: string;
  /** A newline followed `data`. */
  nl?: boolean;
  /** How many lines `data` holds, when more than one. */
  lines?: number;
  /** The exact bytes, base64, when the line is not valid UTF-8. */
  b64?: string;
}

export interface BundleEvent extends EventBase {
  type: "result" | "display";
  /** The bundle's `text/plain` (`null` for a display without one). */
  data: string | null;
  bundle?: MimeBundle;
}

export interface ErrorEvent extends EventBase {
  type: "error";
  data: string;
  ename?: string;
  evalue?: string;
  traceback?: string[];
}

export interface WarningEvent extends EventBase {
  type: "warning";
  data: string;
}

export interface ExitEvent extends EventBase {
  type: "exit";
  /** The exit code. */
  data: number;
}

/** One event of `POST /v1/sandboxes/{id}/exec`. */
export type ExecEvent = OutputEvent | BundleEvent | ErrorEvent | WarningEvent | ExitEvent;

/** `GET /v1/sandboxes/{id}/diff/{other}`: regular files, each list sorted. */
export interface DiffResult {
  added: string[];
  removed: string[];
  modified: string[];
}

/** `POST /v1/sandboxes/{id}/checkpoints`. */
export interface Checkpoint {
  checkpoint: string;
  sandbox_id: string;
  /** Unix milliseconds. */
  created_at: number;
}

/** A global `freeze()` could not keep (a socket, a thread...), and why. */
export interface Unsaved {
  name: string;
  /** The value's type name. */
  type: string;
  reason: string;
}

/** A sandbox frozen to disk: `freeze()`'s answer and `GET /v1/spaces/{space_id}`. */
export interface Space {
  space_id: string;
  /** The sandbox that was frozen into it. */
  sandbox_id: string;
  template: string;
  /** Unix milliseconds. */
  created_at: number;
  /** Bytes on disk: the changed files and the REPL's state. */
  bytes: number;
  /** Globals that could not be kept. */
  unsaved: Unsaved[];
  /** What it keeps (docs/state.md#what-each-kind-keeps). */
  kind: "globals";
  /** Why the sandbox's processes were not kept. */
  processes_not_kept?: string;
}

/** `stat`, `mkdir` and `list` entries (docs/files.md#fileinfo). */
export interface FileInfo {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Permission bits (`0o644` = 420). */
  mode: number;
  mtime_ms: number;
  uid: number;
  gid: number;
  /** A symlink's target, as written. */
  target?: string;
}

export interface ListResult {
  path: string;
  entries: FileInfo[];
  truncated: boolean;
}

export interface UploadResult {
  path: string;
  bytes: number;
}

/** One event of a watch (docs/files.md#watch-get-fileswatchpathp). */
export interface WatchEvent {
  type: "created" | "modified" | "removed" | "overflow";
  path?: string;
  dir?: boolean;
  ts: number;
}

/** `GET /v1/sandboxes/{id}/pty`. */
export interface PtyInfo {
  pty_id: string;
  cmd_label: string;
  created_at_ms: number;
  exit_code: number | null;
  cols: number;
  rows: number;
}

/** Defaults a template gives its sandboxes (a create's own options win). */
export interface TemplateLimits {
  ram_mib?: number;
  rootfs_gb?: number;
  timeout_seconds?: number;
  idle_timeout_seconds?: number;
}

/**
 * A file of a recipe: `content_b64` (the server's field), or `content` (text or
 * bytes), which the SDK sends base64. `mode` defaults to `0o644`.
 */
export interface TemplateFile {
  /** Absolute path in the template; parents are made as needed. */
  path: string;
  content_b64?: string;
  content?: string | Uint8Array;
  mode?: number;
}

/** What `buildTemplate` sends (docs/templates.md#recipes); only `name` is required. */
export interface TemplateRecipe {
  /** Lower-case letters, digits, `-` and `_`; at most 64. Building a name again replaces it. */
  name: string;
  description?: string;
  /** The template it starts from (default `default`): a built-in or one of yours. */
  base?: string;
  /** Debian packages (one step). */
  apt?: string[];
  /** pip requirement specifiers (one step). */
  pip?: string[];
  /** Written first (one step). */
  files?: TemplateFile[];
  /** Shell commands run as root with bash, in order (one step each). */
  commands?: string[];
  /** Modules the template's warm REPL imports. */
  preimport?: string[];
  limits?: TemplateLimits;
  /** The build steps' network. */
  egress?: Egress;
}

/** What depends on a template: `deleteTemplate` is `ConflictError` while sandboxes or spaces do, unless forced. */
export interface TemplateUse {
  sandboxes: string[];
  spaces: string[];
  /** Templates built on it (they do not block a delete). */
  templates: string[];
}

/** `GET /v1/templates/{name}` (docs/templates.md#managing-templates). */
export interface TemplateInfo {
  name: string;
  /** `ready`, `building`, `queued` or `failed` (built-ins build at the server's start). */
  state: string;
  progress: number;
  error?: string;
  kind: "builtin" | "recipe" | "saved";
  description?: string;
  /** The template it was made on (none for built-ins). */
  base?: string;
  /** Unix milliseconds (0 for built-ins). */
  created_at: number;
  /** File data of its own layers. */
  size_bytes: number;
  layers: number;
  preimport: string[];
  limits: TemplateLimits;
  /** A `recipe` template's recipe, file contents left out. */
  recipe?: TemplateRecipe;
  /** A `saved` template's sandbox. */
  saved_from?: string;
  /** Globals of the saved REPL that could not be kept. */
  unsaved?: Unsaved[];
  in_use: TemplateUse;
}

/** A build step begins (`index` from 1 of `total`); `cached`: its layer is reused, nothing runs. */
export interface BuildStepEvent {
  type: "step";
  index: number;
  total: number;
  step: string;
  cached: boolean;
}

/** Output of the running step. */
export interface BuildLogEvent {
  type: "log";
  stream: "stdout" | "stderr";
  text: string;
}

export interface BuildDoneEvent {
  type: "done";
  template: TemplateInfo;
}

/** The build failed; nothing was registered. */
export interface BuildErrorEvent {
  type: "error";
  error: string;
}

/** One event of `POST /v1/templates`. */
export type BuildEvent = BuildStepEvent | BuildLogEvent | BuildDoneEvent | BuildErrorEvent;
