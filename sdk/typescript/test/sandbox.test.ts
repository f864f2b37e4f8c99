/** Sandbox lifecycle, configuration, errors, pause, egress and ports, against a live server. */
import assert from "node:assert/strict";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  BadRequestError,
  Client,
  ConflictError,
  DEFAULT_URL,
  ForkboxError,
  NotFoundError,
  PayloadTooLargeError,
  RateLimitedError,
  Sandbox,
  ServerError,
  UnauthorizedError,
  type EventStream,
  type WatchEvent,
} from "forkbox";
import { TestServer } from "./server.js";

const URL = process.env.FORKBOX_URL!;
const KEY = process.env.FORKBOX_API_KEY!;

/** Run `fn` with some environment variables replaced, then put them back. */
async function withEnv<T>(vars: Record<string, string | undefined>, fn: () => T | Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const apply = (v: Record<string, string | undefined>) => {
    for (const [k, x] of Object.entries(v)) {
      if (x === undefined) delete process.env[k];
      else process.env[k] = x;
    }
  };
  apply(vars);
  try {
    return await fn();
  } finally {
    apply(saved);
  }
}

/** The error `fn` throws, checked to be an instance of `cls`. */
async function rejects<E extends Error>(fn: () => Promise<unknown>, cls: new (...a: never[]) => E): Promise<E> {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${String(e)}`);
    assert.ok(e instanceof ForkboxError);
    return e;
  }
  assert.fail(`expected ${cls.name}, nothing was thrown`);
}

describe("create, connect, info, list, close", () => {
  test("create passes every setting and info reports them", async () => {
    await using sb = await Sandbox.create({
      template: "default",
      timeoutSeconds: 120,
      idleTimeoutSeconds: 60,
      ramMib: 256,
      rootfsGb: 2,
      egress: false,
      persistent: false,
    });
    assert.match(sb.id, /^sb-[a-z2-7]{20}$/);
    const info = await sb.info();
    assert.equal(info.id, sb.id);
    assert.equal(info.template, "default");
    assert.equal(info.timeout_seconds, 120);
    assert.equal(info.idle_timeout_seconds, 60);
    assert.equal(info.ram_mib, 256);
    assert.equal(info.rootfs_gb, 2);
    assert.equal(info.egress, false);
    assert.equal(info.persistent, false);
    assert.equal(info.state, "ready");
    assert.equal(info.expires_at - info.created_at, 120_000);
  });

  test("connect gives a handle on the same sandbox; an unknown id is NotFoundError", async () => {
    await using sb = await Sandbox.create();
    await sb.runCode("shared = 'from the first handle'");
    const again = await Sandbox.connect(sb.id);
    assert.equal(again.id, sb.id);
    assert.equal((await again.runCode("shared")).text, "'from the first handle'");
    const e = await rejects(() => Sandbox.connect("sb-aaaaaaaaaaaaaaaaaaaa"), NotFoundError);
    assert.equal(e.status, 404);
    assert.match(e.message, /sb-aaaaaaaaaaaaaaaaaaaa/);
  });

  test("list includes live sandboxes", async () => {
    await using a = await Sandbox.create();
    await using b = await Sandbox.create();
    const ids = (await Sandbox.list()).map((s) => s.id);
    assert.ok(ids.includes(a.id) && ids.includes(b.id), ids.join(" "));
    assert.ok(ids.indexOf(a.id) < ids.indexOf(b.id), "oldest first");
  });

  test("close destroys the sandbox and may be repeated", async () => {
    const sb = await Sandbox.create();
    await sb.close();
    await rejects(() => sb.info(), NotFoundError);
    await sb.close();
    assert.ok(!(await Sandbox.list()).some((s) => s.id === sb.id));
  });

  test("await using closes the sandbox at the end of the block", async () => {
    let id: string;
    {
      await using sb = await Sandbox.create();
      id = sb.id;
      assert.equal((await sb.info()).id, id);
    }
    await rejects(() => Sandbox.connect(id), NotFoundError);
  });
});

describe("configuration", () => {
  test("FORKBOX_URL and FORKBOX_API_KEY are the defaults", () => {
    const c = new Client();
    assert.equal(c.url, URL);
    assert.equal(c.apiKey, KEY);
    assert.deepEqual(c.authHeaders(), { authorization: `Bearer ${KEY}` });
  });

  test("without the environment: 127.0.0.1:7070 and no key", async () => {
    await withEnv({ FORKBOX_URL: undefined, FORKBOX_API_KEY: undefined }, () => {
      const c = new Client();
      assert.equal(c.url, DEFAULT_URL);
      assert.equal(DEFAULT_URL, "http://127.0.0.1:7070");
      assert.equal(c.apiKey, undefined);
      assert.deepEqual(c.authHeaders(), {});
    });
  });

  test("options win over the environment, and forks share them", async () => {
    await withEnv({ FORKBOX_URL: "http://127.0.0.1:9", FORKBOX_API_KEY: "wrong" }, async () => {
      await using sb = await Sandbox.create({ url: URL + "/", apiKey: KEY });
      assert.equal(sb.client.url, URL);
      const [kid] = await sb.fork(1);
      await using _kid = kid!;
      assert.equal((await kid!.runCode("1 + 1")).text, "2");
    });
  });

  test("a wrong or missing key is UnauthorizedError", async () => {
    const e = await rejects(() => Sandbox.create({ apiKey: "not-the-key" }), UnauthorizedError);
    assert.equal(e.status, 401);
    assert.equal(e.message, "missing or invalid API key");
    await withEnv({ FORKBOX_API_KEY: undefined }, () => rejects(() => Sandbox.list(), UnauthorizedError));
  });
});

describe("errors", () => {
  test("a bad setting is BadRequestError with the server's message", async () => {
    const e = await rejects(() => Sandbox.create({ ramMib: 63 }), BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.message, "ram_mib must be between 64 and 16384, got 63");
    assert.deepEqual(e.body, { error: e.message });
    await using sb = await Sandbox.create();
    await rejects(() => sb.fork(0), BadRequestError);
  });

  test("an unknown template is NotFoundError", async () => {
    await rejects(() => Sandbox.create({ template: "no-such-template" }), NotFoundError);
  });

  test("code over 10 MiB is PayloadTooLargeError", async () => {
    await using sb = await Sandbox.create();
    const e = await rejects(() => sb.runCode("#".repeat(10 * 1024 * 1024 + 1)), PayloadTooLargeError);
    assert.equal(e.status, 413);
  });

  test("merging a sandbox that is not a fork descendant is ConflictError", async () => {
    await using a = await Sandbox.create();
    await using b = await Sandbox.create();
    const e = await rejects(() => a.mergeInto(b), ConflictError);
    assert.equal(e.status, 409);
  });

  test("a ninth watch of one sandbox is RateLimitedError", async () => {
    await using sb = await Sandbox.create();
    const watches: EventStream<WatchEvent>[] = [];
    try {
      for (let i = 0; i < 8; i++) watches.push(await sb.files.watch("/root"));
      const e = await rejects(() => sb.files.watch("/root"), RateLimitedError);
      assert.equal(e.status, 429);
      assert.equal(e.retryAfter, 1); // the server's Retry-After
    } finally {
      for (const w of watches) w.close();
    }
  });

  test("a server whose template is not built answers ServerError (503)", async () => {
    const root = process.env.FORKBOX_SDKTS_ROOT ?? "/var/lib/forkbox-sdkts";
    const empty = join(root, `empty-templates-${process.pid}`);
    mkdirSync(empty, { recursive: true });
    const srv = await TestServer.start({ name: "sdkts-503", templatesDir: empty, waitReady: false });
    try {
      const e = await rejects(() => Sandbox.create({ url: srv.url }), ServerError);
      assert.equal(e.status, 503);
      assert.match(e.message, /template `default`/);
    } finally {
      await srv.stop();
      rmSync(empty, { recursive: true, force: true });
    }
  });
});

describe("pause, resume, egress, ports, replay", () => {
  test("pause stops the sandbox and resume continues it with its state", async () => {
    await using sb = await Sandbox.create();
    await sb.runCode("kept = 7");
    assert.equal((await sb.pause()).state, "paused");
    assert.equal((await sb.info()).state, "paused");
    assert.equal((await sb.resume()).state, "ready");
    assert.equal((await sb.runCode("kept * 6")).text, "42");
  });

  test("getEgress and setEgress read and replace the policy in force", async () => {
    await using sb = await Sandbox.create({ egress: false });
    assert.equal(await sb.getEgress(), false);
    const allow = { allow: ["pypi.org", "*.pythonhosted.org", "203.0.113.0/24"] };
    assert.deepEqual(await sb.setEgress(allow), allow);
    assert.deepEqual(await sb.getEgress(), allow);
    assert.deepEqual((await sb.info()).egress, allow);
    assert.equal(await sb.setEgress(true), true);
    await rejects(() => sb.setEgress({ allow: ["not a domain!"] }), BadRequestError);
    assert.equal(await sb.getEgress(), true);
  });

  test("portUrl reaches a service listening inside the sandbox", async () => {
    await using sb = await Sandbox.create({ egress: false });
    await sb.files.upload("/root/site/hello.txt", "hello from the sandbox");
    await sb.runCode("nohup python3 -m http.server 8000 --directory /root/site >/tmp/http.log 2>&1 &", { language: "bash" });
    assert.equal(sb.portUrl(8000, "/hello.txt"), `${URL}/v1/sandboxes/${sb.id}/ports/8000/hello.txt`);
    let res: Response | undefined;
    for (let i = 0; i < 100; i++) {
      res = await fetch(sb.portUrl(8000, "hello.txt"), { headers: sb.client.authHeaders() });
      if (res.status !== 502) break;
      await res.arrayBuffer();
      await new Promise((ok) => setTimeout(ok, 100));
    }
    assert.equal(res!.status, 200);
    assert.equal(await res!.text(), "hello from the sandbox");
    const unauthenticated = await fetch(sb.portUrl(8000, "hello.txt"));
    assert.equal(unauthenticated.status, 401);
    await unauthenticated.arrayBuffer();
  });

  test("replay returns the events of earlier execs", async () => {
    await using sb = await Sandbox.create();
    await sb.runCode("print('first')");
    await sb.runCode("print('second')");
    const events = await sb.replay();
    const out = events.filter((e) => e.type === "stdout").map((e) => e.data);
    assert.deepEqual(out, ["first", "second"]);
    assert.equal(events.filter((e) => e.type === "exit").length, 2);
  });
});
