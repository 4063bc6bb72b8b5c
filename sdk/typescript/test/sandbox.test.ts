// Sandboxes, commands, background processes, files and errors, against a real daemon.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { ConflictError, InvalidArgumentError, NotFoundError, Sandbox, ConnectionError, Client } from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

let daemon: Daemon;
let sb: Sandbox;

before(async () => {
  daemon = await startDaemon();
  sb = await Sandbox.create({ image: "busybox", memoryMb: 128, labels: { suite: "ts" }, client: daemon.client });
});

after(async () => {
  await sb?.terminate();
  await daemon?.stop();
});

describe("sandboxes", () => {
  test("create waits until the sandbox runs, and its fields come camelCase", async () => {
    assert.equal(sb.info.state, "running");
    assert.match(sb.id, /^sb-[0-9a-f]{16}$/);
    assert.equal(sb.info.memoryMb, 128);
    assert.deepEqual(sb.info.labels, { suite: "ts" });
    assert.equal(typeof sb.info.createdAt, "string");
  });

  test("connect by name, list by labels, rename and relabel", async () => {
    await sb.update({ name: "ts-main" });
    const again = await Sandbox.connect("ts-main", { client: daemon.client });
    assert.equal(again.id, sb.id);
    const labels = await sb.updateLabels({ set: { "team/x": "rl" }, remove: ["suite"] });
    assert.deepEqual(labels, { "team/x": "rl" });
    const listed = await Sandbox.list({ labels: { "team/x": "rl" }, client: daemon.client });
    assert.deepEqual(listed.map((s) => s.id), [sb.id]);
    assert.deepEqual(await Sandbox.list({ labels: { "team/x": "other" }, client: daemon.client }), []);
    await sb.updateLabels({ set: { suite: "ts" }, remove: ["team/x"] });
  });

  test("an unknown sandbox is a NotFoundError with the API's code", async () => {
    await assert.rejects(Sandbox.connect("sb-0000000000000000", { client: daemon.client }), (e: unknown) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      return true;
    });
  });

  test("a bad request is an InvalidArgumentError naming what was wrong", async () => {
    await assert.rejects(Sandbox.create({ image: "busybox", cpus: -1, client: daemon.client }), (e: unknown) => {
      assert.ok(e instanceof InvalidArgumentError);
      assert.match(e.message, /cpus/);
      return true;
    });
    await assert.rejects(sb.updateLabels({ set: { "bad key!": "v" } }), InvalidArgumentError);
  });

  test("a daemon that is not there is a ConnectionError naming where it was looked for", async () => {
    const nowhere = new Client({ url: join(daemon.root, "absent.sock") });
    await assert.rejects(nowhere.health(), (e: unknown) => e instanceof ConnectionError && e.message.includes("absent.sock"));
  });

  test("stats read the sandbox's use", async () => {
    const stats = await sb.stats();
    assert.ok(stats.memoryBytes > 0 && stats.pids >= 1, JSON.stringify(stats));
    assert.equal(typeof stats.cpuSeconds, "number");
  });
});

describe("commands", () => {
  test("run gives exit code, output and its exact bytes", async () => {
    const r = await sb.run("sh", ["-c", "echo out; echo err >&2; exit 3"]);
    assert.equal(r.exitCode, 3);
    // One trailing newline removed, as in the Python SDK; the bytes are exact.
    assert.equal(r.stdout, "out");
    assert.equal(r.stderr, "err");
    assert.equal(r.stdoutBytes.toString(), "out\n");
    const bin = await sb.run("printf", ["\\377\\000a"]);
    assert.deepEqual([...bin.stdoutBytes], [0xff, 0, 0x61]);
  });

  test("env, working directory, user, stdin and timeout", async () => {
    const r = await sb.run("sh", ["-c", "echo $A; pwd; id -u; cat"], { env: { A: "1" }, workingDir: "/tmp", user: "65534", stdin: "in" });
    assert.equal(r.stdout, "1\n/tmp\n65534\nin");
    const slow = await sb.run("sleep", ["30"], { timeoutSecs: 0.5 });
    assert.ok(slow.timedOut);
    assert.equal(slow.signal, 9);
    assert.equal(slow.exitCode, -9);
  });

  test("a program that does not exist is an InvalidArgumentError with code exec_failed", async () => {
    await assert.rejects(sb.run("/bin/nope"), (e: unknown) => e instanceof InvalidArgumentError && e.code === "exec_failed");
  });

  test("output streams to callbacks and to an async iterator as it comes", async () => {
    const seen: string[] = [];
    const r = await sb.run("sh", ["-c", "for i in 1 2 3; do echo $i; sleep 0.1; done; printf end"], { onStdout: (d) => seen.push(d) });
    // A line at a time without its newline, as the Python SDK's on_stdout; the last
    // line without one comes at the end.
    assert.deepEqual(seen, ["1", "2", "3", "end"]);
    assert.equal(r.stdout, "1\n2\n3\nend");
    const stream = sb.stream("sh", ["-c", "echo a; echo b >&2; exit 4"]);
    const chunks = [];
    for await (const chunk of stream) chunks.push(`${chunk.stream}:${chunk.text}`);
    assert.deepEqual(chunks.sort(), ["stderr:b\n", "stdout:a\n"]);
    assert.equal((await stream.result).exitCode, 4);
  });

  test("an aborted command ends the call with an AbortError", async () => {
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 200);
    await assert.rejects(sb.run("sleep", ["30"], { signal: abort.signal }), (e: unknown) => (e as Error).name === "AbortError");
  });
});

describe("background processes", () => {
  test("start, feed stdin, read output with offsets, wait", async () => {
    const p = await sb.startProcess("sh", ["-c", "read line; echo got $line; echo late >&2"]);
    assert.equal(p.info.status, "running");
    await p.writeStdin("hello\n");
    const out = p.output();
    const texts: string[] = [];
    for await (const chunk of out) texts.push(chunk.text);
    assert.deepEqual(texts.sort(), ["got hello\n", "late\n"]);
    assert.equal((await out.result).exitCode, 0);
    const done = await p.wait();
    assert.equal(done.status, "exited");
    assert.equal(done.exitCode, 0);
    const again = p.output({ offset: 4, follow: false });
    const rest: string[] = [];
    for await (const chunk of again) if (chunk.stream === "stdout") rest.push(chunk.text);
    assert.deepEqual(rest, ["hello\n"]);
  });

  test("listed, signalled and killed; a named one is found by name", async () => {
    const p = await sb.startProcess("sleep", ["300"], { name: "sleeper" });
    const listed = await sb.listProcesses();
    assert.ok(listed.some((q) => q.pid === p.pid));
    assert.equal((await sb.getProcess("sleeper")).pid, p.pid);
    await p.sendSignal("TERM");
    const ended = await p.wait({ timeoutSecs: 10 });
    assert.equal(ended.signal, 15);
    const q = await sb.startProcess("sleep", ["300"], { stdinMode: "closed" });
    await q.kill();
    assert.notEqual((await q.wait({ timeoutSecs: 10 })).status, "running");
  });
});

describe("files", () => {
  test("write, read, stat, list, mkdir, remove", async () => {
    await sb.files.write("/work/a/b.txt", "hello", { mode: 0o600 });
    assert.equal(await sb.files.readText("/work/a/b.txt"), "hello");
    const st = await sb.files.stat("/work/a/b.txt");
    assert.equal(st.size, 5);
    assert.equal(st.mode & 0o777, 0o600);
    await sb.files.mkdir("/work/a/c/d", { parents: true });
    const names = (await sb.files.list("/work/a")).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["b.txt:file", "c:dir"]);
    await sb.files.remove("/work/a", { recursive: true });
    assert.equal(await sb.files.exists("/work/a"), false);
    await assert.rejects(sb.files.read("/work/a/b.txt"), NotFoundError);
    await assert.rejects(sb.files.list("/work/nowhere"), NotFoundError);
  });

  test("binary data and streamed upload and download of a large file", async () => {
    const local = mkdtempSync(join(tmpdir(), "sfts-files-"));
    try {
      const big = Buffer.alloc(12 << 20);
      for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i, i);
      writeFileSync(join(local, "big.bin"), big);
      await sb.files.upload(join(local, "big.bin"), "/tmp/big.bin", { mode: 0o640 });
      const inside = await sb.run("sh", ["-c", "stat -c %s /tmp/big.bin"]);
      assert.equal(inside.stdout.trim(), String(big.length));
      assert.equal(await sb.files.downloadTo("/tmp/big.bin", join(local, "back.bin")), big.length);
      assert.ok(readFileSync(join(local, "back.bin")).equals(big));
      await assert.rejects(sb.files.downloadTo("/nonexistent", join(local, "none")), NotFoundError);
      assert.deepEqual(readdirSync(local).sort(), ["back.bin", "big.bin"], "a failed download leaves nothing");
    } finally {
      rmSync(local, { recursive: true, force: true });
    }
  });

  test("a directory watch sees changes as they happen, and a file is no directory to watch", async () => {
    await sb.files.mkdir("/w", { parents: true });
    const watch = await sb.files.watch("/w", { recursive: true });
    const seen: string[] = [];
    const reading = (async () => {
      for await (const e of watch) {
        seen.push(`${e.type} ${e.path}`);
        if (e.type === "delete" && e.path === "/w/g") watch.close();
      }
    })();
    await sb.run("sh", ["-c", "echo a > /w/f; mv /w/f /w/g; mkdir /w/d; echo b > /w/d/x; rm /w/g"]);
    await reading;
    assert.ok(seen.includes("create /w/f") && seen.includes("create /w/d/x") && seen.includes("delete /w/g"), seen.join("\n"));
    await assert.rejects(sb.files.watch("/w/d/x"), InvalidArgumentError);
  });

  test("a sandbox that is not running refuses file calls with a ConflictError", async () => {
    const other = await Sandbox.create({ image: "busybox", memoryMb: 64, client: daemon.client });
    await other.terminate();
    await assert.rejects(other.files.read("/etc/hostname"), ConflictError);
    await other.terminate(); // idempotent
  });
});
