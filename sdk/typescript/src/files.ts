/** Files in a sandbox: read, written, listed and watched by the sandbox's agent, inside it. */

import { createReadStream } from "node:fs";
import type { Readable } from "node:stream";

import { JsonStream } from "./client.js";
import { bytes, saveTo, type Transport } from "./transport.js";
import { camelize, type FileEntry, type FileEvent } from "./wire.js";
import type { components } from "./openapi.js";

/** What a file write takes. */
export interface WriteOptions {
  /** Permission bits of the file (default 0o644). */
  mode?: number;
  signal?: AbortSignal;
}

/** A sandbox's files. Paths are absolute paths inside the sandbox. */
export class Files {
  /** @internal */
  constructor(
    private readonly transport: Transport,
    private readonly route: string,
  ) {}

  /** The file's bytes. */
  async read(path: string, options: { signal?: AbortSignal } = {}): Promise<Buffer> {
    return bytes(await this.download(path, options));
  }

  /** The file as UTF-8 text. */
  async readText(path: string, options: { signal?: AbortSignal } = {}): Promise<string> {
    return (await this.read(path, options)).toString("utf8");
  }

  /** The file's bytes as a stream (for files of any size). */
  async download(path: string, options: { signal?: AbortSignal } = {}): Promise<Readable> {
    return this.transport.open("GET", `${this.route}/files`, { query: { path }, signal: options.signal, idleTimeoutMs: 0 });
  }

  /** Writes the file (parents made, written atomically: an aborted write leaves the old
   * file). `data` is text, bytes, or a stream of bytes. */
  async write(path: string, data: string | Uint8Array | Readable | AsyncIterable<Uint8Array>, options: WriteOptions = {}): Promise<void> {
    const query = { path, mode: (options.mode ?? 0o644).toString(8).padStart(4, "0") };
    const body = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    await this.transport.json("PUT", `${this.route}/files`, { query, body, signal: options.signal, idleTimeoutMs: 0 });
  }

  /** Copies a local file into the sandbox, streamed. */
  async upload(localPath: string, path: string, options: WriteOptions = {}): Promise<void> {
    await this.write(path, createReadStream(localPath), options);
  }

  /** Copies a file out of the sandbox into `localPath`, streamed; nothing is left at
   * `localPath` if it fails. Resolves with the bytes written. */
  async downloadTo(path: string, localPath: string, options: { signal?: AbortSignal } = {}): Promise<number> {
    return saveTo(() => this.download(path, options), localPath);
  }

  /** The entries of a directory. */
  async list(path: string): Promise<FileEntry[]> {
    const doc = await this.transport.json<components["schemas"]["FileList"]>("GET", `${this.route}/files/list`, { query: { path } });
    return camelize(doc.entries);
  }

  /** A file's metadata. */
  async stat(path: string): Promise<FileEntry> {
    return camelize(await this.transport.json("GET", `${this.route}/files/stat`, { query: { path } }));
  }

  /** True when the path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if ((e as { status?: number }).status === 404) return false;
      throw e;
    }
  }

  /** Makes a directory (with `parents`, its missing parents too, and no error if it exists). */
  async mkdir(path: string, options: { parents?: boolean } = {}): Promise<void> {
    await this.transport.json("POST", `${this.route}/files/mkdir`, { json: { path, parents: options.parents ?? false } });
  }

  /** Removes a file, or a directory (with `recursive`, with what it holds). */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.transport.json("DELETE", `${this.route}/files`, { query: { path, recursive: options.recursive ?? false } });
  }

  /** Watches a directory (with `recursive`, the directories under it too): resolves once
   * the watch is in place, then gives every change until `close()`. An open watch makes a
   * memory checkpoint wait for it, then refuse: close it when done. */
  async watch(path: string, options: { recursive?: boolean; signal?: AbortSignal } = {}): Promise<JsonStream<FileEvent>> {
    const query = { path, recursive: options.recursive ?? false };
    const stream = new JsonStream<FileEvent>(
      (signal) => this.transport.open("GET", `${this.route}/files/watch`, { query, signal, idleTimeoutMs: 0 }),
      options.signal,
    );
    return stream.ready();
  }
}
