/**
 * Custom templates (docs/templates.md), against a live server: a sandbox saved
 * as a template, a recipe built with its event stream, list, get and delete.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, test } from "node:test";
import {
  BadRequestError,
  Client,
  ConflictError,
  ForkboxError,
  NotFoundError,
  Sandbox,
  type BuildEvent,
  type TemplateRecipe,
} from "forkbox";

const client = new Client();

function unique(prefix: string): string {
  return `sdkts-${prefix}-${randomBytes(4).toString("hex")}`;
}

/** A recipe that builds in a second: two files (text, and bytes with a mode) and a command using them. */
function tinyRecipe(name: string): TemplateRecipe {
  return {
    name,
    description: "two files and a command",
    files: [
      { path: "/opt/tiny/hello.txt", content: "hello from the recipe\n" },
      { path: "/opt/tiny/run.sh", content: new TextEncoder().encode("#!/bin/sh\necho ran\n"), mode: 0o755 },
    ],
    commands: ["echo building; /opt/tiny/run.sh > /opt/tiny/out.txt"],
  };
}

/** Delete templates a test made (forced), whatever happened. */
async function dropTemplates(names: string[]): Promise<void> {
  for (const name of names) await client.deleteTemplate(name, { force: true }).catch(() => {});
}

describe("templates", () => {
  test("saveTemplate, create from it, get, list, delete (409, then forced)", async () => {
    const name = unique("saved");
    try {
      await using src = await Sandbox.create();
      await src.runCode("answer = 41\nwith open('/root/notes.txt', 'w') as f:\n    f.write('from the source')");
      const info = await src.saveTemplate(name, { description: "the answer, loaded" });
      assert.equal(info.name, name);
      assert.equal(info.kind, "saved");
      assert.equal(info.state, "ready");
      assert.equal(info.saved_from, src.id);
      assert.equal(info.base, "default");
      assert.equal(info.description, "the answer, loaded");
      assert.equal((await src.runCode("answer")).text, "41");

      await using made = await Sandbox.create({ template: name });
      assert.equal((await made.info()).template, name);
      assert.equal((await made.runCode("answer + 1")).text, "42");
      assert.equal(new TextDecoder().decode(await made.files.download("/root/notes.txt")), "from the source");

      const got = await client.getTemplate(name);
      assert.equal(got.kind, "saved");
      assert.deepEqual(got.in_use.sandboxes, [made.id]);
      assert.ok((await client.listTemplates()).some((t) => t.name === name));

      const refused = await client.deleteTemplate(name).then(
        () => assert.fail("deleted while in use"),
        (e: unknown) => e,
      );
      assert.ok(refused instanceof ConflictError, String(refused));
      assert.match(refused.message, /in use.*force/);
      await client.deleteTemplate(name, { force: true });
      await assert.rejects(() => client.getTemplate(name), NotFoundError);
      assert.ok(!(await client.listTemplates()).some((t) => t.name === name));
      assert.equal(new TextDecoder().decode(await made.files.download("/root/notes.txt")), "from the source");
      await assert.rejects(() => Sandbox.create({ template: name }), NotFoundError);
    } finally {
      await dropTemplates([name]);
    }
  });

  test("buildTemplate streams its events; an unchanged recipe is all cached", async () => {
    const name = unique("built");
    try {
      const recipe = tinyRecipe(name);
      const events: BuildEvent[] = [];
      const info = await client.buildTemplate(recipe, { onEvent: (ev) => events.push(ev) });

      assert.deepEqual(
        events.filter((e) => e.type !== "log").map((e) => e.type),
        ["step", "step", "done"],
      );
      const steps = events.flatMap((e) => (e.type === "step" ? [[e.index, e.total, e.cached]] : []));
      assert.deepEqual(steps, [
        [1, 2, false],
        [2, 2, false],
      ]);
      assert.ok(events.some((e) => e.type === "log" && e.text === "building\n"), JSON.stringify(events));
      assert.deepEqual(events.at(-1), { type: "done", template: info });
      assert.equal(info.name, name);
      assert.equal(info.kind, "recipe");
      assert.equal(info.state, "ready");
      assert.equal(info.base, "default");
      assert.deepEqual(info.recipe?.commands, recipe.commands);
      assert.deepEqual(
        info.recipe?.files?.map((f) => f.path),
        ["/opt/tiny/hello.txt", "/opt/tiny/run.sh"],
      );

      {
        await using sb = await Sandbox.create({ template: name });
        const text = async (p: string) => new TextDecoder().decode(await sb.files.download(p));
        assert.equal(await text("/opt/tiny/hello.txt"), "hello from the recipe\n");
        assert.equal(await text("/opt/tiny/out.txt"), "ran\n");
        assert.equal((await sb.files.stat("/opt/tiny/run.sh")).mode & 0o777, 0o755);

        const again: BuildEvent[] = [];
        const same = await client.buildTemplate(recipe, { onEvent: (ev) => again.push(ev) });
        assert.deepEqual(
          again.flatMap((e) => (e.type === "step" ? [e.cached] : [])),
          [true, true],
        );
        assert.ok(!again.some((e) => e.type === "log"));
        assert.equal(same.created_at, info.created_at);
        assert.deepEqual((await client.getTemplate(name)).in_use.sandboxes, [sb.id]);
        assert.equal((await client.listTemplates()).find((t) => t.name === name)?.kind, "recipe");
      }
      await client.deleteTemplate(name); // nothing uses it any more: no force needed
      await assert.rejects(() => client.deleteTemplate(name), NotFoundError);
    } finally {
      await dropTemplates([name]);
    }
  });

  test("a failed build rejects with the server's message; bad recipes are typed errors", async () => {
    const name = unique("fails");
    const events: BuildEvent[] = [];
    const failed = await client
      .buildTemplate({ name, commands: ["echo about to fail; exit 3"] }, { onEvent: (ev) => events.push(ev) })
      .then(
        () => assert.fail("the build succeeded"),
        (e: unknown) => e,
      );
    assert.ok(failed instanceof ForkboxError, String(failed));
    assert.equal(failed.message, "step 1 (run echo about to fail; exit 3): exited with 3");
    assert.equal(failed.status, undefined);
    assert.deepEqual(events.at(-1), { type: "error", error: failed.message });
    assert.ok(events.some((e) => e.type === "log" && e.stream === "stdout" && e.text === "about to fail\n"));
    await assert.rejects(() => client.getTemplate(name), NotFoundError);

    await assert.rejects(() => client.buildTemplate({ name: "Not A Name" }), BadRequestError);
    await assert.rejects(() => client.buildTemplate({ name, base: unique("no-such-base") }), NotFoundError);
    await assert.rejects(() => client.buildTemplate({ name: "default" }), ConflictError);
    await assert.rejects(() => client.deleteTemplate("default"), ConflictError);
    assert.equal((await client.listTemplates()).find((t) => t.name === "default")?.kind, "builtin");
  });
});
