// The console in a real browser: Debian's Chromium, headless, driven by Playwright, against
// a real daemon listening on loopback TCP with a token. With SANDFORK_SCREENSHOTS=DIR the
// main pages are saved there as PNGs (docs/console-*.png are made so).

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const TOKEN = "console-test-token";
let root, daemon, base, browser, page;

function binary() {
  if (process.env.SANDFORK_BIN) return process.env.SANDFORK_BIN;
  return join(process.env.CARGO_TARGET_DIR ?? join(REPO, "target"), "debug", "sandfork");
}

async function freePort() {
  return new Promise((ok) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function api(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${TOKEN}`, ...(body ? { "content-type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : undefined;
}

async function upload(id, path, bytes) {
  const res = await fetch(`${base}/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, {
    method: "PUT",
    headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/octet-stream" },
    body: bytes,
  });
  if (!res.ok) throw new Error(`upload ${path}: ${res.status} ${await res.text()}`);
}

/** `len` pseudo-random bytes from `seed` (xorshift32): the same noise on every run. */
function noise(len, seed) {
  const out = new Uint8Array(len);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < len; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

/** Waits for `text` in the terminal; on timeout, fails with what the terminal shows. */
async function waitForTerminal(text, timeout) {
  try {
    await page.waitForFunction((t) => document.querySelector("#terminal .xterm-rows")?.textContent?.includes(t), text, { timeout });
  } catch (e) {
    const shown = await page.evaluate(() => document.querySelector("#terminal .xterm-rows")?.textContent ?? "(no terminal)");
    throw new Error(`${JSON.stringify(text)} not seen in the terminal: ${e.message}\nthe terminal shows: ${shown.slice(-800)}\ndaemon log: ${readFileSync(join(root, "daemon.log"), "utf8").slice(-1500)}`);
  }
}

async function shot(name) {
  const dir = process.env.SANDFORK_SCREENSHOTS;
  if (dir) await page.screenshot({ path: join(resolve(dir), `console-${name}.png`) });
}

before(async () => {
  root = mkdtempSync(join(tmpdir(), "sfui-"));
  writeFileSync(join(root, "token"), TOKEN);
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const log = openSync(join(root, "daemon.log"), "a");
  if (!existsSync(binary())) throw new Error(`the sandfork daemon is not built at ${binary()}: run make build`);
  daemon = spawn(binary(), ["serve", "--data-dir", join(root, "data"), "--socket", join(root, "s.sock"), "--listen", `127.0.0.1:${port}`, "--token-file", join(root, "token"), "--default-image", "busybox"], { stdio: ["ignore", log, log], detached: true });
  for (let i = 0; ; i++) {
    try {
      if ((await api("GET", "/v1/health")).status === "ok") break;
    } catch {
      if (i > 600) throw new Error(`the daemon did not start:\n${readFileSync(join(root, "daemon.log"), "utf8").slice(-2000)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  page = await (await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true })).newPage();
});

after(async () => {
  await browser?.close();
  if (daemon && daemon.exitCode === null) {
    for (const s of (await api("GET", "/v1/sandboxes").catch(() => ({ sandboxes: [] }))).sandboxes) await api("DELETE", `/v1/sandboxes/${s.id}`).catch(() => undefined);
    const exited = new Promise((r) => daemon.once("exit", r));
    daemon.kill("SIGTERM");
    await exited;
  }
  const mounts = readFileSync("/proc/self/mountinfo", "utf8").split("\n").filter((l) => l.split(" ")[4]?.startsWith(root + "/"));
  const runc = existsSync(join(root, "data", "runc")) ? spawnSync("runc", ["--root", join(root, "data", "runc"), "list", "-q"], { encoding: "utf8" }).stdout.trim() : "";
  if (!mounts.length && !runc) rmSync(root, { recursive: true, force: true });
  assert.deepEqual([mounts, runc], [[], ""], `the daemon left mounts or containers behind (kept ${root})`);
});

test("without a token the console shows the login page and no data; a wrong token is refused", async () => {
  await api("POST", "/v1/sandboxes", { image: "busybox", name: "not-for-strangers", memory_mb: 64 });
  await page.goto(`${base}/ui/`);
  await page.waitForSelector("form.login");
  assert.equal(await page.locator("text=not-for-strangers").count(), 0);
  await page.fill("input[name=token]", "wrong");
  await page.click("form.login button");
  await page.waitForSelector("text=That token is not accepted.");
  await shot("login");
  await page.fill("input[name=token]", TOKEN);
  await page.click("form.login button");
  await page.waitForSelector("text=not-for-strangers");
});

test("create a sandbox, type in its terminal, checkpoint, fork 4, see the lineage, suspend, resume, download", async () => {
  await page.goto(`${base}/ui/#/`);
  await page.fill("input[name=image]", "busybox");
  await page.click("text=Create sandbox");
  await page.waitForURL(/#\/sandboxes\/sb-/);
  const id = decodeURIComponent(page.url().split("/").pop());
  await page.waitForSelector("#state.running");

  // The terminal: what is typed runs in the sandbox.
  await page.click("#terminal");
  await page.keyboard.type("echo hello-$((6*7)) > /tmp/out.txt; cat /tmp/out.txt\n");
  await waitForTerminal("hello-42", 20_000);
  await shot("sandbox");
  // A megabyte of binary noise does not hang the page: the next command still answers.
  // The noise is seeded, so a failure reproduces; the terminal answers queries found in it
  // (typed input while the output floods). Then a full terminal reset, as the bytes switch
  // character sets and modes.
  await upload(id, "/tmp/noise.bin", noise(1_000_000, 0x5eed));
  await page.keyboard.type("cat /tmp/noise.bin; printf '\\033c'; echo done-$((1+1))\n");
  await waitForTerminal("done-2", 60_000);
  await page.keyboard.type("clear\n");

  await page.click("text=Checkpoint memory");
  await page.waitForSelector("#toast >> text=Memory checkpoint: done", { timeout: 60_000 });
  await page.fill("input[aria-label=forks]", "4");
  await page.click("button:text-is('Fork')");
  await page.waitForSelector("#toast >> text=Fork: done", { timeout: 120_000 });
  const forks = (await api("GET", "/v1/sandboxes")).sandboxes.filter((s) => s.fork);
  assert.equal(forks.length, 4);

  // The terminal session came along into the forks, its output still there.
  const child = forks[0].id;
  await page.goto(`${base}/ui/#/snapshots`);
  const parentSnapshot = forks[0].fork.parent_snapshot_id;
  await page.waitForSelector(`svg.lineage g[data-id="${parentSnapshot}"]`);
  assert.equal(await page.locator(`svg.lineage path[data-from="${parentSnapshot}"]`).count(), 4, "four forks drawn from the snapshot");
  assert.equal(await page.locator(`svg.lineage path[data-from="${id}"]`).count(), 2, "two checkpoints drawn from the sandbox");
  await shot("lineage");

  await page.goto(`${base}/ui/#/sandboxes/${id}`);
  await page.waitForSelector("#state.running");
  await page.click("button:text-is('Suspend')");
  await page.waitForSelector("#state.suspended", { timeout: 60_000 });
  await page.click("button:text-is('Resume')");
  await page.waitForSelector("#state.running", { timeout: 60_000 });

  // The file browser: into /tmp, download what the terminal wrote.
  await page.click(".files a:text-is('tmp/')");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click(".files a.download[data-path='/tmp/out.txt']")]);
  assert.equal(readFileSync(await download.path(), "utf8"), "hello-42\n");

  // Deleted while its page is open: a clear message.
  await page.goto(`${base}/ui/#/sandboxes/${child}`);
  await page.waitForSelector("#state.running");
  await api("DELETE", `/v1/sandboxes/${child}`);
  await page.waitForSelector("#gone", { timeout: 20_000 });
  await page.goto(`${base}/ui/#/`);
  await page.waitForSelector(`tr[data-id="${id}"] td.mem >> text=/MiB/`, { timeout: 20_000 });
  await shot("sandboxes");
});

test("a session whose token is gone goes back to the login page", async () => {
  await page.evaluate(() => sessionStorage.clear());
  await page.goto(`${base}/ui/#/snapshots`);
  await page.reload();
  await page.waitForSelector("form.login");
  assert.equal(await page.locator("svg.lineage").count(), 0);
});

// A hostile sandbox's page, reached through the path route on the API's own origin, with
// the operator logged in to the console in the same browser: it gets no token, stores
// nothing for that origin and registers no service worker (docs/SECURITY.md, gateway).
const HOSTILE = `<!doctype html><meta charset="utf-8"><title>hostile</title><body><script>
(async () => {
  const r = { origin: String(self.origin) };
  try { r.token = sessionStorage.getItem("sandfork-token") ?? "none"; } catch (e) { r.token = "blocked:" + e.name; }
  try { document.cookie = "planted=1; path=/"; r.cookie = document.cookie || "none"; } catch (e) { r.cookie = "blocked:" + e.name; }
  for (const [k, scope] of [["sw_root", "/"], ["sw_own", "./"]]) {
    try { await navigator.serviceWorker.register("sw.js", { scope }); r[k] = "registered"; } catch (e) { r[k] = "refused:" + (e && e.name); }
  }
  document.body.id = "probed";
  document.body.textContent = JSON.stringify(r);
})();
</script></body>`;

async function probe(target) {
  await target.waitForSelector("body#probed", { timeout: 30_000 });
  return JSON.parse(await target.textContent("body#probed"));
}

test("a sandbox's page on the API's origin gets no token and registers no service worker", async () => {
  const sb = await api("POST", "/v1/sandboxes", { image: "busybox", memory_mb: 64 });
  try {
    await upload(sb.id, "/www/index.html", new TextEncoder().encode(HOSTILE));
    await upload(sb.id, "/www/sw.js", new TextEncoder().encode("self.addEventListener('fetch', () => {});"));
    await api("POST", `/v1/sandboxes/${sb.id}/processes`, { command: "busybox", args: ["httpd", "-f", "-p", "8080", "-h", "/www"] });
    const url = await api("POST", `/v1/sandboxes/${sb.id}/port-urls`, { port: 8080 });
    // Logged in to the console in this tab: the token is in its session storage.
    await page.goto(`${base}/ui/`);
    if (await page.locator("form.login").count()) {
      await page.fill("input[name=token]", TOKEN);
      await page.click("form.login button");
    }
    await page.waitForFunction(() => sessionStorage.getItem("sandfork-token"));
    for (let i = 0; ; i++) {
      const res = await fetch(base + url.signed_path);
      if (res.ok) break;
      if (i > 100) throw new Error(`the sandbox's page did not come up: ${res.status}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    // Opened in the same tab, and by a link into a new one.
    await page.goto(base + url.signed_path);
    const same = await probe(page);
    const other = await page.context().newPage();
    await other.goto(base + url.signed_path);
    const opened = await probe(other);
    await other.close();
    for (const [how, r] of [["same tab", same], ["new tab", opened]]) {
      assert.equal(r.origin, "null", `${how}: the page runs in an opaque origin: ${JSON.stringify(r)}`);
      assert.ok(!JSON.stringify(r).includes(TOKEN), `${how}: the page read the token: ${JSON.stringify(r)}`);
      assert.match(r.token, /^blocked:/, `${how}: ${JSON.stringify(r)}`);
      assert.match(r.cookie, /^blocked:/, `${how}: ${JSON.stringify(r)}`);
      assert.match(r.sw_root, /^refused:/, `${how}: ${JSON.stringify(r)}`);
      assert.match(r.sw_own, /^refused:/, `${how}: ${JSON.stringify(r)}`);
    }
    // The console in the tab is untouched: back to it, still logged in.
    await page.goto(`${base}/ui/#/`);
    await page.waitForSelector(`tr[data-id="${sb.id}"]`);
    assert.equal(await page.evaluate(() => navigator.serviceWorker.getRegistrations().then((r) => r.length)), 0);
    // A service worker script is never served on the API's origin, whatever the page asks.
    const [path, query] = url.signed_path.split("?");
    const sw = await fetch(`${base}${path}sw.js?${query}`, { headers: { "service-worker": "script" } });
    assert.equal(sw.status, 403);
  } finally {
    await api("DELETE", `/v1/sandboxes/${sb.id}`);
  }
});
