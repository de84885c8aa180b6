import { LimiterError, definite, fromWire, slotFatal } from "./errors.js";
import type { Endpoint } from "./http.js";
import type { Lease } from "./lease.js";
import { ErrorCode, HeartbeatsRequestSlotsMaxItems, Paths, type AcquireResponse, type HeartbeatsRequest } from "./schemas.gen.js";

/** Where a Client logs heartbeat failures and lost leases. */
export interface Logger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** The most concurrent requests of one heartbeat round, or of a close. */
export const MAX_IN_FLIGHT = 4;

/** What the keeper needs of its Client to acquire a degraded lease again. */
export interface Reacquirer {
  reacquire(lease: Lease, signal: AbortSignal): Promise<AcquireResponse>;
  intervalOf(answer: AcquireResponse): number;
}

/**
 * Holds a Client's leases and heartbeats them: one round per interval, the
 * smallest among held leases (or the fixed one), one POST
 * /v1/slots/heartbeats per 1000 leases, idle while none is held. A failed
 * round (no answer, 5xx) never loses a lease: the slots keep their TTL and
 * the next round retries. Only the limiter's answer that a slot is gone
 * loses it.
 */
export class Keeper {
  private readonly leases = new Map<string, Lease>();
  // Held leases by interval, so that the smallest is found in O(tiers).
  private readonly intervals = new Map<number, number>();
  private closed = false;
  private readonly stopping = new AbortController();
  private wake: (() => void) | undefined;
  private readonly done: Promise<void>;
  private rounds = 0;
  // The round each degraded lease's latest re-acquire started in, so that
  // those waiting longest go first when a round cannot take them all.
  private readonly tried = new WeakMap<Lease, number>();
  // Releases of slots re-acquired after their lease's release.
  private readonly givingBack = new Set<Promise<void>>();

  constructor(
    private readonly api: Endpoint,
    private readonly fixedInterval: number | undefined,
    private readonly owner: Reacquirer,
    private readonly log: Logger,
  ) {
    this.done = this.run();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Starts heartbeating lease, or returns the lease already held for the same user and stream; undefined once closed. */
  add(lease: Lease): Lease | undefined {
    if (this.closed) {
      return undefined;
    }
    const key = keyOf(lease.userId, lease.streamId);
    const held = this.leases.get(key);
    if (held !== undefined) {
      return held;
    }
    this.leases.set(key, lease);
    this.count(lease.interval, 1);
    this.nudge();
    return lease;
  }

  /** Stops heartbeating lease; whether it was held. */
  remove(lease: Lease): boolean {
    const key = keyOf(lease.userId, lease.streamId);
    if (this.leases.get(key) !== lease) {
      return false;
    }
    this.leases.delete(key);
    this.count(lease.interval, -1);
    this.nudge();
    return true;
  }

  holds(lease: Lease): boolean {
    return this.leases.get(keyOf(lease.userId, lease.streamId)) === lease;
  }

  holdsKey(userId: string, streamId: string): boolean {
    return this.leases.has(keyOf(userId, streamId));
  }

  /** Whether a lease other than lease is held for its user and stream id (see LeaseOwner.holdsAnother). */
  holdsAnother(lease: Lease): boolean {
    const held = this.leases.get(keyOf(lease.userId, lease.streamId));
    return held !== undefined && held !== lease;
  }

  setInterval(lease: Lease, interval: number): void {
    if (!this.holds(lease) || lease.interval === interval) {
      return;
    }
    this.count(lease.interval, -1);
    lease.interval = interval;
    this.count(interval, 1);
    this.nudge();
  }

  /**
   * Stops heartbeating lease and marks it lost with err, unless it was
   * released meanwhile; whether it was lost. vacant says the limiter
   * answered that it holds no slot under the lease's stream id (see
   * Lease.markLost).
   */
  lose(lease: Lease, err: LimiterError, vacant = false): boolean {
    if (!this.remove(lease)) {
      return false;
    }
    lease.markLost(err, vacant);
    return true;
  }

  /** Stops the loop, cancelling its round in flight, and returns the leases still held, forgetting them. */
  stop(): Lease[] {
    this.closed = true;
    const held = [...this.leases.values()];
    this.leases.clear();
    this.intervals.clear();
    this.stopping.abort(new LimiterError("client_closed", "the limiter client is closed"));
    this.nudge();
    return held;
  }

  /** Resolves once the loop has stopped and the slots it re-acquired for released leases are given back. */
  async stopped(): Promise<void> {
    await this.done;
    await Promise.all([...this.givingBack]);
  }

  private count(interval: number, delta: number): void {
    const n = (this.intervals.get(interval) ?? 0) + delta;
    if (n > 0) {
      this.intervals.set(interval, n);
    } else {
      this.intervals.delete(interval);
    }
  }

  /** The interval rounds run at; 0 while no lease is held. */
  private every(): number {
    if (this.leases.size === 0) {
      return 0;
    }
    return this.fixedInterval ?? Math.min(...this.intervals.keys());
  }

  private nudge(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** Waits ms (forever when undefined) or until nudged. The timer does not keep the process alive. */
  private pause(ms?: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = ms === undefined ? undefined : setTimeout(() => this.nudge(), ms);
      timer?.unref();
      this.wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  private async run(): Promise<void> {
    let last: number | undefined; // start of the latest round, or when leases appeared
    while (!this.closed) {
      const every = this.every();
      if (every === 0) {
        // The first heartbeat of new leases is due one interval after they appear.
        last = undefined;
        await this.pause();
        continue;
      }
      const now = performance.now();
      last ??= now;
      // Measured from the latest round, so that leases coming and going
      // (each nudges) never postpone a round.
      if (now < last + every) {
        await this.pause(last + every - now);
        continue;
      }
      last = now;
      try {
        await this.round([...this.leases.values()], every);
      } catch (err) {
        // A bug must not stop the heartbeats of every lease.
        this.log.error("limiter: heartbeat round failed; retrying next round", { err: String(err) });
      }
    }
  }

  /**
   * Heartbeats leases, then acquires again the degraded ones the limiter no
   * longer holds. The round, re-acquires included, may take no longer than
   * the interval (every): a request hung on a dead connection, or many slow
   * re-acquires, must not hold up the next round while the slots' TTLs run
   * out. What is still running at its end is abandoned, and what has not
   * started is not sent: a lease whose re-acquire did not finish stays
   * degraded, and is acquired again next round.
   */
  private async round(leases: Lease[], every: number): Promise<void> {
    const round = ++this.rounds;
    const deadline = new AbortController();
    const timer = setTimeout(
      () => deadline.abort(new LimiterError(ErrorCode.LimiterUnavailable, `heartbeat round: no answer within the ${Math.round(every)}ms interval`)),
      every,
    );
    timer.unref();
    const stop = () => deadline.abort(this.stopping.signal.reason);
    this.stopping.signal.addEventListener("abort", stop, { once: true });
    if (this.stopping.signal.aborted) {
      stop();
    }
    const signal = deadline.signal;
    try {
      const batches: Lease[][] = [];
      for (let i = 0; i < leases.length; i += HeartbeatsRequestSlotsMaxItems) {
        batches.push(leases.slice(i, i + HeartbeatsRequestSlotsMaxItems));
      }
      const again: Lease[] = [];
      await forEach(
        batches,
        MAX_IN_FLIGHT,
        async (batch) => {
          again.push(...(await this.beat(batch, signal)));
        },
        signal,
      );
      again.sort((a, b) => (this.tried.get(a) ?? 0) - (this.tried.get(b) ?? 0));
      await forEach(again, MAX_IN_FLIGHT, (lease) => this.reacquire(lease, round, signal), signal);
    } finally {
      clearTimeout(timer);
      this.stopping.signal.removeEventListener("abort", stop);
    }
  }

  /** Sends one batch and applies its results; returns the degraded leases the limiter no longer holds, to acquire again. */
  private async beat(batch: Lease[], signal: AbortSignal): Promise<Lease[]> {
    const body: HeartbeatsRequest = {
      slots: batch.map((l) => ({ user_id: l.userId, plan: l.plan, stream_id: l.streamId })),
    };
    let results;
    try {
      ({ results } = await this.api.call("POST", Paths.heartbeats, body, "HeartbeatsResponse", { signal }));
    } catch (err) {
      if (!this.closed) {
        this.log.warn("limiter: heartbeat batch failed; the slots keep their TTL, retrying next round", { slots: batch.length, err: String(err) });
      }
      return [];
    }
    if (results.length !== batch.length) {
      this.log.error("limiter: heartbeat batch answered the wrong number of results; retrying next round", {
        slots: batch.length,
        results: results.length,
      });
      return [];
    }
    const again: Lease[] = [];
    let lost = 0;
    let unconfirmed = 0;
    batch.forEach((lease, i) => {
      const result = results[i]!;
      if (result.stream_id !== lease.streamId) {
        unconfirmed++;
      } else if (result.error !== undefined) {
        if (!slotFatal(result.error.code)) {
          unconfirmed++; // e.g. limiter_unavailable: the slot keeps its TTL
        } else if (this.lose(lease, fromWire(result.error), result.error.code === ErrorCode.SlotLost)) {
          lost++;
        }
      } else if (result.alive) {
        lease.update(result.expires_at, result.degraded);
      } else if (lease.degraded) {
        // Granted or kept while Redis was unreachable, so Redis never held
        // it: count it again rather than end the stream over the limiter's
        // own outage.
        again.push(lease);
      } else if (this.lose(lease, new LimiterError(ErrorCode.SlotLost, "the limiter no longer holds this slot", { status: 410 }), true)) {
        lost++;
      }
    });
    if (unconfirmed > 0) {
      this.log.warn("limiter: heartbeats not confirmed; the slots keep their TTL, retrying next round", { slots: unconfirmed });
    }
    if (lost > 0) {
      this.log.info("limiter: leases lost", { leases: lost });
    }
    return again;
  }

  private async reacquire(lease: Lease, round: number, signal: AbortSignal): Promise<void> {
    if (!this.holds(lease)) {
      return;
    }
    this.tried.set(lease, round);
    let answer: AcquireResponse;
    try {
      answer = await this.owner.reacquire(lease, signal);
    } catch (err) {
      if (definite(err)) {
        // The heartbeat found no slot, and a refused acquire takes none.
        if (this.lose(lease, err as LimiterError, true)) {
          this.log.info("limiter: degraded lease refused on re-acquire", { stream_id: lease.streamId, err: String(err) });
        }
      } else if (!this.closed) {
        this.log.warn("limiter: re-acquiring a degraded lease failed; retrying next round", { stream_id: lease.streamId, err: String(err) });
      }
      return;
    }
    // Redis did not hold the slot: the stream was taken anew.
    lease.acquired(answer, false);
    this.setInterval(lease, this.owner.intervalOf(answer));
    if (!this.holds(lease)) {
      // Released while the acquire was in flight: give the slot back, even
      // when the lease's release succeeded, since it may have reached the
      // limiter before the acquire. Outside the round's bound (it is no
      // heartbeat); stopped() waits for it.
      const back: Promise<void> = lease
        .releaseSlot(true)
        .catch((err: unknown) => {
          this.log.warn("limiter: giving back the slot of a lease released while re-acquired failed; it expires after its TTL", {
            stream_id: lease.streamId,
            err: String(err),
          });
        })
        .finally(() => this.givingBack.delete(back));
      this.givingBack.add(back);
    }
  }
}

function keyOf(userId: string, streamId: string): string {
  return JSON.stringify([userId, streamId]);
}

/** Runs fn over items, at most limit at a time; starts none once signal aborted. */
export async function forEach<T>(items: readonly T[], limit: number, fn: (item: T) => Promise<void>, signal?: AbortSignal): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length && !signal?.aborted) {
      await fn(items[next++]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}
