// What the client sends and how it reads answers, against a local server
// that records requests and answers as the contract allows, including what
// a real serve cannot be made to answer on demand (degraded grants, answers
// that break the contract, and the label as sent; serve records it, see serve.test.ts).

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, test } from "node:test";

import { Admin, Client, ErrorCode, LimiterError, Paths, isLimited, isNotSlotHolder, isPoolLimited, type ClientOptions, type Lease } from "../src/index.js";
import { MemoryLogger, TestServer, eventually, jsonAnswer, type Answer, type Recorded } from "./support.js";
import { retryWait } from "../src/client.js";
import { parseRetryAfter } from "../src/errors.js";

const STREAM_ID = /^[0-9a-f]{32}$/;

function granted(rec: Recorded, degraded = false, intervalMs = 50): Answer {
  return jsonAnswer(200, {
    granted: true,
    stream_id: rec.json.stream_id,
    used: degraded ? 0 : 1,
    limit: 3,
    expires_at: "2030-01-02T03:04:05.678901234Z",
    ttl_ms: 3 * intervalMs,
    heartbeat_interval_ms: intervalMs,
    pruned: 0,
    degraded,
  });
}

function poolLimitReached(): Answer {
  return jsonAnswer(
    429,
    {
      error: {
        code: "pool_limit_reached",
        message: "pool model=gpt-4o holds 1 of its 1 concurrent streams",
        used: 1,
        limit: 1,
        retry_after_ms: 1500,
        pool: "model",
        key: "gpt-4o",
      },
    },
    { "Retry-After": "2" },
  );
}

function notSlotHolder(userId: string, streamId: string) {
  return { code: "not_slot_holder", message: `stream ${streamId} of user ${userId} is held by another caller` };
}

/**
 * Answers acquires with grants (or acquireAnswers first, in turn; undefined
 * drops the connection), once acquireHold (if set) resolves, releases with
 * released (or releaseAnswer), and batches with results[stream_id] (alive,
 * and degraded as its grants are, by default). A stream it grants is held
 * again, so its batch result is forgotten: alive.
 */
class Fake {
  results = new Map<string, Record<string, unknown>>();
  degraded = false;
  acquireAnswer: Answer | undefined;
  acquireAnswers: (Answer | ((rec: Recorded) => Answer))[] = [];
  acquireHold: Promise<void> | undefined;
  releaseAnswer: Answer | undefined;
  batches: Recorded[] = [];

  async answer(rec: Recorded): Promise<Answer> {
    switch (rec.path) {
      case Paths.acquire:
        await this.acquireHold;
        if (this.acquireAnswers.length > 0) {
          const a = this.acquireAnswers.shift();
          return typeof a === "function" ? a(rec) : a;
        }
        if (this.acquireAnswer !== undefined) {
          return this.acquireAnswer;
        }
        this.results.delete(rec.json.stream_id);
        return granted(rec, this.degraded);
      case Paths.release:
        return this.releaseAnswer ?? jsonAnswer(200, { released: true, degraded: false });
      case Paths.heartbeats:
        this.batches.push(rec);
        return jsonAnswer(200, {
          results: rec.json.slots.map((slot: { stream_id: string }) => ({
            stream_id: slot.stream_id,
            alive: true,
            degraded: this.degraded,
            expires_at: "2030-01-02T03:04:06Z",
            ...this.results.get(slot.stream_id),
          })),
        });
    }
    return jsonAnswer(404, { error: { code: "not_found", message: "no route" } });
  }
}

describe("requests and answers", () => {
  let fake: Fake;
  let server: TestServer;
  const clients: Client[] = [];
  const newClient = (options: ClientOptions = {}) => {
    const c = new Client(server.url, { token: "caller-token", logger: new MemoryLogger(), ...options });
    clients.push(c);
    return c;
  };
  beforeEach(async () => {
    fake = new Fake();
    server = await TestServer.start((rec) => fake.answer(rec));
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await server.close();
  });

  test("acquire sends label only when set", async () => {
    const c = newClient();
    await c.acquire("user-1", "paid");
    await c.acquire("user-1", "paid", { label: "pod-7/model-x" });
    await c.acquire("user-1", "paid", { label: "é".repeat(64) }); // 128 bytes of UTF-8
    const bodies = server.received(Paths.acquire).map((r) => r.json);
    assert.deepEqual(Object.keys(bodies[0]).sort(), ["plan", "stream_id", "user_id"]);
    assert.deepEqual([bodies[0].user_id, bodies[0].plan], ["user-1", "paid"]);
    assert.match(bodies[0].stream_id, STREAM_ID);
    assert.equal(bodies[1].label, "pod-7/model-x");
    assert.equal(bodies[2].label, "é".repeat(64));
  });

  test("acquire sends pools as given, only when not empty", async () => {
    const c = newClient();
    await c.acquire("user-1", "paid");
    await c.acquire("user-1", "paid", { pools: {} });
    await c.acquire("user-1", "paid", { pools: { model: "meta-llama/Llama-3.1-70B-Instruct", org: "acme" } });
    const bodies = server.received(Paths.acquire).map((r) => r.json);
    assert.deepEqual(Object.keys(bodies[0]).sort(), ["plan", "stream_id", "user_id"]);
    assert.deepEqual(Object.keys(bodies[1]).sort(), ["plan", "stream_id", "user_id"]);
    assert.deepEqual(bodies[2].pools, { model: "meta-llama/Llama-3.1-70B-Instruct", org: "acme" });
  });

  test("pool_limit_reached is its own error, with the pool key's fields", async () => {
    fake.acquireAnswer = poolLimitReached();
    const err = await newClient()
      .acquire("user-1", "paid", { pools: { model: "gpt-4o" } })
      .then(() => assert.fail("resolved"), (e: unknown) => e);
    assert.ok(isPoolLimited(err), String(err));
    assert.equal(isLimited(err), false, "a pool's cap is not the user's limit");
    assert.deepEqual(
      [err.status, err.code, err.pool, err.key, err.used, err.limit, err.retryAfterMs],
      [429, ErrorCode.PoolLimitReached, "model", "gpt-4o", 1, 1, 1500],
    );
    assert.match(err.message, /\(pool model=gpt-4o, used 1 of 1, retry after 1500ms\)$/);
    assert.equal(server.received(Paths.acquire).length, 1, "a refusal is not retried");
    assert.deepEqual(server.received(Paths.release), []);
  });

  test("an admin call for a user or pool key named . or .. is refused before sending", async () => {
    const admin = new Admin(server.url, "admin-token");
    for (const name of [".", ".."]) {
      assert.throws(() => admin.slots(name), TypeError);
      assert.throws(() => admin.poolKey("model", name), TypeError);
    }
    assert.equal(server.requests.length, 0);
    await admin.slots("...").catch(() => undefined); // three dots are a name like any other
    assert.equal(server.requests.at(-1)?.path, "/v1/admin/users/%2E%2E%2E/slots");
  });

  test("a label over 128 bytes is refused before sending", async () => {
    await assert.rejects(newClient().acquire("user-1", "paid", { label: "é".repeat(65) }), {
      name: "RangeError",
      message: "label must be at most 128 bytes of UTF-8, got 130",
    });
    assert.deepEqual(server.received(Paths.acquire), []);
  });

  test("requests carry JSON and the bearer token", async () => {
    await newClient().acquire("user-1", "paid", { streamId: "chat-1" });
    const rec = server.received(Paths.acquire)[0]!;
    assert.equal(rec.json.stream_id, "chat-1");
    assert.equal(rec.headers["content-type"], "application/json");
    assert.equal(rec.headers.authorization, "Bearer caller-token");
    assert.equal(rec.headers["user-agent"], "joishi-limiter-typescript-client");
  });

  test("one batch per round for every lease", async () => {
    // The first round is due one interval after the first lease: long
    // enough for all five acquires.
    const c = newClient({ heartbeatIntervalMs: 300 });
    const leases: Lease[] = [];
    for (let i = 0; i < 5; i++) {
      leases.push(await c.acquire(`user-${i}`, "paid"));
    }
    assert.ok(await eventually(() => fake.batches.length > 0));
    assert.deepEqual(
      fake.batches[0]!.json.slots.map((s: { user_id: string; plan: string; stream_id: string }) => [s.user_id, s.plan, s.stream_id]).sort(),
      leases.map((l) => [l.userId, "paid", l.streamId]).sort(),
    );
    assert.ok(await eventually(() => leases[0]!.expiresAt.getUTCSeconds() === 6), "a heartbeat's expires_at should update the lease");
  });

  test("batch results lose only the lost slots", async () => {
    const logger = new MemoryLogger();
    const c = newClient({ logger });
    const [lost, unavailable, alive] = [await c.acquire("user-1", "paid"), await c.acquire("user-1", "paid"), await c.acquire("user-1", "paid")];
    fake.results.set(lost.streamId, { alive: false, expires_at: null });
    fake.results.set(unavailable.streamId, { alive: false, expires_at: null, error: { code: "limiter_unavailable", message: "redis down" } });
    const err = await lost.lost;
    assert.deepEqual([err.code, err.status], [ErrorCode.SlotLost, 410]);
    await new Promise((r) => setTimeout(r, 200)); // a few more rounds
    assert.equal(unavailable.error, undefined, "limiter_unavailable must not lose a slot: it keeps its TTL");
    assert.equal(alive.error, undefined);
    assert.ok(logger.lines.some((l) => l.includes("heartbeats not confirmed; the slots keep their TTL")), logger.lines.join("\n"));
    const beaten = fake.batches.at(-1)!.json.slots.map((s: { stream_id: string }) => s.stream_id);
    assert.ok(!beaten.includes(lost.streamId), "a lost lease is heartbeated no more");
  });

  test("a degraded lease the limiter does not hold is acquired again", async () => {
    const c = newClient();
    fake.degraded = true;
    const lease = await c.acquire("user-1", "paid", { label: "pod-7", pools: { model: "gpt-4o" } });
    assert.deepEqual([lease.degraded, lease.used, lease.pools, lease.wouldRefuse], [true, 0, [], undefined]);
    fake.degraded = false;
    // The re-acquire's answer: counted again, the stream is over its plan's
    // limit in shadow mode.
    fake.acquireAnswers.push((rec) => {
      fake.results.delete(rec.json.stream_id); // held again
      return jsonAnswer(200, {
        granted: true,
        stream_id: rec.json.stream_id,
        used: 2,
        limit: 1,
        expires_at: "2030-01-02T03:04:05Z",
        ttl_ms: 150,
        heartbeat_interval_ms: 50,
        pruned: 0,
        degraded: false,
        pools: [{ pool: "model", key: "gpt-4o", used: 1, limit: 1 }],
        would_refuse: "stream_limit_reached",
      });
    });
    fake.results.set(lease.streamId, { alive: false, expires_at: null });
    assert.ok(await eventually(() => server.received(Paths.acquire).length >= 2));
    const again = server.received(Paths.acquire)[1]!.json;
    assert.deepEqual([again.stream_id, again.label, again.pools], [lease.streamId, "pod-7", { model: "gpt-4o" }]);
    // Rounds after the re-acquire find it held: the lease goes on. A round
    // starts once the one before it is applied, so the second is the proof.
    const after = fake.batches.length;
    const beaten = () => fake.batches.slice(after).filter((b) => b.json.slots.some((s: { stream_id: string }) => s.stream_id === lease.streamId)).length;
    assert.ok(await eventually(() => beaten() >= 2), "no two rounds after the re-acquire");
    assert.equal(lease.error, undefined);
    // The lease says what the re-acquire answered.
    assert.deepEqual(
      [lease.degraded, lease.used, lease.limit, lease.pools, lease.wouldRefuse, lease.wouldRefuseBy],
      [false, 2, 1, [{ pool: "model", key: "gpt-4o", used: 1, limit: 1 }], "stream_limit_reached", undefined],
    );
  });

  test("a degraded lease refused by its pool on re-acquire is lost", async () => {
    const c = newClient();
    fake.degraded = true;
    const lease = await c.acquire("user-1", "paid", { pools: { model: "gpt-4o" } });
    fake.acquireAnswer = poolLimitReached();
    fake.results.set(lease.streamId, { alive: false, expires_at: null });
    assert.ok(await eventually(() => lease.error !== undefined), "not lost");
    const err = lease.error;
    assert.ok(isPoolLimited(err), String(err));
    assert.deepEqual([err.pool, err.key], ["model", "gpt-4o"]);
  });

  test("a degraded lease released while its re-acquire is in flight is given back", async () => {
    // Rounds far apart, so that the re-acquire ends well within its round.
    const c = newClient({ heartbeatIntervalMs: 500 });
    fake.degraded = true;
    const lease = await c.acquire("user-1", "paid");
    fake.degraded = false;
    fake.results.set(lease.streamId, { alive: false, expires_at: null });
    let answer!: () => void;
    fake.acquireHold = new Promise((resolve) => (answer = resolve));
    assert.ok(await eventually(() => server.received(Paths.acquire).length === 2), "not acquired again");
    // The release reaches the limiter first; the re-acquire takes the slot again after it.
    await lease.release();
    assert.equal(server.received(Paths.release).length, 1);
    answer();
    assert.ok(await eventually(() => server.received(Paths.release).length === 2), "the slot taken again is not given back");
    assert.deepEqual(
      server.received(Paths.release).map((r) => r.json.stream_id),
      [lease.streamId, lease.streamId],
    );
    assert.equal(lease.error, undefined, "a released lease is not lost");
  });

  test("slow re-acquires hold up no round past its interval", async () => {
    let acquiring = 0;
    let most = 0;
    const counting: typeof fetch = async (input, init) => {
      const acquire = String(input).endsWith(Paths.acquire) ? 1 : 0;
      acquiring += acquire;
      most = Math.max(most, acquiring);
      try {
        return await fetch(input, init);
      } finally {
        acquiring -= acquire;
      }
    };
    const c = newClient({ heartbeatIntervalMs: 100, fetch: counting });
    const healthy = await c.acquire("user-0", "paid");
    fake.degraded = true;
    const degraded: Lease[] = [];
    for (let i = 1; i <= 9; i++) {
      degraded.push(await c.acquire(`user-${i}`, "paid"));
    }
    for (const lease of degraded) {
      fake.results.set(lease.streamId, { alive: false, expires_at: null });
    }
    let answer!: () => void;
    fake.acquireHold = new Promise((resolve) => (answer = resolve)); // the re-acquires hang
    try {
      assert.ok(await eventually(() => server.received(Paths.acquire).length > 10), "not acquired again");
      const from = fake.batches.length;
      await new Promise((r) => setTimeout(r, 1000));
      const beaten = fake.batches.slice(from).filter((b) => b.json.slots.some((s: { stream_id: string }) => s.stream_id === healthy.streamId)).length;
      assert.ok(beaten >= 5, `the healthy lease was heartbeated ${beaten} times in 1s at a 100ms interval`);
      assert.ok(most <= 4, `${most} acquires in flight at once`);
      const tried = server.received(Paths.acquire).slice(10).map((r) => r.json.stream_id);
      assert.ok(tried.length > degraded.length, "a re-acquire abandoned at the end of its round is retried");
      assert.deepEqual([...new Set(tried)].sort(), degraded.map((l) => l.streamId).sort(), "every degraded lease gets its turn");
      for (const lease of [healthy, ...degraded]) {
        assert.equal(lease.error, undefined);
      }
      assert.ok(degraded.every((l) => l.degraded), "a lease whose re-acquire was abandoned stays degraded");
    } finally {
      answer();
    }
  });

  test("a retry_after_ms of 0 falls back to the Retry-After header", async () => {
    const limited = { code: "stream_limit_reached", message: "3 of 3", used: 3, limit: 3, retry_after_ms: 0 };
    for (const [headers, want] of [[{ "Retry-After": "1" }, 1000], [{}, 0]] as const) {
      fake.acquireAnswer = jsonAnswer(429, { error: limited }, headers);
      const err = await newClient()
        .acquire("user-1", "paid")
        .then(() => assert.fail("resolved"), (e: unknown) => e);
      assert.ok(isLimited(err), String(err));
      assert.equal(err.retryAfterMs, want, JSON.stringify(headers));
    }
  });

  test("error answers become typed errors", async () => {
    const cases: [string, Answer, Partial<LimiterError>][] = [
      [
        "429 with the limit's fields",
        jsonAnswer(429, { error: { code: "stream_limit_reached", message: "3 of 3", used: 3, limit: 3, retry_after_ms: 1500 } }),
        { code: ErrorCode.StreamLimitReached, status: 429, used: 3, limit: 3, retryAfterMs: 1500 },
      ],
      [
        "422 of a pool the limiter does not hold",
        jsonAnswer(422, { error: { code: "unknown_pool", message: "no pool region; the pools are model" } }),
        { code: ErrorCode.UnknownPool, status: 422, pool: undefined, key: undefined },
      ],
      [
        "400 of a malformed pool key",
        jsonAnswer(400, { error: { code: "invalid_pool_key", message: "pool model: key has a space" } }),
        { code: ErrorCode.InvalidPoolKey, status: 400 },
      ],
      [
        "a proxy's 502 page",
        { status: 502, headers: { "Content-Type": "text/html", "Retry-After": "3" }, body: "<html>bad gateway</html>" },
        { code: ErrorCode.LimiterUnavailable, status: 502, retryAfterMs: 3000 },
      ],
      [
        "a code this client does not know",
        jsonAnswer(400, { error: { code: "invalid_label", message: "label has a space" } }),
        { code: "invalid_label", status: 400 },
      ],
      ["a status without a body", { status: 418, body: "" }, { code: "http_418", status: 418 }],
    ];
    for (const [name, answer, want] of cases) {
      fake.acquireAnswer = answer;
      const err = await newClient({ acquireRetries: 0 })
        .acquire("user-1", "paid")
        .then(() => assert.fail(`${name}: resolved`), (e: unknown) => e);
      assert.ok(err instanceof LimiterError, `${name}: ${String(err)}`);
      for (const [key, value] of Object.entries(want)) {
        assert.equal(err[key as keyof LimiterError], value, `${name}: ${key}`);
      }
    }
  });

  test("a redirect is not followed: a 3xx is http_<status> naming its Location, and nothing is sent there", async () => {
    // The limiter never redirects its routes: a 3xx comes from something in
    // between. fetch would follow it (sending a POST again as a GET on a
    // 303, and the bearer token along to the same origin or its https).
    const elsewhere = await TestServer.start(() => jsonAnswer(200, { records: [] }));
    try {
      const targets = [elsewhere.url + Paths.acquire, `${server.url}/moved${Paths.acquire}`];
      for (const status of [301, 302, 303, 307, 308]) {
        for (const to of targets) {
          fake.acquireAnswer = { status, headers: { Location: to }, body: "" };
          const err = await newClient()
            .acquire("user-1", "paid")
            .then(() => assert.fail(`${status} to ${to}: resolved`), (e: unknown) => e);
          assert.ok(err instanceof LimiterError, `${status} to ${to}: ${String(err)}`);
          assert.deepEqual([err.status, err.code], [status, `http_${status}`]);
          assert.ok(err.message.includes(to), `${status}: got ${err.message}, want it to name ${to}`);
        }
      }
      assert.equal(server.received(Paths.acquire).length, 10, "a redirect is not retried");
      assert.deepEqual(server.received(Paths.release), [], "a redirected acquire took no slot");
      assert.deepEqual(
        server.requests.map((r) => r.path).filter((p) => p !== Paths.acquire),
        [],
        "the same server got nothing at the path a redirect named",
      );

      const redirecting = await TestServer.start((rec) => ({ status: 302, headers: { Location: elsewhere.url + rec.path }, body: "" }));
      try {
        const err = await new Admin(redirecting.url, "admin-token").audit().then(
          () => assert.fail("resolved"),
          (e: unknown) => e,
        );
        assert.ok(err instanceof LimiterError, String(err));
        assert.deepEqual([err.status, err.code], [302, "http_302"]);
        assert.ok(err.message.includes(elsewhere.url + Paths.adminReadAudit), err.message);
        assert.equal(redirecting.requests.length, 1);
      } finally {
        await redirecting.close();
      }
      assert.deepEqual(elsewhere.requests, [], "the server a redirect names received nothing");
    } finally {
      await elsewhere.close();
    }
  });

  test("an acquire of another caller's stream id is not_slot_holder, not retried, and sends no release", async () => {
    fake.acquireAnswer = jsonAnswer(403, { error: notSlotHolder("user-1", "s") });
    const err = await newClient()
      .acquire("user-1", "paid", { streamId: "s" })
      .then(() => assert.fail("resolved"), (e: unknown) => e);
    assert.ok(isNotSlotHolder(err), String(err));
    assert.deepEqual([err.code, err.status], [ErrorCode.NotSlotHolder, 403]);
    assert.equal(server.received(Paths.acquire).length, 1);
    assert.deepEqual(server.received(Paths.release), []);
  });

  test("a lease keeps the verdict on the acquire that took its stream", async () => {
    // The limiter answers an extension (the retry of an acquire whose answer
    // was lost, an acquire of a held stream id) with the verdict on the
    // acquire that took the stream; the lease keeps it, and an answer
    // without one leaves it as it is.
    const overTheLimit = (rec: Recorded) =>
      jsonAnswer(200, {
        granted: true,
        stream_id: rec.json.stream_id,
        used: 2,
        limit: 1,
        expires_at: "2030-01-02T03:04:05Z",
        ttl_ms: 150,
        heartbeat_interval_ms: 50,
        pruned: 0,
        degraded: false,
        would_refuse: "stream_limit_reached",
      });
    const c = newClient();
    fake.acquireAnswers = [undefined, overTheLimit, overTheLimit, (rec) => granted(rec)];
    const lease = await c.acquire("user-1", "paid", { streamId: "s" });
    assert.deepEqual(server.received(Paths.acquire).map((r) => r.json.stream_id), ["s", "s"]);
    assert.equal(lease.wouldRefuse, "stream_limit_reached", "the retry's answer");
    for (const answered of ["an extension saying it", "an extension saying none"]) {
      assert.equal(await c.acquire("user-1", "paid", { streamId: "s" }), lease, answered);
      assert.equal(lease.wouldRefuse, "stream_limit_reached", answered);
    }
  });

  test("an unanswered acquire whose retry is not_slot_holder sends no release", async () => {
    // The first answer is lost; by the retry, another caller holds the id.
    fake.acquireAnswers = [undefined, jsonAnswer(403, { error: notSlotHolder("user-1", "s") })];
    await assert.rejects(newClient().acquire("user-1", "paid", { streamId: "s" }), (err: unknown) => isNotSlotHolder(err));
    assert.deepEqual(server.received(Paths.acquire).map((r) => r.json.stream_id), ["s", "s"]);
    assert.deepEqual(server.received(Paths.release), [], "the id is another caller's: its release would be refused");
  });

  test("a given-up acquire is released once more only under an id of the client's own", async () => {
    const unavailable = jsonAnswer(503, { error: { code: "limiter_unavailable", message: "redis did not answer in time" } });
    for (const given of [undefined, "s"]) {
      server.requests.length = 0;
      fake.acquireAnswers = [unavailable];
      const c = newClient({ acquireRetries: 0 });
      await assert.rejects(c.acquire("user-1", "paid", { streamId: given }), (err: unknown) => err instanceof LimiterError && err.status === 503);
      const sent = server.received(Paths.acquire).map((r) => r.json.stream_id);
      assert.equal(sent.length, 1);
      assert.deepEqual(server.received(Paths.release).map((r) => r.json.stream_id), sent, "released before acquire rejected");
      await c.close(); // waits for the release sent once more
      // An id the caller gave may be another acquire's by the second
      // release: only the client's own is released twice.
      assert.deepEqual(server.received(Paths.release).map((r) => r.json.stream_id), given ? sent : [...sent, ...sent], `streamId ${given}`);
    }
  });

  test("a Retry-After is digits alone, or an HTTP date read as UTC", () => {
    // As the Go and Python clients read it: delay seconds of digits alone
    // (of a header sent twice, the first), or a date ahead in any of its
    // three forms, asctime's read as UTC; anything else says nothing.
    const now = Date.UTC(2026, 11, 7, 12, 0, 0);
    for (const [header, want] of [
      ["3", 3000],
      [" 2 ", 2000],
      ["10, 1", 10000],
      ["+3", undefined],
      ["-1", undefined],
      ["\u00b2", undefined],
      ["3s", undefined],
      ["Mon, 07 Dec 2026 12:00:05 GMT", 5000],
      ["Monday, 07-Dec-26 12:00:05 GMT", 5000],
      ["Mon Dec  7 12:00:05 2026", 5000],
      ["Mon, 07 Dec 2026 11:59:55 GMT", undefined],
    ] as const) {
      assert.equal(parseRetryAfter(header, now), want, `Retry-After ${JSON.stringify(header)}`);
    }
    // A wait below 0 in a body (not of the contract) is the backoff, not
    // an immediate retry.
    const wait = retryWait(new LimiterError(ErrorCode.LimiterUnavailable, "down", { status: 503, retryAfterMs: -5000 }), 0);
    assert.ok(wait !== undefined && wait > 0, `retryWait of retryAfterMs -5000 = ${wait}`);
  });

  test("a Retry-After past the cap ends the retries at once", async () => {
    // Something in front of the limiter (a maintenance page) asks for more
    // than the 2s the client waits between retries: acquire rejects with
    // that answer's error at once, having released its stream id, rather
    // than wait that long per retry.
    for (const [retryAfter, attempts] of [["10", 1], ["3", 1], ["2", 2]] as const) {
      server.requests.length = 0;
      fake.acquireAnswers = [jsonAnswer(503, { error: { code: "limiter_unavailable", message: "down for maintenance" } }, { "Retry-After": retryAfter })];
      const c = newClient();
      const start = Date.now();
      if (attempts > 1) {
        await (await c.acquire("user-1", "paid")).release();
      } else {
        await assert.rejects(c.acquire("user-1", "paid"), (err: unknown) => err instanceof LimiterError && err.status === 503);
        assert.ok(Date.now() - start < 1000, `Retry-After: ${retryAfter}: acquire rejected after ${Date.now() - start}ms, having waited past the cap`);
      }
      const sent = server.received(Paths.acquire).map((r) => r.json.stream_id);
      assert.equal(sent.length, attempts, `Retry-After: ${retryAfter}: attempts`);
      if (attempts === 1) {
        assert.deepEqual(server.received(Paths.release).map((r) => r.json.stream_id), sent, "released before acquire rejected");
      }
    }
  });

  test("a retry under the streamId an unavailable names calls off the release sent once more", async () => {
    // As serve answers it: naming the stream id the acquire was sent under.
    const unavailable = (rec: Recorded): Answer =>
      jsonAnswer(503, { error: { code: "limiter_unavailable", message: "redis did not answer in time", stream_id: rec.json.stream_id } });
    server.requests.length = 0;
    fake.acquireAnswers = [unavailable];
    const c = newClient({ acquireRetries: 0 });
    let named: string | undefined;
    await assert.rejects(c.acquire("user-1", "paid"), (err: unknown) => {
      named = err instanceof LimiterError ? err.streamId : undefined;
      return err instanceof LimiterError && err.status === 503;
    });
    assert.ok(named, "the 503 names the stream id to retry under");
    const lease = await c.acquire("user-1", "paid", { streamId: named });
    await new Promise((r) => setTimeout(r, 1300)); // past RELEASE_AGAIN_AFTER_MS
    assert.deepEqual(server.received(Paths.release).map((r) => r.json.stream_id), [named], "released once: the retry's slot is not freed");
    await lease.release();
    await c.close();
  });

  test("a release of a slot another caller holds is not_slot_holder", async () => {
    const lease = await newClient().acquire("user-1", "paid", { streamId: "s" });
    fake.releaseAnswer = jsonAnswer(403, { error: notSlotHolder("user-1", "s") });
    await assert.rejects(lease.release(), (err: unknown) => isNotSlotHolder(err) && err.status === 403);
    await assert.rejects(lease.release(), (err: unknown) => isNotSlotHolder(err)); // refused, so not done: asked again
    assert.equal(server.received(Paths.release).length, 2);
    assert.equal(lease.error, undefined, "a refused release is not a loss");
  });

  test("a heartbeat refused as not_slot_holder loses the lease", async () => {
    const c = newClient();
    const [taken, kept] = [await c.acquire("user-1", "paid"), await c.acquire("user-1", "paid")];
    fake.results.set(taken.streamId, { alive: false, expires_at: null, error: notSlotHolder("user-1", taken.streamId) });
    assert.ok(await eventually(() => taken.error !== undefined), "not lost");
    const err = taken.error;
    assert.ok(isNotSlotHolder(err), String(err));
    assert.deepEqual([err.code, err.status], [ErrorCode.NotSlotHolder, 403]);
    assert.equal(taken.signal.reason, err);
    const rounds = fake.batches.length;
    assert.ok(await eventually(() => fake.batches.length >= rounds + 2));
    for (const batch of fake.batches.slice(rounds)) {
      assert.deepEqual(batch.json.slots.map((s: { stream_id: string }) => s.stream_id), [kept.streamId], "a lost lease is heartbeated no more");
    }
    assert.equal(kept.error, undefined);
  });

  // A lost lease's release frees what the limiter may still hold under its
  // stream id for it: not when it answered that it holds nothing
  // (slot_lost, a degraded lease refused on re-acquire), and never once the
  // client holds a lease acquired under the id since, whose slot it is.
  const gone = { alive: false, expires_at: null };
  const refusedBy = (code: string) => ({ ...gone, error: { code, message: "refused" } });
  for (const [name, degraded, result, reacquireAnswer, code, sentWhenReleased] of [
    ["alive false", false, gone, undefined, ErrorCode.SlotLost, false],
    ["per-slot slot_lost", false, refusedBy("slot_lost"), undefined, ErrorCode.SlotLost, false],
    ["per-slot unknown_plan", false, refusedBy("unknown_plan"), undefined, ErrorCode.UnknownPlan, true],
    ["per-slot plan_not_allowed", false, refusedBy("plan_not_allowed"), undefined, ErrorCode.PlanNotAllowed, true],
    ["degraded, refused on re-acquire", true, gone, poolLimitReached(), ErrorCode.PoolLimitReached, false],
  ] as const) {
    for (const reacquired of [false, true]) {
      const sent = sentWhenReleased && !reacquired;
      const since = reacquired ? ", its stream id acquired again since," : "";
      test(`the release of a lease lost by ${name}${since} is ${sent ? "sent: its slot may be held" : "not sent"}`, async () => {
        const c = newClient();
        fake.degraded = degraded;
        const lease = await c.acquire("user-1", "paid", { streamId: "s" });
        fake.acquireAnswer = reacquireAnswer;
        fake.results.set("s", result);
        const err = await Promise.race([lease.lost, new Promise<undefined>((r) => setTimeout(() => r(undefined), 2000))]);
        assert.equal(err?.code, code);
        if (reacquired) {
          fake.degraded = false;
          fake.acquireAnswer = undefined;
          assert.notEqual(await c.acquire("user-1", "paid", { streamId: "s" }), lease);
        }
        const before = server.received(Paths.release).length;
        await lease.release();
        assert.equal(server.received(Paths.release).length - before, sent ? 1 : 0, "releases sent by the lost lease's release");
      });
    }
  }

  test("an answer breaking the contract is refused and its stream id released", async () => {
    fake.acquireAnswer = jsonAnswer(200, { granted: true, stream_id: "s", used: 1 });
    await assert.rejects(newClient().acquire("user-1", "paid", { streamId: "s" }), (err: unknown) => {
      assert.ok(err instanceof LimiterError);
      assert.equal(err.code, "invalid_answer");
      assert.match(err.message, /AcquireResponse\.limit: required/);
      return true;
    });
    assert.deepEqual(server.received(Paths.release).map((r) => r.json.stream_id), ["s"]);
    assert.equal(server.received(Paths.acquire).length, 1, "an answer not of the contract is not retried");
  });

  test("a request that gets no answer in time is limiter_unavailable", async () => {
    const slow = await TestServer.start(() => new Promise<Answer>(() => undefined)); // never answers
    try {
      const c = new Client(slow.url, { requestTimeoutMs: 100, acquireRetries: 0, logger: new MemoryLogger() });
      clients.push(c);
      await assert.rejects(c.acquire("user-1", "paid"), (err: unknown) => {
        assert.ok(err instanceof LimiterError);
        assert.deepEqual([err.code, err.status], [ErrorCode.LimiterUnavailable, 0]);
        assert.match(err.message, /no answer within 100ms/);
        return true;
      });
    } finally {
      await slow.close();
    }
  });
});

// An acquire given up by its signal releases its stream id in the
// background. The application's retry under that streamId, at once, waits
// for that release (a slow one here) before it is sent, so that it does
// not free the slot the retry is granted.
test("a retry under a given-up acquire's streamId keeps the slot it is granted", async () => {
  const slots = new Set<string>();
  let hangNext = false;
  let landed: (() => void) | undefined;
  const server = await TestServer.start(async (rec: Recorded): Promise<Answer> => {
    const key = `${rec.json?.user_id}/${rec.json?.stream_id}`;
    if (rec.path === Paths.acquire) {
      slots.add(key); // the slot is taken in Redis
      if (hangNext) {
        hangNext = false;
        landed?.();
        return new Promise<Answer>(() => undefined); // its answer never comes
      }
      return jsonAnswer(200, {
        granted: true, stream_id: rec.json.stream_id, used: 1, limit: 1,
        expires_at: "2030-01-02T03:04:05Z", ttl_ms: 30000, heartbeat_interval_ms: 10000, pruned: 0, degraded: false,
      });
    }
    if (rec.path === Paths.release) {
      await new Promise((r) => setTimeout(r, 50)); // slower than an acquire
      return jsonAnswer(200, { released: slots.delete(key), degraded: false });
    }
    return jsonAnswer(200, { results: [] });
  });
  const client = new Client(server.url, { logger: new MemoryLogger(), acquireRetries: 0 });
  try {
    for (let i = 0; i < 5; i++) {
      const user = `u${i}`;
      const streamId = `req-${i}`;
      hangNext = true;
      const controller = new AbortController();
      landed = () => controller.abort(new Error("the caller gave up"));
      await assert.rejects(client.acquire(user, "free", { streamId, signal: controller.signal }));
      const lease = await client.acquire(user, "free", { streamId }); // the retry
      await new Promise((r) => setTimeout(r, 100)); // past any release on its way
      assert.ok(slots.has(`${user}/${streamId}`), `run ${i}: the retry's slot was freed by the given-up acquire's release`);
      await lease.release();
    }
  } finally {
    await client.close();
    await server.close();
  }
});
