/** Snapshots: a sandbox's disk (and with a memory checkpoint, its running processes) kept
 * to restore, fork, export and import. */

import { createReadStream } from "node:fs";
import type { Readable } from "node:stream";

import { Client } from "./client.js";
import { saveTo, seg } from "./transport.js";
import { camelize, snakeize, type ForkChild, type ForkRequest, type SnapshotInfo, type SnapshotType } from "./wire.js";
import { Sandbox, type CreateOptions } from "./sandbox.js";
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

/** @internal The fork result of the daemon's `ForkResult` document. */
export function forkResult(client: Client, doc: components["schemas"]["ForkResult"]): ForkResult {
  const children = camelize<ForkChild[]>(doc.children);
  const started = children.filter((c) => c.sandbox).map((c) => new Sandbox(client, c.sandbox!));
  const failed = children.filter((c) => !c.sandbox).map((c) => ({ index: c.index, code: c.error?.code ?? "failed", message: c.error?.message ?? "the child did not start" }));
  return new ForkResult(doc.snapshot_id, started, failed);
}

/** A snapshot. */
export class Snapshot {
  /** @internal */
  constructor(
    readonly client: Client,
    /** The snapshot as last read. */
    public info: SnapshotInfo,
  ) {}

  get id(): string {
    return this.info.id;
  }

  get type(): SnapshotType {
    return this.info.type;
  }

  /** The snapshot with this id. */
  static async get(id: string, options: { client?: Client } = {}): Promise<Snapshot> {
    const client = options.client ?? new Client();
    return new Snapshot(client, camelize(await client.transport.json("GET", `/v1/snapshots/${seg(id)}`)));
  }

  /** Snapshots, optionally only those of one sandbox or of one type; with `published`,
   * also those only the cluster's object store holds. */
  static async list(options: { source?: string; type?: SnapshotType; published?: boolean; client?: Client } = {}): Promise<Snapshot[]> {
    const client = options.client ?? new Client();
    const query = { source: options.source, type: options.type, published: options.published ? "true" : undefined };
    const doc = await client.transport.json<components["schemas"]["SnapshotList"]>("GET", "/v1/snapshots", { query });
    return doc.snapshots.map((s) => new Snapshot(client, camelize(s)));
  }

  /** Whether the snapshot is in the cluster's object store (any node restores it). */
  get published(): boolean {
    return Boolean(this.info.published);
  }

  /** Puts the snapshot in the daemon's object store, so any node of the cluster restores it;
   * resolves once it is there (an UnsupportedError when the daemon has no object store). */
  async publish(options: { signal?: AbortSignal } = {}): Promise<Snapshot> {
    this.info = camelize(await this.client.transport.json("POST", `/v1/snapshots/${seg(this.id)}/publish`, { signal: options.signal, idleTimeoutMs: 0 }));
    return this;
  }

  /** Starts `count` independent sandboxes from this snapshot in one call. */
  async fork(count: number, options: ForkOptions = {}): Promise<ForkResult> {
    const { signal, ...rest } = options;
    const json = snakeize({ ...rest, count });
    const doc = await this.client.transport.json<components["schemas"]["ForkResult"]>("POST", `/v1/snapshots/${seg(this.id)}/fork`, { json, signal, idleTimeoutMs: 0 });
    return forkResult(this.client, doc);
  }

  /** Starts one sandbox from this snapshot (a memory snapshot: warm, its processes running). */
  async restore(options: Omit<CreateOptions, "snapshotId" | "image" | "client"> = {}): Promise<Sandbox> {
    return Sandbox.create({ ...options, snapshotId: this.id, client: this.client });
  }

  /** Deletes the snapshot; sandboxes started from it keep working. With `everywhere`, it
   * leaves the cluster's object store too. */
  async delete(options: { everywhere?: boolean } = {}): Promise<void> {
    const query = { everywhere: options.everywhere ? "true" : undefined };
    await this.client.transport.json("DELETE", `/v1/snapshots/${seg(this.id)}`, { query });
  }

  /** The snapshot as one signed file, streamed (restores the same on any host with the key).
   * With `base`, a snapshot this one descends from that the receiver already has, the file
   * carries only what differs from it (its import then needs that snapshot). */
  async export(options: { signal?: AbortSignal; base?: Snapshot | string } = {}): Promise<Readable> {
    const base = typeof options.base === "string" ? options.base : options.base?.id;
    return this.client.transport.open("POST", `/v1/snapshots/${seg(this.id)}/export`, { signal: options.signal, idleTimeoutMs: 0, query: { base } });
  }

  /** Exports into a local file; nothing is left there if it fails. Resolves with its size. */
  async exportTo(localPath: string, options: { signal?: AbortSignal; base?: Snapshot | string } = {}): Promise<number> {
    return saveTo(() => this.export(options), localPath);
  }

  /** Imports an exported snapshot (a local file's path, or a stream of its bytes); its
   * checksums are verified before anything is kept. */
  static async import(source: string | Readable | AsyncIterable<Uint8Array>, options: { client?: Client; signal?: AbortSignal } = {}): Promise<Snapshot> {
    const client = options.client ?? new Client();
    const body = typeof source === "string" ? createReadStream(source) : source;
    const doc = await client.transport.json("POST", "/v1/snapshots/import", { body, signal: options.signal, idleTimeoutMs: 0 });
    return new Snapshot(client, camelize(doc));
  }
}
