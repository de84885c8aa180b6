import { randomBytes } from "node:crypto";

import { LimiterError, closedError, definite, isNotSlotHolder } from "./errors.js";
import { Keeper, MAX_IN_FLIGHT, forEach, type Logger } from "./heartbeat.js";
import { ENV_TOKEN, Endpoint } from "./http.js";
import { Lease } from "./lease.js";
import { ErrorCode, Paths, type AcquireRequest, type AcquireResponse, type ReleaseRequest } from "./schemas.gen.js";

/** Defaults of the options. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 5000;
export const DEFAULT_ACQUIRE_RETRIES = 2;
/** The most bytes of UTF-8 a label may take. */
export const MAX_LABEL_BYTES = 128;
// Waits between the attempts of an unanswered acquire whose answer carries
// no Retry-After: doubling from the first.
const FIRST_ACQUIRE_BACKOFF_MS = 200;
const MAX_ACQUIRE_BACKOFF_MS = 2000;
// The longest Retry-After an acquire's retry waits out, as long as the
// longest backoff: the limiter's own 503s ask for 1s. An answer asking for
// longer (a maintenance page of a proxy in front of the limiter) ends the
// retries at once, rather than hold acquire that long per retry.
const MAX_RETRY_AFTER_MS = MAX_ACQUIRE_BACKOFF_MS;
// How long after the release of an unanswered acquire it is sent once more:
// the lost attempt may still be on its way to Redis, and reach it after the
// release (the limiter's Redis client sends an acquire script again after a
// broken connection).
const RELEASE_AGAIN_AFTER_MS = 1000;
// Applies when an acquire answer names neither a heartbeat interval nor a
// TTL (it always should).
const FALLBACK_HEARTBEAT_INTERVAL_MS = 10_000;

export interface ClientOptions {
  /**
   * The caller's bearer token, a token of the service's api.tokensFile.
   * Default: the LIMITER_TOKEN environment variable; none when that is
   * empty too (a service without api.tokensFile needs none).
   */
  token?: string;
  /**
   * The fetch the client sends its requests with. Default: the global
   * fetch. To trust a private CA, start Node with NODE_EXTRA_CA_CERTS; for
   * mutual TLS, pass a fetch bound to an agent holding the client
   * certificate (undici's fetch with an Agent whose connect options name
   * ca, cert and key), since the global fetch takes none.
   */
  fetch?: typeof fetch;
  /** Milliseconds each call may take (acquire, one heartbeat batch, release). Default 5000. */
  requestTimeoutMs?: number;
  /**
   * Milliseconds between heartbeat rounds. Default: the smallest
   * heartbeat_interval_ms among held leases, as the limiter answered at
   * acquire. An interval longer than a tier's TTL loses its slots.
   */
  heartbeatIntervalMs?: number;
  /**
   * How many times acquire sends an acquire again, under the same stream
   * id, after an attempt went unanswered (no answer, 503
   * limiter_unavailable): such an attempt may have taken the slot with
   * only its answer lost, and the retry is then granted that slot, not a
   * second one. Between attempts it waits the answer's Retry-After (up to
   * half as long again, for jitter), else 200ms doubling up to 2s (from half
   * of each, for jitter); a Retry-After above 2s (something in front of the
   * limiter asking for a long pause: the limiter's own 503s ask for 1s) is
   * not waited, and acquire gives up at once, rejecting with that answer's
   * error. When it gives up it releases the
   * stream id, so that a slot a lost attempt took does not count against
   * the user for a whole TTL, and, when the id is the client's own, once
   * more a second later, in the background, for an attempt that reached
   * Redis after the first release (close waits for it). 0 disables
   * retrying, not the release. Default 2.
   */
  acquireRetries?: number;
  /** Where heartbeat failures and lost leases are logged. Default: the console's standard error. */
  logger?: Logger;
}

export interface AcquireOptions {
  /**
   * Names the slot (1-128 characters of [A-Za-z0-9._:-]). Default: a
   * random 128-bit id of the client's own. Every acquire is sent under a
   * stream id, so that an attempt whose answer is lost can be retried
   * without taking a second slot.
   */
  streamId?: string;
  /** Recorded with the slot for support: a pod, a model, a request id; at most 128 bytes of UTF-8. Sent only when set. */
  label?: string;
  /**
   * The pool keys the stream joins, pool to key (`{ model: "gpt-4o", org:
   * "acme" }`, at most 4): each capped key must have room too, or the
   * acquire rejects with `pool_limit_reached` (`isPoolLimited`) and takes
   * nothing. The limiter keeps the stream's memberships with its slot: the
   * heartbeats and the release cover them. Sent only when not empty.
   */
  pools?: Record<string, string>;
  /**
   * Gives up the acquire: it rejects with the signal's reason, and the
   * stream id is released in the background (close waits for it), in case
   * the attempt in flight took the slot. An acquire of that `streamId`
   * meanwhile (the application's retry) waits for that release first, so
   * that the slot it is granted is not freed by it.
   */
  signal?: AbortSignal;
}

const consoleLogger: Logger = {
  info: (message, fields) => console.error(message, fields ?? ""),
  warn: (message, fields) => console.error(message, fields ?? ""),
  error: (message, fields) => console.error(message, fields ?? ""),
};

/**
 * A client of one limiter service. All leases of one Client are kept alive
 * together: one POST /v1/slots/heartbeats per interval for up to 1000
 * leases, so 10,000 streams in a process cost ten requests per interval,
 * not 10,000. Close it to stop heartbeating and release what it holds.
 */
export class Client {
  /** @internal */
  readonly api: Endpoint;
  private readonly keeper: Keeper;
  private readonly retries: number;
  private readonly log: Logger;
  private readonly closing = new AbortController(); // cuts retry waits short
  private readonly releasing = new Set<Promise<void>>();
  /** The background releases of given-up acquires, by user and stream id. */
  private readonly givingBack = new Map<string, Promise<void>>();
  /**
   * The releases sent once more (see releaseUnanswered), by stream id: an
   * acquire under that id (the caller's retry under the `streamId` an
   * error names) calls its release off, or waits for it once sent.
   */
  private readonly againFor = new Map<string, { off: boolean; sending?: Promise<void> }>();
  private closed: Promise<number> | undefined;

  /** baseURL is the API listener, e.g. "http://limiter.default.svc:8080" (a path prefix is kept). */
  constructor(baseURL: string, options: ClientOptions = {}) {
    const token = options.token === undefined ? (process.env[ENV_TOKEN] ?? "").trim() : options.token.trim();
    if (options.token !== undefined && token === "") {
      throw new TypeError(`token must not be empty (leave it out to read ${ENV_TOKEN})`);
    }
    if (options.heartbeatIntervalMs !== undefined && !(options.heartbeatIntervalMs > 0)) {
      throw new RangeError(`heartbeatIntervalMs must be > 0, got ${options.heartbeatIntervalMs}`);
    }
    const retries = options.acquireRetries ?? DEFAULT_ACQUIRE_RETRIES;
    if (!Number.isInteger(retries) || retries < 0) {
      throw new RangeError(`acquireRetries must be an integer >= 0, got ${retries}`);
    }
    this.retries = retries;
    this.log = options.logger ?? consoleLogger;
    this.api = new Endpoint(baseURL, token, options.fetch ?? globalThis.fetch, options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS);
    this.keeper = new Keeper(
      this.api,
      options.heartbeatIntervalMs,
      { reacquire: (lease, signal) => this.reacquire(lease, signal), intervalOf: heartbeatIntervalOf },
      this.log,
    );
  }

  /**
   * Takes a stream slot for userId under plan and heartbeats it until it is
   * released or lost. Rejects with a LimiterError: `stream_limit_reached`
   * (with used, limit, retryAfterMs), `pool_limit_reached` (with pool, key,
   * and the key's used, limit, retryAfterMs), `unknown_plan`,
   * `unknown_pool`, `plan_not_allowed`, `not_slot_holder` (a `streamId`
   * another caller holds), `unauthenticated`, an invalid id or pool key,
   * `limiter_unavailable` (also when the limiter cannot be reached),
   * `client_closed` after close; with a RangeError for a label over 128
   * bytes. Acquiring a stream id this client already holds resolves to the
   * held Lease. A grant made while the limiter could not reach Redis (a
   * tier failing open) is a Lease with degraded true. The Lease says what
   * the grant answered: `used`, `limit`, `pools`, and `wouldRefuse` when a
   * plan or pool in shadow mode would have refused the stream and did not;
   * an acquire of a held stream id updates the held Lease with its answer.
   */
  async acquire(userId: string, plan: string, options: AcquireOptions = {}): Promise<Lease> {
    if (this.keeper.isClosed) {
      throw closedError();
    }
    options.signal?.throwIfAborted();
    const body: AcquireRequest = { user_id: userId, plan, stream_id: options.streamId || newStreamID() };
    if (options.label) {
      const size = Buffer.byteLength(options.label, "utf8");
      if (size > MAX_LABEL_BYTES) {
        throw new RangeError(`label must be at most ${MAX_LABEL_BYTES} bytes of UTF-8, got ${size}`);
      }
      body.label = options.label;
    }
    if (options.pools && Object.keys(options.pools).length > 0) {
      body.pools = { ...options.pools };
    }
    if (options.streamId) {
      // A release of a given-up acquire of this id, still on its way,
      // would free the slot this one is granted: it goes first.
      const key = givingBackKey(userId, options.streamId);
      await this.givingBack.get(key);
      // The id is the caller's from here: a late attempt that took a slot
      // under it took this acquire's, which its lease releases.
      const again = this.againFor.get(key);
      if (again) {
        again.off = true;
        await again.sending;
      }
    }
    const answer = await this.acquireRetrying(body, !options.streamId, options.signal);
    const lease = new Lease(
      { api: this.api, forget: (l) => this.keeper.remove(l), holdsAnother: (l) => this.keeper.holdsAnother(l) },
      userId,
      plan,
      answer.stream_id,
      options.label || undefined,
      heartbeatIntervalOf(answer),
      answer,
      body.pools,
    );
    const held = this.keeper.add(lease);
    if (held === undefined) {
      // Closed while the request was in flight: give the slot back.
      await lease.releaseSlot().catch(() => undefined);
      throw closedError();
    }
    if (held !== lease) {
      held.acquired(answer, true);
      this.keeper.setInterval(held, lease.interval);
    }
    return held;
  }

  /** Acquires a lease, runs fn with it, and releases it however fn ends (a failed release is logged: the slot expires after its TTL). */
  async withLease<T>(userId: string, plan: string, fn: (lease: Lease) => Promise<T> | T, options: AcquireOptions = {}): Promise<T> {
    const lease = await this.acquire(userId, plan, options);
    try {
      return await fn(lease);
    } finally {
      await lease.release().catch((err: unknown) => {
        this.log.warn("limiter: releasing a lease failed; it expires after its TTL", { stream_id: lease.streamId, err: String(err) });
      });
    }
  }

  /**
   * Stops heartbeating (cancelling a round in flight) and releases every
   * lease still held, in parallel (a lease it cannot release expires after
   * its TTL); their `lost` resolves with `client_closed`. Acquire rejects
   * afterwards. Also waits for the releases of acquires given up by their
   * signal, and for those sent once more (see acquireRetries). Resolves to how many lease releases failed (each is logged);
   * calling it again resolves to the same.
   */
  close(): Promise<number> {
    this.closed ??= this.shutDown();
    return this.closed;
  }

  private async shutDown(): Promise<number> {
    const held = this.keeper.stop();
    this.closing.abort();
    const closedAt = closedError();
    let failed = 0;
    let first: unknown;
    await forEach(held, MAX_IN_FLIGHT, async (lease) => {
      try {
        await lease.releaseSlot();
      } catch (err) {
        failed++;
        first ??= err;
      } finally {
        lease.markLost(closedAt);
      }
    });
    await Promise.all([this.keeper.stopped(), ...this.releasing]);
    if (failed > 0) {
      this.log.warn("limiter: releasing leases failed (they expire after their TTL)", { failed, leases: held.length, first: String(first) });
    }
    return failed;
  }

  private async acquireOnce(body: AcquireRequest, signal?: AbortSignal): Promise<AcquireResponse> {
    const answer = await this.api.call("POST", Paths.acquire, body, "AcquireResponse", { signal });
    if (!answer.granted || !answer.stream_id) {
      // The contract refuses with 429; a 200 without a grant is a server bug.
      throw new LimiterError("invalid_answer", `POST ${Paths.acquire}: answer 200 without a granted stream_id`, { status: 200 });
    }
    return answer;
  }

  /**
   * Sends body (whose stream_id is set) until it is answered, at most
   * 1 + acquireRetries times; releases the stream id when it gives up after
   * an unanswered attempt (once more later when the id was made for this
   * acquire, generated).
   */
  private async acquireRetrying(body: AcquireRequest, generated: boolean, signal?: AbortSignal): Promise<AcquireResponse> {
    let unanswered = false;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.acquireOnce(body, signal);
      } catch (err) {
        if (definite(err) && !unanswered) {
          throw err; // refused: no attempt can have taken a slot
        }
        if (isNotSlotHolder(err)) {
          // Another caller holds the id: no attempt of ours holds it, and
          // the limiter would refuse our release of it too.
          throw err;
        }
        if (!definite(err)) {
          unanswered = true;
          const retryable = err instanceof LimiterError && err.code === ErrorCode.LimiterUnavailable;
          const wait = retryable ? retryWait(err, attempt) : undefined;
          if (attempt < this.retries && wait !== undefined && (await this.pause(wait, signal))) {
            continue;
          }
        }
        // While the caller waits, release before answering, so that its
        // next acquire finds the slot free; once it gave up, in the
        // background.
        const released = this.releaseUnanswered(body, generated, signal?.aborted ?? false);
        if (signal?.aborted) {
          throw signal.reason;
        }
        await released;
        throw err;
      }
    }
  }

  /** Waits ms unless the client closes or signal aborts first; whether it waited. */
  private pause(ms: number, signal?: AbortSignal): Promise<boolean> {
    return new Promise((resolve) => {
      const signals = [this.closing.signal, ...(signal ? [signal] : [])];
      if (signals.some((s) => s.aborted)) {
        resolve(false);
        return;
      }
      const done = (waited: boolean) => {
        clearTimeout(timer);
        signals.forEach((s) => s.removeEventListener("abort", abort));
        resolve(waited);
      };
      const abort = () => done(false);
      const timer = setTimeout(() => done(true), ms);
      signals.forEach((s) => s.addEventListener("abort", abort, { once: true }));
    });
  }

  /**
   * Frees the slot an unanswered acquire of body may have taken, unless
   * this client holds a lease of that stream id (the acquire was a
   * re-acquire of a slot in use). When the id was made for this acquire
   * (generated), no one else can hold it, so the release is sent once more
   * RELEASE_AGAIN_AFTER_MS later, for an attempt that reached Redis after
   * the first. Best effort: if a release fails, the slot frees itself after
   * its TTL. Both are tracked in `releasing`, which close waits for; the
   * promise returned is the first's.
   */
  private releaseUnanswered(body: AcquireRequest, generated: boolean, givenUp: boolean): Promise<void> {
    const streamId = body.stream_id!;
    if (this.keeper.holdsKey(body.user_id, streamId)) {
      return Promise.resolve();
    }
    const release: ReleaseRequest = { user_id: body.user_id, stream_id: streamId };
    const send = (): Promise<void> =>
      this.api.call("POST", Paths.release, release, "ReleaseResponse").then(
        () => undefined,
        (err: unknown) => {
          this.log.warn("limiter: releasing the stream id of an unanswered acquire failed; a slot it took expires after its TTL", {
            stream_id: streamId,
            given_up: givenUp,
            err: String(err),
          });
        },
      );
    const track = (p: Promise<void>): Promise<void> => {
      const tracked: Promise<void> = p.finally(() => this.releasing.delete(tracked));
      this.releasing.add(tracked);
      return tracked;
    };
    const sent = track(send());
    if (givenUp) {
      const key = givingBackKey(body.user_id, streamId);
      this.givingBack.set(key, sent);
      void sent.then(() => {
        if (this.givingBack.get(key) === sent) {
          this.givingBack.delete(key);
        }
      });
    }
    if (generated && this.closed === undefined) {
      const key = givingBackKey(body.user_id, streamId);
      const again: { off: boolean; sending?: Promise<void> } = { off: false };
      this.againFor.set(key, again);
      const forget = (): void => {
        if (this.againFor.get(key) === again) {
          this.againFor.delete(key);
        }
      };
      track(
        sent
          .then(() => new Promise<void>((resolve) => setTimeout(resolve, RELEASE_AGAIN_AFTER_MS)))
          .then(() => {
            if (again.off) {
              forget();
              return undefined;
            }
            again.sending = send().finally(forget);
            return again.sending;
          }),
      );
    }
    return sent;
  }

  private reacquire(lease: Lease, signal: AbortSignal): Promise<AcquireResponse> {
    const body: AcquireRequest = { user_id: lease.userId, plan: lease.plan, stream_id: lease.streamId };
    if (lease.label) {
      body.label = lease.label;
    }
    if (lease.poolKeys) {
      body.pools = { ...lease.poolKeys };
    }
    return this.acquireOnce(body, signal);
  }
}

/** The key of a stream id's background release in Client.givingBack. */
function givingBackKey(userId: string, streamId: string): string {
  return `${userId}\u0000${streamId}`;
}

/** A random 128-bit stream id, as hex. */
export function newStreamID(): string {
  return randomBytes(16).toString("hex");
}

/** The heartbeat interval an acquire answer asks for, in milliseconds. */
export function heartbeatIntervalOf(answer: AcquireResponse): number {
  if (answer.heartbeat_interval_ms > 0) {
    return answer.heartbeat_interval_ms;
  }
  if (answer.ttl_ms > 0) {
    return answer.ttl_ms / 3;
  }
  return FALLBACK_HEARTBEAT_INTERVAL_MS;
}

/**
 * How long to wait after the attempt-th unanswered attempt failed with err:
 * at least the answer's Retry-After, up to half as long again; without one,
 * a doubling backoff drawn from its upper half. The jitter keeps clients cut
 * off by one outage from all coming back at once. undefined when the
 * answer's Retry-After is above MAX_RETRY_AFTER_MS: no retry.
 */
export function retryWait(err: LimiterError, attempt: number): number | undefined {
  if (err.retryAfterMs && err.retryAfterMs > 0) {
    // (none, or below 0, not of the contract: the backoff)
    if (err.retryAfterMs > MAX_RETRY_AFTER_MS) {
      return undefined;
    }
    return err.retryAfterMs + Math.random() * (err.retryAfterMs / 2);
  }
  const wait = Math.min(FIRST_ACQUIRE_BACKOFF_MS * 2 ** attempt, MAX_ACQUIRE_BACKOFF_MS);
  return wait / 2 + Math.random() * (wait / 2);
}
