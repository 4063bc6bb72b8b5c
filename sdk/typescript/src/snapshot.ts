/** Snapshots: a sandbox's disk (and with a memory checkpoint, its running processes) kept
 * to restore, fork (both in `fork.ts`), export and import. */

import { createReadStream } from "node:fs";
import type { Readable } from "node:stream";

import { Client } from "./client.js";
import { saveTo, seg } from "./transport.js";
import { camelize, type SnapshotInfo, type SnapshotType } from "./wire.js";
import type { components } from "./openapi.js";

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
