/**
 * A Vercel AI SDK tool that runs code in a forkbox sandbox:
 *
 *   const result = await generateText({ model, tools: { runCode: forkboxTool({ sandbox }) }, prompt });
 */
import { tool, type Tool } from "ai";
import { z } from "zod";
import { ExecTimeoutError } from "./errors.js";
import type { Execution } from "./execution.js";
import type { Sandbox } from "./sandbox.js";

export interface ForkboxToolOptions {
  sandbox: Sandbox;
  /** What the model is told the tool does. */
  description?: string;
  /** Per-call timeout (default: the server's, 300 s). */
  timeoutMs?: number;
}

/** What the model sends: `language` may be left out (python). */
export interface ForkboxToolInput {
  code: string;
  language?: "python" | "bash";
}

/** What the model gets back from a call. */
export interface ForkboxToolOutput {
  stdout: string;
  stderr: string;
  /** `text/plain` of the last expression's value, or `null`. */
  result: string | null;
  /** `"Name: value"` of an exception or a timeout, or `null`. */
  error: string | null;
  exitCode: number | null;
}

const DESCRIPTION =
  "Run code in a persistent sandbox. language 'python' (default) runs in a REPL whose variables, " +
  "imports and files persist between calls, and the value of the last expression is returned as result; " +
  "'bash' runs a shell command. Returns stdout, stderr, result and error.";

function output(e: Execution): ForkboxToolOutput {
  return {
    stdout: e.stdout,
    stderr: e.stderr,
    result: e.text,
    error: e.error === null ? null : `${e.error.name}: ${e.error.value}`,
    exitCode: e.exitCode,
  };
}

export function forkboxTool(options: ForkboxToolOptions): Tool<ForkboxToolInput, ForkboxToolOutput> {
  const { sandbox, timeoutMs } = options;
  return tool({
    description: options.description ?? DESCRIPTION,
    inputSchema: z.object({
      code: z.string().describe("The code to run"),
      language: z.enum(["python", "bash"]).optional().describe("python (the persistent REPL, the default) or bash"),
    }),
    execute: async ({ code, language }): Promise<ForkboxToolOutput> => {
      try {
        return output(await sandbox.runCode(code, { language: language ?? "python", timeoutMs }));
      } catch (e) {
        if (e instanceof ExecTimeoutError) return output(e.execution);
        throw e;
      }
    },
  });
}
