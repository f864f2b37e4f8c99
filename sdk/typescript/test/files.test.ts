/** The files API through the SDK, against a live server. */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { BadRequestError, ConflictError, NotFoundError, Sandbox, type WatchEvent } from "forkbox";

let sb: Sandbox;
before(async () => {
  sb = await Sandbox.create();
});
after(async () => {
  await sb.close();
});

const text = (b: Uint8Array) => new TextDecoder().decode(b);

/** A stream of `chunks` chunks of 1 MiB, each byte its chunk's number. */
function chunked(chunks: number): { stream: ReadableStream<Uint8Array>; sha256: string } {
  const hash = createHash("sha256");
  const all: Uint8Array[] = [];
  for (let i = 0; i < chunks; i++) {
    const c = new Uint8Array(1 << 20).fill(i);
    hash.update(c);
    all.push(c);
  }
  let i = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(ctl) {
      if (i < all.length) ctl.enqueue(all[i++]!);
      else ctl.close();
    },
  });
  return { stream, sha256: hash.digest("hex") };
}

describe("upload and download", () => {
  test("a string, seen by the REPL; relative paths start at /root", async () => {
    assert.deepEqual(await sb.files.upload("notes/a.txt", "héllo\n"), { path: "/root/notes/a.txt", bytes: 7 });
    assert.equal((await sb.runCode("open('/root/notes/a.txt').read()")).text, "'héllo\\n'");
    assert.equal(text(await sb.files.download("/root/notes/a.txt")), "héllo\n");
  });

  test("bytes round-trip exactly", async () => {
    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
    await sb.files.upload("/tmp/bytes.bin", bytes);
    assert.deepEqual(await sb.files.download("/tmp/bytes.bin"), bytes);
    assert.equal((await sb.runCode("list(open('/tmp/bytes.bin', 'rb').read()) == list(range(256))")).text, "True");
  });

  test("a ReadableStream is streamed up; downloadStream streams down", async () => {
    const { stream, sha256 } = chunked(8);
    assert.deepEqual(await sb.files.upload("/tmp/big.bin", stream), { path: "/tmp/big.bin", bytes: 8 << 20 });
    const check = await sb.runCode("sha256sum /tmp/big.bin | cut -d' ' -f1", { language: "bash" });
    assert.equal(check.stdout.trim(), sha256);
    const hash = createHash("sha256");
    let chunks = 0;
    for await (const chunk of await sb.files.downloadStream("/tmp/big.bin")) {
      hash.update(chunk);
      chunks++;
    }
    assert.equal(hash.digest("hex"), sha256);
    assert.ok(chunks > 1, "the download came in pieces");
  });

  test("range reads part of a file", async () => {
    await sb.files.upload("/tmp/digits", "0123456789");
    assert.equal(text(await sb.files.download("/tmp/digits", { range: { offset: 2, length: 3 } })), "234");
    assert.equal(text(await sb.files.download("/tmp/digits", { range: { offset: 7 } })), "789");
    const stream = await sb.files.downloadStream("/tmp/digits", { range: { offset: 0, length: 1 } });
    assert.equal(text(new Uint8Array(await new Response(stream).arrayBuffer())), "0");
  });

  test("mode, append and parents", async () => {
    await sb.files.upload("/tmp/m/secret", "a", { mode: 0o600 });
    assert.equal((await sb.files.stat("/tmp/m/secret")).mode, 0o600);
    await sb.files.upload("/tmp/m/secret", "b", { append: true });
    assert.equal(text(await sb.files.download("/tmp/m/secret")), "ab");
    await assert.rejects(() => sb.files.upload("/tmp/missing/dir/f", "x", { parents: false }), NotFoundError);
    await assert.rejects(() => sb.files.download("/tmp/nothing-here"), NotFoundError);
    await assert.rejects(() => sb.files.upload("/tmp/m", "x"), ConflictError);
    await assert.rejects(() => sb.files.download("/proc/self/status"), BadRequestError);
  });
});

describe("metadata and changes", () => {
  test("list: entries sorted by name, links described, limit truncates", async () => {
    await sb.files.mkdir("/tmp/l/sub");
    await sb.files.upload("/tmp/l/b.txt", "12345");
    await sb.runCode("ln -s b.txt /tmp/l/a-link", { language: "bash" });
    const l = await sb.files.list("/tmp/l");
    assert.equal(l.path, "/tmp/l");
    assert.equal(l.truncated, false);
    assert.deepEqual(
      l.entries.map((e) => [e.name, e.type]),
      [
        ["a-link", "symlink"],
        ["b.txt", "file"],
        ["sub", "dir"],
      ],
    );
    assert.equal(l.entries[0]!.target, "b.txt");
    const one = await sb.files.list("/tmp/l", { limit: 1 });
    assert.equal(one.entries.length, 1);
    assert.equal(one.truncated, true);
  });

  test("stat follows links", async () => {
    await sb.files.upload("/tmp/s/f", "12345");
    await sb.runCode("ln -sf /tmp/s/f /tmp/s/link", { language: "bash" });
    const st = await sb.files.stat("/tmp/s/link");
    assert.equal(st.type, "file");
    assert.equal(st.size, 5);
    assert.equal(st.uid, 0);
    assert.ok(Math.abs(st.mtime_ms - Date.now()) < 60_000);
  });

  test("mkdir makes parents with a mode", async () => {
    const info = await sb.files.mkdir("/tmp/deep/er/dir", { mode: 0o700 });
    assert.equal(info.type, "dir");
    assert.equal(info.path, "/tmp/deep/er/dir");
    assert.equal(info.mode, 0o700);
    assert.equal((await sb.runCode("test -d /tmp/deep/er/dir && echo yes", { language: "bash" })).stdout, "yes\n");
  });

  test("remove: a file, a non-empty directory only with recursive", async () => {
    await sb.files.upload("/tmp/r/x/f", "1");
    await sb.files.remove("/tmp/r/x/f");
    await assert.rejects(() => sb.files.stat("/tmp/r/x/f"), NotFoundError);
    await sb.files.upload("/tmp/r/x/g", "1");
    await assert.rejects(() => sb.files.remove("/tmp/r"), ConflictError);
    await sb.files.remove("/tmp/r", { recursive: true });
    await assert.rejects(() => sb.files.stat("/tmp/r"), NotFoundError);
  });

  test("rename, refusing to replace unless overwrite", async () => {
    await sb.files.upload("/tmp/n/from", "new");
    await sb.files.upload("/tmp/n/to", "old");
    await assert.rejects(() => sb.files.rename("/tmp/n/from", "/tmp/n/to"), ConflictError);
    await sb.files.rename("/tmp/n/from", "/tmp/n/to", { overwrite: true });
    assert.equal(text(await sb.files.download("/tmp/n/to")), "new");
    await sb.files.rename("/tmp/n/to", "/tmp/n/moved");
    await assert.rejects(() => sb.files.stat("/tmp/n/to"), NotFoundError);
  });

  test("chmod sets permission bits", async () => {
    await sb.files.upload("/tmp/run.sh", "#!/bin/sh\necho ran\n");
    await sb.files.chmod("/tmp/run.sh", 0o755);
    assert.equal((await sb.files.stat("/tmp/run.sh")).mode, 0o755);
    assert.equal((await sb.runCode("/tmp/run.sh", { language: "bash" })).stdout, "ran\n");
  });

  test("watch reports changes from the REPL and the API, and ends on close", async () => {
    await sb.files.mkdir("/tmp/w");
    const watch = await sb.files.watch("/tmp/w");
    await sb.files.upload("/tmp/w/api.txt", "1");
    await sb.runCode("import os\nos.mkdir('/tmp/w/d')\nopen('/tmp/w/d/repl.txt', 'w').write('2')");
    const seen: WatchEvent[] = [];
    for await (const ev of watch) {
      seen.push(ev);
      if (ev.path === "/tmp/w/d/repl.txt") break;
    }
    const created = seen.filter((e) => e.type === "created").map((e) => [e.path, e.dir ?? false]);
    assert.deepEqual(created.slice(0, 2), [
      ["/tmp/w/api.txt", false],
      ["/tmp/w/d", true],
    ]);
    assert.ok(seen.every((e) => typeof e.ts === "number"));
    // close() ends an iteration that is waiting for the next event.
    const quiet = await sb.files.watch("/tmp/w", { recursive: false });
    const done = (async () => {
      for await (const _ of quiet) assert.fail("nothing changed");
      return "ended";
    })();
    await new Promise((ok) => setTimeout(ok, 100));
    quiet.close();
    assert.equal(await done, "ended");
  });

  test("a watch ends when its directory is removed", { timeout: 10_000 }, async () => {
    await sb.files.mkdir("/tmp/gone");
    const watch = await sb.files.watch("/tmp/gone");
    await sb.files.upload("/tmp/gone/f", "1");
    await sb.files.remove("/tmp/gone", { recursive: true });
    const seen: string[] = [];
    for await (const ev of watch) seen.push(`${ev.type} ${ev.path}`);
    assert.equal(seen[0], "created /tmp/gone/f");
  });
});
