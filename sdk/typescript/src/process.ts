/** Background processes in a sandbox: started, fed, signalled, waited on, their output read. */

import { CommandStream, type OutputChunk } from "./commands.js";
import { seg, stdinFields, type Transport } from "./transport.js";
import { camelize, snakeize, type ProcessInfo, type SpawnRequest } from "./wire.js";

/** How a background process starts: the command's options plus supervision. */
export type StartProcessOptions = Omit<SpawnRequest, "command" | "args" | "stdin" | "stdinB64"> & {
  /** Fixed standard input (else a pipe fed with `writeStdin`, unless `stdinMode` is `closed`). */
  stdin?: string | Uint8Array;
  signal?: AbortSignal;
};

/** Where to read a process's output from, and whether to follow it. */
export interface OutputOptions {
  offset?: number;
  stderrOffset?: number;
  /** Keep reading until the process ends (default true). */
  follow?: boolean;
  signal?: AbortSignal;
}

/** A background process: its state when last read, and what can be done to it. */
export class Process {
  /** @internal */
  constructor(
    private readonly transport: Transport,
    private readonly route: string,
    /** The process as last read (`refresh` reads it again). */
    public info: ProcessInfo,
  ) {}

  /** The process's id in the sandbox (stable across checkpoints and forks). */
  get pid(): number {
    return this.info.pid;
  }

  // The fields of `info` on the process itself, as the Python SDK has them.
  /** `running` or `exited`, as last read. */
  get status(): string {
    return this.info.status;
  }
  get exitCode(): number | null {
    return this.info.exitCode ?? null;
  }
  get signal(): number | null {
    return this.info.signal ?? null;
  }
  get command(): string {
    return this.info.command;
  }
  get args(): string[] {
    return this.info.args;
  }
  get startedAt(): string {
    return this.info.startedAt;
  }
  get endedAt(): string | null {
    return this.info.endedAt ?? null;
  }
  get stdinWritable(): boolean {
    return this.info.stdinWritable;
  }
  get name(): string | null {
    return this.info.name ?? null;
  }

  private get path(): string {
    return `${this.route}/processes/${seg(this.info.pid)}`;
  }

  /** Reads the process's state again. */
  async refresh(): Promise<ProcessInfo> {
    this.info = camelize(await this.transport.json("GET", this.path));
    return this.info;
  }

  /** Waits until the process ends (or `timeoutSecs` pass: it is then still `running`). */
  async wait(options: { timeoutSecs?: number; signal?: AbortSignal } = {}): Promise<ProcessInfo> {
    const query = { timeout_secs: options.timeoutSecs };
    this.info = camelize(await this.transport.json("POST", `${this.path}/wait`, { query, signal: options.signal, idleTimeoutMs: 0 }));
    return this.info;
  }

  /** Sends a signal (a number or a name such as `"TERM"`) to the process group. */
  async sendSignal(signal: number | string): Promise<void> {
    await this.transport.json("POST", `${this.path}/signal`, { json: { signal } });
  }

  /** Stops the process: SIGTERM, then SIGKILL after 2 s (a supervised one is not restarted). */
  async kill(): Promise<void> {
    await this.transport.json("DELETE", this.path);
  }

  /** Restarts the process; the new run has a new pid. */
  async restart(): Promise<Process> {
    return new Process(this.transport, this.route, camelize(await this.transport.json("POST", `${this.path}/restart`)));
  }

  /** Writes to the process's standard input. */
  async writeStdin(data: string | Uint8Array): Promise<void> {
    await this.transport.json("POST", `${this.path}/stdin`, { body: typeof data === "string" ? Buffer.from(data) : data });
  }

  async closeStdin(): Promise<void> {
    await this.transport.json("POST", `${this.path}/stdin/close`);
  }

  /** The output so far, and with `follow` (the default) until the process ends. Each chunk
   * carries its offset, so a reader that stops can go on from where it was. */
  output(options: OutputOptions = {}): CommandStream & AsyncIterable<OutputChunk> {
    const query = { offset: options.offset, stderr_offset: options.stderrOffset, follow: options.follow ?? true };
    return new CommandStream(
      () => this.transport.open("GET", `${this.path}/output`, { query, signal: options.signal, idleTimeoutMs: 0 }),
      !query.follow,
    );
  }
}

/** Starts a background process. */
export async function startProcess(
  transport: Transport,
  route: string,
  command: string,
  args: string[],
  options: StartProcessOptions,
): Promise<Process> {
  const { stdin, signal, ...rest } = options;
  const body = { ...(snakeize({ ...rest, command, args }) as object), ...stdinFields(stdin) };
  const info = camelize<ProcessInfo>(await transport.json("POST", `${route}/processes`, { json: body, signal }));
  return new Process(transport, route, info);
}
