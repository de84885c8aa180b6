import type { LimiterError } from "./errors.js";
import type { Endpoint } from "./http.js";
import { Paths, type ReleaseRequest } from "./schemas.gen.js";

/** What a Lease needs of its Client. */
export interface LeaseOwner {
  readonly api: Endpoint;
  /** Stops heartbeating the lease. */
  forget(lease: Lease): void;
}

/**
 * One held stream slot. Its Client heartbeats it until it is released, the
 * client is closed, or the limiter says the slot is gone: then `signal`
 * aborts and `lost` resolves, both with the reason.
 *
 * ```ts
 * const lease = await limits.acquire("user-42", "paid");
 * try {
 *   // Pass lease.signal to the upstream call: it aborts if the slot is lost.
 *   await streamTo(res, { signal: lease.signal });
 * } finally {
 *   await lease.release();
 * }
 * ```
 */
export class Lease {
  /** @internal Milliseconds between heartbeats; managed by the client. */
  interval: number;

  private expires: Date;
  private isDegraded: boolean;
  private released = false;
  private lostError: LimiterError | undefined;
  private readonly controller = new AbortController();
  private resolveLost!: (err: LimiterError) => void;

  /**
   * Resolves, never rejects, when the lease is lost: the limiter answered
   * that the slot no longer exists (expired, released by support) or cannot
   * be heartbeated (unknown plan, plan not allowed, a slot another caller
   * holds, invalid ids), or the client was closed. Release does not resolve
   * it.
   */
  readonly lost: Promise<LimiterError>;

  constructor(
    private readonly owner: LeaseOwner,
    /** The user the slot counts against. */
    readonly userId: string,
    /** The plan the slot was acquired under. */
    readonly plan: string,
    /** The slot's stream id (given to acquire, or made by the client). */
    readonly streamId: string,
    /** The label sent with the acquire, if any. */
    readonly label: string | undefined,
    interval: number,
    expiresAt: Date,
    degraded: boolean,
    /** @internal The pool keys sent with the acquire, sent again on a re-acquire. */
    readonly poolKeys?: Readonly<Record<string, string>>,
  ) {
    this.interval = interval;
    this.expires = expiresAt;
    this.isDegraded = degraded;
    this.lost = new Promise((resolve) => {
      this.resolveLost = resolve;
    });
  }

  /** Aborts when the lease is lost, with the LimiterError as its reason. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /**
   * Why the lease was lost: `slot_lost`, `unknown_plan`, `plan_not_allowed`,
   * `not_slot_holder`, an invalid id, `stream_limit_reached` or
   * `pool_limit_reached` (a degraded lease refused on re-acquire), or
   * `client_closed`. Undefined while it is held.
   */
  get error(): LimiterError | undefined {
    return this.lostError;
  }

  /** When the slot stops counting unless heartbeated, as of the latest answer; heartbeats move it forward. */
  get expiresAt(): Date {
    return this.expires;
  }

  /**
   * Whether the latest answer about the slot was degraded: the limiter could
   * not reach Redis and, its tier failing open, granted or kept the slot
   * without counting it. A degraded lease the limiter later reports lost is
   * acquired again under its stream id, and only lost if that is refused.
   */
  get degraded(): boolean {
    return this.isDegraded;
  }

  /**
   * Stops heartbeating the lease and frees its slot. Idempotent: once a
   * release succeeded, later calls send nothing; after a failure (a
   * rejection with a LimiterError), calling it again retries. A slot never
   * released expires after its TTL.
   */
  async release(): Promise<void> {
    this.owner.forget(this);
    await this.releaseSlot();
  }

  /**
   * @internal Frees the slot without touching the heartbeats. again sends
   * the release even after one succeeded: for a slot a re-acquire took
   * again after that release reached the limiter.
   */
  async releaseSlot(again = false): Promise<void> {
    if (this.released && !again) {
      return;
    }
    const body: ReleaseRequest = { user_id: this.userId, stream_id: this.streamId };
    await this.owner.api.call("POST", Paths.release, body, "ReleaseResponse");
    this.released = true;
  }

  /** @internal Marks the lease lost with err, once. */
  markLost(err: LimiterError): void {
    if (this.lostError !== undefined) {
      return;
    }
    this.lostError = err;
    this.controller.abort(err);
    this.resolveLost(err);
  }

  /** @internal Records an answer about the slot. */
  update(expiresAt: Date | undefined, degraded: boolean): void {
    if (expiresAt !== undefined) {
      this.expires = expiresAt;
    }
    this.isDegraded = degraded;
  }
}
