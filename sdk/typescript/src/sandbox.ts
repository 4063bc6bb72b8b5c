/** A sandbox: an isolated Linux environment that runs commands and processes, holds files,
 * and is checkpointed, forked, suspended and resumed. */

import { Client, JsonStream, type ProgressCallback } from "./client.js";
import { run, streamCommand, type CommandResult, type CommandStream, type RunOptions } from "./commands.js";
import { SandboxError, TimeoutError } from "./errors.js";
import { Files } from "./files.js";
import { Process, startProcess, type StartProcessOptions } from "./process.js";
import { Pty } from "./pty.js";
import { Snapshot } from "./snapshot.js";
import { seg } from "./transport.js";
import {
  camelize,
  snakeize,
  type CheckpointRequest,
  type CreateSandboxRequest,
  type LogEntry,
  type PortUrl,
  type SandboxEvent,
  type SandboxInfo,
  type SandboxState,
  type SandboxStats,
  type UpdateSandboxRequest,
} from "./wire.js";
import type { components } from "./openapi.js";

const DEFAULT_STARTUP_TIMEOUT_MS = 300_000;

/** What `Sandbox.create` takes: the API's fields, camelCase, plus the client's own. */
export type CreateOptions = CreateSandboxRequest & {
  client?: Client;
  /** Progress lines of an image built on first use. */
  onProgress?: ProgressCallback;
  /** How long to wait for the sandbox to run (default 300 000 ms); it is deleted after. */
  startupTimeoutMs?: number;
  signal?: AbortSignal;
};

/** What a sandbox's log takes. */
export interface LogOptions {
  /** Start at this line (`seq`). */
  since?: number;
  /** Only the last N lines. */
  tail?: number;
  /** Only this process (a pid, or a supervised process's name). */
  process?: string | number;
  stream?: "stdout" | "stderr";
  /** Keep following new lines. */
  follow?: boolean;
  signal?: AbortSignal;
}

/** A handle on one sandbox. */
export class Sandbox {
  /** The sandbox's files. */
  readonly files: Files;
  /** The sandbox's terminal sessions. */
  readonly pty: Pty;

  /** @internal */
  constructor(
    readonly client: Client,
    /** The sandbox as last read (`refresh` reads it again). */
    public info: SandboxInfo,
  ) {
    this.files = new Files(client.transport, this.route);
    this.pty = new Pty(client.transport, this.route);
  }

  /** The sandbox's id (`sb-…`). */
  get id(): string {
    return this.info.id;
  }

  get name(): string | null | undefined {
    return this.info.name;
  }

  private get route(): string {
    return `/v1/sandboxes/${seg(this.info.id)}`;
  }

  private get transport() {
    return this.client.transport;
  }

  /** Creates a sandbox from an image (built on first use) or a snapshot, and waits until
   * it runs; a sandbox that does not start is deleted and the error says why. */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const { client: given, onProgress, startupTimeoutMs, signal, ...request } = options;
    const client = given ?? new Client();
    if (onProgress && request.image) await client.ensureImage(request.image, { onProgress, signal });
    const doc = await client.transport.json("POST", "/v1/sandboxes", { json: snakeize(request), signal, idleTimeoutMs: 0 });
    const sandbox = new Sandbox(client, camelize(doc));
    try {
      await sandbox.waitStarted(startupTimeoutMs ?? DEFAULT_STARTUP_TIMEOUT_MS, signal);
    } catch (e) {
      await sandbox.terminate().catch(() => undefined);
      throw e;
    }
    return sandbox;
  }

  /** A handle on an existing sandbox, by id or name. */
  static async connect(idOrName: string, options: { client?: Client } = {}): Promise<Sandbox> {
    const client = options.client ?? new Client();
    return new Sandbox(client, camelize(await client.transport.json("GET", `/v1/sandboxes/${seg(idOrName)}`)));
  }

  /** Live sandboxes (terminated ones with `state: "terminated"`), optionally by name or by
   * labels (every label given must match). */
  static async list(options: { state?: SandboxState; name?: string; labels?: Record<string, string>; client?: Client } = {}): Promise<Sandbox[]> {
    const client = options.client ?? new Client();
    const query = { state: options.state, name: options.name, labels: options.labels };
    const doc = await client.transport.json<components["schemas"]["SandboxList"]>("GET", "/v1/sandboxes", { query });
    return doc.sandboxes.map((s) => new Sandbox(client, camelize(s)));
  }

  private async waitStarted(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let delay = 20;
    while (this.info.state === "creating") {
      if (Date.now() > deadline) throw new TimeoutError(`Sandbox ${this.id} did not start within ${timeoutMs} ms`);
      signal?.throwIfAborted();
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 500);
      await this.refresh();
    }
    if (this.info.state !== "running") {
      const detail = this.info.error ? `: ${this.info.error}` : "";
      throw new SandboxError(`Sandbox ${this.id} became ${this.info.state} during startup${detail}`);
    }
  }

  /** Reads the sandbox again. */
  async refresh(): Promise<SandboxInfo> {
    this.info = camelize(await this.transport.json("GET", this.route));
    return this.info;
  }

  /** The sandbox's state, read now. */
  async state(): Promise<SandboxState> {
    return (await this.refresh()).state;
  }

  /** Runs a command to completion. A non-zero exit is not an error; a command that cannot
   * start (no such program) is an `InvalidArgumentError` with code `exec_failed`. With
   * `onStdout`/`onStderr` the output streams to them as it comes. */
  run(command: string, args: string[] = [], options: RunOptions = {}): Promise<CommandResult> {
    return run(this.transport, this.route, command, args, options);
  }

  /** Runs a command, its output read as it comes: `for await (const chunk of stream)`,
   * then `await stream.result`. */
  stream(command: string, args: string[] = [], options: Omit<RunOptions, "onStdout" | "onStderr"> = {}): CommandStream {
    return streamCommand(this.transport, this.route, command, args, options);
  }

  /** Starts a background process. */
  startProcess(command: string, args: string[] = [], options: StartProcessOptions = {}): Promise<Process> {
    return startProcess(this.transport, this.route, command, args, options);
  }

  /** The sandbox's background processes (and terminal sessions). */
  async listProcesses(): Promise<Process[]> {
    const doc = await this.transport.json<components["schemas"]["ProcessList"]>("GET", `${this.route}/processes`);
    return doc.processes.map((p) => new Process(this.transport, this.route, camelize(p)));
  }

  /** A background process by pid, or a supervised one by name. */
  async getProcess(pid: number | string): Promise<Process> {
    return new Process(this.transport, this.route, camelize(await this.transport.json("GET", `${this.route}/processes/${seg(pid)}`)));
  }

  /** Checkpoints the sandbox: its disk (`filesystem`, the default), or its disk, memory and
   * running processes (`memory`). The sandbox runs on. */
  async checkpoint(options: CheckpointRequest & { signal?: AbortSignal } = {}): Promise<Snapshot> {
    const { signal, ...request } = options;
    const doc = await this.transport.json("POST", `${this.route}/checkpoint`, { json: snakeize(request), signal, idleTimeoutMs: 0 });
    return new Snapshot(this.client, camelize(doc));
  }

  // `fork` is in fork.ts, with the other calls that start sandboxes from a snapshot.

  /** Suspends the sandbox: a memory checkpoint, then its processes stop and free their
   * memory. Any call that needs it running resumes it. */
  async suspend(): Promise<SandboxInfo> {
    this.info = camelize(await this.transport.json("POST", `${this.route}/suspend`, { idleTimeoutMs: 0 }));
    return this.info;
  }

  /** Resumes a suspended sandbox where it was. */
  async resume(): Promise<SandboxInfo> {
    this.info = camelize(await this.transport.json("POST", `${this.route}/resume`, { idleTimeoutMs: 0 }));
    return this.info;
  }

  /** Changes the sandbox: name, labels (replaced), egress lists, idle timeout, ports. */
  async update(changes: UpdateSandboxRequest): Promise<SandboxInfo> {
    this.info = camelize(await this.transport.json("PATCH", this.route, { json: snakeize(changes) }));
    return this.info;
  }

  /** Sets and removes labels in one step (no read-modify-write race between clients). */
  async updateLabels(patch: { set?: Record<string, string>; remove?: string[] }): Promise<Record<string, string>> {
    const doc = await this.transport.json<components["schemas"]["Labels"]>("PATCH", `${this.route}/labels`, { json: patch });
    this.info = { ...this.info, labels: doc.labels };
    return doc.labels;
  }

  /** Sets the idle timeout, counted from now (0: never), and what it does. */
  async setTimeout(seconds: number, options: { onTimeout?: "terminate" | "suspend" } = {}): Promise<SandboxInfo> {
    return this.update({ timeoutSecs: seconds, onTimeout: options.onTimeout });
  }

  /** Replaces the egress lists of a sandbox with internet, at once, without a restart. */
  async updateNetwork(rules: { allowOut?: string[]; denyOut?: string[] }): Promise<SandboxInfo> {
    return this.update(rules);
  }

  /** CPU, memory, disk and network use, read now. */
  async stats(): Promise<SandboxStats> {
    return camelize(await this.transport.json("GET", `${this.route}/stats`));
  }

  /** The lines the sandbox's background processes wrote. */
  logs(options: LogOptions = {}): JsonStream<LogEntry> {
    const { signal, ...query } = options;
    return new JsonStream<LogEntry>((s) => this.transport.open("GET", `${this.route}/logs`, { query, signal: s, idleTimeoutMs: 0 }), signal);
  }

  /** This sandbox's lifecycle events: the kept ones after `since` first, then new ones
   * unless `follow` is false. */
  events(options: { since?: number; follow?: boolean; signal?: AbortSignal } = {}): JsonStream<SandboxEvent> {
    return this.client.events({ ...options, sandbox: this.id });
  }

  /** The URL of `path` on `port` through the daemon's gateway (HTTP, WebSocket, SSE):
   * signed, opening that port for `expiresInSecs` (default 3600), or bare with `signed:
   * false` (public ports, or a client that sends `portToken()`). A daemon on a Unix socket
   * gives `http+unix://SOCKET:PATH`. */
  async getUrl(port: number, options: { path?: string; expiresInSecs?: number; signed?: boolean } = {}): Promise<string> {
    const access = await this.portAccess(port, options.expiresInSecs ?? 3600);
    const [route, query] = (options.signed === false ? access.path : access.signedPath).split("?", 2);
    const ep = this.client.endpoint;
    const path = ep.basePath + route!.replace(/\/+$/, "") + "/" + (options.path ?? "/").replace(/^\/+/, "") + (query ? `?${query}` : "");
    if (ep.scheme === "unix" && access.baseUrl) return access.baseUrl.replace(/\/+$/, "") + path;
    if (ep.scheme === "unix") return `http+unix://${ep.socketPath}:${path}`;
    const host = ep.host.includes(":") ? `[${ep.host}]` : ep.host;
    return `${ep.scheme}://${host}:${ep.port}${path}`;
  }

  /** The host name of `port` for host-based routing (`{port}-{id}.<domain>`). */
  async getHost(port: number): Promise<string> {
    return (await this.portAccess(port, 60)).host;
  }

  /** The token that opens every port of this sandbox (`X-Sandfork-Access-Token`). */
  async portToken(): Promise<string> {
    return (await this.portAccess(1, 60)).accessToken;
  }

  /** Revokes every access token and signed URL of this sandbox made so far; resolves with
   * the new access token. */
  async rotatePortToken(): Promise<string> {
    const doc = await this.transport.json("POST", `${this.route}/access-token`);
    return String((doc as { access_token: string }).access_token);
  }

  private async portAccess(port: number, expiresInSecs: number): Promise<PortUrl> {
    return camelize(await this.transport.json("POST", `${this.route}/port-urls`, { json: { port, expires_in_secs: expiresInSecs } }));
  }

  /** Terminates the sandbox (idempotent). */
  async terminate(): Promise<void> {
    this.info = camelize(await this.transport.json("DELETE", this.route, { idleTimeoutMs: 0 }));
  }
}
