// The package as users get it: `npm pack`, installed into a new project, imported and
// type-checked there, and driving a real daemon; the SDK's types match the OpenAPI document.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { startDaemon, type Daemon } from "./daemon.js";

const PACKAGE = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
let daemon: Daemon;
let work: string;

before(async () => {
  daemon = await startDaemon();
  work = mkdtempSync(join(tmpdir(), "sfts-pack-"));
});

after(async () => {
  rmSync(work, { recursive: true, force: true });
  await daemon?.stop();
});

const npm = (args: string[], cwd: string) => execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8" });

test("the SDK's generated types are those of docs/openapi.json", () => {
  execFileSync(join(PACKAGE, "node_modules/.bin/openapi-typescript"), ["../../docs/openapi.json", "--output", "src/openapi.ts", "--check"], { cwd: PACKAGE, stdio: "pipe" });
});

test("npm pack makes a package that installs, type-checks and runs in a new project", () => {
  npm(["pack", "--pack-destination", work], PACKAGE);
  const tarball = readdirSync(work).find((f) => f.endsWith(".tgz"));
  assert.ok(tarball, "npm pack wrote a tarball");
  const project = join(work, "app");
  execFileSync("mkdir", ["-p", project]);
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  npm(["install", "--prefer-offline", join(work, tarball), "@types/node@20"], project);
  writeFileSync(
    join(project, "main.ts"),
    `import { Sandbox, NotFoundError, type CommandResult } from "sandfork";
const sb = await Sandbox.create({ image: "busybox", memoryMb: 64 });
try {
  const r: CommandResult = await sb.run("echo", ["from the package"]);
  const missing = await Sandbox.connect("sb-0000000000000000").catch((e: unknown) => e instanceof NotFoundError);
  console.log(JSON.stringify({ out: r.stdout, missing }));
} finally {
  await sb.terminate();
}
`,
  );
  writeFileSync(
    join(project, "tsconfig.json"),
    JSON.stringify({ compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true, types: ["node"], outDir: "out" }, files: ["main.ts"] }),
  );
  execFileSync(join(PACKAGE, "node_modules/.bin/tsc"), ["-p", project], { stdio: "pipe" });
  const out = execFileSync("node", [join(project, "out/main.js")], { cwd: project, encoding: "utf8", env: { ...process.env, SANDFORK_URL: daemon.url } });
  assert.deepEqual(JSON.parse(out), { out: "from the package", missing: true });
});
