/**
 * The Vercel AI SDK tool, driven the way the framework drives it (validate
 * the model's input with the tool's schema, then `execute`), with no model.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { asSchema } from "ai";
import { Sandbox } from "forkbox";
import { forkboxTool, type ForkboxToolInput, type ForkboxToolOutput } from "forkbox/ai";

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create();
});
after(async () => {
  await sb.close();
});

// What the framework passes to `execute` (ai 7 adds the call's `context`).
const call = { toolCallId: "call-1", messages: [], context: {} };

async function run(tool: ReturnType<typeof forkboxTool>, input: ForkboxToolInput): Promise<ForkboxToolOutput> {
  const checked = await asSchema(tool.inputSchema).validate!(input);
  assert.ok(checked.success, "the input passes the tool's schema");
  return (await tool.execute!(checked.value, call)) as ForkboxToolOutput;
}

describe("forkboxTool", () => {
  test("its schema asks for code and an optional language", async () => {
    const tool = forkboxTool({ sandbox: sb });
    assert.match(String(tool.description), /persistent/);
    const schema = asSchema(tool.inputSchema);
    const json = (await schema.jsonSchema) as { properties: Record<string, unknown>; required: string[] };
    assert.deepEqual(Object.keys(json.properties).sort(), ["code", "language"]);
    assert.deepEqual(json.required, ["code"]);
    assert.equal((await schema.validate!({})).success, false);
    assert.equal((await schema.validate!({ code: "1", language: "ruby" })).success, false);
    assert.equal(forkboxTool({ sandbox: sb, description: "mine" }).description, "mine");
  });

  test("execute runs python in the sandbox, keeping state between calls", async () => {
    const tool = forkboxTool({ sandbox: sb });
    assert.deepEqual(await run(tool, { code: "x = 21\nprint('set')\nx * 2" }), {
      stdout: "set\n",
      stderr: "",
      result: "42",
      error: null,
      exitCode: 0,
    });
    assert.equal((await run(tool, { code: "print(x)" })).stdout, "21\n");
    // Called without validation, as a framework that trusts the model might.
    const raw = (await tool.execute!({ code: "x + 1" }, call)) as ForkboxToolOutput;
    assert.equal(raw.result, "22");
  });

  test("bash, and errors come back as data for the model", async () => {
    const tool = forkboxTool({ sandbox: sb });
    const bash = await run(tool, { code: "echo hi; ls /nonexistent", language: "bash" });
    assert.equal(bash.stdout, "hi\n");
    assert.match(bash.stderr, /No such file or directory/);
    assert.equal(bash.exitCode, 2);
    const err = await run(tool, { code: "1 / 0" });
    assert.equal(err.error, "ZeroDivisionError: division by zero");
    assert.equal(err.exitCode, 1);
    assert.match(err.stderr, /Traceback/);
  });

  test("a timeout returns what the code printed, with the error", async () => {
    const tool = forkboxTool({ sandbox: sb, timeoutMs: 400 });
    const out = await run(tool, { code: "import time\nprint('started', flush=True)\ntime.sleep(30)" });
    assert.equal(out.stdout, "started\n");
    assert.equal(out.error, "TimeoutError: execution timed out after 400 ms");
    assert.equal(out.exitCode, 124);
  });
});
