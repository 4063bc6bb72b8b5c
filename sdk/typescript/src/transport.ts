/**
 * HTTP/1.1 to the daemon over a Unix socket or TCP, with nothing but Node's own `http`
 * (fetch cannot speak over a Unix socket). Each request opens its own connection, so one
 * client serves any number of concurrent calls; streamed replies keep theirs until read.
 */

import { createWriteStream, readFileSync } from "node:fs";
import { rename, rm } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import http from "node:http";
import https from "node:https";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { StringDecoder } from "node:string_decoder";

import { ConnectionError, InvalidArgumentError, apiError } from "./errors.js";

/** Where the daemon listens when `SANDFORK_URL` is not set. */
export const DEFAULT_SOCKET = "/var/lib/sandfork/sandfork.sock";

/** Where the daemon listens: a Unix socket, or an HTTP(S) origin with an optional prefix. */
export interface Endpoint {
  scheme: "unix" | "http" | "https";
  socketPath: string;
  host: string;
  port: number;
  basePath: string;
}

/** Parses `unix:///path.sock`, a bare socket path, or `http(s)://host:port[/prefix]`. */
export function parseUrl(url: string): Endpoint {
  const text = url.trim();
  if (text.startsWith("/")) return { scheme: "unix", socketPath: text, host: "", port: 0, basePath: "" };
  if (text.startsWith("unix://")) {
    const path = decodeURIComponent(text.slice("unix://".length));
    if (!path.startsWith("/")) {
      throw new InvalidArgumentError(`unix URL ${text} needs an absolute socket path, e.g. unix:///run/sandfork.sock`, 400, "invalid_url");
    }
    return { scheme: "unix", socketPath: path, host: "", port: 0, basePath: "" };
  }
  let parsed: URL;
  try {
    parsed = new URL(text);
  } catch {
    throw new InvalidArgumentError(`unsupported daemon URL ${text}: use unix:///path/to.sock or http://host:port`, 400, "invalid_url");
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new InvalidArgumentError(`unsupported daemon URL ${text}: use unix:///path/to.sock or http://host:port`, 400, "invalid_url");
  }
  const scheme = parsed.protocol === "https:" ? "https" : "http";
  return {
    scheme,
    socketPath: "",
    host: parsed.hostname.replace(/^\[|\]$/g, ""),
    port: parsed.port ? Number(parsed.port) : scheme === "https" ? 443 : 80,
    basePath: parsed.pathname.replace(/\/+$/, ""),
  };
}

/** Query values; `undefined` and `null` are left out, objects are sent as JSON. */
export type Query = Record<string, string | number | boolean | object | null | undefined>;

/** What one request carries. */
export interface RequestOptions {
  query?: Query;
  /** A JSON body. */
  json?: unknown;
  /** A raw body: bytes, or a stream of them. */
  body?: Uint8Array | string | Readable | AsyncIterable<Uint8Array>;
  contentType?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Milliseconds without a byte before the request fails; 0: never (streams, waits). */
  idleTimeoutMs?: number;
}

/** The path and query of a request, as sent. */
export function target(endpoint: Endpoint, path: string, query?: Query): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query ?? {})) {
    if (value === undefined || value === null) continue;
    params.set(key, typeof value === "object" ? JSON.stringify(value) : String(value));
  }
  const qs = params.toString();
  return endpoint.basePath + path + (qs ? "?" + qs : "");
}

/** A path segment, escaped. */
export function seg(value: string | number): string {
  return encodeURIComponent(String(value));
}

/** The HTTP side of a client: sends requests, turns error replies into typed errors. */
export class Transport {
  /** The CA bundle an `https://` daemon's certificate is checked against, if any. */
  readonly caBundle?: Buffer;

  constructor(
    readonly endpoint: Endpoint,
    readonly token: string | undefined,
    caFile?: string,
    private readonly timeoutMs = 30_000,
  ) {
    if (caFile) this.caBundle = readFileSync(caFile);
  }

  /** Sends a request; resolves with the reply once its status is 2xx, else throws. */
  async open(method: string, path: string, options: RequestOptions = {}): Promise<http.IncomingMessage> {
    const headers: Record<string, string> = { "user-agent": "sandfork-typescript", ...options.headers };
    if (this.token) headers["authorization"] = `Bearer ${this.token}`;
    let payload: Uint8Array | string | Readable | AsyncIterable<Uint8Array> | undefined = options.body;
    if (options.json !== undefined) {
      payload = JSON.stringify(options.json);
      headers["content-type"] = "application/json";
    } else if (payload !== undefined) {
      headers["content-type"] = options.contentType ?? "application/octet-stream";
    }
    if (typeof payload === "string" || payload instanceof Uint8Array) {
      headers["content-length"] = String(Buffer.byteLength(payload));
    }
    const ep = this.endpoint;
    const requestOptions: https.RequestOptions = {
      method,
      path: target(ep, path, options.query),
      headers,
      signal: options.signal,
      // A connection of its own, closed after the reply: no pooled socket the daemon may
      // have closed meanwhile is ever reused.
      agent: false,
      ...(ep.scheme === "unix" ? { socketPath: ep.socketPath } : { host: ep.host, port: ep.port }),
      ...(this.caBundle ? { ca: this.caBundle } : {}),
    };
    const response = await new Promise<http.IncomingMessage>((resolve, reject) => {
      const req = (ep.scheme === "https" ? https : http).request(requestOptions, resolve);
      const idle = options.idleTimeoutMs ?? this.timeoutMs;
      if (idle > 0) {
        req.setTimeout(idle, () => req.destroy(new ConnectionError(`no answer from the daemon within ${idle} ms: ${method} ${path}`)));
      }
      req.on("error", (e: Error) => reject(wrap(e, ep, method, path)));
      if (payload === undefined || typeof payload === "string" || payload instanceof Uint8Array) {
        req.end(payload);
      } else {
        const source = payload instanceof Readable ? payload : Readable.from(payload);
        source.on("error", (e) => req.destroy(e));
        source.pipe(req);
      }
    });
    response.setTimeout(0);
    const status = response.statusCode ?? 0;
    if (status >= 200 && status < 300) return response;
    throw apiError(status, await text(response));
  }

  /** A request whose reply is JSON (or empty: `undefined`). */
  async json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const body = await text(await this.open(method, path, options));
    return (body ? JSON.parse(body) : undefined) as T;
  }
}

function wrap(e: Error, ep: Endpoint, method: string, path: string): Error {
  if (e.name === "AbortError" || e instanceof ConnectionError) return e;
  const where = ep.scheme === "unix" ? ep.socketPath : `${ep.host}:${ep.port}`;
  return new ConnectionError(`cannot reach the sandfork daemon at ${where} (${method} ${path}): ${e.message}`);
}

/** The whole body as text. */
export async function text(stream: Readable): Promise<string> {
  return (await bytes(stream)).toString("utf8");
}

/** The whole body. */
export async function bytes(stream: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** The JSON values of an NDJSON body, one per line; empty lines (keep-alives) skipped. */
export async function* ndjson<T>(stream: Readable): AsyncGenerator<T> {
  const decoder = new StringDecoder("utf8");
  let pending = "";
  try {
    for await (const chunk of stream) {
      pending += decoder.write(chunk as Buffer);
      let newline: number;
      while ((newline = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, newline).trim();
        pending = pending.slice(newline + 1);
        if (line) yield JSON.parse(line) as T;
      }
    }
    pending += decoder.end();
    if (pending.trim()) yield JSON.parse(pending) as T;
  } finally {
    stream.destroy();
  }
}

/** Writes a streamed body into `localPath` through a temporary file beside it, renamed
 * into place at the end: nothing is left at `localPath` if it fails. Resolves with the
 * bytes written. */
export async function saveTo(open: () => Promise<Readable>, localPath: string): Promise<number> {
  const temporary = join(dirname(localPath), `.${basename(localPath)}.${process.pid}.${Date.now()}.part`);
  try {
    const source = await open();
    let written = 0;
    source.on("data", (chunk: Buffer) => (written += chunk.length));
    await pipeline(source, createWriteStream(temporary, { flags: "wx" }));
    await rename(temporary, localPath);
    return written;
  } catch (e) {
    await rm(temporary, { force: true });
    throw e;
  }
}

/** A command's standard input as the API takes it: text as `stdin`, bytes as `stdin_b64`. */
export function stdinFields(stdin: string | Uint8Array | undefined): { stdin?: string; stdin_b64?: string } {
  if (typeof stdin === "string") return { stdin };
  return stdin ? { stdin_b64: Buffer.from(stdin).toString("base64") } : {};
}
