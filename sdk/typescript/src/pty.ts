/** PTY sessions of one sandbox (docs/pty.md): a real terminal that outlives its client. */
import { Client, EventStream, fromBase64, toBase64 } from "./client.js";
import { ForkboxError } from "./errors.js";
import type { PtyInfo } from "./types.js";

export interface PtyCreateOptions {
  /** A shell command line, run under `/bin/bash -lc` (default `bash`). */
  cmd?: string;
  /** A program and its arguments, executed directly (instead of `cmd`). */
  argv?: string[];
  /** Terminal size; default 80×24. */
  cols?: number;
  rows?: number;
  /** Added to the sandbox's environment (`TERM=xterm-256color` is already set). */
  env?: Record<string, string>;
  /** Working directory; default `/root`. */
  cwd?: string;
  /** Kill the session after this long. */
  timeoutMs?: number;
}

export interface PtyReadOptions {
  /** Byte offset to read from (default 0: the oldest byte kept). */
  sinceSeq?: number;
  /** At most this many bytes (default 64 KiB, at most 1 MiB). */
  maxBytes?: number;
  /** Wait this long for output (default 10 s, at most 30 s). */
  timeoutMs?: number;
}

/** `read`'s answer. Pass `nextSeq` back as `sinceSeq`. */
export interface PtyReadResult {
  data: Uint8Array;
  seq: number;
  nextSeq: number;
  /** Bytes lost because the reader was more than 1 MiB behind. */
  dropped: number;
  /** The session exited and everything from `sinceSeq` on was read. */
  exited: boolean;
  exitCode: number | null;
}

type PtyEvent =
  | { type: "pty_ready"; session_id: string }
  | { type: "pty_data"; data_b64: string; seq: number }
  | { type: "pty_exit"; data: number };

/** The PTY sessions of one sandbox: `sandbox.pty`. */
export class Pty {
  readonly #client: Client;
  readonly #base: string;

  constructor(client: Client, sandboxId: string) {
    this.#client = client;
    this.#base = `/v1/sandboxes/${sandboxId}/pty`;
  }

  /** Start a session; its handle streams the terminal's output from the first byte. */
  async create(options: PtyCreateOptions = {}): Promise<PtyHandle> {
    const body = {
      ...(options.argv === undefined ? { shellCmd: options.cmd ?? "bash" } : { argv: options.argv }),
      cols: options.cols,
      rows: options.rows,
      env: options.env === undefined ? undefined : Object.entries(options.env),
      cwd: options.cwd,
      timeout_ms: options.timeoutMs,
    };
    const events = await this.#client.stream<PtyEvent>("POST", this.#base, { json: body });
    const first = await events.next();
    if (first?.type !== "pty_ready") {
      events.close();
      throw new ForkboxError(`the PTY session did not start: ${JSON.stringify(first)}`);
    }
    return new PtyHandle(this, first.session_id, events);
  }

  /** Every session of the sandbox, exited ones included (the 16 most recent). */
  list(): Promise<PtyInfo[]> {
    return this.#client.json("GET", this.#base);
  }

  /** Follow an existing session: what its 1 MiB ring still holds, then live output. */
  async attach(ptyId: string): Promise<PtyHandle> {
    return new PtyHandle(this, ptyId, await this.#client.stream<PtyEvent>("GET", `${this.#base}/${ptyId}/attach`));
  }

  /** Long-poll a session's output from `sinceSeq` (no stream needed). */
  async read(ptyId: string, options: PtyReadOptions = {}): Promise<PtyReadResult> {
    const r = await this.#client.json<{
      data_b64: string;
      seq: number;
      next_seq: number;
      dropped: number;
      exited: boolean;
      exit_code: number | null;
    }>("POST", `${this.#base}/${ptyId}/read`, {
      json: { since_seq: options.sinceSeq ?? 0, max_bytes: options.maxBytes, timeout_ms: options.timeoutMs },
    });
    return {
      data: fromBase64(r.data_b64),
      seq: r.seq,
      nextSeq: r.next_seq,
      dropped: r.dropped,
      exited: r.exited,
      exitCode: r.exit_code ?? null,
    };
  }

  /** Type into a session (`"ls\r"`, `"\x03"` for Ctrl-C). */
  async input(ptyId: string, data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.#client.json("POST", `${this.#base}/${ptyId}/input`, { json: { data_b64: toBase64(bytes) } });
  }

  /** Resize the terminal; its foreground program gets SIGWINCH. */
  async resize(ptyId: string, cols: number, rows: number): Promise<void> {
    await this.#client.json("POST", `${this.#base}/${ptyId}/resize`, { json: { cols, rows } });
  }

  /** SIGKILL every process of the session (exit code 137). */
  async kill(ptyId: string): Promise<void> {
    await this.#client.json("POST", `${this.#base}/${ptyId}/kill`);
  }
}

/**
 * One session. Iterate it for the terminal's output (`Uint8Array` chunks,
 * until the command exits); closing the stream does not end the session.
 */
export class PtyHandle implements AsyncIterable<Uint8Array> {
  readonly id: string;
  /** Set once the session's exit was seen. */
  exitCode: number | null = null;
  readonly #pty: Pty;
  readonly #events: EventStream<PtyEvent>;

  constructor(pty: Pty, id: string, events: EventStream<PtyEvent>) {
    this.#pty = pty;
    this.id = id;
    this.#events = events;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    for await (const ev of this.#events) {
      if (ev.type === "pty_data") yield fromBase64(ev.data_b64);
      else if (ev.type === "pty_exit") {
        this.exitCode = ev.data;
        return;
      }
    }
  }

  /** Wait for the command to exit (reading and dropping output nobody iterated); its exit code. */
  async wait(): Promise<number> {
    for await (const _ of this) {
      // drain
    }
    let since = 0;
    while (this.exitCode === null) {
      // The stream was closed early: long-poll until the session has exited.
      const r = await this.read({ sinceSeq: since, maxBytes: 1 << 20, timeoutMs: 30_000 });
      since = r.nextSeq;
      if (r.exited) this.exitCode = r.exitCode ?? -1;
    }
    return this.exitCode;
  }

  input(data: string | Uint8Array): Promise<void> {
    return this.#pty.input(this.id, data);
  }

  resize(cols: number, rows: number): Promise<void> {
    return this.#pty.resize(this.id, cols, rows);
  }

  kill(): Promise<void> {
    return this.#pty.kill(this.id);
  }

  read(options: PtyReadOptions = {}): Promise<PtyReadResult> {
    return this.#pty.read(this.id, options);
  }

  /** Stop following the output; the session goes on (attach again later). */
  close(): void {
    this.#events.close();
  }
}
