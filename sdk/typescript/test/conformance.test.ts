// The behaviour both SDKs share (sdk/conformance.json; the Python SDK checks the same file
// in sdk/python/tests/test_conformance.py).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { ForkResult, Sandbox } from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

interface Run {
  name: string;
  command: string;
  args: string[];
  stdout: string;
  stdout_bytes: string;
  stderr: string;
  exit_code: number;
}
interface Callback {
  name: string;
  command: string;
  args: string[];
  stdout_lines: string[];
}
interface Spec {
  runs: Run[];
  callbacks: Callback[];
  create_defaults: { cpus: number; memory_mb: number; network_mode: string };
  fork: { count: number; is_a_list: boolean };
}

const spec: Spec = JSON.parse(readFileSync(join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "conformance.json"), "utf8"));

let daemon: Daemon;
let sb: Sandbox;

before(async () => {
  daemon = await startDaemon();
  sb = await Sandbox.create({ image: "busybox", memoryMb: 128, client: daemon.client });
});

after(async () => {
  await sb?.terminate();
  await daemon?.stop();
});

for (const c of spec.runs) {
  test(`run: ${c.name}`, async () => {
    const r = await sb.run(c.command, c.args);
    assert.deepEqual([r.stdout, r.stderr, r.exitCode], [c.stdout, c.stderr, c.exit_code]);
    assert.equal(r.stdoutBytes.toString("utf8"), c.stdout_bytes);
  });
}

for (const c of spec.callbacks) {
  test(`callbacks: ${c.name}`, async () => {
    const seen: string[] = [];
    await sb.run(c.command, c.args, { onStdout: (line) => seen.push(line) });
    assert.deepEqual(seen, c.stdout_lines);
  });
}

test("create defaults", async () => {
  const fresh = await Sandbox.create({ image: "busybox", client: daemon.client });
  try {
    const want = spec.create_defaults;
    assert.deepEqual([fresh.info.cpus, fresh.info.memoryMb, fresh.info.network.mode], [want.cpus, want.memory_mb, want.network_mode]);
  } finally {
    await fresh.terminate();
  }
});

test("a fork result is an array", async () => {
  const source = await Sandbox.create({ image: "busybox", memoryMb: 128, client: daemon.client });
  try {
    const snap = await source.checkpoint({ type: "memory" });
    const result = await snap.fork(spec.fork.count);
    try {
      assert.equal(Array.isArray(result), spec.fork.is_a_list);
      assert.ok(result instanceof ForkResult);
      assert.equal(result.length, spec.fork.count);
      assert.equal(result.snapshotId, snap.id);
    } finally {
      await result.terminateAll();
      await snap.delete();
    }
  } finally {
    await source.terminate();
  }
});
