// Terminal sessions, the port gateway, logs and events, against a real daemon.

import assert from "node:assert/strict";
import http from "node:http";
import { after, before, test } from "node:test";

import { Sandbox, type SandboxEvent } from "../src/index.js";
import { startDaemon, type Daemon } from "./daemon.js";

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

/** Collects a session's output until `pattern` shows up in it. */
async function until(output: () => string, pattern: RegExp, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!pattern.test(output())) {
    assert.ok(Date.now() < deadline, `waited for ${pattern} in:\n${output()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

test("a terminal session: typed input, resize, Ctrl-C, exit, and a reconnect that misses nothing", async () => {
  let seen = "";
  const session = await sb.pty.create({ command: "sh", cols: 100, rows: 30, onData: (d) => (seen += d.toString()) });
  await session.write("stty size\n");
  await until(() => seen, /30 100/);
  await session.resize(120, 40);
  await session.write("stty size\n");
  await until(() => seen, /40 120/);
  await session.write("sleep 30\n");
  await new Promise((r) => setTimeout(r, 200));
  await session.write("\x03echo after-interrupt\n");
  await until(() => seen, /after-interrupt\r?\n/);
  session.disconnect();

  // Attached again by pid: the buffered output replays first.
  let replay = "";
  const again = await sb.pty.connect(session.pid, { onData: (d) => (replay += d.toString()) });
  await until(() => replay, /after-interrupt/);
  await again.write("exit 7\n");
  const exit = await again.wait();
  assert.equal(exit.exitCode, 7);
});

test("a terminal session iterates its output", async () => {
  const session = await sb.pty.create({ command: "sh", args: ["-c", "echo one; echo two"] });
  let text = "";
  for await (const chunk of session) text += chunk.toString();
  assert.match(text, /one\r?\ntwo/);
  assert.equal((await session.wait()).exitCode, 0);
});

/** A GET through the daemon's Unix socket. */
function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  const match = /^http\+unix:\/\/(.+?):(\/.*)$/.exec(url);
  assert.ok(match, url);
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: match[1], path: match[2], headers }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

test("a port is reached through the gateway with a signed URL or the token, and not without", async () => {
  await sb.files.write("/www/index.html", "hello from the sandbox\n");
  await sb.startProcess("httpd", ["-f", "-p", "127.0.0.1:8080", "-h", "/www"], { name: "web" });
  const signed = await sb.getUrl(8080, { path: "/index.html" });
  let answer = await get(signed);
  for (let i = 0; answer.status === 502 && i < 50; i++) {
    await new Promise((r) => setTimeout(r, 100)); // httpd still starting
    answer = await get(signed);
  }
  assert.equal(answer.status, 200);
  assert.equal(answer.body, "hello from the sandbox\n");
  const bare = await sb.getUrl(8080, { path: "/index.html", signed: false });
  assert.equal((await get(bare)).status, 401);
  assert.equal((await get(bare, { "x-sandfork-access-token": "wrong" })).status, 403);
  assert.equal((await get(bare, { "x-sandfork-access-token": await sb.portToken() })).status, 200);
  assert.match(await sb.getHost(8080), new RegExp(`^8080-${sb.id}\\.`));
  assert.equal((await get(await sb.getUrl(8081))).status, 502, "nothing listens on 8081");
});

test("the log of background processes, filtered and followed", async () => {
  const p = await sb.startProcess("sh", ["-c", "echo first; sleep 0.2; echo oops >&2; sleep 0.2; echo later"]);
  await p.wait();
  // The agent logs what it read; the last line may land a moment after the exit.
  let lines: string[] = [];
  for (const deadline = Date.now() + 5_000; lines.length < 3 && Date.now() < deadline; ) {
    lines = [];
    for await (const entry of sb.logs({ process: p.pid })) lines.push(`${entry.level}:${entry.message}`);
  }
  assert.deepEqual(lines, ["info:first", "error:oops", "info:later"]);
  const tail = [];
  for await (const entry of sb.logs({ process: p.pid, tail: 1 })) tail.push(entry.message);
  assert.deepEqual(tail, ["later"]);

  // Followed from a line not written yet: it starts there.
  let last = 0;
  for await (const entry of sb.logs({ tail: 1 })) last = entry.seq;
  const followed = sb.logs({ follow: true, stream: "stdout", since: last + 2 });
  const got: string[] = [];
  const reading = (async () => {
    for await (const entry of followed) {
      got.push(`${entry.seq}:${entry.message}`);
      followed.close();
    }
  })();
  await (await sb.startProcess("sh", ["-c", "echo skipped; sleep 0.2; echo streamed"])).wait();
  await reading;
  assert.deepEqual(got, [`${last + 2}:streamed`]);
});

test("lifecycle events of a sandbox, replayed and followed", async () => {
  const other = await Sandbox.create({ image: "busybox", memoryMb: 64, client: daemon.client });
  const events = other.events({ since: 0 });
  const types: SandboxEvent["type"][] = [];
  const reading = (async () => {
    for await (const e of events) {
      types.push(e.type);
      if (e.type === "terminated") events.close();
    }
  })();
  await other.checkpoint();
  await other.terminate();
  await reading;
  assert.deepEqual(types, ["created", "started", "checkpointed", "terminated"]);
});
