/**
 * The API's JSON in TypeScript's spelling. Every type here is derived from the daemon's
 * OpenAPI document (`src/openapi.ts`, generated from docs/openapi.json by `npm run
 * generate`; the tests fail when it is stale), with snake_case keys turned camelCase at the
 * type level and at run time alike, so the SDK's types cannot drift from the API.
 */

import type { components } from "./openapi.js";

type Schemas = components["schemas"];

/** `memory_mb` → `memoryMb`. */
export type CamelCase<S extends string> = S extends `${infer Head}_${infer Tail}` ? `${Head}${Capitalize<CamelCase<Tail>>}` : S;

/** A wire type with every key camelCase, deeply. */
export type Camelize<T> = T extends readonly (infer U)[]
  ? Camelize<U>[]
  : T extends object
    ? { [K in keyof T as K extends string ? CamelCase<K> : K]: Camelize<T[K]> }
    : T;

/** Fields whose value is a map of the user's own keys (kept as given). */
const USER_MAPS = new Set(["env", "labels", "secrets", "set"]);

/** Wire JSON → SDK object: keys camelCase, user maps untouched. */
export function camelize<T>(value: unknown): T {
  return convert(value, (key) => key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase())) as T;
}

/** SDK object → wire JSON: keys snake_case, user maps untouched, `undefined` dropped. */
export function snakeize(value: unknown): unknown {
  return convert(value, (key) => key.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase()));
}

function convert(value: unknown, rename: (key: string) => string): unknown {
  if (Array.isArray(value)) return value.map((v) => convert(v, rename));
  if (value === null || typeof value !== "object" || value instanceof Uint8Array) return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) {
    if (v === undefined) continue;
    const name = rename(key);
    out[name] = USER_MAPS.has(name) ? v : convert(v, rename);
  }
  return out;
}

/** A sandbox as the daemon describes it. */
export type SandboxInfo = Camelize<Schemas["Sandbox"]>;
/** A sandbox's lifecycle state. */
export type SandboxState = Schemas["State"];
/** What `Sandbox.create` takes (and the handle's own options). */
export type CreateSandboxRequest = Camelize<Schemas["CreateSandbox"]>;
/** What `sandbox.update` changes. */
export type UpdateSandboxRequest = Camelize<Schemas["UpdateSandbox"]>;
/** A snapshot (filesystem or memory checkpoint). */
export type SnapshotInfo = Camelize<Schemas["Snapshot"]>;
export type SnapshotType = Schemas["SnapshotType"];
/** What a checkpoint takes. */
export type CheckpointRequest = Camelize<Schemas["CheckpointRequest"]>;
/** What a fork takes (but `count`, given apart). */
export type ForkRequest = Camelize<Schemas["ForkRequest"]>;
export type ForkChild = Camelize<Schemas["ForkChild"]>;
/** A command as exec and processes take it. */
export type ExecRequest = Camelize<Schemas["ExecRequest"]>;
export type ExecResult = Camelize<Schemas["ExecResult"]>;
/** One event of a streamed command or a process's output. */
export type StreamEvent = Camelize<Schemas["StreamEvent"]>;
export type SpawnRequest = Camelize<Schemas["SpawnProcess"]>;
/** A background process (or terminal session) in a sandbox. */
export type ProcessInfo = Camelize<Schemas["Process"]>;
export type FileEntry = Camelize<Schemas["FileEntry"]>;
/** One change under a watched directory. */
export type FileEvent = Camelize<Schemas["FileEvent"]>;
export type CreatePtyRequest = Camelize<Schemas["CreatePty"]>;
export type PortUrl = Camelize<Schemas["PortUrl"]>;
/** One line of a sandbox's log. */
export type LogEntry = Camelize<Schemas["LogEntry"]>;
/** One lifecycle event (created, forked, checkpointed, suspended, oom, ...). */
export type SandboxEvent = Camelize<Schemas["SandboxEvent"]>;
export type SandboxStats = Camelize<Schemas["SandboxStats"]>;
export type Health = Camelize<Schemas["Health"]>;
export type ImageInfo = Camelize<Schemas["Image"]>;
export type VolumeInfo = Camelize<Schemas["Volume"]>;
export type CreateVolumeRequest = Camelize<Schemas["CreateVolume"]>;
