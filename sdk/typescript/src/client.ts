/** The connection to one daemon: where it listens, its token, and the daemon-wide calls. */

import type { Readable } from "node:stream";

import { ndjson, parseUrl, seg, text, Transport, DEFAULT_SOCKET, type Endpoint } from "./transport.js";
import { ConnectionError, streamError } from "./errors.js";
import { camelize, snakeize, type CreateVolumeRequest, type Health, type ImageInfo, type SandboxEvent, type VolumeInfo } from "./wire.js";
import type { components } from "./openapi.js";

/** How to reach the daemon. Every field falls back to the environment, then the default. */
export interface ClientOptions {
  /** `unix:///path.sock`, a bare socket path, or `http(s)://host:port`; else `SANDFORK_URL`,
   * else the default socket `/var/lib/sandfork/sandfork.sock`. */
  url?: string;
  /** Bearer token for a daemon on TCP; else `SANDFORK_TOKEN`. */
  token?: string;
  /** A PEM bundle to check an `https://` daemon's certificate against; else `SANDFORK_CA`. */
  caFile?: string;
  /** Milliseconds an ordinary request may wait for a byte (default 30 000). Commands,
   * streams, waits, uploads and forks are never cut short by it. */
  timeoutMs?: number;
}

/** A progress line of an image being built. */
export type ProgressCallback = (line: string) => void;

/** One daemon. Keeps no connection open between calls, so share it freely. */
export class Client {
  /** @internal */
  readonly transport: Transport;

  constructor(options: ClientOptions = {}) {
    const env = process.env;
    const endpoint = parseUrl(options.url ?? env.SANDFORK_URL ?? DEFAULT_SOCKET);
    const token = options.token ?? env.SANDFORK_TOKEN ?? undefined;
    this.transport = new Transport(endpoint, token || undefined, options.caFile ?? env.SANDFORK_CA, options.timeoutMs);
  }

  /** Where the daemon listens. */
  get endpoint(): Endpoint {
    return this.transport.endpoint;
  }

  /** `{status, version, apiVersion}`. */
  async health(options: { signal?: AbortSignal } = {}): Promise<Health> {
    return camelize(await this.transport.json("GET", "/v1/health", options));
  }

  /** The images the daemon has. */
  async listImages(): Promise<ImageInfo[]> {
    const doc = await this.transport.json<components["schemas"]["ImageList"]>("GET", "/v1/images");
    return camelize(doc.images);
  }

  /** Makes sure the daemon has image `name`: builds a built-in one (busybox, debian,
   * python, browser) if it is missing, or joins the build in flight, telling each progress
   * line to `onProgress`. */
  async ensureImage(name: string, options: { onProgress?: ProgressCallback; signal?: AbortSignal } = {}): Promise<void> {
    const stream = await this.transport.open("POST", `/v1/images/${seg(name)}/ensure`, { signal: options.signal, idleTimeoutMs: 0 });
    for await (const event of ndjson<{ type: string; message?: string; code?: string }>(stream)) {
      if (event.type === "progress") options.onProgress?.(event.message ?? "");
      else if (event.type === "done") return;
      else if (event.type === "error") throw streamError(event);
    }
    throw new ConnectionError(`the daemon ended the build of image ${name} without a result`);
  }

  /** Named volumes: storage that outlives sandboxes. */
  async createVolume(name: string, options: Omit<CreateVolumeRequest, "name"> = {}): Promise<VolumeInfo> {
    return camelize(await this.transport.json("POST", "/v1/volumes", { json: snakeize({ ...options, name }) }));
  }

  async listVolumes(): Promise<VolumeInfo[]> {
    const doc = await this.transport.json<components["schemas"]["VolumeList"]>("GET", "/v1/volumes");
    return camelize(doc.volumes);
  }

  async deleteVolume(name: string): Promise<void> {
    await this.transport.json("DELETE", `/v1/volumes/${seg(name)}`);
  }

  /** Every sandbox's lifecycle events (or one sandbox's): the kept ones after `since`
   * first, then new ones as they happen unless `follow` is false. */
  events(options: EventOptions = {}): EventFeed {
    return new EventFeed(this, options);
  }

  /** The daemon's Prometheus metrics, as text. */
  async metrics(): Promise<string> {
    return text(await this.transport.open("GET", "/metrics"));
  }
}

/** What an events feed takes. */
export interface EventOptions {
  /** Only this sandbox's events. */
  sandbox?: string;
  /** Replay the kept events after this sequence number first (0: all kept). */
  since?: number;
  /** Keep following new events (default true). */
  follow?: boolean;
  signal?: AbortSignal;
}

/** An NDJSON stream as an async iterable that can be closed from outside. */
export class JsonStream<T> implements AsyncIterable<T> {
  private readonly abort = new AbortController();
  private opened?: Promise<Readable>;

  /** @internal */
  constructor(
    private readonly start: (signal: AbortSignal) => Promise<Readable>,
    signal?: AbortSignal,
  ) {
    signal?.addEventListener("abort", () => this.abort.abort(signal.reason), { once: true });
  }

  /** Sends the request now (iterating does it otherwise); resolves once the daemon has
   * answered, so what happens from then on is in the stream. */
  async ready(): Promise<this> {
    await this.open();
    return this;
  }

  private open(): Promise<Readable> {
    this.opened ??= this.start(this.abort.signal);
    return this.opened;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    let stream: Readable;
    try {
      stream = await this.open();
    } catch (e) {
      if (this.abort.signal.aborted) return;
      throw e;
    }
    try {
      for await (const item of ndjson<unknown>(stream)) {
        if (this.abort.signal.aborted) return;
        yield camelize<T>(item);
      }
    } catch (e) {
      if (this.abort.signal.aborted) return;
      throw e;
    }
  }

  /** Ends the stream (a pending iteration finishes without an error). */
  close(): void {
    this.abort.abort();
  }
}

/** The lifecycle events of the daemon's sandboxes. */
export class EventFeed extends JsonStream<SandboxEvent> {
  /** @internal */
  constructor(client: Client, options: EventOptions) {
    const query = { sandbox: options.sandbox, since: options.since ?? 0, no_follow: options.follow === false ? true : undefined };
    super((signal) => client.transport.open("GET", "/v1/events", { query, signal, idleTimeoutMs: 0 }), options.signal);
  }
}
