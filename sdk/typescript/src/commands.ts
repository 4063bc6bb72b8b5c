/** Commands run to completion in a sandbox: one result, or their output as it comes. */

import type { Readable } from "node:stream";

import { ConnectionError, SandforkError, streamError } from "./errors.js";
import { ndjson, stdinFields, type Transport } from "./transport.js";
import { camelize, snakeize, type ExecRequest, type ExecResult, type StreamEvent } from "./wire.js";

/** How a command runs. */
export interface RunOptions {
  env?: Record<string, string>;
  /** Absolute path. */
  workingDir?: string;
  /** `name`, `uid` or `uid:gid`. */
  user?: string;
  /** Kill the command after this many seconds. */
  timeoutSecs?: number;
  /** Standard input. */
  stdin?: string | Uint8Array;
  /** Output as it arrives, a line at a time without its newline (the command then
   * streams); a last line with no newline comes when the command ends. */
  onStdout?: (data: string) => void;
  onStderr?: (data: string) => void;
  signal?: AbortSignal;
}

/** What a command left. `exitCode` is `-signal` for a command killed by a signal. */
export interface CommandResult {
  exitCode: number;
  signal: number | null;
  /** The output as text with one trailing newline removed (as in the Python SDK). */
  stdout: string;
  stderr: string;
  /** The exact bytes (`stdout` is them decoded as UTF-8, its last newline kept). */
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
  timedOut: boolean;
  durationMs: number;
}

/** A chunk of a command's output. */
export interface OutputChunk {
  stream: "stdout" | "stderr";
  data: Buffer;
  /** `data` decoded as UTF-8. */
  text: string;
  /** Where `data` starts in its stream. */
  offset: number;
}

/** The exec request body for `command`. */
export function execBody(command: string, args: string[], options: RunOptions, stream: boolean): unknown {
  const request: ExecRequest = {
    command,
    args,
    env: options.env,
    workingDir: options.workingDir,
    user: options.user,
    timeoutSecs: options.timeoutSecs,
    stream,
  };
  return { ...(snakeize(request) as object), ...stdinFields(options.stdin) };
}

/** The result of a non-streamed exec. */
export function resultOf(doc: unknown): CommandResult {
  const r = camelize<ExecResult>(doc);
  const stdoutBytes = r.stdoutB64 ? Buffer.from(r.stdoutB64, "base64") : Buffer.from(r.stdout, "utf8");
  const stderrBytes = r.stderrB64 ? Buffer.from(r.stderrB64, "base64") : Buffer.from(r.stderr, "utf8");
  return finish(stdoutBytes, stderrBytes, r);
}

function finish(
  stdoutBytes: Buffer,
  stderrBytes: Buffer,
  exit: { exitCode?: number | null; signal?: number | null; timedOut: boolean; durationMs: number },
): CommandResult {
  const signal = exit.signal ?? null;
  return {
    exitCode: exit.exitCode ?? (signal ? -signal : -1),
    signal,
    stdout: withoutLastNewline(stdoutBytes.toString("utf8")),
    stderr: withoutLastNewline(stderrBytes.toString("utf8")),
    stdoutBytes,
    stderrBytes,
    timedOut: exit.timedOut,
    durationMs: exit.durationMs,
  };
}

/** The chunk a stdout/stderr event carries, or `undefined` for other events. */
export function chunkOf(event: StreamEvent): OutputChunk | undefined {
  if (event.type !== "stdout" && event.type !== "stderr") return undefined;
  const data = event.dataB64 ? Buffer.from(event.dataB64, "base64") : Buffer.from(event.data ?? "", "utf8");
  return { stream: event.type, data, text: data.toString("utf8"), offset: event.offset };
}

/**
 * A command's output as it comes: `for await (const chunk of stream)`, then `await
 * stream.result` (which also works without iterating: the output is then collected).
 */
export class CommandStream implements AsyncIterable<OutputChunk> {
  /** The command's result, once its output has been read to the end. */
  readonly result: Promise<CommandResult>;
  private settle!: (r: CommandResult) => void;
  private fail!: (e: unknown) => void;
  private started = false;

  /** @internal */
  constructor(
    private readonly open: () => Promise<Readable>,
    /** A process's output read without following may end before the process does. */
    private readonly mayEndOpen = false,
  ) {
    this.result = new Promise((resolve, reject) => {
      this.settle = resolve;
      this.fail = reject;
    });
    // A result nobody awaits must not become an unhandled rejection.
    this.result.catch(() => undefined);
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    if (this.started) throw new Error("a command's output can be iterated once");
    this.started = true;
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    try {
      for await (const raw of ndjson<unknown>(await this.open())) {
        const event = camelize<StreamEvent>(raw);
        const chunk = chunkOf(event);
        if (chunk) {
          (chunk.stream === "stdout" ? out : err).push(chunk.data);
          yield chunk;
        } else if (event.type === "exit") {
          this.settle(finish(Buffer.concat(out), Buffer.concat(err), event));
          return;
        } else if (event.type === "error") {
          throw streamError(event);
        }
      }
      if (!this.mayEndOpen) throw new ConnectionError("the daemon ended the command's output without its exit");
      this.fail(new SandforkError("the process is still running: its output was read without following it"));
    } catch (e) {
      this.fail(e);
      throw e;
    }
  }

  /** Reads the output to the end (if nobody iterates it) and gives the result. */
  async wait(): Promise<CommandResult> {
    if (!this.started) {
      for await (const _ of this) {
        // collected by the iterator
      }
    }
    return this.result;
  }
}

/** Runs a command to completion: streamed when the caller wants output as it comes. */
export async function run(transport: Transport, route: string, command: string, args: string[], options: RunOptions): Promise<CommandResult> {
  if (!options.onStdout && !options.onStderr) {
    const doc = await transport.json("POST", `${route}/exec`, { json: execBody(command, args, options, false), signal: options.signal, idleTimeoutMs: 0 });
    return resultOf(doc);
  }
  const stream = streamCommand(transport, route, command, args, options);
  const lines = { stdout: new Lines(options.onStdout), stderr: new Lines(options.onStderr) };
  for await (const chunk of stream) lines[chunk.stream].push(chunk.text);
  lines.stdout.end();
  lines.stderr.end();
  return stream.result;
}

/** Hands a callback whole lines of a stream's text, without their newline. */
class Lines {
  private partial = "";
  constructor(private readonly callback?: (line: string) => void) {}

  push(text: string): void {
    if (!this.callback) return;
    const parts = (this.partial + text).split("\n");
    this.partial = parts.pop() ?? "";
    for (const line of parts) this.callback(line);
  }

  end(): void {
    if (this.callback && this.partial) this.callback(this.partial);
    this.partial = "";
  }
}

/** `text` without one trailing newline: what `stdout` and `stderr` hold, as in the Python
 * SDK (the exact bytes are in `stdoutBytes` and `stderrBytes`). */
function withoutLastNewline(text: string): string {
  return text.endsWith("\n") ? text.slice(0, -1) : text;
}

/** A command whose output is read as it comes. */
export function streamCommand(transport: Transport, route: string, command: string, args: string[], options: RunOptions): CommandStream {
  const json = execBody(command, args, options, true);
  return new CommandStream(() => transport.open("POST", `${route}/exec`, { json, signal: options.signal, idleTimeoutMs: 0 }));
}
