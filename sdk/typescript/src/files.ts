/** The files API of one sandbox (docs/files.md): streamed upload and download, metadata, watch. */
import { Client, EventStream } from "./client.js";
import { ForkboxError } from "./errors.js";
import type { FileInfo, ListResult, UploadResult, WatchEvent } from "./types.js";

export interface UploadOptions {
  /** Permission bits (`0o640`); default those of the file replaced, else `0o644`. */
  mode?: number;
  /** Append instead of replacing (not atomic). */
  append?: boolean;
  /** Make missing parent directories (default `true`); `false` answers `NotFoundError` instead. */
  parents?: boolean;
  signal?: AbortSignal;
}

export interface DownloadOptions {
  /** Read only part of the file: `length` bytes from `offset` (to the end without `length`). */
  range?: { offset: number; length?: number };
  signal?: AbortSignal;
}

/** Bits as the server reads them in a query: octal digits. */
function octal(mode: number | undefined): string | undefined {
  return mode === undefined ? undefined : mode.toString(8);
}

function rangeHeader(range: DownloadOptions["range"]): Record<string, string> {
  if (range === undefined) return {};
  const end = range.length === undefined ? "" : String(range.offset + range.length - 1);
  return { range: `bytes=${range.offset}-${end}` };
}

/** Files of one sandbox; paths are inside it, relative ones start at `/root`. */
export class Files {
  readonly #client: Client;
  readonly #base: string;

  constructor(client: Client, sandboxId: string) {
    this.#client = client;
    this.#base = `/v1/sandboxes/${sandboxId}/files`;
  }

  /** Write `data` to `path`, streamed; a replacing upload is atomic. */
  upload(path: string, data: string | Uint8Array | ReadableStream<Uint8Array>, options: UploadOptions = {}): Promise<UploadResult> {
    return this.#client.json("PUT", this.#base, {
      query: { path, mode: octal(options.mode), append: options.append, parents: options.parents },
      body: data,
      signal: options.signal,
    });
  }

  /** A regular file's bytes. */
  async download(path: string, options: DownloadOptions = {}): Promise<Uint8Array> {
    const res = await this.#get(path, options);
    return new Uint8Array(await res.arrayBuffer());
  }

  /** A regular file's bytes as a stream, for files too big to hold in memory. */
  async downloadStream(path: string, options: DownloadOptions = {}): Promise<ReadableStream<Uint8Array>> {
    return (await this.#get(path, options)).body!;
  }

  #get(path: string, options: DownloadOptions): Promise<Response> {
    return this.#client.fetch("GET", this.#base, { query: { path }, headers: rangeHeader(options.range), signal: options.signal });
  }

  /** A directory's entries, sorted by name (symlinks not followed); at most `limit` (default 10,000). */
  list(path: string, options: { limit?: number } = {}): Promise<ListResult> {
    return this.#client.json("GET", this.#base, { query: { path, list: 1, limit: options.limit } });
  }

  /** Metadata of `path` (symlinks followed). */
  stat(path: string): Promise<FileInfo> {
    return this.#client.json("GET", this.#base, { query: { path, stat: 1 } });
  }

  /** `mkdir -p`. */
  mkdir(path: string, options: { mode?: number } = {}): Promise<FileInfo> {
    return this.#client.json("POST", `${this.#base}/mkdir`, { json: { path, mode: options.mode } });
  }

  /** Remove a file, a link or an empty directory; a whole tree with `recursive`. */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.#client.json("DELETE", this.#base, { query: { path, recursive: options.recursive } });
  }

  /** Rename or move; `ConflictError` if `to` exists, unless `overwrite`. */
  async rename(from: string, to: string, options: { overwrite?: boolean } = {}): Promise<void> {
    await this.#client.json("POST", `${this.#base}/rename`, { json: { from, to, overwrite: options.overwrite } });
  }

  /** Change permission bits (`0o755`). */
  async chmod(path: string, mode: number): Promise<void> {
    await this.#client.json("POST", `${this.#base}/chmod`, { json: { path, mode } });
  }

  /**
   * Watch the directory `path` (and below it, unless `recursive: false`).
   * Resolves once the watch is in place: every change after that is reported.
   * The stream ends when the directory is removed, the sandbox destroyed, or on `close()`.
   */
  async watch(path: string, options: { recursive?: boolean } = {}): Promise<EventStream<WatchEvent>> {
    const events = await this.#client.stream<WatchEvent | { type: "ready" }>("GET", `${this.#base}/watch`, {
      query: { path, recursive: options.recursive },
    });
    const first = await events.next();
    if (first?.type !== "ready") {
      events.close();
      throw new ForkboxError(`the watch of ${path} did not start: ${JSON.stringify(first)}`);
    }
    return events as EventStream<WatchEvent>;
  }
}
