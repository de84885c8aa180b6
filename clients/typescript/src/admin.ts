import { MAX_ADMIN_ANSWER_BYTES, Endpoint } from "./http.js";
import { DEFAULT_REQUEST_TIMEOUT_MS } from "./client.js";
import {
  Paths,
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
 * served when the service has admin.tokensFile set. Every call, refused
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
    return this.api.call("GET", Paths.adminListSlots.replace("{user_id}", userSegment(userId)), undefined, "AdminSlotsResponse");
  }

  /**
   * Releases every slot of the user (role operator): the holders' next
   * heartbeat is answered slot_lost. reason is required (at most 500
   * characters) and recorded in the audit.
   */
  releaseAll(userId: string, reason: string): Promise<AdminReleaseResponse> {
    const body: AdminReleaseRequest = { reason };
    return this.api.call("POST", Paths.adminReleaseAll.replace("{user_id}", userSegment(userId)), body, "AdminReleaseResponse");
  }

  /** The most recent admin calls, newest first: limit of them (1-1000), default the service's (50). */
  audit(limit?: number): Promise<AuditResponse> {
    const query = limit === undefined ? "" : `?limit=${encodeURIComponent(String(limit))}`;
    return this.api.call("GET", Paths.adminReadAudit + query, undefined, "AuditResponse");
  }
}

/** userId escaped as one path segment; a dot-only id is written %2E..., or it would be resolved away as a directory. */
export function userSegment(userId: string): string {
  if (userId !== "" && /^\.+$/.test(userId)) {
    return "%2E".repeat(userId.length);
  }
  return encodeURIComponent(userId);
}
