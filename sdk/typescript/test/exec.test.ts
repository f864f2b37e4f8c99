/** runCode, runCodeStream, fork, mergeInto and diff against a live server. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ExecTimeoutError, Execution, ForkboxError, Sandbox, type ExecEvent } from "forkbox";

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create();
});
after(async () => {
  await sb.close();
});

describe("runCode", () => {
  test("stdout and stderr are the exact text, newlines and all", async () => {
    const e = await sb.runCode('import sys\nprint("a")\nprint()\nprint("b", end="")\n_ = sys.stderr.write("x\\n\\ny")');
    assert.equal(e.stdout, "a\n\nb");
    assert.equal(e.stderr, "x\n\ny");
    assert.equal(e.exitCode, 0);
    assert.equal(e.error, null);
    assert.equal(e.result, null);
    assert.equal(e.text, null);
  });

  test("a line longer than one event is joined back without a newline", async () => {
    const e = await sb.runCode('print("x" * 200_000)\nprint("é" * 70_000, end="")');
    assert.equal(e.stdout, "x".repeat(200_000) + "\n" + "é".repeat(70_000));
    assert.ok(e.events.filter((ev) => ev.type === "stdout").length > 3, "the server cut the lines");
  });

  test("many lines come in a few chunks, every byte kept", async () => {
    const e = await sb.runCode("for i in range(30000): print(i)");
    assert.equal(e.stdout, Array.from({ length: 30000 }, (_, i) => `${i}\n`).join(""));
    const out = e.events.filter((ev) => ev.type === "stdout");
    assert.ok(out.length < 300, `${out.length} events`);
    assert.equal(out.reduce((n, ev) => n + (ev.type === "stdout" ? (ev.lines ?? 1) : 0), 0), 30000);
  });

  test("output that is not UTF-8 is decoded from its bytes", async () => {
    const e = await sb.runCode('import sys\nsys.stdout.buffer.write(b"\\xffok\\n")\nsys.stdout.flush()');
    assert.equal(e.stdout, "\uFFFDok\n");
    assert.ok(e.events.some((ev) => ev.type === "stdout" && ev.b64 !== undefined));
  });

  test("the last expression's value is result, a MIME bundle", async () => {
    const e = await sb.runCode("x = 6 * 7\nx");
    assert.deepEqual(e.result, { "text/plain": "42" });
    assert.equal(e.text, "42");
    const df = await sb.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
    assert.match(String(df.result?.["text/html"]), /<table/);
    assert.match(df.text!, /a\n0 {2}1\n1 {2}2/);
  });

  test("display() calls are displays, in order", async () => {
    const e = await sb.runCode(
      'display({"text/html": "<b>hi</b>", "text/plain": "hi"}, raw=True)\n' +
        "class Dot:\n    def _repr_svg_(self): return '<svg/>'\n    def __repr__(self): return 'Dot()'\n" +
        'display(Dot())\ndisplay({"application/json": {"a": [1]}}, raw=True)',
    );
    assert.deepEqual(e.displays, [
      { "text/html": "<b>hi</b>", "text/plain": "hi" },
      { "image/svg+xml": "<svg/>", "text/plain": "Dot()" },
      { "application/json": { a: [1] } },
    ]);
    assert.equal(e.result, null);
  });

  test("an exception is error, exit code 1, traceback on stderr", async () => {
    const e = await sb.runCode("1 / 0");
    assert.equal(e.exitCode, 1);
    assert.equal(e.error?.name, "ZeroDivisionError");
    assert.equal(e.error?.value, "division by zero");
    assert.equal(e.error?.traceback.at(-1), "ZeroDivisionError: division by zero");
    assert.match(e.stderr, /^Traceback \(most recent call last\):\n[\s\S]*ZeroDivisionError: division by zero\n$/);
  });

  test("a dead REPL is reported, and the next call warns that its state is gone", async () => {
    await sb.runCode("lost = 1");
    const died = await sb.runCode("import os\nos._exit(3)");
    assert.equal(died.exitCode, 3);
    const next = await sb.runCode("'lost' in globals()");
    assert.equal(next.text, "False");
    assert.equal(next.warnings.length, 1);
    assert.match(next.warnings[0]!, /exited with status 3; .* gone/);
  });

  test("bash runs beside the REPL with its own exit code", async () => {
    const e = await sb.runCode("echo out; echo err >&2; exit 3", { language: "bash" });
    assert.equal(e.stdout, "out\n");
    assert.equal(e.stderr, "err\n");
    assert.equal(e.exitCode, 3);
    assert.equal(e.error, null);
  });

  test("timeoutMs interrupts the call: ExecTimeoutError with what it printed", async () => {
    const started = Date.now();
    const e = await sb.runCode('import time\nprint("before", flush=True)\ntime.sleep(30)', { timeoutMs: 500 }).then(
      () => assert.fail("no timeout"),
      (err: unknown) => err,
    );
    assert.ok(e instanceof ExecTimeoutError && e instanceof ForkboxError, String(e));
    assert.ok(Date.now() - started < 10_000);
    assert.equal(e.execution.stdout, "before\n");
    assert.equal(e.execution.exitCode, 124);
    assert.equal(e.execution.error?.name, "TimeoutError");
    assert.equal(e.message, "execution timed out after 500 ms");
    const bash = await sb.runCode("sleep 30", { language: "bash", timeoutMs: 300 }).catch((err: unknown) => err);
    assert.ok(bash instanceof ExecTimeoutError);
    // A bash command that exits 124 by itself is not a timeout.
    assert.equal((await sb.runCode("exit 124", { language: "bash" })).exitCode, 124);
  });

  test("onStdout and onStderr get the output while the code runs", async () => {
    const out: [string, number][] = [];
    const err: string[] = [];
    const e = await sb.runCode(
      'import sys, time\nprint("one", flush=True)\ntime.sleep(1)\nprint("two")\nsys.stderr.write("e")',
      { onStdout: (t) => out.push([t, Date.now()]), onStderr: (t) => err.push(t) },
    );
    const end = Date.now();
    assert.deepEqual(
      out.map(([t]) => t),
      ["one\n", "two\n"],
    );
    assert.ok(end - out[0]![1] >= 800, "the first line arrived before the sleep ended");
    assert.deepEqual(err, ["e"]);
    assert.equal(e.stdout, "one\ntwo\n");
  });
});

describe("runCodeStream", () => {
  test("yields typed events as they happen, ending with exit", async () => {
    const events: [ExecEvent, number][] = [];
    for await (const ev of sb.runCodeStream('import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)\n"done"')) {
      events.push([ev, Date.now()]);
    }
    const types = events.map(([ev]) => ev.type);
    assert.deepEqual(types, ["stdout", "stdout", "stdout", "result", "exit"]);
    assert.deepEqual(
      events.map(([ev]) => ev.seq),
      [0, 1, 2, 3, 4],
    );
    assert.ok(events[4]![1] - events[0]![1] >= 800, "events streamed, not buffered");
    const folded = new Execution();
    for (const [ev] of events) folded.push(ev);
    assert.equal(folded.stdout, "0\n1\n2\n");
    assert.equal(folded.text, "'done'");
    assert.equal(folded.exitCode, 0);
  });

  test("leaving the loop early closes the stream; the call still runs to its end", async () => {
    for await (const ev of sb.runCodeStream('import time\nprint("go", flush=True)\ntime.sleep(0.5)\nfinished = True')) {
      assert.equal(ev.type, "stdout");
      break;
    }
    assert.equal((await sb.runCode("finished")).text, "True");
  });

  test("an AbortSignal stops waiting for the call (which goes on in the sandbox)", async () => {
    const started = Date.now();
    await assert.rejects(
      () => sb.runCode("import time\ntime.sleep(1.5)\nslept = True", { signal: AbortSignal.timeout(300) }),
      (e: Error) => e.name === "TimeoutError" && !(e instanceof ForkboxError),
    );
    assert.ok(Date.now() - started < 1200, "runCode returned at the abort");
    const events = sb.runCodeStream("1", { signal: AbortSignal.abort() });
    await assert.rejects(() => events.next(), (e: Error) => e.name === "AbortError");
    assert.equal((await sb.runCode("slept")).text, "True");
  });

  test("python and bash, with a timeout", async () => {
    const kinds: string[] = [];
    for await (const ev of sb.runCodeStream("sleep 5", { language: "bash", timeoutMs: 200 })) kinds.push(ev.type);
    assert.deepEqual(kinds, ["error", "exit"]);
  });
});

describe("fork, mergeInto, diff", () => {
  test("fork(n) gives n children with the parent's state, isolated from each other", async () => {
    await using parent = await Sandbox.create();
    await parent.runCode("data = [1, 2, 3]\nopen('/root/base.txt', 'w').write('base')");
    const kids = await parent.fork(2);
    try {
      assert.equal(kids.length, 2);
      assert.notEqual(kids[0]!.id, kids[1]!.id);
      await kids[0]!.runCode("data.append(4)");
      assert.equal((await kids[0]!.runCode("data")).text, "[1, 2, 3, 4]");
      assert.equal((await kids[1]!.runCode("data")).text, "[1, 2, 3]");
      assert.equal((await parent.runCode("data")).text, "[1, 2, 3]");
      assert.equal((await kids[1]!.runCode("open('/root/base.txt').read()")).text, "'base'");
      kids.push(...(await parent.fork()));
      assert.equal(kids.length, 3, "n defaults to 1");
    } finally {
      for (const k of kids) await k.close();
    }
  });

  test("mergeInto keeps the winner's state under the parent's id", async () => {
    await using parent = await Sandbox.create();
    await parent.runCode("score = 0");
    const [a, b] = await parent.fork(2);
    await a!.runCode("score = 1");
    await b!.runCode("score = 2\nopen('/root/winner', 'w').write('b')");
    await parent.mergeInto(b!);
    assert.equal((await parent.runCode("score")).text, "2");
    assert.equal((await parent.runCode("cat /root/winner", { language: "bash" })).stdout, "b");
    await assert.rejects(() => b!.info(), /was merged into/);
    await a!.close();
    await b!.close();
  });

  test("diff lists added, removed and modified files under paths", async () => {
    await using parent = await Sandbox.create();
    await parent.runCode("mkdir -p /root/d && echo 1 > /root/d/same && echo 1 > /root/d/changed && echo 1 > /root/d/gone", {
      language: "bash",
    });
    const [kid] = await parent.fork(1);
    await using child = kid!;
    await child.runCode("echo 2 > /root/d/changed && rm /root/d/gone && echo new > /root/d/new && echo t > /tmp/t", {
      language: "bash",
    });
    assert.deepEqual(await parent.diff(child), {
      added: ["/root/d/new", "/tmp/t"],
      removed: ["/root/d/gone"],
      modified: ["/root/d/changed"],
    });
    assert.deepEqual(await parent.diff(child.id, { paths: ["/tmp"] }), { added: ["/tmp/t"], removed: [], modified: [] });
  });
});
