/**
 * A real sandfork daemon for the tests, on a fresh data directory of its own: started by
 * `startDaemon`, and on `stop` every sandbox it still has is terminated, the daemon gets
 * SIGTERM, and the test fails if a container, mount or loop device is left behind.
 *
 * The binary is `$SANDFORK_BIN`, else `$CARGO_TARGET_DIR/debug/sandfork`, else the
 * repository's `target/debug/sandfork`.
 */

import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { accessSync, constants, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client, Sandbox } from "../src/index.js";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** A daemon started for a test file. */
export interface Daemon {
  url: string;
  root: string;
  client: Client;
  stop(): Promise<void>;
}

function binary(): string {
  const candidates = process.env.SANDFORK_BIN
    ? [process.env.SANDFORK_BIN]
    : [join(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"), "debug", "sandfork"), join(REPO, "target", "debug", "sandfork")];
  for (const path of candidates) {
    try {
      accessSync(path, constants.X_OK);
      return path;
    } catch {
      // next
    }
  }
  throw new Error(`the sandfork daemon is not built (looked at ${candidates.join(", ")}): run make build`);
}

function logTail(log: string): string {
  try {
    return readFileSync(log, "utf8").split("\n").slice(-40).join("\n");
  } catch {
    return "(no log)";
  }
}

/** Starts `sandfork serve` on a new temporary directory; resolves once it is healthy. */
export async function startDaemon(): Promise<Daemon> {
  // A short path: Unix socket paths are limited to 107 bytes.
  const root = mkdtempSync(join(tmpdir(), "sfts-"));
  const socket = join(root, "s.sock");
  const log = join(root, "daemon.log");
  const out = openSync(log, "a");
  const child: ChildProcess = spawn(binary(), ["serve", "--data-dir", join(root, "data"), "--socket", socket, "--default-image", "busybox"], {
    stdio: ["ignore", out, out],
    detached: true,
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "info" },
  });
  const url = `unix://${socket}`;
  const client = new Client({ url, timeoutMs: 5_000 });
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the daemon exited with ${child.exitCode} before it was healthy:\n${logTail(log)}`);
    try {
      if ((await client.health()).status === "ok") break;
    } catch {
      // not yet
    }
    if (Date.now() > deadline) throw new Error(`the daemon was not healthy within 60 s:\n${logTail(log)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const stop = async () => {
    const left: string[] = [];
    if (child.exitCode === null) {
      for (const sb of await Sandbox.list({ client })) {
        left.push(sb.id);
        await sb.terminate().catch(() => undefined);
      }
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([exited, new Promise((r) => (timer = setTimeout(r, 60_000)))]);
      clearTimeout(timer);
      if (child.exitCode === null) {
        child.kill("SIGKILL");
        throw new Error(`the daemon did not stop within 60 s of SIGTERM:\n${logTail(log)}`);
      }
    }
    const leaks = leaksUnder(root);
    if (leaks.length === 0 && !process.env.SANDFORK_TEST_KEEP) rmSync(root, { recursive: true, force: true });
    if (left.length) throw new Error(`sandboxes left running by the tests: ${left.join(", ")}`);
    if (leaks.length) throw new Error(`the daemon left these behind (kept ${root}):\n${leaks.join("\n")}`);
  };
  return { url, root, client: new Client({ url }), stop };
}

/** Mounts, loop devices and runc containers under `root`. */
function leaksUnder(root: string): string[] {
  const found: string[] = [];
  for (const line of readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
    const point = line.split(" ")[4]?.replace(/\\040/g, " ");
    if (point && (point === root || point.startsWith(root + "/"))) found.push(`mount ${point}`);
  }
  for (const dev of readdirSync("/sys/block").filter((d) => d.startsWith("loop"))) {
    const backing = join("/sys/block", dev, "loop", "backing_file");
    if (existsSync(backing) && readFileSync(backing, "utf8").trim().startsWith(root + "/")) found.push(`loop device ${dev}`);
  }
  const runcRoot = join(root, "data", "runc");
  if (existsSync(runcRoot)) {
    const listed = spawnSync("runc", ["--root", runcRoot, "list", "--quiet"], { encoding: "utf8" });
    for (const id of (listed.stdout ?? "").split("\n").filter(Boolean)) found.push(`runc container ${id}`);
  }
  return found;
}
