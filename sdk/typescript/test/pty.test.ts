/** PTY sessions through the SDK, against a live server. */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { ConflictError, NotFoundError, Sandbox, type PtyHandle } from "forkbox";

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create();
});
after(async () => {
  await sb.close();
});

/** Read a session's stream until its text matches `re`; the text so far. */
async function until(pty: PtyHandle, re: RegExp, seen = { text: "" }): Promise<string> {
  const decoder = new TextDecoder();
  const iter = pty[Symbol.asyncIterator]();
  while (!re.test(seen.text)) {
    const next = await iter.next();
    if (next.done) assert.fail(`the stream ended before ${re}: ${JSON.stringify(seen.text)}`);
    seen.text += decoder.decode(next.value, { stream: true });
  }
  return seen.text;
}

describe("pty", { timeout: 60_000 }, () => {
  test("create a shell: input, resize, exit code", async () => {
    const pty = await sb.pty.create({ cmd: "bash", cols: 100, rows: 30 });
    assert.match(pty.id, /^pty-/);
    const seen = { text: "" };
    await pty.input("tty; stty size; echo hi-$((1 + 2))\r");
    await until(pty, /30 100\r?\n[\s\S]*hi-3/, seen);
    assert.match(seen.text, /\/dev\/pts\/\d+/);
    await pty.resize(120, 40);
    await pty.input("stty size\r");
    await until(pty, /40 120/, seen);
    await pty.input(new TextEncoder().encode("exit 7\r"));
    assert.equal(await pty.wait(), 7);
    assert.equal(pty.exitCode, 7);
    await assert.rejects(() => pty.input("late\r"), ConflictError);
  });

  test("argv, env and cwd", async () => {
    const pty = await sb.pty.create({
      argv: ["python3", "-c", "import os, sys; print(os.environ['GREETING'], os.getcwd(), sys.stdout.isatty())"],
      env: { GREETING: "hola" },
      cwd: "/tmp",
    });
    const chunks: Uint8Array[] = [];
    for await (const chunk of pty) chunks.push(chunk);
    assert.equal(Buffer.concat(chunks).toString(), "hola /tmp True\r\n");
    assert.equal(pty.exitCode, 0);
    assert.equal(await pty.wait(), 0);
  });

  test("list shows running and exited sessions", async () => {
    const pty = await sb.pty.create({ argv: ["bash", "-c", "echo started; exec sleep 600"], cols: 90, rows: 20 });
    // A kill that comes before the command has started is lost by the server (about 1 in 12
    // tries right after create): wait for it to run.
    await until(pty, /started/);
    let info = (await sb.pty.list()).find((p) => p.pty_id === pty.id);
    assert.ok(info);
    assert.equal(info.exit_code, null);
    assert.equal(info.cols, 90);
    assert.equal(info.rows, 20);
    assert.match(info.cmd_label, /sleep/);
    await pty.kill();
    assert.equal(await pty.wait(), 137);
    info = (await sb.pty.list()).find((p) => p.pty_id === pty.id);
    assert.equal(info?.exit_code, 137);
  });

  test("close leaves the session running; attach replays its output, then live", async () => {
    const pty = await sb.pty.create({ cmd: "bash" });
    await pty.input("echo first-$((40 + 2))\r");
    await until(pty, /first-42/);
    pty.close();
    await pty.input("echo second-$((40 + 3))\r");
    const again = await sb.pty.attach(pty.id);
    assert.equal(again.id, pty.id);
    const seen = { text: "" };
    await until(again, /second-43/, seen);
    assert.match(seen.text, /first-42[\s\S]*second-43/);
    await again.input("exit\r");
    assert.equal(await again.wait(), 0);
    // The first handle's stream was closed: wait() asks the server instead.
    assert.equal(await pty.wait(), 0);
  });

  test("read long-polls from an offset", async () => {
    const pty = await sb.pty.create({ argv: ["bash", "-c", "echo one; sleep 0.3; echo two"] });
    pty.close();
    let text = "";
    let since = 0;
    for (;;) {
      const r = await sb.pty.read(pty.id, { sinceSeq: since, timeoutMs: 5000 });
      assert.equal(r.seq, since);
      assert.equal(r.nextSeq, since + r.data.length);
      assert.equal(r.dropped, 0);
      text += new TextDecoder().decode(r.data);
      since = r.nextSeq;
      if (r.exited) {
        assert.equal(r.exitCode, 0);
        break;
      }
    }
    assert.equal(text, "one\r\ntwo\r\n");
    const part = await pty.read({ sinceSeq: 5, maxBytes: 3 });
    assert.equal(new TextDecoder().decode(part.data), "two");
    assert.equal(part.nextSeq, 8);
  });

  test("timeoutMs ends the session; unknown sessions are NotFoundError", async () => {
    const started = Date.now();
    const pty = await sb.pty.create({ argv: ["sleep", "600"], timeoutMs: 300 });
    const code = await pty.wait();
    assert.notEqual(code, 0);
    assert.ok(Date.now() - started < 10_000);
    await assert.rejects(() => sb.pty.attach("pty-nosuchsession"), NotFoundError);
    await assert.rejects(() => sb.pty.kill("pty-nosuchsession"), NotFoundError);
  });
});
