/**
 * The HTTP layer: where the server is, the bearer key, JSON calls and NDJSON
 * streams, all on the platform's `fetch`.
 */
import { errorFromResponse, ForkboxError } from "./errors.js";
import type { BuildEvent, TemplateFile, TemplateInfo, TemplateRecipe } from "./types.js";

export const DEFAULT_URL = "http://127.0.0.1:7070";

/** Where the server is and how to authenticate. */
export interface ClientOptions {
  /** Base URL of the server; default `FORKBOX_URL`, else `http://127.0.0.1:7070`. */
  url?: string;
  /** Bearer key; default `FORKBOX_API_KEY`, else none. */
  apiKey?: string;
}

/** Query parameters; `undefined` values are left out. */
export type Query = Record<string, string | number | boolean | undefined>;

export interface RequestOptions {
  query?: Query;
  /** Sent as JSON with `Content-Type: application/json`. */
  json?: unknown;
  /** Sent as is (a streamed body when it is a `ReadableStream`). */
  body?: string | Uint8Array | ReadableStream<Uint8Array>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

export interface BuildTemplateOptions {
  /** Called with each event of the build as it comes: `step`, `log`, then `done` or `error`. */
  onEvent?: (event: BuildEvent) => void;
  /** Stops following the build (the server goes on with it; its layers are kept). */
  signal?: AbortSignal;
}

/** A recipe file as the server takes it: `content` (text or bytes) sent as `content_b64`. */
function wireFile({ content, ...file }: TemplateFile): TemplateFile {
  if (content === undefined) return file;
  const bytes = typeof content === "string" ? new TextEncoder().encode(content) : content;
  return { ...file, content_b64: toBase64(bytes) };
}

function env(name: string): string | undefined {
  const value = typeof process === "undefined" ? undefined : process.env[name];
  return value === "" ? undefined : value;
}

/** One server and key; shared by a sandbox and everything made from it (forks, files, PTYs). */
export class Client {
  readonly url: string;
  readonly apiKey: string | undefined;

  constructor(options: ClientOptions = {}) {
    this.url = (options.url ?? env("FORKBOX_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? env("FORKBOX_API_KEY");
  }

  /** `{authorization: "Bearer <key>"}` when a key is set: for requests the SDK does not make (the port proxy). */
  authHeaders(): Record<string, string> {
    return this.apiKey === undefined ? {} : { authorization: `Bearer ${this.apiKey}` };
  }

  /** The absolute URL of an API path (`/v1/...`) with its query. */
  urlOf(path: string, query?: Query): string {
    const u = new URL(this.url + path);
    for (const [k, v] of Object.entries(query ?? {})) {
      if (v !== undefined) u.searchParams.set(k, String(v));
    }
    return u.toString();
  }

  /** Send a request; a non-2xx answer is thrown as its typed error. */
  async fetch(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...this.authHeaders(), ...options.headers };
    let body: BodyInit | undefined;
    if (options.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.json);
    } else if (options.body !== undefined) {
      body = options.body as BodyInit;
    }
    const init: RequestInit & { duplex?: "half" } = { method, headers, body, signal: options.signal };
    if (body instanceof ReadableStream) init.duplex = "half";
    const res = await fetch(this.urlOf(path, options.query), init);
    if (!res.ok) throw await errorFromResponse(res);
    return res;
  }

  /** A call whose answer is JSON (or empty, `204`: then `undefined`). */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const res = await this.fetch(method, path, options);
    const text = await res.text();
    return (text === "" ? undefined : JSON.parse(text)) as T;
  }

  /** A call whose answer is an NDJSON stream: its objects, parsed as they arrive. */
  async stream<T>(method: string, path: string, options: RequestOptions = {}): Promise<EventStream<T>> {
    const abort = new AbortController();
    const user = options.signal;
    user?.addEventListener("abort", () => abort.abort(user.reason), { once: true });
    if (user?.aborted) abort.abort(user.reason);
    const res = await this.fetch(method, path, { ...options, signal: abort.signal });
    return new EventStream(ndjson<T>(res.body!), abort, user);
  }

  /**
   * Build a template from a recipe (docs/templates.md#recipes), streaming its
   * events to `onEvent`; resolves to the template. A bad recipe is a typed
   * error before anything runs (`BadRequestError`, `NotFoundError` for an
   * unknown base, `ConflictError` for a taken name); a failed step rejects with
   * a `ForkboxError` carrying the server's message.
   */
  async buildTemplate(recipe: TemplateRecipe, options: BuildTemplateOptions = {}): Promise<TemplateInfo> {
    const json = recipe.files === undefined ? recipe : { ...recipe, files: recipe.files.map(wireFile) };
    const events = await this.stream<BuildEvent>("POST", "/v1/templates", { json, signal: options.signal });
    for await (const ev of events) {
      options.onEvent?.(ev);
      if (ev.type === "done") return ev.template;
      if (ev.type === "error") throw new ForkboxError(ev.error);
    }
    throw new ForkboxError("the build stream ended without a done or error event");
  }

  /** The built-in templates and your custom ones. */
  listTemplates(): Promise<TemplateInfo[]> {
    return this.json("GET", "/v1/templates");
  }

  /** One template: its kind, base, size, recipe, and what uses it (`in_use`). */
  getTemplate(name: string): Promise<TemplateInfo> {
    return this.json("GET", `/v1/templates/${name}`);
  }

  /**
   * Delete a custom template: `ConflictError` while sandboxes or spaces use it,
   * unless `force` (they keep their files; the name goes at once).
   */
  async deleteTemplate(name: string, options: { force?: boolean } = {}): Promise<void> {
    await this.json("DELETE", `/v1/templates/${name}`, { query: { force: options.force ? "true" : undefined } });
  }
}

/**
 * The events of one streamed answer. Iterate it once; leaving the loop early
 * or `close()` ends the request.
 */
export class EventStream<T> implements AsyncIterable<T> {
  readonly #events: AsyncGenerator<T>;
  readonly #abort: AbortController;
  readonly #user: AbortSignal | undefined;

  /** `abort` ends the request; `user`, the caller's signal, aborting it makes `next` throw its reason. */
  constructor(events: AsyncGenerator<T>, abort: AbortController, user?: AbortSignal) {
    this.#events = events;
    this.#abort = abort;
    this.#user = user;
  }

  /** The next event, or `undefined` at the end of the stream (or after `close()`). */
  async next(): Promise<T | undefined> {
    this.#user?.throwIfAborted();
    if (this.#abort.signal.aborted) return undefined;
    try {
      const r = await this.#events.next();
      return r.done ? undefined : r.value;
    } catch (e) {
      this.#user?.throwIfAborted();
      if (this.#abort.signal.aborted) return undefined;
      throw e;
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    try {
      for (let ev = await this.next(); ev !== undefined; ev = await this.next()) yield ev;
    } finally {
      this.close();
    }
  }

  /** Close the connection; an iteration waiting for the next event ends. */
  close(): void {
    this.#abort.abort();
  }
}

/**
 * Parse an NDJSON byte stream. Leaving the loop early (`break`, `return`, a
 * throw) cancels the stream, which closes the connection.
 */
export async function* ndjson<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<T> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let start = 0;
      let nl: number;
      while ((nl = buf.indexOf("\n", start)) >= 0) {
        const line = buf.slice(start, nl);
        start = nl + 1;
        if (line.trim() !== "") yield JSON.parse(line) as T;
      }
      buf = buf.slice(start);
    }
    if (buf.trim() !== "") yield JSON.parse(buf) as T;
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Base64 to bytes, without Node's `Buffer` (the SDK also runs where there is none). */
export function fromBase64(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Bytes to base64. */
export function toBase64(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}
