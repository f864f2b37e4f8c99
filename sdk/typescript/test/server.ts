/**
 * A real `forkbox serve` process for the tests, as tests/e2e/helpers.py's
 * ForkboxServer does it: a free loopback port, a fresh state directory, the
 * shared built templates, no template builds.
 *
 * Environment:
 *   FORKBOX_BIN             the server binary (default <repo>/target/debug/forkbox)
 *   FORKBOX_TEMPLATES_DIR   built templates (default /var/lib/forkbox/templates)
 *   FORKBOX_SDKTS_ROOT      where state directories go (default /var/lib/forkbox-sdkts)
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { closeSync, mkdirSync, openSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
const BIN = process.env.FORKBOX_BIN ?? join(REPO, "target/debug/forkbox");
const TEMPLATES_DIR = process.env.FORKBOX_TEMPLATES_DIR ?? "/var/lib/forkbox/templates";
const ROOT = process.env.FORKBOX_SDKTS_ROOT ?? "/var/lib/forkbox-sdkts";
const READY_TIMEOUT_MS = 120_000;

export interface ServerOptions {
  /** Used in the state directory's name. */
  name: string;
  apiKey?: string;
  /** Default: the shared built templates. */
  templatesDir?: string;
  /** Wait for healthz `200` (else only for the server to answer at all). */
  waitReady?: boolean;
}

async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => ok(port));
    });
  });
}

function isMounted(path: string): boolean {
  let real: string;
  try {
    real = realpathSync(path);
  } catch {
    return false;
  }
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .some((line) => line.split(" ")[4] === real);
}

export class TestServer {
  readonly url: string;
  readonly stateDir: string;
  readonly logPath: string;
  readonly #proc: ChildProcess;
  #exited: Promise<number | null>;

  private constructor(url: string, stateDir: string, proc: ChildProcess) {
    this.url = url;
    this.stateDir = stateDir;
    this.logPath = stateDir + ".log";
    this.#proc = proc;
    this.#exited = new Promise((ok) => proc.once("exit", (code) => ok(code)));
  }

  static async start(options: ServerOptions): Promise<TestServer> {
    const port = await freePort();
    const stateDir = join(ROOT, `${options.name}-${process.pid}-${randomBytes(4).toString("hex")}`);
    mkdirSync(stateDir, { recursive: true });
    const args = ["serve", "--listen", `127.0.0.1:${port}`, "--state-dir", stateDir];
    args.push("--templates-dir", options.templatesDir ?? TEMPLATES_DIR, "--no-build-templates");
    // The volume image is allocated in full: keep it small, as the e2e servers do.
    args.push("--volume-gib", "4");
    if (options.apiKey !== undefined) args.push("--api-key", options.apiKey);
    const env: NodeJS.ProcessEnv = { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "info" };
    for (const k of ["FORKBOX_API_KEYS", "FORKBOX_LISTEN", "FORKBOX_STATE_DIR", "FORKBOX_TEMPLATES_DIR"]) delete env[k];
    const log = openSync(stateDir + ".log", "w");
    const proc = spawn(BIN, args, { stdio: ["ignore", log, log], env });
    closeSync(log);
    const server = new TestServer(`http://127.0.0.1:${port}`, stateDir, proc);
    try {
      await server.#waitReady(options.waitReady ?? true);
    } catch (e) {
      await server.stop();
      throw e;
    }
    return server;
  }

  async #waitReady(ready: boolean): Promise<void> {
    const deadline = Date.now() + READY_TIMEOUT_MS;
    let note = "not listening yet";
    while (Date.now() < deadline) {
      if (this.#proc.exitCode !== null || this.#proc.signalCode !== null) {
        throw new Error(`forkbox server exited before it was ready:\n${this.logTail()}`);
      }
      try {
        const res = await fetch(`${this.url}/v1/healthz`);
        note = `healthz ${res.status}: ${await res.text()}`;
        if (res.status === 200 || !ready) return;
      } catch {
        // not listening yet
      }
      await new Promise((ok) => setTimeout(ok, 100));
    }
    throw new Error(`forkbox server not ready after ${READY_TIMEOUT_MS} ms (${note}):\n${this.logTail()}`);
  }

  logTail(lines = 40): string {
    try {
      return readFileSync(this.logPath, "utf8").split("\n").slice(-lines).join("\n");
    } catch {
      return "(no log)";
    }
  }

  /** SIGTERM (SIGKILL after 90 s), then remove the state directory and, unless kept, the log. */
  async stop(options: { keepLog?: boolean } = {}): Promise<number | null> {
    if (this.#proc.exitCode === null && this.#proc.signalCode === null) {
      this.#proc.kill("SIGTERM");
      const timer = setTimeout(() => this.#proc.kill("SIGKILL"), 90_000);
      await this.#exited;
      clearTimeout(timer);
    }
    const volume = join(this.stateDir, "volume");
    // A leaked mount is a server bug; never recurse into a mounted volume.
    if (isMounted(volume)) spawnSync("umount", ["-l", volume]);
    rmSync(this.stateDir, { recursive: true, force: true });
    if (!options.keepLog) rmSync(this.logPath, { force: true });
    return this.#exited;
  }
}
