/**
 * sandfork: isolated Linux sandboxes you snapshot once and fork many times.
 *
 * ```ts
 * import { Sandbox } from "sandfork";
 *
 * const sb = await Sandbox.create({ image: "python" });
 * await sb.run("pip", ["install", "numpy"]);
 * const snap = await sb.checkpoint({ type: "memory" });
 * const workers = await snap.fork(8);
 * ```
 */

export { Client, EventFeed, JsonStream, type ClientOptions, type EventOptions, type ProgressCallback } from "./client.js";
export { CommandStream, type CommandResult, type OutputChunk, type RunOptions } from "./commands.js";
export * from "./errors.js";
export { Files, type WriteOptions } from "./files.js";
export { Process, type OutputOptions, type StartProcessOptions } from "./process.js";
export { Pty, PtySession, type CreatePtyOptions, type PtyExit } from "./pty.js";
export { Sandbox, type CreateOptions, type LogOptions } from "./sandbox.js";
export { ForkResult, type ForkFailure, type ForkOptions } from "./fork.js";
export { Snapshot } from "./snapshot.js";
export { DEFAULT_SOCKET, parseUrl, type Endpoint } from "./transport.js";
export type * from "./wire.js";
export { camelize, snakeize } from "./wire.js";
export type { components, paths } from "./openapi.js";
