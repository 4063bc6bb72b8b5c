// Checkpoints, restore, fork, suspend/resume and export/import, against a real daemon.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { after, before, test } from "node:test";

import { ForkResult, InvalidArgumentError, NotFoundError, Sandbox, Snapshot, UnsupportedError } from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

let daemon: Daemon;

before(async () => {
  daemon = await startDaemon();
});

after(async () => {
  await daemon?.stop();
});

/** A sandbox with a counter process holding state in memory, and a file on disk. */
async function warmParent(): Promise<Sandbox> {
  const sb = await Sandbox.create({ image: "busybox", memoryMb: 128, client: daemon.client });
  await sb.files.write("/data/state.txt", "disk state\n");
  // Renamed into place: a reader never sees the file empty between truncate and write.
  await sb.startProcess("sh", ["-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done"], { name: "counter" });
  await sb.run("sh", ["-c", "while [ ! -s /tmp/count ]; do sleep 0.02; done"]);
  return sb;
}

test("a memory checkpoint forks into independent warm sandboxes that cannot see each other's writes", async () => {
  const parent = await warmParent();
  try {
    const snap = await parent.checkpoint({ type: "memory", name: "warm", labels: { kind: "test" } });
    assert.equal(snap.type, "memory");
    assert.match(snap.id, /^snap-/);
    assert.equal(snap.info.sourceSandboxId, parent.id);
    const forks = await snap.fork(3, { perChild: [{ env: { WHO: "0" } }, { env: { WHO: "1" } }, { env: { WHO: "2" } }], labels: { role: "worker" } });
    try {
      assert.equal(forks.length, 3);
      assert.deepEqual(forks.errors, []);
      const counts = await Promise.all(
        forks.map(async (child, i) => {
          assert.deepEqual(child.info.labels, { role: "worker" });
          assert.equal((await child.run("sh", ["-c", "echo $WHO"])).stdout.trim(), String(i));
          assert.equal(await child.files.readText("/data/state.txt"), "disk state\n");
          // The counter process came along, running.
          const counter = await child.getProcess("counter");
          assert.equal(counter.info.status, "running");
          await child.files.write("/data/mine.txt", child.id);
          return Number((await child.files.readText("/tmp/count")).trim());
        }),
      );
      assert.ok(counts.every((c) => c > 0), counts.join(","));
      for (const child of forks) {
        assert.equal(await child.files.readText("/data/mine.txt"), child.id, "each fork sees its own write only");
      }
      assert.equal(await parent.files.exists("/data/mine.txt"), false);
    } finally {
      await forks.terminateAll();
    }
    const listed = await Snapshot.list({ source: parent.id, client: daemon.client });
    assert.deepEqual(listed.map((s) => s.id), [snap.id]);
    await snap.delete();
    await assert.rejects(Snapshot.get(snap.id, { client: daemon.client }), NotFoundError);
  } finally {
    await parent.terminate();
  }
});

test("a filesystem checkpoint restores the disk; a sandbox forks itself", async () => {
  const parent = await warmParent();
  try {
    const snap = await parent.checkpoint();
    assert.equal(snap.type, "filesystem");
    const restored = await snap.restore({ labels: { from: "fs" } });
    try {
      assert.equal(await restored.files.readText("/data/state.txt"), "disk state\n");
      assert.deepEqual(restored.info.labels, { from: "fs" });
    } finally {
      await restored.terminate();
    }
    const own = await parent.fork(2, { namePrefix: "ts-child" });
    try {
      // An array, as the Python SDK's fork result is a list.
      assert.ok(Array.isArray(own) && own instanceof ForkResult);
      assert.deepEqual(own.map((s) => s.name).sort(), ["ts-child-0", "ts-child-1"]);
      const counter = await own[0]!.getProcess("counter");
      assert.equal(counter.status, "running");
      assert.equal(counter.status, counter.info.status, "a process's fields are on it, as in Python");
    } finally {
      await own.terminateAll();
    }
    await assert.rejects(parent.fork(0), InvalidArgumentError);
  } finally {
    await parent.terminate();
  }
});

test("suspend frees the sandbox's processes and resume brings them back where they were", async () => {
  const sb = await warmParent();
  try {
    const suspended = await sb.suspend();
    assert.equal(suspended.state, "suspended");
    const resumed = await sb.resume();
    assert.equal(resumed.state, "running");
    assert.equal((await sb.getProcess("counter")).info.status, "running");
    // A call to a suspended sandbox resumes it.
    await sb.suspend();
    assert.equal(await sb.files.readText("/data/state.txt"), "disk state\n");
    assert.equal(await sb.state(), "running");
  } finally {
    await sb.terminate();
  }
});

test("an exported snapshot imports and restores the same", async () => {
  const sb = await warmParent();
  const local = mkdtempSync(join(tmpdir(), "sfts-export-"));
  try {
    const snap = await sb.checkpoint({ type: "memory" });
    const size = await snap.exportTo(join(local, "snap.sfk"));
    assert.equal(statSync(join(local, "snap.sfk")).size, size);
    await snap.delete();
    const imported = await Snapshot.import(join(local, "snap.sfk"), { client: daemon.client });
    assert.equal(imported.type, "memory");
    const back = await imported.restore();
    try {
      assert.equal(await back.files.readText("/data/state.txt"), "disk state\n");
      assert.equal((await back.getProcess("counter")).info.status, "running");
    } finally {
      await back.terminate();
      await imported.delete();
    }
    // A bad archive is refused with the reason, and nothing is kept.
    const ids = async () => (await Snapshot.list({ client: daemon.client })).map((s) => s.id).sort();
    const before = await ids();
    await assert.rejects(Snapshot.import(Readable.from([Buffer.from("not a snapshot")]), { client: daemon.client }), InvalidArgumentError);
    assert.deepEqual(await ids(), before);
  } finally {
    await sb.terminate();
    rmSync(local, { recursive: true, force: true });
  }
});

test("publishing needs an object store: a daemon without one says so, and lists its own", async () => {
  const sb = await Sandbox.create({ image: "busybox", memoryMb: 128, client: daemon.client });
  try {
    const snap = await sb.checkpoint();
    assert.equal(snap.published, false);
    await assert.rejects(snap.publish(), (e: unknown) => e instanceof UnsupportedError && /object_store/.test(String(e)));
    const listed = await Snapshot.list({ published: true, client: daemon.client });
    assert.ok(listed.some((s) => s.id === snap.id));
    await assert.rejects(snap.delete({ everywhere: true }), UnsupportedError);
    await snap.delete();
  } finally {
    await sb.terminate();
  }
});
