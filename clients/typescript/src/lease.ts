import type { LimiterError } from "./errors.js";
import type { Endpoint } from "./http.js";
import { Paths, type AcquireResponse, type PoolGrant, type ReleaseRequest } from "./schemas.gen.js";

/** What a Lease needs of its Client. */
export interface LeaseOwner {
  readonly api: Endpoint;
  /** Stops heartbeating the lease. */
  forget(lease: Lease): void;
  /**
   * Whether the client heartbeats a lease other than lease of its user and
   * stream id: one an acquire of the id took after lease was lost or
   * released, which now holds the slot.
   */
  holdsAnother(lease: Lease): boolean;
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
 *
 * It also says what its acquire answered: the user's `used` and `limit`, the
 * pool keys joined (`pools`), and `wouldRefuse` when a plan or pool in
 * shadow mode would have refused the stream and did not.
 */
export class Lease {
  /** @internal Milliseconds between heartbeats; managed by the client. */
  interval: number;

  private expires: Date;
  private isDegraded: boolean;
  private usedSlots = 0;
  private judgedLimit = 0;
  private joined: readonly PoolGrant[] = [];
  private refusal: AcquireResponse["would_refuse"];
  private refusalBy: PoolGrant | undefined;
  private released = false;
  /**
   * The limiter answered that it holds no slot under the stream id for the
   * lease (see markLost): its release has nothing to free, and would free
   * the slot of an acquire of the id since.
   */
  private vacant = false;
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
    granted: AcquireResponse,
    /** @internal The pool keys sent with the acquire, sent again on a re-acquire. */
    readonly poolKeys?: Readonly<Record<string, string>>,
  ) {
    this.interval = interval;
    this.expires = granted.expires_at;
    this.isDegraded = granted.degraded;
    this.acquired(granted, false);
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
   * How many live slots the user holds, this one included, as of the latest
   * acquire answer about the slot: acquire's, that of an acquire of its
   * `streamId` again (an extension), or that of a degraded lease's
   * re-acquire. 0 when that answer was degraded (not counted). Heartbeats
   * answer no counts, so it does not follow the user's other streams coming
   * and going in between. Above `limit` when a plan in shadow mode let the
   * stream in over its limit (see `wouldRefuse`), or when the limit was
   * lowered while the user's streams were held.
   */
  get used(): number {
    return this.usedSlots;
  }

  /**
   * The limit the latest acquire answer about the slot was judged by (see
   * `used`): the plan's max_concurrent_streams, or the user's support
   * override while one is in force.
   */
  get limit(): number {
    return this.judgedLimit;
  }

  /**
   * The capped pool keys the stream joined (acquire's `pools`), in the order
   * of the pools' names, each with its live memberships (`used`) and cap
   * (`limit`) as of the latest acquire answer about the slot (see `used`);
   * empty when it joined none. A key its pool does not cap is not listed:
   * the stream joins nothing there. A key's `used` is 0 when the answer was
   * degraded.
   */
  get pools(): readonly PoolGrant[] {
    return this.joined;
  }

  /**
   * The refusal a scope in shadow mode (a plan's or a pool's `enforce:
   * false`) would have answered to the acquire that took the stream, and
   * did not: `stream_limit_reached` (the plan's limit; that answer's `used`
   * counted the stream, above its limit) or `pool_limit_reached` (a pool
   * key's cap: `wouldRefuseBy`). Undefined when no scope would have refused,
   * and always when every scope enforces (an enforcing scope refuses:
   * acquire rejects). It is the stream's admission that is judged: an
   * acquire of the `streamId` again extends the held stream whatever the
   * limits, so its answer keeps what the first said; a degraded lease's
   * re-acquire takes the stream anew, and says it again.
   */
  get wouldRefuse(): AcquireResponse["would_refuse"] {
    return this.refusal;
  }

  /**
   * For a `wouldRefuse` of `pool_limit_reached`, the pool key in shadow mode
   * that would have refused the stream (the first in the order of the
   * pools' names), with its live memberships and cap as that acquire
   * answered; undefined otherwise.
   */
  get wouldRefuseBy(): PoolGrant | undefined {
    return this.refusalBy;
  }

  /**
   * Stops heartbeating the lease and frees its slot. Idempotent: once a
   * release succeeded, later calls send nothing; after a failure (a
   * rejection with a LimiterError), calling it again retries. A slot never
   * released expires after its TTL.
   *
   * It sends nothing where the slot under the stream id is no longer the
   * lease's: when the client holds another Lease of that user and stream id
   * (an acquire of the id after this lease was lost, or after its release
   * failed: the slot is that Lease's now), or when the limiter answered that
   * it holds no slot under the id (the lease lost with `slot_lost`, or a
   * degraded lease refused on re-acquire). A lease lost for another reason
   * (`unknown_plan`, `plan_not_allowed`, `not_slot_holder`, an invalid id,
   * `client_closed`) may still hold its slot: its release is sent.
   */
  async release(): Promise<void> {
    this.owner.forget(this);
    await this.releaseSlot();
  }

  /**
   * @internal Frees the slot without touching the heartbeats. again sends
   * the release even after one succeeded: for a slot a re-acquire took
   * again after that release reached the limiter. Nothing is sent, and the
   * lease counts as released, when the slot under the stream id is not the
   * lease's (see release).
   */
  async releaseSlot(again = false): Promise<void> {
    if (this.released && !again) {
      return;
    }
    if (!this.vacant && !this.owner.holdsAnother(this)) {
      const body: ReleaseRequest = { user_id: this.userId, stream_id: this.streamId };
      await this.owner.api.call("POST", Paths.release, body, "ReleaseResponse");
    }
    this.released = true;
  }

  /**
   * @internal Marks the lease lost with err, once. vacant says the limiter
   * answered that it holds no slot under the stream id: a heartbeat's
   * slot_lost, or a degraded lease's re-acquire refused (the heartbeat before
   * it found no slot, and a refused acquire takes none).
   */
  markLost(err: LimiterError, vacant = false): void {
    if (this.lostError !== undefined) {
      return;
    }
    this.lostError = err;
    this.vacant = vacant;
    this.controller.abort(err);
    this.resolveLost(err);
  }

  /**
   * @internal Records an acquire's answer about the slot. extension says it
   * answers an acquire of a stream the lease held already, which the limiter
   * extends whatever the limits: its answer says the would_refuse of the
   * acquire that took the stream, and one that says none (a release before
   * this one) leaves the lease's as it is.
   */
  acquired(answer: AcquireResponse, extension: boolean): void {
    this.expires = answer.expires_at;
    this.isDegraded = answer.degraded;
    this.usedSlots = answer.used;
    this.judgedLimit = answer.limit;
    this.joined = Object.freeze((answer.pools ?? []).map((g) => Object.freeze({ ...g })));
    if (!extension || answer.would_refuse !== undefined) {
      this.refusal = answer.would_refuse;
      this.refusalBy = answer.would_refuse_by === undefined ? undefined : Object.freeze({ ...answer.would_refuse_by });
    }
  }

  /** @internal Records a heartbeat's answer about the slot: heartbeats answer neither counts nor would_refuse (see `used`). */
  update(expiresAt: Date | undefined, degraded: boolean): void {
    if (expiresAt !== undefined) {
      this.expires = expiresAt;
    }
    this.isDegraded = degraded;
  }
}
