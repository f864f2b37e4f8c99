/**
 * `npm test`: start one forkbox server with an API key, run every test file
 * with `node --test` against it (the SDK finds it through FORKBOX_URL and
 * FORKBOX_API_KEY), check that the tests left no sandbox, space or custom template behind, stop it.
 *
 *   node build/test/run.js                      every *.test.js
 *   node build/test/run.js files.test.js ...    some of them
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TestServer } from "./server.js";

const here = dirname(fileURLToPath(import.meta.url));
const picked = process.argv.slice(2);
const files = (picked.length > 0 ? picked : readdirSync(here).filter((f) => f.endsWith(".test.js")).sort()).map((f) =>
  join(here, f),
);

const apiKey = randomBytes(16).toString("hex");
const server = await TestServer.start({ name: "sdkts", apiKey });
let status = 1;
try {
  const env = { ...process.env, FORKBOX_URL: server.url, FORKBOX_API_KEY: apiKey };
  const child = spawn(process.execPath, ["--test", "--test-reporter=spec", ...files], { stdio: "inherit", env });
  status = await new Promise<number>((ok) => child.once("exit", (code) => ok(code ?? 1)));

  const headers = { authorization: `Bearer ${apiKey}` };
  const left = ((await (await fetch(`${server.url}/v1/sandboxes`, { headers })).json()) as { sandboxes: { id: string }[] }).sandboxes;
  if (left.length > 0) {
    console.error(`the tests left ${left.length} sandbox(es) behind: ${left.map((s) => s.id).join(" ")}`);
    status ||= 1;
  }
  // Until the state routes land, /v1/spaces is 404: nothing to check.
  const spaces = await fetch(`${server.url}/v1/spaces`, { headers });
  const kept = spaces.ok ? ((await spaces.json()) as { spaces: { space_id: string }[] }).spaces : [];
  if (kept.length > 0) {
    console.error(`the tests left ${kept.length} space(s) behind: ${kept.map((s) => s.space_id).join(" ")}`);
    status ||= 1;
  }
  const templates = (await (await fetch(`${server.url}/v1/templates`, { headers })).json()) as { name: string; kind: string }[];
  const custom = templates.filter((t) => t.kind !== "builtin");
  if (custom.length > 0) {
    console.error(`the tests left ${custom.length} template(s) behind: ${custom.map((t) => t.name).join(" ")}`);
    status ||= 1;
  }
} finally {
  const code = await server.stop({ keepLog: status !== 0 });
  if (status !== 0) console.error(`server log: ${server.logPath}`);
  if (code !== 0) {
    console.error(`the server exited with ${code}`);
    status ||= 1;
  }
}
process.exit(status);
