import { DecodeError, ErrorCode, decode, type ApiError } from "./schemas.gen.js";

/**
 * Codes the client itself gives errors that did not come from the limiter.
 * A transport failure is `limiter_unavailable` with status 0.
 */
export const ClientCode = {
  /** The Client was closed: acquire refuses afterwards, and it is the error of the leases it still held. */
  ClientClosed: "client_closed",
  /** An answer that does not match the contract (not JSON, a field missing or of the wrong type). */
  InvalidAnswer: "invalid_answer",
} as const;

/** What a LimiterError carries besides its code and message. */
export interface LimiterErrorFields {
  /** The HTTP status; 0 when there was no answer. */
  status?: number;
  used?: number;
  limit?: number;
  retryAfterMs?: number;
  streamId?: string;
  pool?: string;
  key?: string;
  cause?: unknown;
}

/**
 * A refusal or failure of the limiter. `code` is stable: an ErrorCode, a
 * ClientCode, or `http_<status>` when an answer was not the limiter's JSON
 * (a proxy's page) or was a 3xx, whose Location the client does not follow
 * and the message names. `used`, `limit` and `retryAfterMs` are set on
 * `stream_limit_reached`, and on `pool_limit_reached` as the pool key's;
 * `retryAfterMs` also from a Retry-After header, when the body names none
 * or 0. `pool` and `key` name the pool key of a `pool_limit_reached`.
 * `streamId` names the stream id of an acquire answered
 * `limiter_unavailable`.
 */
export class LimiterError extends Error {
  readonly code: string;
  readonly status: number;
  readonly used?: number;
  readonly limit?: number;
  readonly retryAfterMs?: number;
  readonly streamId?: string;
  readonly pool?: string;
  readonly key?: string;

  constructor(code: string, message: string, fields: LimiterErrorFields = {}) {
    super(describe(code, message, fields), fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = "LimiterError";
    this.code = code;
    this.status = fields.status ?? 0;
    this.used = fields.used;
    this.limit = fields.limit;
    this.retryAfterMs = fields.retryAfterMs;
    this.streamId = fields.streamId;
    this.pool = fields.pool;
    this.key = fields.key;
  }
}

function describe(code: string, message: string, f: LimiterErrorFields): string {
  let text = "limiter: " + code;
  if (f.status) {
    text += ` (HTTP ${f.status})`;
  }
  if (message) {
    text += ": " + message;
  }
  if (code === ErrorCode.PoolLimitReached) {
    text += ` (pool ${f.pool}=${f.key}, used ${f.used} of ${f.limit}, retry after ${f.retryAfterMs}ms)`;
  }
  if (code === ErrorCode.StreamLimitReached) {
    text += ` (used ${f.used} of ${f.limit}, retry after ${f.retryAfterMs}ms)`;
  }
  return text;
}

/** Whether err says the user's stream limit is reached (429 stream_limit_reached). */
export function isLimited(err: unknown): err is LimiterError {
  return err instanceof LimiterError && err.code === ErrorCode.StreamLimitReached;
}

/**
 * Whether err says a pool key the acquire named (`pools`) holds its cap of
 * streams, whoever's they are (429 pool_limit_reached): `pool` and `key`
 * name it, `used`, `limit` and `retryAfterMs` are the key's. Never
 * isLimited: the user's own limit did not refuse it. The acquire took
 * nothing.
 */
export function isPoolLimited(err: unknown): err is LimiterError {
  return err instanceof LimiterError && err.code === ErrorCode.PoolLimitReached;
}

/**
 * Whether err says the stream id is held by another caller (403
 * not_slot_holder): the service authenticates its callers, and a slot
 * belongs to the caller that took it; the limiter changed nothing. Acquire
 * rejects so for a `streamId` another caller holds, a lease's release for a
 * slot another caller took over, and a lease whose heartbeat is refused so
 * is lost with it. Support releases any slot through the admin API.
 */
export function isNotSlotHolder(err: unknown): err is LimiterError {
  return err instanceof LimiterError && err.code === ErrorCode.NotSlotHolder;
}

const INVALID: ReadonlySet<string> = new Set([ErrorCode.InvalidRequest, ErrorCode.InvalidUserId, ErrorCode.InvalidStreamId, ErrorCode.InvalidPoolKey]);

// Per-slot batch errors every later heartbeat would answer the same (besides INVALID).
const FATAL: ReadonlySet<string> = new Set([ErrorCode.SlotLost, ErrorCode.UnknownPlan, ErrorCode.PlanNotAllowed, ErrorCode.NotSlotHolder]);

// The status a single-slot call answers for a code, so that a batch's
// per-slot error reads like the single call's.
const STATUS: Readonly<Record<string, number>> = {
  [ErrorCode.SlotLost]: 410,
  [ErrorCode.UnknownPlan]: 422,
  [ErrorCode.PlanNotAllowed]: 403,
  [ErrorCode.NotSlotHolder]: 403,
  [ErrorCode.LimiterUnavailable]: 503,
  [ErrorCode.Internal]: 500,
  [ErrorCode.InvalidRequest]: 400,
  [ErrorCode.InvalidUserId]: 400,
  [ErrorCode.InvalidStreamId]: 400,
  [ErrorCode.InvalidPoolKey]: 400,
};

/** The LimiterError of a wire error; status defaults to the one the single-slot call answers for its code. */
export function fromWire(err: ApiError, status?: number): LimiterError {
  return new LimiterError(err.code, err.message, {
    status: status ?? STATUS[err.code] ?? 0,
    used: err.used,
    limit: err.limit,
    retryAfterMs: err.retry_after_ms,
    streamId: err.stream_id,
    pool: err.pool,
    key: err.key,
  });
}

/** The LimiterError of a non-2xx answer. */
export function fromAnswer(status: number, body: string, retryAfterHeader: string | null): LimiterError {
  let wire: ApiError;
  try {
    wire = decode("ErrorResponse", JSON.parse(body)).error;
  } catch (e) {
    if (!(e instanceof SyntaxError || e instanceof DecodeError)) {
      throw e;
    }
    // Not the limiter's JSON: a proxy's page.
    let message = body.trim();
    if (message.length > 200) {
      message = message.slice(0, 200) + "…";
    }
    const code = status === 502 || status === 503 || status === 504 ? ErrorCode.LimiterUnavailable : `http_${status}`;
    wire = { code, message: message || `HTTP ${status}` };
  }
  // A body's retry_after_ms of 0 names no wait: the header may.
  if (!wire.retry_after_ms) {
    const header = parseRetryAfter(retryAfterHeader);
    if (header !== undefined) {
      wire = { ...wire, retry_after_ms: header };
    }
  }
  return fromWire(wire, status);
}

/**
 * Milliseconds of a Retry-After header (delay seconds, or an HTTP date,
 * read as UTC when it names no zone). Of a header sent twice, which fetch
 * joins with ", ", the first.
 */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (!value) {
    return undefined;
  }
  let text = value.trim();
  const seconds = /^(\d+)\s*(?:,|$)/.exec(text);
  if (seconds) {
    return Number(seconds[1]) * 1000;
  }
  if (!/(GMT|UTC|[+-]\d{4})\s*$/.test(text)) {
    text += " GMT"; // asctime names no zone: HTTP dates are UTC
  }
  const at = Date.parse(text);
  return Number.isNaN(at) || at <= now ? undefined : at - now;
}

/**
 * Whether err is the limiter's answer about the request itself, as opposed
 * to a failure to get one (no answer, 5xx, an answer not of the contract),
 * after which the same request may well succeed.
 */
export function definite(err: unknown): boolean {
  if (!(err instanceof LimiterError)) {
    return false;
  }
  if (err.code === ErrorCode.LimiterUnavailable || err.code === ClientCode.InvalidAnswer || err.code === ClientCode.ClientClosed) {
    return false;
  }
  return err.status > 0 && err.status < 500;
}

/** Whether a per-slot batch error means the slot cannot be kept: every later heartbeat would answer the same. */
export function slotFatal(code: string): boolean {
  return FATAL.has(code) || INVALID.has(code);
}

export function closedError(): LimiterError {
  return new LimiterError(ClientCode.ClientClosed, "the limiter client is closed");
}
