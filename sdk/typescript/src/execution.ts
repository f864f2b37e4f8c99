/** The outcome of one exec, folded from its event stream. */
import { fromBase64 } from "./client.js";
import type { ExecEvent, MimeBundle, OutputEvent } from "./types.js";

/** A Python exception (or `TimeoutError`, `ReplDied`, `MemoryError`) from an `error` event. */
export interface ExecError {
  name: string;
  value: string;
  traceback: string[];
}

/** The text an output event stands for: its line, and the newline when one followed. */
export function outputText(ev: OutputEvent): string {
  const text = ev.b64 === undefined ? ev.data : new TextDecoder().decode(fromBase64(ev.b64));
  return ev.nl ? text + "\n" : text;
}

/**
 * Everything an exec produced. `stdout` and `stderr` are the exact text the
 * code wrote (lines rebuilt with their newlines); build one from a
 * `runCodeStream` with `push`.
 */
export class Execution {
  stdout = "";
  stderr = "";
  /** `null` until the `exit` event. */
  exitCode: number | null = null;
  /** The bundle of the last expression's value, when it was not `None`. */
  result: MimeBundle | null = null;
  /** Bundles of `display()` calls and matplotlib figures, in order. */
  displays: MimeBundle[] = [];
  /** The first error of the call, or `null`. */
  error: ExecError | null = null;
  warnings: string[] = [];
  /** Every event, in order. */
  events: ExecEvent[] = [];

  /** `text/plain` of the result, or `null`. */
  get text(): string | null {
    const t = this.result?.["text/plain"];
    return typeof t === "string" ? t : null;
  }

  /** Fold one event in. */
  push(ev: ExecEvent): void {
    this.events.push(ev);
    switch (ev.type) {
      case "stdout":
        this.stdout += outputText(ev);
        break;
      case "stderr":
        this.stderr += outputText(ev);
        break;
      case "result":
        this.result = ev.bundle ?? { "text/plain": ev.data };
        break;
      case "display":
        this.displays.push(ev.bundle ?? (ev.data === null ? {} : { "text/plain": ev.data }));
        break;
      case "error":
        this.error ??= { name: ev.ename ?? "Error", value: ev.evalue ?? ev.data, traceback: ev.traceback ?? [] };
        break;
      case "warning":
        this.warnings.push(ev.data);
        break;
      case "exit":
        this.exitCode = ev.data;
        break;
    }
  }

  /** Whether the server interrupted the call at its timeout. */
  get timedOut(): boolean {
    return this.error?.name === "TimeoutError" && this.exitCode === 124;
  }
}
