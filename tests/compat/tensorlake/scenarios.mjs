// Scenarios that drive the unmodified Tensorlake TypeScript/JS SDK (npm `tensorlake` 0.5.89).
//
// Only the environment configures the SDK: TENSORLAKE_API_URL and TENSORLAKE_API_KEY
// (and INDEXIFY_NAMESPACE, default "default"). Point TENSORLAKE_API_URL at the recorder
// (recorder.py) to record fixtures, or at a sandfork daemon to check compatibility.
// The package is imported as `tensorlake`; when this file does not sit below a
// node_modules that has it, set TENSORLAKE_JS_DIR to a directory that does.
// The SDK needs Node >= 22.
//
//     node scenarios.mjs list
//     node scenarios.mjs SCENARIO [SCENARIO ...]
//
// Each step prints one JSON line {"step", "ok", ...} (a call that succeeded, then the values
// it returned under the same step name); exit status 1 when a step that must succeed failed.
// Error scenarios record the error class and message instead.

import path from "node:path";
import { pathToFileURL } from "node:url";

async function loadSdk() {
  try {
    return await import("tensorlake");
  } catch (e) {
    const dir = process.env.TENSORLAKE_JS_DIR;
    if (!dir) throw e;
    return await import(
      pathToFileURL(path.join(dir, "node_modules", "tensorlake", "dist", "index.js")).href
    );
  }
}

const tl = await loadSdk();
const { Sandbox, SandboxClient } = tl;

const IMAGE = process.env.SCENARIO_IMAGE ?? "tensorlake/ubuntu-minimal";
const RUN_ID = process.env.SCENARIO_RUN_ID ?? "";
const name = (base) => `${base}${RUN_ID}`;
let FAILED = false;

function out(step, ok = true, fields = {}) {
  console.log(JSON.stringify({ step, ok, ...fields }, (k, v) => (typeof v === "bigint" ? String(v) : v)));
}

async function must(step, fn) {
  try {
    const value = await fn();
    out(step);
    return value;
  } catch (e) {
    FAILED = true;
    out(step, false, { error: e?.constructor?.name, message: String(e?.message ?? e), stack: String(e?.stack ?? "").split("\n").slice(0, 4) });
    throw e;
  }
}

// Like must, for a call a server may refuse (a feature it lacks): the refusal is recorded
// (ok false, "soft": true) and the scenario goes on; returns undefined then.
async function may(step, fn) {
  try {
    return await fn();
  } catch (e) {
    const fields = { error: e?.constructor?.name, message: String(e?.message ?? e), soft: true };
    if (e?.statusCode !== undefined) fields.statusCode = e.statusCode;
    out(step, false, fields);
    return undefined;
  }
}

async function expectError(step, fn) {
  try {
    const v = await fn();
    let shown;
    try {
      shown = JSON.stringify(v)?.slice(0, 200);
    } catch {
      shown = String(v?.constructor?.name);
    }
    out(step, false, { unexpected_success: shown });
  } catch (e) {
    const chain = [];
    for (let p = Object.getPrototypeOf(e); p && p !== Object.prototype && chain.length < 5; p = Object.getPrototypeOf(p)) {
      chain.push(p.constructor?.name);
    }
    const fields = { error: e?.constructor?.name, chain, message: String(e?.message ?? e) };
    for (const k of ["statusCode", "status", "code", "sandboxId", "reason"]) {
      if (e?.[k] !== undefined && typeof e[k] !== "function") fields[k] = e[k];
    }
    out(step, true, fields);
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (u8) => Buffer.from(u8).toString("utf8");

async function awaitStatus(sb, want, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const st = await sb.status();
    if (st === want || Date.now() > deadline) return st;
    await sleep(500);
  }
}

const scenarios = {
  async lifecycle() {
    const sb = await must("create", () =>
      Sandbox.create({ image: IMAGE, cpus: 1, memoryMb: 512, timeoutSecs: 600, name: name("compat-life") }),
    );
    out("create", true, { sandboxId: sb.sandboxId, name: sb.name, traceId: sb.traceId });
    const info = await must("info", () => sb.info());
    out("info", true, { status: info.status, sandboxUrl: info.sandboxUrl, resources: info.resources });
    out("status", true, { status: await must("status", () => sb.status()) });
    const again = await must("connect_by_name", () => Sandbox.connect({ sandboxId: name("compat-life") }));
    out("connect_by_name", true, { sandboxId: again.sandboxId });
    const listed = await must("list", () => Sandbox.list());
    out("list", true, { ids: listed.map((s) => s.sandboxId), statuses: listed.map((s) => s.status) });
    await must("update", () =>
      sb.update({ name: name("compat-life-renamed"), exposedPorts: [8080], allowUnauthenticatedAccess: false }),
    );
    const info2 = await must("info_after_update", () => sb.info());
    out("update", true, { name: info2.name, exposedPorts: info2.exposedPorts });
    const client = new SandboxClient({}, true);
    const got = await must("client_get", () => client.get(sb.sandboxId));
    out("client_get", true, { status: got.status, traceId: got.traceId });
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async create_wait() {
    const sb = await must("create_blocking", () => Sandbox.create({ image: IMAGE }));
    out("create_blocking", true, { sandboxId: sb.sandboxId });
    const client = new SandboxClient({}, true);
    const created = await must("client_create", () => client.create({ image: IMAGE, name: name("compat-pending") }));
    out("client_create", true, { sandboxId: created.sandboxId, status: created.status });
    const st = await awaitStatus({ status: async () => (await client.get(created.sandboxId)).status }, "running");
    out("client_poll", true, { status: st });
    await must("terminate", () => sb.terminate());
    await must("terminate2", () => client.delete(created.sandboxId));
    out("terminate");
  },

  async suspend_resume() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE, name: name("compat-suspend") }));
    await must("suspend", () => sb.suspend({ pollInterval: 0.5 }));
    out("suspend", true, { status: await sb.status() });
    await must("resume", () => sb.resume({ pollInterval: 0.5 }));
    out("resume", true, { status: await sb.status() });
    const r = await must("run_after_resume", () => sb.run("echo", { args: ["back"] }));
    out("run_after_resume", true, { stdout: r.stdout });
    await must("suspend_nowait", () => sb.suspend({ wait: false }));
    out("suspend_nowait", true, { status: await awaitStatus(sb, "suspended") });
    await must("resume_nowait", () => sb.resume({ wait: false }));
    out("resume_nowait", true, { status: await awaitStatus(sb, "running") });
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async snapshot() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    await must("write", () => sb.writeFile("/tmp/marker", Buffer.from("before-snapshot\n")));
    const fsSnap = await must("checkpoint_fs", () => sb.checkpoint({ checkpointType: "filesystem", pollInterval: 0.5 }));
    out("checkpoint_fs", true, { snapshotId: fsSnap.snapshotId, status: fsSnap.status, snapshotType: fsSnap.snapshotType });
    const memSnap = await must("checkpoint_mem", () =>
      sb.checkpoint({ checkpointType: "memory", pollInterval: 0.5, waitUntil: "completed" }),
    );
    out("checkpoint_mem", true, { snapshotId: memSnap.snapshotId, status: memSnap.status });
    const none = await must("checkpoint_nowait", () => sb.checkpoint({ wait: false }));
    out("checkpoint_nowait", true, { returned: String(none) });
    const got = await must("get_snapshot", () => Sandbox.getSnapshot(memSnap.snapshotId));
    out("get_snapshot", true, { status: got.status, sandboxId: got.sandboxId });
    const snaps = await must("list_snapshots", () => sb.listSnapshots());
    out("list_snapshots", true, { ids: snaps.map((s) => s.snapshotId) });
    const all = await must("list_all_snapshots", () => Sandbox.listSnapshots());
    out("list_all_snapshots", true, { count: all.length });
    const restored = await must("restore", () => Sandbox.create({ snapshotId: memSnap.snapshotId }));
    const data = await must("read_restored", () => restored.readFile("/tmp/marker"));
    out("restore", true, { sandboxId: restored.sandboxId, marker: text(data) });
    await must("terminate_restored", () => restored.terminate());
    await must("delete_snapshot", () => Sandbox.deleteSnapshot(fsSnap.snapshotId));
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async copy() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    await must("write", () => sb.writeFile("/tmp/marker", Buffer.from("parent\n")));
    const res = await must("copy", () => sb.copy({ times: 2 }));
    out("copy", true, {
      keys: Object.keys(res),
      traceId: res.traceId,
      sourceSandboxId: res.sourceSandboxId,
      sandboxes: res.sandboxes.map((c) => ({ sandboxId: c.sandboxId, status: c.status, sandboxUrl: c.sandboxUrl })),
    });
    for (const c of res.sandboxes) {
      const child = await must("connect_copy", () => Sandbox.connect({ sandboxId: c.sandboxId }));
      const data = await must("read_copy", () => child.readFile("/tmp/marker"));
      out("read_copy", true, { sandboxId: c.sandboxId, marker: text(data) });
      await must("terminate_copy", () => child.terminate());
    }
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async pools() {
    const client = new SandboxClient({}, true);
    const created = await may("create_pool", () =>
      client.createPool({ image: IMAGE, cpus: 1, memoryMb: 512, timeoutSecs: 0, maxContainers: 3, warmContainers: 1 }),
    );
    if (created === undefined) {
      // A server without pools: every pool call is refused the same way.
      await may("list_pools", () => client.listPools());
      await may("get_pool", () => client.getPool("no-such-pool"));
      await may("claim", () => Sandbox.create({ poolId: "no-such-pool" }));
      await may("update_pool", () =>
        client.updatePool("no-such-pool", { image: IMAGE, cpus: 1, memoryMb: 512, maxContainers: 4, warmContainers: 0 }),
      );
      await may("delete_pool", () => client.deletePool("no-such-pool"));
      return;
    }
    out("create_pool", true, { poolId: created.poolId, namespace: created.namespace });
    const pools = await must("list_pools", () => client.listPools());
    out("list_pools", true, { ids: pools.map((p) => p.poolId) });
    const pool = await must("get_pool", () => client.getPool(created.poolId));
    out("get_pool", true, { image: pool.image, containers: pool.containers });
    const claimed = await must("claim", () => Sandbox.create({ poolId: created.poolId }));
    out("claim", true, { sandboxId: claimed.sandboxId });
    const r = await must("run_in_claimed", () => claimed.run("echo", { args: ["pooled"] }));
    out("run_in_claimed", true, { stdout: r.stdout });
    await expectError("delete_pool_in_use", () => client.deletePool(created.poolId));
    await must("update_pool", () =>
      client.updatePool(created.poolId, { image: IMAGE, cpus: 1, memoryMb: 512, maxContainers: 4, warmContainers: 0 }),
    );
    await must("terminate_claimed", () => claimed.terminate());
    await must("delete_pool", () => client.deletePool(created.poolId));
    out("delete_pool");
  },

  // The fork pattern: a process whose state lives in its memory (a shell counter), a
  // memory checkpoint, then 5 restores: in each the same process runs on, counting on from
  // where the checkpoint caught it (a cold start would have no process, or count from 1),
  // and each restore is its own sandbox (a file written in one is not in another).
  async fork_warm() {
    const counter =
      "n=0; while :; do n=$((n+1)); echo $n > /tmp/count.tmp && mv /tmp/count.tmp /tmp/count; sleep 0.1; done";
    const count = async (sb) => Number(text(await sb.readFile("/tmp/count")).trim() || 0);
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    const p = await must("start_counter", () => sb.startProcess("sh", { args: ["-c", counter] }));
    await sleep(1000);
    const atCheckpoint = await must("count_before_checkpoint", () => count(sb));
    const snap = await must("checkpoint_mem", () => sb.checkpoint({ checkpointType: "memory", pollInterval: 0.5 }));
    out("checkpoint_mem", true, { snapshotId: snap.snapshotId, count: atCheckpoint });
    const restores = [];
    const started = Date.now();
    for (let i = 0; i < 5; i++) {
      restores.push(await must("restore", () => Sandbox.create({ snapshotId: snap.snapshotId })));
    }
    out("restore", true, { count: restores.length, seconds: (Date.now() - started) / 1000, sandboxIds: restores.map((r) => r.sandboxId) });
    await sleep(500);
    for (const [i, r] of restores.entries()) {
      const g = await must("get_counter", () => r.getProcess(p.pid));
      const first = await must("read_count", () => count(r));
      await sleep(400);
      const later = await must("read_count", () => count(r));
      await must("write_own", () => r.writeFile("/tmp/own", Buffer.from(`restore-${i}\n`)));
      out("warm_state", true, { index: i, sandboxId: r.sandboxId, status: g.status, atCheckpoint, first, later });
    }
    const own = [];
    for (const r of restores) own.push(text(await must("read_own", () => r.readFile("/tmp/own"))));
    out("independent", true, { own });
    for (const r of restores) await must("terminate_restore", () => r.terminate());
    await must("delete_snapshot", () => Sandbox.deleteSnapshot(snap.snapshotId));
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  // A run and a follow that stay quiet for seconds before their output: the server may
  // keep such streams alive (sandfork sends a comment line every second).
  async quiet() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    const r = await must("run_quiet", () => sb.run("sh", { args: ["-c", "sleep 2.5; echo done"] }));
    out("run_quiet", true, { exitCode: r.exitCode, stdout: r.stdout });
    const p = await must("start_quiet", () => sb.startProcess("sh", { args: ["-c", "sleep 2.5; echo late; echo later >&2"] }));
    const evs = [];
    await must("follow_quiet", async () => {
      for await (const e of sb.followOutput(p.pid)) evs.push({ line: e.line, stream: e.stream });
    });
    out("follow_quiet", true, { events: evs });
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async processes() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    let r = await must("run_echo", () => sb.run("echo", { args: ["hello", "world"] }));
    out("run_echo", true, { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr, keys: Object.keys(r) });
    r = await must("run_sh", () =>
      sb.run("sh", { args: ["-c", "echo out; echo err >&2; exit 3"], env: { A: "1" }, workingDir: "/tmp", timeout: 30 }),
    );
    out("run_sh", true, { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr });
    const p = await must("start_sleep", () => sb.startProcess("sleep", { args: ["300"] }));
    out("start_sleep", true, { pid: p.pid, status: p.status });
    const procs = await must("list_processes", () => sb.listProcesses());
    out("list_processes", true, { pids: procs.map((x) => x.pid) });
    const g = await must("get_process", () => sb.getProcess(p.pid));
    out("get_process", true, { status: g.status });
    const s = await must("send_signal", () => sb.sendSignal(p.pid, 15));
    out("send_signal", true, { success: s.success });
    await sleep(500);
    const g2 = await must("get_after_signal", () => sb.getProcess(p.pid));
    out("get_after_signal", true, { status: g2.status, signal: g2.signal, exitCode: g2.exitCode });
    const c = await must("start_cat", () =>
      sb.startProcess("cat", { stdinMode: "pipe", stdoutMode: "capture", stderrMode: "capture" }),
    );
    await must("write_stdin", () => sb.writeStdin(c.pid, Buffer.from("line one\nline two\n")));
    await must("close_stdin", () => sb.closeStdin(c.pid));
    await sleep(500);
    const so = await must("get_stdout", () => sb.getStdout(c.pid));
    out("get_stdout", true, { lines: so.lines, lineCount: so.lineCount });
    const se = await must("get_stderr", () => sb.getStderr(c.pid));
    out("get_stderr", true, { lines: se.lines });
    const oo = await must("get_output", () => sb.getOutput(c.pid));
    out("get_output", true, { lines: oo.lines });
    const evs = [];
    await must("follow_output", async () => {
      for await (const e of sb.followOutput(c.pid)) evs.push({ line: e.line, stream: e.stream });
    });
    out("follow_output", true, { events: evs });
    const lines = [];
    await must("follow_stdout", async () => {
      for await (const e of sb.followStdout(c.pid)) lines.push(e.line);
    });
    out("follow_stdout", true, { lines });
    const k = await must("start_sleep2", () => sb.startProcess("sleep", { args: ["300"] }));
    await must("kill_process", () => sb.killProcess(k.pid));
    await sleep(500);
    const g3 = await must("get_after_kill", () => sb.getProcess(k.pid));
    out("get_after_kill", true, { status: g3.status, signal: g3.signal });
    await expectError("get_missing_process", () => sb.getProcess(999999));
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async files() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    await must("mkdir", () => sb.run("mkdir", { args: ["-p", "/tmp/compat"] }));
    await must("write_file", () => sb.writeFile("/tmp/compat/a.txt", Buffer.from("alpha\n")));
    const bin = Uint8Array.from({ length: 256 }, (_, i) => i);
    await must("write_file_bin", () => sb.writeFile("/tmp/compat/b.bin", bin));
    const a = await must("read_file", () => sb.readFile("/tmp/compat/a.txt"));
    out("read_file", true, { content: text(a) });
    const b = await must("read_file_bin", () => sb.readFile("/tmp/compat/b.bin"));
    out("read_file_bin", true, { same: Buffer.from(b).equals(Buffer.from(bin)) });
    const ls = await must("list_directory", () => sb.listDirectory("/tmp/compat"));
    out("list_directory", true, { path: ls.path, entries: ls.entries.map((e) => [e.name, e.isDir, e.size]) });
    await must("delete_file", () => sb.deleteFile("/tmp/compat/a.txt"));
    await expectError("read_deleted", () => sb.readFile("/tmp/compat/a.txt"));
    await expectError("delete_missing", () => sb.deleteFile("/tmp/compat/nope.txt"));
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async pty() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    const chunks = [];
    const exits = [];
    const pty = await must("create_pty", () =>
      sb.createPty({
        command: "/bin/sh",
        rows: 24,
        cols: 80,
        onData: (b) => chunks.push(Buffer.from(b)),
        onExit: (c) => exits.push(c),
      }),
    );
    out("create_pty", true, { sessionId: pty.sessionId });
    await must("resize", () => pty.resize(100, 30));
    await must("send_input", () => pty.sendInput("echo hi-from-pty\n"));
    await sleep(500);
    await must("send_exit", () => pty.sendInput("exit\n"));
    const code = await must("wait", () => pty.wait());
    out("pty_exit", true, { exitCode: code, output: Buffer.concat(chunks).toString("utf8"), exits });
    const sess = await must("create_pty_session", () =>
      sb.createPtySession({ command: "/bin/sh", args: ["-i"], env: { TERM: "xterm" }, workingDir: "/", rows: 10, cols: 40 }),
    );
    out("create_pty_session", true, { keys: Object.keys(sess).sort() });
    out("pty_ws_url", true, { url: sb.ptyWsUrl(sess.sessionId, sess.token) });
    const p2 = await must("connect_pty", () => sb.connectPty(sess.sessionId, sess.token));
    await must("kill_pty", () => p2.kill());
    p2.disconnect();
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async health() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    const h = await must("health", () => sb.health());
    out("health", true, { healthy: h.healthy });
    const i = await must("daemon_info", () => sb.daemonInfo());
    out("daemon_info", true, { version: i.version, uptimeSecs: i.uptimeSecs });
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  // Recorded with TENSORLAKE_API_URL=http://api.sandfork.test:PORT (names from a private
  // hosts file) to show the non-localhost URL derivation.
  async hosts_basic() {
    const sb = await must("create", () => Sandbox.create({ image: IMAGE }));
    out("create", true, { sandboxId: sb.sandboxId });
    const r = await must("run", () => sb.run("echo", { args: ["hosts"] }));
    out("run", true, { stdout: r.stdout });
    await must("write_file", () => sb.writeFile("/tmp/h.txt", Buffer.from("h\n")));
    out("read_file", true, { content: text(await must("read_file", () => sb.readFile("/tmp/h.txt"))) });
    out("list", true, { ids: (await must("list", () => Sandbox.list())).map((s) => s.sandboxId) });
    await must("terminate", () => sb.terminate());
    out("terminate");
  },

  async errors() {
    // connect() is lazy in this SDK: the sandbox is looked up on the first data-plane call.
    await expectError("connect_missing", async () => (await Sandbox.connect({ sandboxId: "missing-sandbox" })).health());
    const client = new SandboxClient({}, true);
    await expectError("get_missing", () => client.get("missing-sandbox"));
    await expectError("delete_missing", () => client.delete("missing-sandbox"));
    await expectError("get_snapshot_missing", () => Sandbox.getSnapshot("missing-snapshot"));
    await expectError("get_pool_missing", () => client.getPool("missing-pool"));
    const bad = new SandboxClient({ apiKey: "sandfork-bad-key" }, true);
    await expectError("list_bad_key_401", () => bad.list());
    const forbidden = new SandboxClient({ apiKey: "sandfork-forbidden-key" }, true);
    await expectError("list_forbidden_403", () => forbidden.list());
    await expectError("create_bad_key_401", () => Sandbox.create({ image: IMAGE, apiKey: "sandfork-bad-key" }));
    const sb = await must("create_named", () => Sandbox.create({ image: IMAGE, name: name("compat-dup") }));
    await expectError("create_duplicate_409", () => Sandbox.create({ image: IMAGE, name: name("compat-dup") }));
    await expectError("connect_bad_key_401", async () =>
      (await Sandbox.connect({ sandboxId: sb.sandboxId, apiKey: "sandfork-bad-key" })).health(),
    );
    const info = await sb.info();
    const h = new Sandbox({ sandboxId: sb.sandboxId, proxyUrl: info.sandboxUrl, apiKey: "sandfork-bad-key" });
    await expectError("dataplane_bad_key_401", () => h.health());
    await expectError("dataplane_missing_file_404", () => sb.readFile("/definitely/missing"));
    await must("terminate", () => sb.terminate());
    out("terminate");
  },
};

async function main(argv) {
  if (argv.length === 0 || argv[0] === "list") {
    console.log(Object.keys(scenarios).join("\n"));
    return 0;
  }
  for (const sc of argv) {
    out("scenario", true, { name: sc, apiUrl: process.env.TENSORLAKE_API_URL });
    const fn = scenarios[sc];
    if (!fn) {
      out("scenario_failed", false, { name: sc, error: "unknown scenario" });
      FAILED = true;
      continue;
    }
    try {
      await fn();
    } catch (e) {
      FAILED = true;
      out("scenario_failed", false, { name: sc, error: e?.constructor?.name, message: String(e?.message ?? e) });
    }
  }
  return FAILED ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
