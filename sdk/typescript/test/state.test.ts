/**
 * Checkpoints and spaces (freeze to disk, resume), against a live server.
 * The routes are those of the state issue's contract (docs/state.md).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { ConflictError, NotFoundError, RateLimitedError, Sandbox } from "forkbox";

/** A unix-milliseconds time within the last minute. */
function recent(ms: number): void {
  assert.equal(typeof ms, "number");
  assert.ok(Math.abs(Date.now() - ms) < 60_000, `${ms} is not now`);
}

/** Delete spaces a failed test may have left. */
async function dropSpaces(ids: string[]): Promise<void> {
  for (const id of ids) await Sandbox.deleteSpace(id).catch(() => {});
}

describe("checkpoints", () => {
  test("checkpoint, list, restore (reusable), delete", async () => {
    await using sb = await Sandbox.create();
    await sb.runCode("x = 1\nopen('/root/f', 'w').write('one')");
    const cp = await sb.checkpoint();
    assert.match(cp.checkpoint, /^cp-/);
    assert.equal(cp.sandbox_id, sb.id);
    recent(cp.created_at);
    await sb.runCode("x = 2\nopen('/root/f', 'w').write('two')");
    const cp2 = await sb.checkpoint();
    assert.deepEqual(
      (await sb.checkpoints()).map((c) => c.checkpoint),
      [cp.checkpoint, cp2.checkpoint],
    );

    for (let round = 0; round < 2; round++) {
      const info = await sb.restore(cp);
      assert.equal(info.id, sb.id);
      assert.equal((await sb.runCode("x")).text, "1");
      assert.equal((await sb.runCode("open('/root/f').read()")).text, "'one'");
      await sb.runCode("x = 3");
    }
    await sb.restore(cp2.checkpoint);
    assert.equal((await sb.runCode("x")).text, "2");

    await sb.deleteCheckpoint(cp);
    assert.deepEqual(
      (await sb.checkpoints()).map((c) => c.checkpoint),
      [cp2.checkpoint],
    );
    await assert.rejects(() => sb.restore(cp), NotFoundError);
    await assert.rejects(() => sb.deleteCheckpoint(cp.checkpoint), NotFoundError);
  });

  test("checkpoints beyond the per-sandbox cap are RateLimitedError", async () => {
    await using sb = await Sandbox.create();
    let made = 0;
    let refused: unknown;
    while (made < 64 && refused === undefined) {
      await sb.checkpoint().then(
        () => made++,
        (e: unknown) => (refused = e),
      );
    }
    assert.ok(refused instanceof RateLimitedError, String(refused));
    assert.match(refused.message, /checkpoints/);
    assert.equal((await sb.checkpoints()).length, made);
    await sb.deleteCheckpoint((await sb.checkpoints())[0]!);
    await sb.checkpoint();
  });
});

describe("spaces", () => {
  test("freeze, list and get the space, resume it as a new sandbox", async () => {
    const spaces: string[] = [];
    try {
      await using sb = await Sandbox.create();
      await sb.runCode("import socket\nkept = {'a': [1, 2]}\nsock = socket.socket()\nopen('/root/f', 'w').write('on disk')");
      const frozen = await sb.freeze();
      spaces.push(frozen.space_id);
      assert.match(frozen.space_id, /^sp-/);
      assert.equal(frozen.sandbox_id, sb.id);
      assert.equal(frozen.template, "default");
      recent(frozen.created_at);
      assert.ok(frozen.bytes > 0);
      assert.ok(frozen.unsaved.some((u) => u.name === "sock" && u.type === "socket"), JSON.stringify(frozen.unsaved));

      const info = await sb.info();
      assert.equal(info.state, "frozen");
      assert.equal(info.space_id, frozen.space_id);
      await assert.rejects(() => sb.runCode("1"), ConflictError);

      assert.ok((await Sandbox.listSpaces()).some((s) => s.space_id === frozen.space_id));
      const space = await Sandbox.getSpace(frozen.space_id);
      assert.equal(space.sandbox_id, sb.id);
      assert.equal(space.template, "default");
      assert.equal(space.bytes, frozen.bytes);
      recent(space.created_at);

      await using back = await Sandbox.resume(frozen.space_id, { timeoutSeconds: 600, egress: false });
      assert.notEqual(back.id, sb.id);
      const first = await back.runCode("kept");
      assert.equal(first.text, "{'a': [1, 2]}");
      assert.ok(first.warnings.some((w) => w.includes("sock")), JSON.stringify(first.warnings));
      assert.equal((await back.runCode("open('/root/f').read()")).text, "'on disk'");
      const backInfo = await back.info();
      assert.equal(backInfo.timeout_seconds, 600);
      assert.equal(backInfo.egress, false);

      await assert.rejects(() => Sandbox.getSpace(frozen.space_id), NotFoundError);
      await assert.rejects(() => Sandbox.resume(frozen.space_id), NotFoundError);
    } finally {
      await dropSpaces(spaces);
    }
  });

  test("deleteSpace removes a space", async () => {
    const spaces: string[] = [];
    try {
      await using sb = await Sandbox.create();
      const { space_id } = await sb.freeze();
      spaces.push(space_id);
      await Sandbox.deleteSpace(space_id);
      assert.ok(!(await Sandbox.listSpaces()).some((s) => s.space_id === space_id));
      await assert.rejects(() => Sandbox.getSpace(space_id), NotFoundError);
      await assert.rejects(() => Sandbox.deleteSpace(space_id), NotFoundError);
    } finally {
      await dropSpaces(spaces);
    }
  });

  test("a persistent sandbox hibernates at its idle timeout and the next call wakes it", { timeout: 60_000 }, async () => {
    await using sb = await Sandbox.create({ persistent: true, idleTimeoutSeconds: 1 });
    const created = await sb.info();
    assert.equal(created.persistent, true);
    assert.equal(created.keep_processes, true);
    await sb.runCode("import threading, time\nn = [0]\nthreading.Thread(target=lambda: [n.__setitem__(0, n[0] + 1) or time.sleep(0.005) for _ in iter(int, 1)], daemon=True).start()");
    let info = await sb.info();
    for (let i = 0; i < 300 && info.state !== "hibernated"; i++) {
      await new Promise((ok) => setTimeout(ok, 100));
      info = await sb.info();
    }
    assert.equal(info.state, "hibernated");
    // Woken by the call, under the same id, its thread still counting.
    const first = Number((await sb.runCode("print(n[0])")).stdout.trim());
    await new Promise((ok) => setTimeout(ok, 100));
    assert.ok(Number((await sb.runCode("print(n[0])")).stdout.trim()) > first);
    assert.equal((await sb.hibernate()).state, "hibernated");
    assert.equal((await sb.runCode("print(n[0] > 0)")).stdout, "True\n");
  });
});
