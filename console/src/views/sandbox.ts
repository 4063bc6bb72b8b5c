// One sandbox: its state and actions, a live terminal, files, logs, processes and events.

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";

import { ApiError, call, json, ndjson, socketUrl, type FileEntry, type Process, type Sandbox } from "../api";
import { age, bytes, h, labels } from "../dom";
import { toast, type View } from "./view";

/** Output kept in a panel's view at most (older lines drop off, so a flood cannot hang the page). */
const MAX_LINES = 2000;

export const sandboxView: View = async (root, id) => {
  const route = `/v1/sandboxes/${encodeURIComponent(id!)}`;
  const stops: (() => void)[] = [];
  const head = h("div", { class: "head" });
  const term = h("div", { class: "terminal", id: "terminal" });
  const files = h("div", { class: "files" });
  const logs = h("pre", { class: "log", id: "logs" });
  const procs = h("tbody");
  const events = h("ul", { class: "events", id: "events" });
  root.append(
    head,
    h("section", {}, h("h2", {}, "Terminal"), term),
    h("section", {}, h("h2", {}, "Files"), files),
    h("div", { class: "two" },
      h("section", {}, h("h2", {}, "Logs"), logs),
      h("section", {}, h("h2", {}, "Events"), events)),
    h("section", {}, h("h2", {}, "Processes"), h("table", { class: "list" }, h("thead", {}, h("tr", {}, ...["pid", "name", "command", "status", "age"].map((t) => h("th", {}, t)))), procs)),
  );

  let sandbox = await json<Sandbox>("GET", route);
  const gone = (e: unknown) => e instanceof ApiError && e.status === 404;

  /** The sandbox went away while its page was open: say so, stop everything. */
  let isLost = false;
  function lost(): void {
    if (isLost) return;
    isLost = true;
    stops.forEach((s) => s());
    root.replaceChildren(h("p", { class: "error", id: "gone" }, `Sandbox ${id} was deleted.`), h("a", { href: "#/" }, "Back to the sandboxes"));
  }

  async function act(what: string, run: () => Promise<unknown>): Promise<void> {
    try {
      await run();
      toast(`${what}: done`);
      await drawHead();
    } catch (e) {
      if (gone(e)) return lost();
      toast(`${what}: ${(e as Error).message}`);
    }
  }

  async function drawHead(): Promise<void> {
    sandbox = await json<Sandbox>("GET", route);
    if (sandbox.state === "terminated") return lost();
    const forks = h("input", { type: "number", min: "1", max: "64", value: "4", "aria-label": "forks", class: "count" });
    head.replaceChildren(
      h("h1", {}, sandbox.name ?? sandbox.id),
      h("p", {}, h("span", { class: `state ${sandbox.state}`, id: "state" }, sandbox.state), ` · ${sandbox.image} · ${sandbox.cpus} CPU · ${sandbox.memory_mb} MiB · ${age(sandbox.created_at)} old `, labels(sandbox.labels)),
      h("div", { class: "actions" },
        h("button", { onclick: () => void act("Checkpoint", () => json("POST", `${route}/checkpoint`, { type: "filesystem" })) }, "Checkpoint disk"),
        h("button", { onclick: () => void act("Memory checkpoint", () => json("POST", `${route}/checkpoint`, { type: "memory" })) }, "Checkpoint memory"),
        h("span", { class: "fork" }, forks, h("button", { onclick: () => void act("Fork", () => json("POST", `${route}/fork`, { count: Number(forks.value) })) }, "Fork")),
        h("button", { onclick: () => void act("Suspend", () => json("POST", `${route}/suspend`)) }, "Suspend"),
        h("button", { onclick: () => void act("Resume", () => json("POST", `${route}/resume`)) }, "Resume"),
        h("button", { class: "danger", onclick: () => confirm(`Delete ${sandbox.id}?`) && void act("Delete", () => json("DELETE", route)) }, "Delete"),
      ),
    );
  }

  await drawHead();
  stops.push(openTerminal(term, route, lost));
  stops.push(await fileBrowser(files, route, lost));
  stops.push(follow(`${route}/logs?follow=true&tail=200`, logs, (l: { process: string; level: string; message: string }) => `${l.process} ${l.level === "error" ? "!" : ">"} ${l.message}`));
  stops.push(followEvents(events, sandbox.id, () => void drawHead().catch((e) => gone(e) && lost())));
  const refreshProcs = async () => {
    try {
      const { processes } = await json<{ processes: Process[] }>("GET", `${route}/processes`);
      procs.replaceChildren(...processes.map((p) => h("tr", {}, h("td", {}, String(p.pid)), h("td", {}, p.name ?? ""), h("td", {}, [p.command, ...p.args].join(" ")), h("td", {}, p.status), h("td", {}, age(p.started_at)))));
    } catch (e) {
      if (gone(e)) lost();
    }
  };
  await refreshProcs();
  const timer = setInterval(() => void refreshProcs(), 3000);
  stops.push(() => clearInterval(timer));
  return () => stops.forEach((s) => s());
};

/**
 * A terminal session on the sandbox, over the PTY WebSocket. The session outlives its
 * socket: after a checkpoint (close code 1012) or any other drop it attaches again from the
 * output offset it has, backing off while attaching fails, until the program exits.
 */
function openTerminal(el: HTMLElement, route: string, lost: () => void): () => void {
  const xterm = new Terminal({ convertEol: false, scrollback: 5000, fontSize: 13 });
  const fit = new FitAddon();
  xterm.loadAddon(fit);
  xterm.open(el);
  fit.fit();
  let socket: WebSocket | undefined;
  let offset = 0;
  let closed = false;
  let exited = false;
  let failures = 0;
  let pid: number | undefined;
  const connect = () => {
    const ws = new WebSocket(socketUrl(`${route}/pty/${pid}/connect?offset=${offset}`));
    ws.binaryType = "arraybuffer";
    ws.onmessage = (ev) => {
      failures = 0;
      if (ev.data instanceof ArrayBuffer) {
        offset += ev.data.byteLength;
        xterm.write(new Uint8Array(ev.data));
        return;
      }
      const msg = JSON.parse(String(ev.data)) as { type: string; offset?: number };
      if (msg.type === "offset" && msg.offset !== undefined) offset = msg.offset;
      if (msg.type === "exit") {
        exited = true;
        xterm.write("\r\n[the session ended]\r\n");
      }
    };
    ws.onclose = (ev) => {
      if (closed || exited || ev.code === 1000) return;
      failures += 1;
      if (failures > 8) {
        xterm.write(`\r\n[disconnected: ${ev.reason || `code ${ev.code}`}]\r\n`);
        return;
      }
      setTimeout(connect, Math.min(300 * 2 ** (failures - 1), 5000));
    };
    socket = ws;
  };
  (async () => {
    try {
      const proc = await json<Process>("POST", `${route}/pty`, { cols: xterm.cols, rows: xterm.rows });
      pid = proc.pid;
      connect();
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) lost();
      else xterm.write(`cannot open a terminal: ${(e as Error).message}\r\n`);
    }
  })();
  const input = xterm.onData((data) => socket?.readyState === WebSocket.OPEN && socket.send(new TextEncoder().encode(data)));
  const resize = () => {
    fit.fit();
    if (socket?.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", cols: xterm.cols, rows: xterm.rows }));
  };
  window.addEventListener("resize", resize);
  return () => {
    closed = true;
    window.removeEventListener("resize", resize);
    input.dispose();
    socket?.close(1000);
    if (pid !== undefined) void call("DELETE", `${route}/processes/${pid}`).catch(() => undefined);
    xterm.dispose();
  };
}

/** A directory listing with navigation, download links and an upload form. */
async function fileBrowser(el: HTMLElement, route: string, lost: () => void): Promise<() => void> {
  let dir = "/";
  const show = async (path: string) => {
    try {
      const { entries } = await json<{ entries: FileEntry[] }>("GET", `${route}/files/list?path=${encodeURIComponent(path)}`);
      dir = path;
      const up = path === "/" ? null : h("li", {}, h("a", { href: "#", onclick: (ev) => (ev.preventDefault(), void show(path.replace(/\/[^/]+\/?$/, "") || "/")) }, ".."));
      const picker = h("input", { type: "file", "aria-label": "upload" });
      el.replaceChildren(
        h("p", { class: "path" }, dir),
        h("ul", { class: "entries" }, up, ...entries.sort((a, b) => a.name.localeCompare(b.name)).map((e) =>
          e.type === "dir"
            ? h("li", { class: "dir" }, h("a", { href: "#", onclick: (ev) => (ev.preventDefault(), void show(e.path)) }, `${e.name}/`))
            : h("li", {}, h("a", { href: "#", class: "download", "data-path": e.path, onclick: (ev) => (ev.preventDefault(), void download(route, e)) }, e.name), ` ${bytes(e.size)}`))),
        h("form", { class: "inline", onsubmit: (ev) => (ev.preventDefault(), void upload(picker)) }, picker, h("button", { type: "submit" }, "Upload here")),
      );
    } catch (e) {
      if (e instanceof ApiError && e.status === 404 && path === "/") return lost();
      toast((e as Error).message);
    }
  };
  const upload = async (picker: HTMLInputElement) => {
    const file = picker.files?.[0];
    if (!file) return;
    const target = `${dir.replace(/\/$/, "")}/${file.name}`;
    try {
      await call("PUT", `${route}/files?path=${encodeURIComponent(target)}`, undefined, file);
      toast(`uploaded ${target}`);
      await show(dir);
    } catch (e) {
      toast((e as Error).message);
    }
  };
  await show("/");
  return () => undefined;
}

/** Downloads a file as the browser does, streamed to a blob (no text decoding of binary data). */
async function download(route: string, entry: FileEntry): Promise<void> {
  try {
    const res = await call("GET", `${route}/files?path=${encodeURIComponent(entry.path)}`);
    const url = URL.createObjectURL(await res.blob());
    const a = h("a", { href: url, download: entry.name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (e) {
    toast((e as Error).message);
  }
}

/** Appends each line of an NDJSON stream to `el`, keeping the last MAX_LINES. */
function follow<T>(path: string, el: HTMLElement, line: (v: T) => string): () => void {
  const abort = new AbortController();
  void ndjson<T>(path, (v) => {
    el.append(line(v) + "\n");
    while (el.childNodes.length > MAX_LINES) el.firstChild!.remove();
    el.scrollTop = el.scrollHeight;
  }, abort.signal).catch(() => undefined);
  return () => abort.abort();
}

function followEvents(el: HTMLElement, id: string, changed: () => void): () => void {
  const abort = new AbortController();
  void ndjson<{ seq: number; at: string; type: string; message?: string; snapshot_id?: string }>(
    `/v1/events?sandbox=${encodeURIComponent(id)}&since=0`,
    (e) => {
      el.prepend(h("li", { "data-type": e.type }, `${e.at.slice(11, 19)} ${e.type}${e.snapshot_id ? ` ${e.snapshot_id}` : ""}${e.message ? ` — ${e.message}` : ""}`));
      while (el.childNodes.length > MAX_LINES) el.lastChild!.remove();
      changed();
    },
    abort.signal,
  ).catch(() => undefined);
  return () => abort.abort();
}
