/**
 * The Gemini adapter, driven the way a Gemini tool loop drives it, with no
 * model: the calls come out of a generateContent answer (the API's JSON made
 * into the SDK's `GenerateContentResponse`, as `ai.models.generateContent`
 * does), and the parts the handler returns are what the next request sends.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { GenerateContentResponse, Type, type FunctionCall, type Part } from "@google/genai";
import { Sandbox } from "forkbox";
import { FUNCTION_DECLARATION, TOOL, handleFunctionCall } from "forkbox/gemini";

// A 1×1 PNG, shown with display() (the default template has no matplotlib).
const PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
const PNG_MAGIC = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create();
});
after(async () => {
  await sb.close();
});

/** The calls of an answer with one `functionCall` part per `args` (Gemini 3 signs the first). */
function functionCalls(...args: Record<string, unknown>[]): FunctionCall[] {
  const parts = args.map((a, i) => ({
    functionCall: { id: `fc-${i + 1}`, name: "run_code", args: a },
    ...(i === 0 ? { thoughtSignature: "c2ln" } : {}),
  }));
  const body = JSON.stringify({
    candidates: [{ content: { role: "model", parts: [{ text: "Running it." }, ...parts] }, finishReason: "STOP", index: 0 }],
    modelVersion: "gemini-3.8-flash",
  });
  const response: GenerateContentResponse = Object.assign(new GenerateContentResponse(), JSON.parse(body));
  const calls = response.functionCalls;
  assert.ok(calls, "the SDK finds the calls");
  return calls;
}

/** A part as the request carries it (JSON). */
function wire(part: Part): { functionResponse: Record<string, any> } {
  return JSON.parse(JSON.stringify(part));
}

describe("forkbox/gemini", () => {
  test("the declaration asks for code and an optional language", () => {
    assert.equal(FUNCTION_DECLARATION.name, "run_code");
    assert.match(String(FUNCTION_DECLARATION.description), /persistent REPL/);
    const params = FUNCTION_DECLARATION.parameters!;
    assert.equal(params.type, Type.OBJECT);
    assert.deepEqual(Object.keys(params.properties!).sort(), ["code", "language"]);
    assert.deepEqual(params.required, ["code"]);
    assert.deepEqual(params.properties!["language"]!.enum, ["python", "bash"]);
    assert.deepEqual(TOOL, { functionDeclarations: [FUNCTION_DECLARATION] });
  });

  test("python runs in the sandbox, keeping state between calls; the answer echoes the call", async () => {
    const [first, bash] = functionCalls({ code: "x = 7\nx * 6" }, { code: "echo $((x + 1)); ls /nonexistent", language: "bash" });
    assert.deepEqual(wire(await handleFunctionCall(first!, sb)), {
      functionResponse: { id: "fc-1", name: "run_code", response: { output: "result:\n42\nexit_code: 0", exit_code: 0 } },
    });
    const sh = wire(await handleFunctionCall(bash!, sb)).functionResponse;
    assert.equal(sh["id"], "fc-2");
    assert.equal(sh["response"].exit_code, 2);
    assert.match(sh["response"].output, /^stdout:\n1\n/); // a shell, not the REPL's x
    assert.match(sh["response"].output, /No such file or directory/);

    const [again, err] = functionCalls({ code: "print(x + 1)" }, { code: "1 / 0" });
    assert.deepEqual(wire(await handleFunctionCall(again!, sb)).functionResponse["response"], {
      output: "stdout:\n8\n\nexit_code: 0",
      exit_code: 0,
    });
    const e = wire(await handleFunctionCall(err!, sb)).functionResponse["response"];
    assert.equal(e.exit_code, 1);
    assert.match(e.output, /\nerror: ZeroDivisionError: division by zero\nexit_code: 1$/);
  });

  test("displayed pictures go back inline in the response's parts", async () => {
    const code =
      `display({'image/png': '${PNG}', 'text/plain': 'dot'}, raw=True)\n` +
      `display({'image/gif': 'R0lGODlhAQABAAAAACw=', 'text/plain': 'anim'}, raw=True)`;
    const [call] = functionCalls({ code });
    const res = wire(await handleFunctionCall(call!, sb)).functionResponse;
    assert.match(res["response"].output, /display 1 \(image\/png, text\/plain\):\ndot\ndisplay 2 \(image\/gif, text\/plain\):\nanim/);
    assert.deepEqual(res["parts"], [{ inlineData: { mimeType: "image/png", data: PNG } }]); // no GIF: Gemini takes none
    const bytes = Uint8Array.from(atob(res["parts"][0].inlineData.data), (c) => c.charCodeAt(0));
    assert.deepEqual([...bytes.subarray(0, 8)], PNG_MAGIC);

    const plain = wire(await handleFunctionCall(call!, sb, { withImages: false })).functionResponse;
    assert.equal("parts" in plain, false);
  });

  test("a timeout answers what the code printed; a call without an id gets none", async () => {
    const call: FunctionCall = { name: "run_code", args: { code: "import time\nprint('started', flush=True)\ntime.sleep(30)" } };
    const res = wire(await handleFunctionCall(call, sb, { timeoutMs: 400 })).functionResponse;
    assert.equal("id" in res, false);
    assert.equal(res["name"], "run_code");
    assert.equal(res["response"].exit_code, 124);
    assert.match(res["response"].output, /^stdout:\nstarted\n/);
    assert.match(res["response"].output, /timed out: execution timed out after 400 ms\nexit_code: 124$/);
  });
});
