// The daemon's /v1 API from the browser: same origin, the API token (when the daemon listens
// on TCP) kept in session storage and sent as a bearer token.

const TOKEN_KEY = "sandfork-token";

/** An answer the daemon refused: status, the API's code and its message. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value: string | null): void {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const t = token();
  return t ? { ...extra, authorization: `Bearer ${t}` } : extra;
}

/** Sends a request; throws an ApiError for anything but 2xx. */
export async function call(method: string, path: string, body?: unknown, raw?: BodyInit): Promise<Response> {
  const init: RequestInit = { method, headers: headers(body !== undefined ? { "content-type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  else if (raw !== undefined) init.body = raw;
  const res = await fetch(path, init);
  if (!res.ok) {
    let code = `http_${res.status}`;
    let message = `${res.status} ${res.statusText}`;
    try {
      const doc = (await res.json()) as { code?: string; message?: string };
      code = doc.code ?? code;
      message = doc.message ?? message;
    } catch {
      // not JSON
    }
    throw new ApiError(res.status, code, message);
  }
  return res;
}

export async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await call(method, path, body);
  const text = await res.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/** Reads an NDJSON stream, calling `each` per value, until it ends or `signal` aborts. */
export async function ndjson<T>(path: string, each: (value: T) => void, signal: AbortSignal): Promise<void> {
  const res = await fetch(path, { headers: headers(), signal });
  if (!res.ok || !res.body) throw new ApiError(res.status, `http_${res.status}`, `${res.status} ${res.statusText}`);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += value;
      let nl: number;
      while ((nl = pending.indexOf("\n")) >= 0) {
        const line = pending.slice(0, nl).trim();
        pending = pending.slice(nl + 1);
        if (line) each(JSON.parse(line) as T);
      }
    }
  } catch (e) {
    if (!signal.aborted) throw e;
  }
}

/** A WebSocket URL for `path` on this origin (the token in the query: browsers cannot set
 * headers on a WebSocket). */
export function socketUrl(path: string): string {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const t = token();
  if (t) url.searchParams.set("access_token", t);
  return url.toString();
}

export interface Sandbox {
  id: string;
  name?: string | null;
  state: string;
  image: string;
  cpus: number;
  memory_mb: number;
  labels: Record<string, string>;
  created_at: string;
  snapshot_id?: string | null;
  fork?: { parent_snapshot_id: string; index: number } | null;
  error?: string | null;
}

export interface Snapshot {
  id: string;
  name?: string | null;
  type: "filesystem" | "memory";
  image: string;
  size_bytes: number;
  created_at: string;
  source_sandbox_id?: string | null;
  labels: Record<string, string>;
}

export interface Stats {
  cpu_seconds: number;
  cpus: number;
  memory_bytes: number;
  memory_limit_bytes: number;
}

export interface FileEntry {
  name: string;
  path: string;
  type: string;
  size: number;
  modified_at: string;
}

export interface Process {
  pid: number;
  command: string;
  args: string[];
  status: string;
  name?: string | null;
  started_at: string;
  exit_code?: number | null;
}
