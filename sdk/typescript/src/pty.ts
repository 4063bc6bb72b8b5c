/**
 * Terminal sessions: a process on a pseudo-terminal in the sandbox, its output and input
 * over a WebSocket. A memory checkpoint closes attached sockets (code 1012); a session
 * reconnects by itself from the last byte it saw, so nothing is lost or seen twice.
 */

import WebSocket from "ws";

import { SandboxError } from "./errors.js";
import { Process } from "./process.js";
import { seg, target, type Transport } from "./transport.js";
import { camelize, snakeize, type CreatePtyRequest, type ProcessInfo } from "./wire.js";

const RECONNECTS = 50;

/** How a terminal session starts (a login shell without `command`). */
export type CreatePtyOptions = CreatePtyRequest & {
  /** Output as it arrives. */
  onData?: (data: Buffer) => void;
  /** Called once when the session's process ends. */
  onExit?: (exit: PtyExit) => void;
  signal?: AbortSignal;
};

/** How a session's process ended. */
export interface PtyExit {
  exitCode: number | null;
  signal: number | null;
}

/** A live terminal session. Iterate it for output, or give `onData`. */
export class PtySession implements AsyncIterable<Buffer> {
  /** How the process ended, once it has. */
  exit?: PtyExit;
  private socket?: WebSocket;
  private offset = 0;
  private closed = false;
  private readonly queue: Buffer[] = [];
  private wake?: () => void;
  private failure?: Error;
  private readonly ended: Promise<PtyExit>;
  private finish!: (exit: PtyExit) => void;
  private fail!: (e: Error) => void;

  /** @internal */
  constructor(
    private readonly transport: Transport,
    private readonly route: string,
    /** The session's process (a background process like any other). */
    readonly process: Process,
    private readonly callbacks: { onData?: (data: Buffer) => void; onExit?: (exit: PtyExit) => void },
  ) {
    this.ended = new Promise((resolve, reject) => {
      this.finish = resolve;
      this.fail = reject;
    });
    this.ended.catch(() => undefined);
  }

  /** The session's pid in the sandbox (stable across checkpoints and forks). */
  get pid(): number {
    return this.process.pid;
  }

  /** @internal Opens the WebSocket; resolves once it is open. */
  async connect(): Promise<void> {
    const ep = this.transport.endpoint;
    const path = target(ep, `${this.route}/pty/${seg(this.pid)}/connect`, { offset: this.offset });
    const url = ep.scheme === "unix" ? `ws+unix://${ep.socketPath}:${path}` : `${ep.scheme === "https" ? "wss" : "ws"}://${hostOf(ep.host)}:${ep.port}${path}`;
    const headers: Record<string, string> = this.transport.token ? { authorization: `Bearer ${this.transport.token}` } : {};
    const socket = new WebSocket(url, { headers, ca: this.transport.caBundle });
    // Listening from the start: output sent along with the handshake is delivered in the
    // same tick as "open", before anything awaiting it runs.
    socket.on("message", (data: Buffer, isBinary: boolean) => this.received(data, isBinary));
    // A socket that never opened is the failed attempt `connect` rejects with.
    let opened = false;
    socket.on("close", (code: number, reason: Buffer) => opened && void this.lost(socket, code, reason.toString()));
    this.socket = socket;
    await new Promise<void>((resolve, reject) => {
      socket.once("open", () => {
        opened = true;
        resolve();
      });
      socket.once("unexpected-response", (_req, res) => reject(new SandboxError(`terminal session ${this.pid}: the daemon answered ${res.statusCode}`)));
      socket.once("error", reject);
    });
    socket.on("error", () => undefined);
  }

  private received(data: Buffer, isBinary: boolean): void {
    if (isBinary) {
      this.offset += data.length;
      this.callbacks.onData?.(data);
      this.queue.push(data);
      this.wake?.();
      return;
    }
    const msg = JSON.parse(data.toString("utf8")) as { type: string; offset?: number; exit_code?: number | null; signal?: number | null; message?: string };
    if (msg.type === "offset" && typeof msg.offset === "number") this.offset = msg.offset;
    else if (msg.type === "exit") this.exit = { exitCode: msg.exit_code ?? null, signal: msg.signal ?? null };
  }

  private async lost(socket: WebSocket, code: number, reason: string): Promise<void> {
    if (socket !== this.socket) return;
    if (this.closed || code === 1000 || this.exit) return this.done();
    if (code !== 1012) return this.done(new SandboxError(`terminal session ${this.pid} ended: ${reason || code}`));
    let last: unknown;
    for (let i = 0; i < RECONNECTS && !this.closed; i++) {
      await new Promise((r) => setTimeout(r, 100));
      try {
        await this.connect();
        return;
      } catch (e) {
        last = e;
      }
    }
    this.done(this.closed ? undefined : new SandboxError(`terminal session ${this.pid}: cannot reconnect: ${String(last)}`));
  }

  private done(error?: Error): void {
    if (error) {
      this.failure = error;
      this.fail(error);
    } else {
      const exit = this.exit ?? { exitCode: null, signal: null };
      if (this.exit) this.callbacks.onExit?.(exit);
      this.finish(exit);
    }
    this.closed = true;
    this.wake?.();
  }

  /** Types `data` into the terminal. */
  async write(data: string | Uint8Array): Promise<void> {
    await this.send(typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data));
  }

  /** Resizes the terminal (the foreground program gets SIGWINCH). */
  async resize(cols: number, rows: number): Promise<void> {
    await this.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  private async send(message: Buffer | string): Promise<void> {
    for (let i = 0; i < RECONNECTS; i++) {
      const socket = this.socket;
      if (this.failure) throw this.failure;
      if (this.closed || !socket) throw new SandboxError(`terminal session ${this.pid} is closed`);
      if (socket.readyState === WebSocket.OPEN) {
        await new Promise<void>((resolve, reject) => socket.send(message, (e) => (e ? reject(e) : resolve())));
        return;
      }
      await new Promise((r) => setTimeout(r, 100)); // a reconnect is under way
    }
    throw new SandboxError(`terminal session ${this.pid}: not connected`);
  }

  /** Waits until the session's process ends. */
  wait(): Promise<PtyExit> {
    return this.ended;
  }

  /** Ends the session's process. */
  async kill(): Promise<void> {
    await this.process.kill();
  }

  /** Detaches: the socket closes, the process goes on (connect again with `sandbox.pty.connect`). */
  disconnect(): void {
    this.closed = true;
    this.socket?.close(1000);
    this.done();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (;;) {
      const chunk = this.queue.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this.failure) throw this.failure;
      if (this.closed) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}

function hostOf(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/** A sandbox's terminal sessions (`sandbox.pty`). */
export class Pty {
  /** @internal */
  constructor(
    private readonly transport: Transport,
    private readonly route: string,
  ) {}

  /** Starts a process on a new terminal (a login shell without `command`) and attaches. */
  async create(options: CreatePtyOptions = {}): Promise<PtySession> {
    const { onData, onExit, signal, ...request } = options;
    const info = camelize<ProcessInfo>(await this.transport.json("POST", `${this.route}/pty`, { json: snakeize(request), signal }));
    const session = new PtySession(this.transport, this.route, new Process(this.transport, this.route, info), { onData, onExit });
    await session.connect();
    return session;
  }

  /** Attaches to a live session by pid; its buffered output is replayed first. */
  async connect(pid: number, options: Pick<CreatePtyOptions, "onData" | "onExit"> = {}): Promise<PtySession> {
    const info = camelize<ProcessInfo>(await this.transport.json("GET", `${this.route}/processes/${seg(pid)}`));
    const session = new PtySession(this.transport, this.route, new Process(this.transport, this.route, info), options);
    await session.connect();
    return session;
  }

  /** Resizes a session without a socket. */
  async resize(pid: number, cols: number, rows: number): Promise<void> {
    await this.transport.json("POST", `${this.route}/pty/${seg(pid)}/resize`, { json: { cols, rows } });
  }
}
