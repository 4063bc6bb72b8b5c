/** Forks and restores: every call that starts sandboxes from a snapshot. `Sandbox.fork`,
 * `Snapshot.fork` and `Snapshot.restore` are defined here, above both classes, so that
 * neither class's module imports the other's. */

import type { Client } from "./client.js";
import { Sandbox, type CreateOptions } from "./sandbox.js";
import { Snapshot } from "./snapshot.js";
import { seg } from "./transport.js";
import { camelize, snakeize, type ForkChild, type ForkRequest } from "./wire.js";
import type { components } from "./openapi.js";

/** What a fork takes: every child's env, secrets and labels, per-child additions, names and
 * idle timeout. */
export type ForkOptions = Omit<ForkRequest, "count"> & { signal?: AbortSignal };

/** A child that failed to start, and why. */
export interface ForkFailure {
  index: number;
  code: string;
  message: string;
}

/** The sandboxes a fork started, in index order: an array (`map`, `length`, indexing), as
 * the Python SDK's is a list, plus the snapshot they came from and the children that did
 * not start (each child succeeds or fails on its own). */
export class ForkResult extends Array<Sandbox> {
  /** @internal */
  constructor(
    /** The snapshot the children started from. */
    readonly snapshotId: string,
    sandboxes: Sandbox[],
    /** The children that did not start, with why. */
    readonly errors: ForkFailure[],
  ) {
    super();
    this.push(...sandboxes);
  }

  /** `map`, `filter` and the like give plain arrays (never this constructor). */
  static override get [Symbol.species](): ArrayConstructor {
    return Array;
  }

  /** The children that started (the array itself, for code written against the older shape). */
  get sandboxes(): Sandbox[] {
    return [...this];
  }

  /** Terminates every child that started. */
  async terminateAll(): Promise<void> {
    await Promise.all(this.map((s) => s.terminate()));
  }
}

declare module "./sandbox.js" {
  interface Sandbox {
    /** Checkpoints this sandbox's memory and starts `count` independent copies of it. */
    fork(count: number, options?: ForkOptions): Promise<ForkResult>;
  }
}

declare module "./snapshot.js" {
  interface Snapshot {
    /** Starts `count` independent sandboxes from this snapshot in one call. */
    fork(count: number, options?: ForkOptions): Promise<ForkResult>;
    /** Starts one sandbox from this snapshot (a memory snapshot: warm, its processes running). */
    restore(options?: Omit<CreateOptions, "snapshotId" | "image" | "client">): Promise<Sandbox>;
  }
}

/** The fork result of the daemon's `ForkResult` document. */
function forkResult(client: Client, doc: components["schemas"]["ForkResult"]): ForkResult {
  const children = camelize<ForkChild[]>(doc.children);
  const started = children.filter((c) => c.sandbox).map((c) => new Sandbox(client, c.sandbox!));
  const failed = children.filter((c) => !c.sandbox).map((c) => ({ index: c.index, code: c.error?.code ?? "failed", message: c.error?.message ?? "the child did not start" }));
  return new ForkResult(doc.snapshot_id, started, failed);
}

/** Asks `path` (a sandbox's or a snapshot's fork) for `count` children. */
async function fork(client: Client, path: string, count: number, options: ForkOptions): Promise<ForkResult> {
  const { signal, ...rest } = options;
  const json = snakeize({ ...rest, count });
  const doc = await client.transport.json<components["schemas"]["ForkResult"]>("POST", path, { json, signal, idleTimeoutMs: 0 });
  return forkResult(client, doc);
}

/** Adds `methods` to `target` as a class body would: writable, configurable, not enumerable. */
function defineMethods(target: object, methods: Record<string, (...args: never[]) => unknown>): void {
  for (const [name, value] of Object.entries(methods)) {
    Object.defineProperty(target, name, { value, writable: true, enumerable: false, configurable: true });
  }
}

defineMethods(Sandbox.prototype, {
  async fork(this: Sandbox, count: number, options: ForkOptions = {}): Promise<ForkResult> {
    return fork(this.client, `/v1/sandboxes/${seg(this.id)}/fork`, count, options);
  },
});

defineMethods(Snapshot.prototype, {
  async fork(this: Snapshot, count: number, options: ForkOptions = {}): Promise<ForkResult> {
    return fork(this.client, `/v1/snapshots/${seg(this.id)}/fork`, count, options);
  },
  async restore(this: Snapshot, options: Omit<CreateOptions, "snapshotId" | "image" | "client"> = {}): Promise<Sandbox> {
    return Sandbox.create({ ...options, snapshotId: this.id, client: this.client });
  },
});
