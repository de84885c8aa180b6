import { MAX_ADMIN_ANSWER_BYTES, Endpoint } from "./http.js";
import { DEFAULT_REQUEST_TIMEOUT_MS } from "./client.js";
import {
  Paths,
  type AdminPoolKeyResponse,
  type AdminReleaseRequest,
  type AdminReleaseResponse,
  type AdminSlotsResponse,
  type AuditResponse,
} from "./schemas.gen.js";

export interface AdminOptions {
  /** The fetch to send requests with (see ClientOptions.fetch). Default: the global fetch. */
  fetch?: typeof fetch;
  /** Milliseconds each call may take. Default 5000. */
  requestTimeoutMs?: number;
}

/**
 * Calls the limiter's admin API (/v1/admin/...) with one token: the admin
 * listener (admin.addr, e.g. "http://limiter-admin.default.svc:8081"),
 * served when the service has admin.tokensFile set; over TLS
 * ("https://...") when it has http.tls set: trust the CA of its
 * certificate with NODE_EXTRA_CA_CERTS, or a fetch of your own (see
 * ClientOptions.fetch), unless the system's roots do. Every call, refused
 * ones included, is audited under the token's name. A refused call rejects
 * with a LimiterError of code `unauthorized` (401), `forbidden` (403, a
 * viewer's token on an operator's call) or `invalid_request` (400).
 */
export class Admin {
  private readonly api: Endpoint;

  constructor(baseURL: string, token: string, options: AdminOptions = {}) {
    if (!token.trim()) {
      throw new TypeError("token must not be empty");
    }
    this.api = new Endpoint(
      baseURL,
      token.trim(),
      options.fetch ?? globalThis.fetch,
      options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
      MAX_ADMIN_ANSWER_BYTES,
    );
  }

  /** The user's live slots, earliest expiry first (role viewer or operator). */
  slots(userId: string): Promise<AdminSlotsResponse> {
    return this.api.call("GET", Paths.adminListSlots.replace("{user_id}", segment(userId)), undefined, "AdminSlotsResponse");
  }

  /**
   * Releases every slot of the user (role operator): the holders' next
   * heartbeat is answered slot_lost. reason is required (at most 500
   * characters) and recorded in the audit.
   */
  releaseAll(userId: string, reason: string): Promise<AdminReleaseResponse> {
    const body: AdminReleaseRequest = { reason };
    return this.api.call("POST", Paths.adminReleaseAll.replace("{user_id}", segment(userId)), body, "AdminReleaseResponse");
  }

  /**
   * Who holds key of pool (each holder's user_id, stream and record), its
   * cap (limit, absent when the pool caps neither) and its override in
   * force (role viewer or operator). A pool the service does not hold
   * rejects with code `unknown_pool` (422); a key outside 1-128 bytes of
   * [A-Za-z0-9._:/@-] with `invalid_pool_key` (400). Keys are case-sensitive.
   */
  poolKey(pool: string, key: string): Promise<AdminPoolKeyResponse> {
    const path = Paths.adminGetPoolKey.replace("{pool}", segment(pool)).replace("{key}", segment(key));
    return this.api.call("GET", path, undefined, "AdminPoolKeyResponse");
  }

  /** The most recent admin calls, newest first: limit of them (1-1000), default the service's (50). */
  audit(limit?: number): Promise<AuditResponse> {
    const query = limit === undefined ? "" : `?limit=${encodeURIComponent(String(limit))}`;
    return this.api.call("GET", Paths.adminReadAudit + query, undefined, "AuditResponse");
  }
}

/**
 * value (a user id, a pool's name or key) escaped as one path segment: a
 * "/" is %2F; a dot-only one is written %2E..., or it would be resolved
 * away as a directory. "." and ".." cannot be sent at all: fetch resolves
 * even %2E and %2E%2E away (WHATWG URL), and the service would answer
 * another path's 404; they are refused here, naming what can reach them.
 * A lone surrogate, which UTF-8 cannot encode, is sent as U+FFFD, as
 * JSON.stringify's escape of one is read: the service refuses the id
 * holding it (invalid_user_id, invalid_pool_key), where
 * encodeURIComponent would throw URIError.
 */
export function segment(value: string): string {
  if (value === "." || value === "..") {
    throw new TypeError(
      `${JSON.stringify(value)} cannot be a path segment of a fetch URL (it is resolved away); ` +
        "reach it with the limiter admin CLI, the Go or Python client, or curl --path-as-is",
    );
  }
  if (value !== "" && /^\.+$/.test(value)) {
    return "%2E".repeat(value.length);
  }
  return encodeURIComponent(value.replace(LONE_SURROGATE, "\uFFFD"));
}

/** A surrogate not in a pair. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;
