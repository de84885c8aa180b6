// The client against a real `limiter serve` on real Redis, started by
// e2e/clients_test.go (which passes the URLs and tokens in LIMITER_TEST_*).
//
// The server's tiers: free 1 stream, paid 3, and watch 1 in shadow mode
// (enforce: false), all with a 2s slot TTL and a 500ms heartbeat interval;
// its pool model caps the key gpt-4o at 1 stream (every other key
// uncapped), and its pool org, in shadow mode, caps every key at 1. Callers: LIMITER_TOKEN may use every plan,
// LIMITER_TEST_SCOPED_TOKEN only paid, and the TLS server's client
// certificate (LIMITER_TEST_TLS_CERT) names a caller of free only. The TLS
// server's certificate is of LIMITER_TEST_TLS_CA, which the node process
// trusts (NODE_EXTRA_CA_CERTS).

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { afterEach, describe, test } from "node:test";

import { Admin, Client, ErrorCode, LimiterError, Paths, isLimited, isNotSlotHolder, isPoolLimited, type ClientOptions, type Lease } from "../src/index.js";
import { FaultProxy, MemoryLogger, httpsFetch, scrape, serveEnv, total, user } from "./support.js";

const TTL_MS = 2000;
const INTERVAL_MS = 500;

const { env, skip } = serveEnv(
  "LIMITER_TEST_URL",
  "LIMITER_TEST_OPS_URL",
  "LIMITER_TEST_ADMIN_URL",
  "LIMITER_TEST_ADMIN_TOKEN",
  "LIMITER_TOKEN",
  "LIMITER_TEST_SCOPED_TOKEN",
  "LIMITER_TEST_TLS_URL",
  "LIMITER_TEST_TLS_CA",
  "LIMITER_TEST_TLS_CERT",
  "LIMITER_TEST_TLS_KEY",
  "LIMITER_TEST_TLS_ADMIN_URL",
);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Rejects with a LimiterError of code; returns it. */
async function refused(promise: Promise<unknown>, code: string): Promise<LimiterError> {
  const err = await promise.then(
    () => assert.fail(`resolved, want a rejection with ${code}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof LimiterError, `rejected with ${String(err)}, want a LimiterError`);
  assert.equal(err.code, code, String(err));
  return err;
}

describe("against a real serve", { skip }, () => {
  const admin = skip ? undefined! : new Admin(env.LIMITER_TEST_ADMIN_URL, env.LIMITER_TEST_ADMIN_TOKEN);
  const clients: Client[] = [];
  const proxies: FaultProxy[] = [];
  const newClient = (url = env.LIMITER_TEST_URL, options: ClientOptions = {}) => {
    const c = new Client(url, { logger: new MemoryLogger(), ...options });
    clients.push(c);
    return c;
  };
  const newProxy = async () => {
    const p = await FaultProxy.start(env.LIMITER_TEST_URL);
    proxies.push(p);
    return p;
  };
  const used = async (u: string) => (await admin.slots(u)).used;
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((c) => c.close()));
    await Promise.all(proxies.splice(0).map((p) => p.close()));
  });

  test("acquire up to the limit, then stream_limit_reached with its fields", async () => {
    const c = newClient();
    const u = user();
    const leases = [await c.acquire(u, "paid"), await c.acquire(u, "paid"), await c.acquire(u, "paid")];
    assert.equal(new Set(leases.map((l) => l.streamId)).size, 3);
    const err = await refused(c.acquire(u, "paid"), ErrorCode.StreamLimitReached);
    assert.deepEqual([err.status, err.used, err.limit], [429, 3, 3]);
    assert.ok(err.retryAfterMs !== undefined && err.retryAfterMs > 0 && err.retryAfterMs <= TTL_MS, `retryAfterMs ${err.retryAfterMs}`);
    const slots = await admin.slots(u);
    assert.equal(slots.used, 3);
    assert.deepEqual(slots.slots.map((s) => s.stream_id).sort(), leases.map((l) => l.streamId).sort());
  });

  test("the label is recorded with the slot", async () => {
    const c = newClient();
    const u = user();
    const lease = await c.acquire(u, "paid", { label: "pod-7/model-x" });
    const slots = (await admin.slots(u)).slots;
    assert.deepEqual(slots.map((s) => [s.stream_id, s.label, s.plan]), [[lease.streamId, "pod-7/model-x", "paid"]]);
    await assert.rejects(c.acquire(u, "paid", { label: "x".repeat(129) }), RangeError);
    assert.equal(await used(u), 1, "a refused label must take no slot");
  });

  test("a pool key is a cap shared by every user", async () => {
    const c = newClient();
    const [first, second] = [user(), user()];
    const gpt = { model: "gpt-4o" };
    const lease = await c.acquire(first, "paid", { pools: gpt });
    const err = await refused(c.acquire(second, "paid", { pools: gpt }), ErrorCode.PoolLimitReached);
    assert.ok(isPoolLimited(err));
    assert.equal(isLimited(err), false, "the second user's own limit did not refuse it");
    assert.deepEqual([err.status, err.pool, err.key, err.used, err.limit], [429, "model", "gpt-4o", 1, 1]);
    assert.ok(err.retryAfterMs !== undefined && err.retryAfterMs > 0 && err.retryAfterMs <= TTL_MS, `retryAfterMs ${err.retryAfterMs}`);
    assert.equal(await used(second), 0, "a pool's refusal must take no slot");
    // Support sees who holds the key.
    const shown = await admin.poolKey("model", "gpt-4o");
    assert.deepEqual([shown.used, shown.limit, shown.holders.map((h) => [h.user_id, h.stream_id])], [1, 1, [[first, lease.streamId]]]);

    await lease.release();
    await (await c.acquire(second, "paid", { pools: gpt })).release();
    // A key the pool does not cap is joined by nothing.
    await (await c.acquire(first, "paid", { pools: { model: "gpt-4o-mini" } })).release();

    assert.equal((await refused(c.acquire(user(), "paid", { pools: { region: "eu" } }), ErrorCode.UnknownPool)).status, 422);
    assert.equal((await refused(c.acquire(user(), "paid", { pools: { model: "gpt 4o" } }), ErrorCode.InvalidPoolKey)).status, 400);
  });

  test("a lease says what its acquire answered", async () => {
    const c = newClient();
    const [watcher, enforced, over] = [user(), user(), user()];
    const org = user("org"); // a key of the shadow pool org, capped at 1
    const said = (l: Lease) => [l.used, l.limit, l.pools, l.wouldRefuse, l.wouldRefuseBy];
    const under = await c.acquire(watcher, "watch", { streamId: "under" });
    const overPlan = await c.acquire(watcher, "watch", { streamId: "over" });
    const gpt = await c.acquire(enforced, "paid", { pools: { model: "gpt-4o", org } });
    try {
      const overPool = await c.acquire(over, "paid", { pools: { org } });
      const cases: [string, Lease, unknown[]][] = [
        ["a shadow plan's first stream", under, [1, 1, [], undefined, undefined]],
        ["a shadow plan's stream over its limit", overPlan, [2, 1, [], "stream_limit_reached", undefined]],
        [
          "a grant by scopes that enforce (and a shadow key with room)",
          gpt,
          [1, 3, [{ pool: "model", key: "gpt-4o", used: 1, limit: 1 }, { pool: "org", key: org, used: 1, limit: 1 }], undefined, undefined],
        ],
        [
          "a shadow pool key over its cap",
          overPool,
          [1, 3, [{ pool: "org", key: org, used: 2, limit: 1 }], "pool_limit_reached", { pool: "org", key: org, used: 2, limit: 1 }],
        ],
      ];
      for (const [name, lease, want] of cases) {
        assert.deepEqual(said(lease), want, name);
      }
      // The enforced key refuses once full: no lease says otherwise.
      await refused(c.acquire(user(), "paid", { pools: { model: "gpt-4o" } }), ErrorCode.PoolLimitReached);

      // An acquire of a held stream id (an extension) resolves to the held
      // lease with its answer's counts; the limiter extends a held stream
      // whatever the limits, so what the first acquire said of shadow mode
      // stands.
      for (const [lease, wouldRefuse] of [
        [under, undefined],
        [overPlan, "stream_limit_reached"],
      ] as const) {
        const again = await c.acquire(watcher, "watch", { streamId: lease.streamId });
        assert.equal(again, lease);
        assert.deepEqual([again.used, again.limit, again.wouldRefuse], [2, 1, wouldRefuse], lease.streamId);
      }
    } finally {
      await gpt.release(); // model=gpt-4o is every test's key
    }
  });

  test("release frees the slot and is idempotent", async () => {
    const c = newClient();
    const u = user();
    const lease = await c.acquire(u, "free");
    await refused(c.acquire(u, "free"), ErrorCode.StreamLimitReached);
    await lease.release();
    await lease.release();
    assert.equal(await used(u), 0);
    assert.equal(lease.error, undefined, "a release is not a loss");
    await (await c.acquire(u, "free")).release();
  });

  test("withLease releases when the stream fails", async () => {
    const c = newClient();
    const u = user();
    await assert.rejects(
      c.withLease(u, "free", async () => {
        assert.equal(await used(u), 1);
        throw new Error("upstream failed mid-stream");
      }),
      /upstream failed mid-stream/,
    );
    assert.equal(await used(u), 0);
  });

  test("close releases every lease and marks it lost", async () => {
    const c = newClient();
    const u = user();
    const leases = [await c.acquire(u, "paid"), await c.acquire(u, "paid"), await c.acquire(u, "paid")];
    assert.equal(await c.close(), 0);
    assert.equal(await used(u), 0);
    for (const lease of leases) {
      assert.equal((await lease.lost).code, "client_closed");
      assert.ok(lease.signal.aborted);
    }
    await refused(c.acquire(u, "paid"), "client_closed");
  });

  test("heartbeats batch every lease in one request per interval", async () => {
    const users = Array.from({ length: 10 }, () => user());
    const before = await scrape(env.LIMITER_TEST_OPS_URL);
    const start = performance.now();
    const c = newClient();
    const leases: Lease[] = [];
    for (const u of users) {
      for (let i = 0; i < 3; i++) {
        leases.push(await c.acquire(u, "paid"));
      }
    }
    await sleep(1.5 * TTL_MS); // every slot would have expired without heartbeats
    for (const u of users) {
      assert.equal(await used(u), 3, `user ${u}'s slots outlived their TTL only if heartbeated`);
    }
    await c.close();
    const held = performance.now() - start;

    // Once serve has counted every round's request (it counts after
    // answering), rounds * leases bounds the heartbeats.
    const delta = (after: Map<string, number>, name: string, labels: Record<string, string>) =>
      total(after, name, labels) - total(before, name, labels);
    let rounds = 0;
    let beats = 0;
    let singles = 0;
    for (const deadline = Date.now() + 5000; ; await sleep(50)) {
      const after = await scrape(env.LIMITER_TEST_OPS_URL);
      rounds = delta(after, "http_server_request_duration_seconds_count", { http_route: Paths.heartbeats });
      beats = delta(after, "limiter_heartbeat_total", { outcome: "alive" });
      singles = delta(after, "http_server_request_duration_seconds_count", { http_route: Paths.heartbeat });
      if (beats <= rounds * leases.length || Date.now() > deadline) {
        break;
      }
    }
    assert.equal(singles, 0, "no lease should be heartbeated on its own");
    assert.ok(rounds >= 2, `${rounds} rounds`);
    assert.ok(rounds <= held / INTERVAL_MS + 1, `${rounds} batch requests in ${Math.round(held)}ms: more than one per interval`);
    // Every round carried every lease, but the first may have caught the
    // acquires before they were all done.
    assert.ok(beats <= rounds * leases.length && beats >= (rounds - 1) * leases.length, `${beats} heartbeats in ${rounds} rounds of ${leases.length} leases`);
  });

  test("an admin release marks the lease lost", async () => {
    const c = newClient();
    const [u, other] = [user(), user()];
    const lease = await c.acquire(u, "free");
    const kept = await c.acquire(other, "free");
    const answer = await admin.releaseAll(u, "ticket 1: locked out after a crash");
    assert.deepEqual(answer.released, [lease.streamId]);
    const err = await Promise.race([lease.lost, sleep(5 * INTERVAL_MS).then(() => undefined)]);
    assert.ok(err, "not lost within five heartbeat intervals");
    assert.deepEqual([err.status, err.code], [410, ErrorCode.SlotLost]);
    assert.ok(lease.signal.aborted && lease.signal.reason === err);
    await sleep(2 * INTERVAL_MS);
    assert.equal(kept.error, undefined, "another user's lease was lost too");
    assert.equal(await used(other), 1);
    const records = (await admin.audit(10)).records;
    assert.ok(records.some((r) => r.user_id === u && r.action === "release_all" && r.released?.[0] === lease.streamId));
  });

  for (const another of [false, true]) {
    test(`the release of a lost lease spares the slot re-acquired under its stream id (${another ? "by another client" : "by the same client"})`, async () => {
      // Support frees a stream's slot, its lease is lost with slot_lost, and
      // the application acquires the stream again under its stream id. The
      // lost lease's release (withLease's, or a finally's) must not free the
      // new lease's slot: the user would hold one stream more than the plan
      // allows, and the new lease would be lost at its next heartbeat.
      const c = newClient();
      const u = user();
      const old = await c.acquire(u, "free", { streamId: "chat-1" });
      await admin.releaseAll(u, "ticket 3: support frees the slot");
      const err = await Promise.race([old.lost, sleep(5 * INTERVAL_MS).then(() => undefined)]);
      assert.ok(err, "not lost within five heartbeat intervals");
      assert.equal(err.code, ErrorCode.SlotLost);
      const current = await (another ? newClient() : c).acquire(u, "free", { streamId: "chat-1" });
      assert.notEqual(current, old);
      await old.release();
      assert.equal(await used(u), 1, "the lost lease's release freed the re-acquired lease's slot");
      await refused(c.acquire(u, "free"), ErrorCode.StreamLimitReached);
      const lost = await Promise.race([current.lost, sleep(3 * INTERVAL_MS).then(() => undefined)]);
      assert.equal(lost, undefined, `the re-acquired lease was lost: ${String(lost)}`);
    });
  }

  test("a retry waits the Retry-After of the answer before it", async () => {
    const proxy = await newProxy();
    proxy.fail(Paths.acquire, "503"); // with Retry-After: 1
    await (await newClient(proxy.url).acquire(user(), "free")).release();
    const sent = proxy.received(Paths.acquire).map((r) => r.at);
    assert.equal(sent.length, 2);
    assert.ok(sent[1]! - sent[0]! >= 1000, `the retry came ${Math.round(sent[1]! - sent[0]!)}ms after the attempt answered Retry-After: 1`);
  });

  for (const fault of ["503", "drop"]) {
    test(`an unanswered acquire is retried under the same stream id (${fault})`, async () => {
      const proxy = await newProxy();
      proxy.fail(Paths.acquire, fault);
      const u = user();
      const lease = await newClient(proxy.url).acquire(u, "free");
      assert.deepEqual(
        proxy.received(Paths.acquire).map((r) => r.json.stream_id),
        [lease.streamId, lease.streamId],
      );
      // free allows one stream: the retry was granted the slot the lost
      // attempt took, not a second one, as its answer says.
      assert.equal(await used(u), 1);
      assert.deepEqual([lease.used, lease.limit], [1, 1]);
      assert.deepEqual(proxy.received(Paths.release), []);
    });
  }

  test("an acquire that gives up releases its stream id", async () => {
    const proxy = await newProxy();
    proxy.fail(Paths.acquire, "503", "503");
    const u = user();
    const err = await refused(newClient(proxy.url, { acquireRetries: 1 }).acquire(u, "free"), ErrorCode.LimiterUnavailable);
    assert.equal(err.status, 503);
    const acquired = proxy.received(Paths.acquire).map((r) => r.json.stream_id);
    assert.equal(acquired.length, 2);
    assert.equal(acquired[0], acquired[1]);
    assert.deepEqual(proxy.received(Paths.release).map((r) => r.json.stream_id), acquired.slice(0, 1));
    assert.equal(await used(u), 0, "the slot the lost attempts took should have been released");
  });

  test("an acquire given up by its signal releases its stream id", async () => {
    const proxy = await newProxy();
    proxy.fail(Paths.acquire, "503", "503", "503");
    const u = user();
    const c = newClient(proxy.url);
    const controller = new AbortController();
    const acquiring = c.acquire(u, "free", { signal: controller.signal });
    setTimeout(() => controller.abort(new Error("the caller went away")), 100);
    await assert.rejects(acquiring, /the caller went away/);
    await c.close(); // waits for the releases in the background
    // The client made the id: released at once and once more a second later.
    assert.equal(proxy.received(Paths.release).length, 2);
    assert.equal(await used(u), 0);
  });

  test("a given-up acquire that lands late is released once more", async () => {
    const proxy = await newProxy();
    // Answered 503 at once, the attempt reaches serve 0.3s later: after
    // the client gave up and released its stream id.
    proxy.fail(Paths.acquire, "late");
    const u = user();
    const c = newClient(proxy.url, { acquireRetries: 0 });
    await refused(c.acquire(u, "free"), ErrorCode.LimiterUnavailable);
    const sent = proxy.received(Paths.acquire).map((r) => r.json.stream_id);
    const deadline = Date.now() + 2 * FaultProxy.lateMs;
    while ((await used(u)) !== 1) {
      assert.ok(Date.now() < deadline, "the late attempt took no slot");
      await sleep(20);
    }
    // The release sent once more, a second after the first, frees it;
    // close waits for it. Without it the slot would count against the
    // user for its TTL.
    await c.close();
    assert.deepEqual(proxy.received(Paths.release).map((r) => r.json.stream_id), [...sent, ...sent]);
    assert.equal(await used(u), 0, "the slot the late attempt took should have been released");
  });

  test("a refusal is not retried", async () => {
    const proxy = await newProxy();
    const c = newClient(proxy.url);
    const u = user();
    await c.acquire(u, "free");
    await refused(c.acquire(u, "free"), ErrorCode.StreamLimitReached);
    assert.equal(proxy.received(Paths.acquire).length, 2);
    assert.deepEqual(proxy.received(Paths.release), []);
  });

  test("callers authenticate with their token", async () => {
    const u = user();
    const saved = process.env.LIMITER_TOKEN;
    delete process.env.LIMITER_TOKEN;
    try {
      const err = await refused(newClient().acquire(u, "paid"), ErrorCode.Unauthenticated);
      assert.equal(err.status, 401);
    } finally {
      process.env.LIMITER_TOKEN = saved;
    }
    await refused(newClient(undefined, { token: "not-a-known-token" }).acquire(u, "paid"), ErrorCode.Unauthenticated);
    const scoped = newClient(undefined, { token: env.LIMITER_TEST_SCOPED_TOKEN });
    assert.equal((await refused(scoped.acquire(u, "free"), ErrorCode.PlanNotAllowed)).status, 403);
    await (await scoped.acquire(u, "paid")).release();
  });

  test("a slot belongs to the caller that took it", async () => {
    const u = user();
    // The first heartbeat is due after the takeover below.
    const first = newClient(undefined, { heartbeatIntervalMs: 1500 });
    const lease = await first.acquire(u, "paid");
    const other = newClient(undefined, { token: env.LIMITER_TEST_SCOPED_TOKEN });
    const err = await refused(other.acquire(u, "paid", { streamId: lease.streamId }), ErrorCode.NotSlotHolder);
    assert.ok(isNotSlotHolder(err));
    assert.equal(err.status, 403);
    assert.equal(await used(u), 1, "a refused acquire must change nothing");

    // Support frees the slot and the other caller takes the stream id.
    await admin.releaseAll(u, "ticket 2: stream moved to another caller");
    const taken = await other.acquire(u, "paid", { streamId: lease.streamId });
    const lost = await Promise.race([lease.lost, sleep(1500 + 5 * INTERVAL_MS).then(() => undefined)]);
    assert.ok(lost, "not lost within five heartbeat intervals");
    assert.deepEqual([lost.status, lost.code], [403, ErrorCode.NotSlotHolder]);
    await refused(lease.release(), ErrorCode.NotSlotHolder);
    assert.deepEqual((await admin.slots(u)).slots.map((s) => s.stream_id), [taken.streamId], "a refused release must change nothing");
    await taken.release();
    assert.equal(await used(u), 0);
  });

  test("refusals of bad input", async () => {
    const c = newClient();
    assert.equal((await refused(c.acquire(user(), "no-such-plan"), ErrorCode.UnknownPlan)).status, 422);
    await refused(c.acquire("a}b", "free"), ErrorCode.InvalidUserId);
    await refused(c.acquire(user(), "free", { streamId: "not a stream id" }), ErrorCode.InvalidStreamId);
  });

  test("ids holding a lone surrogate are refused as invalid, as from the Python client", async () => {
    const c = newClient();
    await refused(c.acquire("a\udcffb", "free"), ErrorCode.InvalidUserId);
    await refused(c.acquire(user(), "free", { streamId: "s\udcff" }), ErrorCode.InvalidStreamId);
    await refused(c.acquire(user(), "free", { pools: { model: "k\udcff" } }), ErrorCode.InvalidPoolKey);
    await refused(c.acquire(user(), "free", { label: "l\udcff" }), ErrorCode.InvalidLabel);
  });

  test("admin path ids holding a lone surrogate are refused as invalid, as from the Python client", async () => {
    await refused(admin.slots("a\udcffb"), ErrorCode.InvalidUserId);
    await refused(admin.releaseAll("a\ud800", "cleanup"), ErrorCode.InvalidUserId);
    await refused(admin.poolKey("model", "k\udcff"), ErrorCode.InvalidPoolKey);
  });

  test("TLS: the global fetch trusting the service's CA, and mutual TLS through the fetch option", async () => {
    const u = user();
    // NODE_EXTRA_CA_CERTS trusts the CA; the global fetch takes no client
    // certificate, so the token names the caller.
    await (await newClient(env.LIMITER_TEST_TLS_URL).acquire(u, "paid")).release();

    const saved = process.env.LIMITER_TOKEN;
    delete process.env.LIMITER_TOKEN;
    try {
      const [ca, cert, key] = [await readFile(env.LIMITER_TEST_TLS_CA), await readFile(env.LIMITER_TEST_TLS_CERT), await readFile(env.LIMITER_TEST_TLS_KEY)];
      const byCertificate = newClient(env.LIMITER_TEST_TLS_URL, { fetch: httpsFetch({ ca, cert, key }) });
      await (await byCertificate.acquire(u, "free")).release();
      // The certificate's caller may use free only.
      await refused(byCertificate.acquire(u, "paid"), ErrorCode.PlanNotAllowed);
    } finally {
      process.env.LIMITER_TOKEN = saved;
    }
  });

  test("TLS: the admin API over https, its CA trusted", async () => {
    const url = env.LIMITER_TEST_TLS_ADMIN_URL;
    assert.ok(url.startsWith("https://"), url);
    // NODE_EXTRA_CA_CERTS trusts the CA of the admin listener's certificate.
    const overTLS = new Admin(url, env.LIMITER_TEST_ADMIN_TOKEN);
    assert.equal((await overTLS.slots(user())).used, 0);
    // Plain HTTP reaches no admin API.
    const plain = new Admin("http://" + url.slice("https://".length), env.LIMITER_TEST_ADMIN_TOKEN);
    const err = await refused(plain.slots(user()), "http_400");
    assert.equal(err.status, 400);
  });
});
