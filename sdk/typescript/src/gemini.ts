/**
 * Gemini function calling (`@google/genai`) backed by a forkbox sandbox: the
 * declaration of a `run_code` function, and the handler that runs the model's
 * calls of it and answers each with its `functionResponse` part.
 *
 *   const config = { tools: [TOOL] };
 *   const response = await ai.models.generateContent({ model, contents, config });
 *   for (const call of response.functionCalls ?? []) parts.push(await handleFunctionCall(call, sandbox));
 */
import {
  Type,
  type FunctionCall,
  type FunctionDeclaration,
  type FunctionResponsePart,
  type Part,
  type Tool,
} from "@google/genai";
import { ExecTimeoutError } from "./errors.js";
import type { Execution } from "./execution.js";
import type { Sandbox } from "./sandbox.js";

/** The Python adapters' description (forkbox.integrations._common), so both SDKs tell the model the same. */
const DESCRIPTION =
  "Execute code in an isolated forkbox sandbox. language 'python' (default) runs in a persistent REPL: " +
  "variables, imports and files survive between calls, and the value of the last expression is shown; " +
  "'bash' runs a shell command. Returns stdout, stderr, the result, the error and the exit code; " +
  "plots (matplotlib) and display() images come back as images.";

/**
 * `run_code(code, language?)`. `parameters` is the API's OpenAPI schema
 * subset, which every Gemini model takes.
 */
export const FUNCTION_DECLARATION: FunctionDeclaration = {
  name: "run_code",
  description: DESCRIPTION,
  parameters: {
    type: Type.OBJECT,
    properties: {
      code: { type: Type.STRING, description: "The code to run." },
      language: {
        type: Type.STRING,
        enum: ["python", "bash"],
        description: "'python' (a persistent REPL, the default) or 'bash'.",
      },
    },
    required: ["code"],
  },
};

/** A tool holding only `FUNCTION_DECLARATION`: `config: { tools: [TOOL] }`. */
export const TOOL: Tool = { functionDeclarations: [FUNCTION_DECLARATION] };

/** The image types a function response carries to Gemini (no GIF); other pictures are only named in the text. */
export const GEMINI_IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp"] as const;

export interface HandleFunctionCallOptions {
  /** Per-call timeout (default: the server's, 300 s); past it, the answer is what the code printed, exit code 124. */
  timeoutMs?: number;
  /** Send displayed pictures in the response's `parts` (default `true`); `false` for models before Gemini 3. */
  withImages?: boolean;
}

/** What `response` holds: the call's text, as the Python adapters write it, and its exit code. */
export type RunCodeResponse = {
  output: string;
  exit_code: number | null;
};

/** The text a model reads about a call: the same sections as the Python adapters' `describe`. */
function describe(e: Execution): string {
  const parts: string[] = [];
  if (e.stdout) parts.push(`stdout:\n${e.stdout}`);
  if (e.stderr) parts.push(`stderr:\n${e.stderr}`);
  if (e.text !== null) parts.push(`result:\n${e.text}`);
  e.displays.forEach((bundle, i) => {
    const kinds = Object.keys(bundle).sort().join(", ");
    const text = bundle["text/plain"];
    parts.push(`display ${i + 1} (${kinds})` + (text === undefined ? "" : `:\n${String(text)}`));
  });
  if (e.timedOut) parts.push(`timed out: ${e.error?.value ?? ""}`);
  else if (e.error !== null) parts.push(`error: ${e.error.name}` + (e.error.value ? `: ${e.error.value}` : ""));
  for (const w of e.warnings) parts.push(`warning: ${w}`);
  parts.push(`exit_code: ${e.exitCode}`);
  return parts.join("\n");
}

/** One inline image per display (and result) bundle that has a picture Gemini takes: its first such type. */
function pictures(e: Execution): FunctionResponsePart[] {
  const out: FunctionResponsePart[] = [];
  for (const bundle of e.result ? [...e.displays, e.result] : e.displays) {
    const mimeType = GEMINI_IMAGE_TYPES.find((t) => typeof bundle[t] === "string");
    if (mimeType !== undefined) out.push({ inlineData: { mimeType, data: bundle[mimeType] as string } });
  }
  return out;
}

/**
 * Run a `run_code` call (an item of `response.functionCalls`, or a part's
 * `functionCall`) in `sandbox` and answer the part that goes back to the
 * model: `{functionResponse: {id, name, response: {output, exit_code}, parts?}}`,
 * with the call's `id` and `name`, and one inline image in `parts` per PNG,
 * JPEG or WebP picture the code displayed (base64, as the SDK carries bytes).
 * Errors in the code are data for the model; a failure of the server (the
 * sandbox is gone) throws. Run a turn's calls one after another: they share
 * the REPL.
 */
export async function handleFunctionCall(
  call: FunctionCall,
  sandbox: Sandbox,
  options: HandleFunctionCallOptions = {},
): Promise<Part> {
  const args = call.args ?? {};
  const code = String(args["code"] ?? "");
  const language = (args["language"] || "python") as "python" | "bash"; // the server checks it
  let e: Execution;
  try {
    e = await sandbox.runCode(code, { language, timeoutMs: options.timeoutMs });
  } catch (err) {
    if (!(err instanceof ExecTimeoutError)) throw err;
    e = err.execution;
  }
  const response: RunCodeResponse = { output: describe(e), exit_code: e.exitCode };
  const parts = options.withImages === false ? [] : pictures(e);
  return {
    functionResponse: {
      ...(call.id === undefined ? {} : { id: call.id }),
      name: call.name ?? FUNCTION_DECLARATION.name!,
      response,
      ...(parts.length > 0 ? { parts } : {}),
    },
  };
}
