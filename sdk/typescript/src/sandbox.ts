/** A sandbox: its REPL, files, terminals, forks and state (docs/api.md). */
import { Client, type ClientOptions } from "./client.js";
import { ExecTimeoutError, ForkboxError, NotFoundError } from "./errors.js";
import { Execution, outputText } from "./execution.js";
import { Files } from "./files.js";
import { Pty } from "./pty.js";
import type { Checkpoint, DiffResult, Egress, ExecEvent, SandboxInfo, Space, TemplateInfo } from "./types.js";

/** Settings of a sandbox's life, shared by `create` and `resume`. */
export interface LifetimeOptions extends ClientOptions {
  /** Lifetime in seconds (default 3600). */
  timeoutSeconds?: number;
  /** Destroyed (or hibernated, if persistent) after this long without an exec (default 600). */
  idleTimeoutSeconds?: number;
  /** Hibernate (to disk, same id, woken by the next call) instead of being destroyed at the idle timeout. */
  persistent?: boolean;
  egress?: Egress;
}

export interface CreateOptions extends LifetimeOptions {
  /** `default`, `python-datasci` or one of your templates (`client.listTemplates()`). */
  template?: string;
  /**
   * Freezes and hibernation keep every process, not just the REPL's globals (criu); such a
   * sandbox forks through criu too, slower than a pooled one. Default: `persistent`, when the
   * server has criu (docs/state.md).
   */
  keepProcesses?: boolean;
  /** Memory limit for everything in the sandbox (default 1024). */
  ramMib?: number;
  rootfsGb?: number;
}

export interface RunOptions {
  language?: "python" | "bash";
  /** Interrupt the call after this long (default 300000); then `runCode` throws `ExecTimeoutError`. */
  timeoutMs?: number;
  /** Called with stdout as it arrives: the lines that came together, with their newlines, or a piece of a long line. */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  signal?: AbortSignal;
}

function lifetimeBody(o: LifetimeOptions): Record<string, unknown> {
  return {
    timeout_seconds: o.timeoutSeconds,
    idle_timeout_seconds: o.idleTimeoutSeconds,
    persistent: o.persistent,
    egress: o.egress,
  };
}

function checkpointId(cp: string | Checkpoint): string {
  return typeof cp === "string" ? cp : cp.checkpoint;
}

export class Sandbox implements AsyncDisposable {
  readonly id: string;
  readonly client: Client;
  /** Files of this sandbox. */
  readonly files: Files;
  /** PTY sessions of this sandbox. */
  readonly pty: Pty;

  constructor(id: string, client: Client) {
    this.id = id;
    this.client = client;
    this.files = new Files(client, id);
    this.pty = new Pty(client, id);
  }

  get #path(): string {
    return `/v1/sandboxes/${this.id}`;
  }

  /** Create a sandbox; resolves when its REPL is ready for the first call. */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const client = new Client(options);
    const body = {
      template: options.template,
      ram_mib: options.ramMib,
      rootfs_gb: options.rootfsGb,
      keep_processes: options.keepProcesses,
      ...lifetimeBody(options),
    };
    const info = await client.json<{ id: string }>("POST", "/v1/sandboxes", { json: body });
    return new Sandbox(info.id, client);
  }

  /** A handle on an existing sandbox (checked: `NotFoundError` if there is none). */
  static async connect(id: string, options: ClientOptions = {}): Promise<Sandbox> {
    const sb = new Sandbox(id, new Client(options));
    await sb.info();
    return sb;
  }

  /** Every live sandbox, oldest first. */
  static async list(options: ClientOptions = {}): Promise<SandboxInfo[]> {
    return (await new Client(options).json<{ sandboxes: SandboxInfo[] }>("GET", "/v1/sandboxes")).sandboxes;
  }

  /** Bring a frozen space back as a new sandbox; the space is consumed. */
  static async resume(spaceId: string, options: LifetimeOptions = {}): Promise<Sandbox> {
    const client = new Client(options);
    const info = await client.json<{ id: string }>("POST", `/v1/spaces/${spaceId}/resume`, { json: lifetimeBody(options) });
    return new Sandbox(info.id, client);
  }

  /** Every space (frozen sandbox) on the server. */
  static async listSpaces(options: ClientOptions = {}): Promise<Space[]> {
    return (await new Client(options).json<{ spaces: Space[] }>("GET", "/v1/spaces")).spaces;
  }

  static getSpace(spaceId: string, options: ClientOptions = {}): Promise<Space> {
    return new Client(options).json("GET", `/v1/spaces/${spaceId}`);
  }

  static async deleteSpace(spaceId: string, options: ClientOptions = {}): Promise<void> {
    await new Client(options).json("DELETE", `/v1/spaces/${spaceId}`);
  }

  info(): Promise<SandboxInfo> {
    return this.client.json("GET", this.#path);
  }

  /**
   * Run code and wait for it to finish. Exceptions in the code do not throw:
   * they are `error` (and a non-zero `exitCode`). A call interrupted at its
   * timeout throws `ExecTimeoutError`, carrying what it printed.
   */
  async runCode(code: string, options: RunOptions = {}): Promise<Execution> {
    const execution = new Execution();
    for await (const ev of this.runCodeStream(code, options)) {
      execution.push(ev);
      if (ev.type === "stdout") options.onStdout?.(outputText(ev));
      else if (ev.type === "stderr") options.onStderr?.(outputText(ev));
    }
    if (execution.exitCode === null) throw new ForkboxError("the exec stream ended without an exit event");
    if (execution.timedOut) throw new ExecTimeoutError(execution.error!.value, execution);
    return execution;
  }

  /** Run code; its events as they happen, ending with `exit`. */
  async *runCodeStream(code: string, options: Omit<RunOptions, "onStdout" | "onStderr"> = {}): AsyncGenerator<ExecEvent> {
    const events = await this.client.stream<ExecEvent>("POST", `${this.#path}/exec`, {
      // "chunks": the lines that arrived together come in one event.
      json: { code, language: options.language, timeout_ms: options.timeoutMs, output: "chunks" },
      signal: options.signal,
    });
    yield* events;
  }

  /** The sandbox's last ≤ 1000 events across its execs, oldest first. */
  async replay(): Promise<ExecEvent[]> {
    const events: ExecEvent[] = [];
    for await (const ev of await this.client.stream<ExecEvent>("GET", `${this.#path}/replay`)) events.push(ev);
    return events;
  }

  /** `n` copy-on-write children with this sandbox's exact state (docs/fork.md). */
  async fork(n = 1): Promise<Sandbox[]> {
    const r = await this.client.json<{ children: string[] }>("POST", `${this.#path}/fork`, { json: { n } });
    return r.children.map((id) => new Sandbox(id, this.client));
  }

  /** Keep `winner` (a fork descendant): this id now drives its REPL and files; the winner's id is gone. */
  async mergeInto(winner: Sandbox | string): Promise<void> {
    const id = typeof winner === "string" ? winner : winner.id;
    await this.client.json("POST", `${this.#path}/merge_into/${id}`);
  }

  /** Files that differ from `other` under `paths` (default `/root` and `/tmp`). */
  diff(other: Sandbox | string, options: { paths?: string[] } = {}): Promise<DiffResult> {
    const id = typeof other === "string" ? other : other.id;
    return this.client.json("GET", `${this.#path}/diff/${id}`, { query: { paths: options.paths?.join(",") } });
  }

  /** Stop every process (no CPU, memory kept); any call resumes it. */
  pause(): Promise<SandboxInfo> {
    return this.client.json("POST", `${this.#path}/pause`);
  }

  resume(): Promise<SandboxInfo> {
    return this.client.json("POST", `${this.#path}/resume`);
  }

  /** Save the sandbox's state now, to `restore` later. */
  checkpoint(): Promise<Checkpoint> {
    return this.client.json("POST", `${this.#path}/checkpoints`, { json: {} });
  }

  /** This sandbox's checkpoints, oldest first. */
  async checkpoints(): Promise<Checkpoint[]> {
    return (await this.client.json<{ checkpoints: Checkpoint[] }>("GET", `${this.#path}/checkpoints`)).checkpoints;
  }

  /** Go back to a checkpoint (which stays usable). */
  restore(cp: string | Checkpoint): Promise<SandboxInfo> {
    return this.client.json("POST", `${this.#path}/restore`, { json: { checkpoint: checkpointId(cp) } });
  }

  async deleteCheckpoint(cp: string | Checkpoint): Promise<void> {
    await this.client.json("DELETE", `${this.#path}/checkpoints/${checkpointId(cp)}`);
  }

  /** Freeze to disk as a space; bring it back with `Sandbox.resume(spaceId)`. */
  freeze(): Promise<Space> {
    return this.client.json("POST", `${this.#path}/freeze`);
  }

  /** Send to disk keeping this id (`state: "hibernated"`); the next call wakes it (docs/state.md#hibernation). */
  hibernate(): Promise<SandboxInfo> {
    return this.client.json("POST", `${this.#path}/hibernate`);
  }

  /**
   * Save this sandbox's files and REPL state as the template `name`
   * (docs/templates.md#saving-a-sandbox): new sandboxes of it start where this
   * one is. The sandbox goes on; saving again under a name replaces it.
   */
  saveTemplate(name: string, options: { description?: string } = {}): Promise<TemplateInfo> {
    return this.client.json("POST", `${this.#path}/template`, { json: { name, description: options.description } });
  }

  async getEgress(): Promise<Egress> {
    return (await this.client.json<{ egress: Egress }>("GET", `${this.#path}/egress`)).egress;
  }

  /** Replace the egress policy; the policy now in force. */
  async setEgress(egress: Egress): Promise<Egress> {
    return (await this.client.json<{ egress: Egress }>("PATCH", `${this.#path}/egress`, { json: { egress } })).egress;
  }

  /** The URL that reaches `127.0.0.1:{port}` inside the sandbox (send `client.authHeaders()` with it). */
  portUrl(port: number, path = ""): string {
    return `${this.client.url}${this.#path}/ports/${port}/${path.replace(/^\/+/, "")}`;
  }

  /** Destroy the sandbox; closing one that is already gone is not an error. */
  async close(): Promise<void> {
    try {
      await this.client.json("DELETE", this.#path);
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
