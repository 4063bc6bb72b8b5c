/** Errors the SDK throws: one class per kind of failure, so callers can `instanceof`. */

import { ERROR_STATUS } from "./codes.js";

/** Every error the SDK throws. */
export class SandforkError extends Error {
  override name = "SandforkError";
}

/** The daemon could not be reached, or it broke off a reply. */
export class ConnectionError extends SandforkError {
  override name = "ConnectionError";
}

/** A wait ran out of time (a sandbox that did not start, a process that did not end). */
export class TimeoutError extends SandforkError {
  override name = "TimeoutError";
}

/** A sandbox failed, or ended while it was being started or waited on. */
export class SandboxError extends SandforkError {
  override name = "SandboxError";
}

/** The daemon answered with an error: `status` is the HTTP status, `code` the API's. */
export class ApiError extends SandforkError {
  override name = "ApiError";
  constructor(
    message: string,
    readonly status: number,
    readonly code: string,
  ) {
    super(message);
  }
}

/** 400: a malformed request or a bad value; the message names it. */
export class InvalidArgumentError extends ApiError {
  override name = "InvalidArgumentError";
}
/** 401: the daemon wants a (different) bearer token. */
export class UnauthorizedError extends ApiError {
  override name = "UnauthorizedError";
}
/** 404: no such sandbox, snapshot, image, process or path. */
export class NotFoundError extends ApiError {
  override name = "NotFoundError";
}
/** 409: the sandbox is in the wrong state for the call (the message names the state). */
export class ConflictError extends ApiError {
  override name = "ConflictError";
}
/** 413: a body over the daemon's limit. */
export class TooLargeError extends ApiError {
  override name = "TooLargeError";
}
/** 422: a combination that cannot work. */
export class UnsupportedError extends ApiError {
  override name = "UnsupportedError";
}
/** 429: the host is full (the message names what). */
export class OverCapacityError extends ApiError {
  override name = "OverCapacityError";
}
/** 503: the daemon is shutting down, or the sandbox's agent is unreachable. */
export class UnavailableError extends ApiError {
  override name = "UnavailableError";
}

const BY_STATUS: Record<number, new (m: string, s: number, c: string) => ApiError> = {
  400: InvalidArgumentError,
  401: UnauthorizedError,
  404: NotFoundError,
  409: ConflictError,
  413: TooLargeError,
  422: UnsupportedError,
  429: OverCapacityError,
  503: UnavailableError,
};

/** The error for a daemon's `{code, message}` reply (or whatever body it sent). */
export function apiError(status: number, body: string): ApiError {
  let code = "http_" + status;
  let message = body.trim() || `the daemon answered ${status}`;
  try {
    const doc = JSON.parse(body) as { code?: unknown; message?: unknown };
    if (typeof doc.code === "string") code = doc.code;
    if (typeof doc.message === "string") message = doc.message;
  } catch {
    // not JSON: the body itself is the message
  }
  const Kind = BY_STATUS[status] ?? ApiError;
  return new Kind(message, status, code);
}

/** The error an `{"type": "error", code, message}` stream event stands for. */
export function streamError(event: { code?: string | null; message?: string | null }): SandforkError {
  const code = event.code ?? "error";
  const status = ERROR_STATUS[code] ?? 500;
  return apiError(status, JSON.stringify({ code, message: event.message ?? code }));
}
