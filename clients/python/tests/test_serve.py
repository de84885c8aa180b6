"""The client against a real `limiter serve` on real Redis, started by
e2e/clients_test.go (which passes the URLs and tokens in LIMITER_TEST_*).

The server's tiers: free 1 stream, paid 3, and watch 1 in shadow mode
(enforce: false), all with a 2s slot TTL and a 500ms heartbeat interval;
its pool model caps the key gpt-4o at 1 stream (every other key uncapped),
and its pool org, in shadow mode, caps every key at 1. Callers: LIMITER_TOKEN may use every plan,
LIMITER_TEST_SCOPED_TOKEN only paid, and the TLS server's client
certificate names a caller that may use only free.
"""

from __future__ import annotations

import os
import ssl
import time
import unittest
from unittest import mock

from limiter_client import (
    Admin,
    Client,
    ClientClosed,
    InvalidRequest,
    LimiterError,
    LimitReached,
    NotSlotHolder,
    PlanNotAllowed,
    PoolLimitReached,
    SlotLost,
    Unauthenticated,
    Unavailable,
    UnknownPlan,
    UnknownPool,
)
from limiter_client.client import RELEASE_AGAIN_AFTER
from limiter_client.schemas import Paths, PoolGrant

from .support import FaultProxy, env, scrape, total, user

TTL = 2.0
INTERVAL = 0.5


class ServeTest(unittest.TestCase):
    def setUp(self) -> None:
        self.url = env("LIMITER_TEST_URL")
        self.ops = env("LIMITER_TEST_OPS_URL")
        self.admin = Admin(env("LIMITER_TEST_ADMIN_URL"), env("LIMITER_TEST_ADMIN_TOKEN"))
        env("LIMITER_TOKEN")  # the default caller of every Client below
        self.client = self.new_client(self.url)

    def new_client(self, url: str, **options) -> Client:
        client = Client(url, **options)
        self.addCleanup(client.close)
        return client

    def used(self, user_id: str) -> int:
        return self.admin.slots(user_id).used

    def test_acquire_up_to_the_limit_then_limit_reached(self) -> None:
        u = user()
        leases = [self.client.acquire(u, "paid") for _ in range(3)]
        self.assertEqual(len({l.stream_id for l in leases}), 3, "each acquire should take a slot of its own")
        with self.assertRaises(LimitReached) as caught:
            self.client.acquire(u, "paid")
        err = caught.exception
        self.assertEqual((err.status, err.code, err.used, err.limit), (429, "stream_limit_reached", 3, 3))
        self.assertIsNotNone(err.retry_after)
        self.assertGreater(err.retry_after, 0)
        self.assertLessEqual(err.retry_after, TTL)
        slots = self.admin.slots(u)
        self.assertEqual(slots.used, 3)
        self.assertEqual(sorted(s.stream_id for s in slots.slots), sorted(l.stream_id for l in leases))

    def test_label_is_recorded_with_the_slot(self) -> None:
        u = user()
        lease = self.client.acquire(u, "paid", label="pod-7/model-x")
        slots = self.admin.slots(u).slots
        self.assertEqual([(s.stream_id, s.label) for s in slots], [(lease.stream_id, "pod-7/model-x")])
        self.assertEqual(slots[0].plan, "paid")
        with self.assertRaises(ValueError):
            self.client.acquire(u, "paid", label="x" * 129)
        self.assertEqual(self.used(u), 1, "a refused label must take no slot")

    def test_pool_key_is_a_cap_shared_by_every_user(self) -> None:
        first, second = user(), user()
        gpt = {"model": "gpt-4o"}
        lease = self.client.acquire(first, "paid", pools=gpt)
        with self.assertRaises(PoolLimitReached) as caught:
            self.client.acquire(second, "paid", pools=gpt)
        err = caught.exception
        self.assertNotIsInstance(err, LimitReached, "the second user's own limit did not refuse it")
        self.assertEqual(
            (err.status, err.code, err.pool, err.key, err.used, err.limit),
            (429, "pool_limit_reached", "model", "gpt-4o", 1, 1),
        )
        self.assertIsNotNone(err.retry_after)
        self.assertGreater(err.retry_after, 0)
        self.assertLessEqual(err.retry_after, TTL)
        self.assertEqual(self.used(second), 0, "a pool's refusal must take no slot")
        # Support sees who holds the key.
        shown = self.admin.pool_key("model", "gpt-4o")
        self.assertEqual(
            (shown.used, shown.limit, [(h.user_id, h.stream_id) for h in shown.holders]),
            (1, 1, [(first, lease.stream_id)]),
        )

        lease.release()
        self.client.acquire(second, "paid", pools=gpt).release()
        # A key the pool does not cap is joined by nothing.
        self.client.acquire(first, "paid", pools={"model": "gpt-4o-mini"}).release()

        with self.assertRaises(UnknownPool) as caught:
            self.client.acquire(user(), "paid", pools={"region": "eu"})
        self.assertEqual((caught.exception.status, caught.exception.code), (422, "unknown_pool"))
        with self.assertRaises(InvalidRequest) as caught:
            self.client.acquire(user(), "paid", pools={"model": "gpt 4o"})
        self.assertEqual((caught.exception.status, caught.exception.code), (400, "invalid_pool_key"))

    def test_lease_says_what_its_acquire_answered(self) -> None:
        watcher, enforced, over = user(), user(), user()
        org = user("org")  # a key of the shadow pool org, capped at 1
        under = self.client.acquire(watcher, "watch", stream_id="under")
        over_plan = self.client.acquire(watcher, "watch", stream_id="over")
        gpt = self.client.acquire(enforced, "paid", pools={"model": "gpt-4o", "org": org})
        over_pool = self.client.acquire(over, "paid", pools={"org": org})
        try:
            for name, lease, want in [
                ("a shadow plan's first stream", under, (1, 1, [], None, None)),
                ("a shadow plan's stream over its limit", over_plan, (2, 1, [], "stream_limit_reached", None)),
                (
                    "a grant by scopes that enforce (and a shadow key with room)",
                    gpt,
                    (1, 3, [PoolGrant("model", "gpt-4o", 1, 1), PoolGrant("org", org, 1, 1)], None, None),
                ),
                (
                    "a shadow pool key over its cap",
                    over_pool,
                    (1, 3, [PoolGrant("org", org, 2, 1)], "pool_limit_reached", PoolGrant("org", org, 2, 1)),
                ),
            ]:
                got = (lease.used, lease.limit, lease.pools, lease.would_refuse, lease.would_refuse_by)
                self.assertEqual(got, want, name)
            # The enforced key refuses once full: no lease says otherwise.
            with self.assertRaises(PoolLimitReached):
                self.client.acquire(user(), "paid", pools={"model": "gpt-4o"})

            # An acquire of a held stream id (an extension) returns the held
            # lease with its answer's counts; the limiter extends a held
            # stream whatever the limits, so what the first acquire said of
            # shadow mode stands.
            for lease, would_refuse in [(under, None), (over_plan, "stream_limit_reached")]:
                again = self.client.acquire(watcher, "watch", stream_id=lease.stream_id)
                self.assertIs(again, lease)
                self.assertEqual((again.used, again.limit, again.would_refuse), (2, 1, would_refuse), lease.stream_id)
        finally:
            gpt.release()  # model=gpt-4o is every test's key

    def test_release_frees_the_slot_and_is_idempotent(self) -> None:
        u = user()
        lease = self.client.acquire(u, "free")
        with self.assertRaises(LimitReached):
            self.client.acquire(u, "free")
        lease.release()
        lease.release()
        self.assertEqual(self.used(u), 0)
        self.assertFalse(lease.lost.is_set(), "a release is not a loss")
        self.client.acquire(u, "free").release()

    def test_with_block_releases_when_the_stream_fails(self) -> None:
        u = user()
        with self.assertRaises(RuntimeError):
            with self.client.acquire(u, "free") as lease:
                self.assertEqual(self.used(u), 1)
                raise RuntimeError("upstream failed mid-stream")
        self.assertEqual(self.used(u), 0, "the with block should have released %s" % lease.stream_id)

    def test_close_releases_every_lease_and_marks_it_lost(self) -> None:
        u = user()
        client = self.new_client(self.url)
        leases = [client.acquire(u, "paid") for _ in range(3)]
        self.assertEqual(client.close(), 0)
        self.assertEqual(self.used(u), 0)
        for lease in leases:
            self.assertTrue(lease.lost.is_set())
            self.assertIsInstance(lease.error, ClientClosed)
        with self.assertRaises(ClientClosed):
            client.acquire(u, "paid")

    def test_heartbeats_batch_every_lease_in_one_request_per_interval(self) -> None:
        users = [user() for _ in range(10)]
        before = scrape(self.ops)
        start = time.monotonic()
        client = self.new_client(self.url)
        leases = [client.acquire(u, "paid") for u in users for _ in range(3)]
        time.sleep(1.5 * TTL)  # every slot would have expired without heartbeats
        for u in users:
            self.assertEqual(self.used(u), 3, "user %s's slots outlived their TTL only if heartbeated" % u)
        client.close()
        held = time.monotonic() - start

        # Once serve has counted every round's request (it counts after
        # answering), rounds * leases bounds the heartbeats.
        deadline = time.monotonic() + 5
        while True:
            after = scrape(self.ops)
            rounds = total(after, "http_server_request_duration_seconds_count", http_route=Paths.HEARTBEATS) - total(
                before, "http_server_request_duration_seconds_count", http_route=Paths.HEARTBEATS
            )
            beats = total(after, "limiter_heartbeat_total", outcome="alive") - total(
                before, "limiter_heartbeat_total", outcome="alive"
            )
            if beats <= rounds * len(leases) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        singles = total(after, "http_server_request_duration_seconds_count", http_route=Paths.HEARTBEAT) - total(
            before, "http_server_request_duration_seconds_count", http_route=Paths.HEARTBEAT
        )
        self.assertEqual(singles, 0, "no lease should be heartbeated on its own")
        self.assertGreaterEqual(rounds, 2)
        self.assertLessEqual(rounds, held / INTERVAL + 1, "%d batch requests in %.1fs: more than one per interval" % (rounds, held))
        # Every round carried every lease, but the first may have caught
        # the acquires before they were all done.
        self.assertLessEqual(beats, rounds * len(leases))
        self.assertGreaterEqual(beats, (rounds - 1) * len(leases), "%d heartbeats in %d rounds of %d leases" % (beats, rounds, len(leases)))

    def test_admin_release_marks_the_lease_lost(self) -> None:
        u, other = user(), user()
        lease = self.client.acquire(u, "free")
        kept = self.client.acquire(other, "free")
        answer = self.admin.release_all(u, "ticket 1: locked out after a crash")
        self.assertEqual(answer.released, [lease.stream_id])
        self.assertTrue(lease.lost.wait(5 * INTERVAL), "lost not set within five heartbeat intervals")
        self.assertIsInstance(lease.error, SlotLost)
        self.assertEqual((lease.error.status, lease.error.code), (410, "slot_lost"))
        time.sleep(2 * INTERVAL)
        self.assertFalse(kept.lost.is_set(), "another user's lease was lost too: %s" % kept.error)
        self.assertEqual(self.used(other), 1)
        records = self.admin.audit(limit=10).records
        self.assertIn((u, "release_all", [lease.stream_id]), [(r.user_id, r.action, r.released) for r in records])

    def test_release_of_a_lost_lease_spares_the_slot_reacquired_under_its_id(self) -> None:
        # Support frees a stream's slot, its lease is lost with SlotLost, and
        # the application acquires the stream again under its stream id. The
        # lost lease's release (its with block ending) must not free the new
        # lease's slot: the user would hold one stream more than the plan
        # allows, and the new lease would be lost at its next heartbeat.
        for another in (False, True):
            with self.subTest(reacquired_by_another_client=another):
                u = user()
                old = self.client.acquire(u, "free", stream_id="chat-1")
                self.admin.release_all(u, "ticket 3: support frees the slot")
                self.assertTrue(old.lost.wait(5 * INTERVAL), "lost not set within five heartbeat intervals")
                self.assertIsInstance(old.error, SlotLost)
                again = self.new_client(self.url) if another else self.client
                current = again.acquire(u, "free", stream_id="chat-1")
                self.assertIsNot(current, old)
                old.release()
                self.assertEqual(self.used(u), 1, "the lost lease's release freed the re-acquired lease's slot")
                with self.assertRaises(LimitReached):
                    self.client.acquire(u, "free")
                self.assertFalse(current.lost.wait(3 * INTERVAL), "the re-acquired lease was lost: %s" % current.error)
                current.release()

    def test_a_retry_waits_the_retry_after_of_the_answer_before(self) -> None:
        with FaultProxy(self.url) as proxy:
            proxy.fail(Paths.ACQUIRE, "503")  # with Retry-After: 1
            self.new_client(proxy.url).acquire(user(), "free").release()
            sent = [r.at for r in proxy.received(Paths.ACQUIRE)]
            self.assertEqual(len(sent), 2)
            self.assertGreaterEqual(sent[1] - sent[0], 1.0, "the retry came before the answer's Retry-After of 1s")

    def test_unanswered_acquire_is_retried_under_the_same_stream_id(self) -> None:
        for fault in ("503", "drop"):
            with self.subTest(fault=fault), FaultProxy(self.url) as proxy:
                u = user()
                proxy.fail(Paths.ACQUIRE, fault)
                lease = self.new_client(proxy.url).acquire(u, "free")
                sent = [r.json["stream_id"] for r in proxy.received(Paths.ACQUIRE)]
                self.assertEqual(sent, [lease.stream_id, lease.stream_id])
                # free allows one stream: the retry was granted the slot the
                # lost attempt took, not a second one, as its answer says.
                self.assertEqual(self.used(u), 1)
                self.assertEqual((lease.used, lease.limit), (1, 1))
                self.assertEqual(proxy.received(Paths.RELEASE), [])

    def test_acquire_that_gives_up_releases_its_stream_id(self) -> None:
        with FaultProxy(self.url) as proxy:
            u = user()
            proxy.fail(Paths.ACQUIRE, "503", "503")
            with self.assertRaises(Unavailable) as caught:
                self.new_client(proxy.url, acquire_retries=1).acquire(u, "free")
            self.assertEqual(caught.exception.status, 503)
            acquired = [r.json["stream_id"] for r in proxy.received(Paths.ACQUIRE)]
            released = [r.json["stream_id"] for r in proxy.received(Paths.RELEASE)]
            self.assertEqual(len(acquired), 2)
            self.assertEqual(acquired[0], acquired[1])
            self.assertEqual(released, acquired[:1])
            self.assertEqual(self.used(u), 0, "the slot the lost attempts took should have been released")

    def test_a_given_up_acquire_that_lands_late_is_released_once_more(self) -> None:
        with FaultProxy(self.url) as proxy:
            u = user()
            # Answered 503 at once, the attempt reaches serve 0.3s later:
            # after the client gave up and released its stream id.
            proxy.fail(Paths.ACQUIRE, "late")
            client = self.new_client(proxy.url, acquire_retries=0)
            with self.assertRaises(Unavailable):
                client.acquire(u, "free")
            sent = [r.json["stream_id"] for r in proxy.received(Paths.ACQUIRE)]
            deadline = time.monotonic() + 2 * FaultProxy.LATE
            while self.used(u) != 1:
                self.assertLess(time.monotonic(), deadline, "the late attempt took no slot")
                time.sleep(0.02)
            # The release sent once more, a second after the first, frees
            # it; close waits for it. Without it the slot would count
            # against the user for its TTL.
            client.close()
            self.assertEqual([r.json["stream_id"] for r in proxy.received(Paths.RELEASE)], sent * 2)
            self.assertEqual(self.used(u), 0, "the slot the late attempt took should have been released")

    def test_a_retry_under_the_id_an_unavailable_names_keeps_its_slot(self) -> None:
        with FaultProxy(self.url) as proxy:
            u = user()
            proxy.fail(Paths.ACQUIRE, "503", "503", "503")
            client = self.new_client(proxy.url, acquire_retries=2)
            with self.assertRaises(Unavailable) as caught:
                client.acquire(u, "free")
            sid = caught.exception.stream_id
            self.assertTrue(sid)
            # As docs/api.md says: retry under the id the 503 names. The
            # release of the given-up acquire sent once more must not free
            # the slot the retry is granted.
            lease = client.acquire(u, "free", stream_id=sid)
            time.sleep(RELEASE_AGAIN_AFTER + 0.5)
            self.assertEqual(self.used(u), 1, "the retry's slot was freed by the give-back of the acquire before it")
            with self.assertRaises(LimitReached):
                client.acquire(u, "free")
            self.assertFalse(lease.lost.is_set(), "the retry's lease was lost: %s" % lease.error)
            self.assertEqual([r.json["stream_id"] for r in proxy.received(Paths.RELEASE)], [sid])

    def test_an_acquire_refused_before_it_is_sent_calls_nothing_off(self) -> None:
        with FaultProxy(self.url) as proxy:
            u = user()
            proxy.fail(Paths.ACQUIRE, "503")
            client = self.new_client(proxy.url, acquire_retries=0)
            with self.assertRaises(Unavailable) as caught:
                client.acquire(u, "free")
            sid = caught.exception.stream_id
            # Refused by the client itself, never sent: the release of the
            # given-up acquire sent once more is still due.
            with self.assertRaises(ValueError):
                client.acquire(u, "free", stream_id=sid, label="x" * 129)
            client.close()  # waits for it
            self.assertEqual([r.json["stream_id"] for r in proxy.received(Paths.RELEASE)], [sid, sid])

    def test_refusal_is_not_retried(self) -> None:
        with FaultProxy(self.url) as proxy:
            u = user()
            client = self.new_client(proxy.url)
            client.acquire(u, "free")
            with self.assertRaises(LimitReached):
                client.acquire(u, "free")
            self.assertEqual(len(proxy.received(Paths.ACQUIRE)), 2)
            self.assertEqual(proxy.received(Paths.RELEASE), [])

    def test_callers_authenticate_with_their_token(self) -> None:
        u = user()
        with mock.patch.dict(os.environ, {"LIMITER_TOKEN": ""}):
            with self.assertRaises(Unauthenticated) as caught:
                self.new_client(self.url).acquire(u, "paid")
            self.assertEqual(caught.exception.status, 401)
        with self.assertRaises(Unauthenticated):
            self.new_client(self.url, token="not-a-known-token").acquire(u, "paid")
        scoped = self.new_client(self.url, token=env("LIMITER_TEST_SCOPED_TOKEN"))
        with self.assertRaises(PlanNotAllowed) as caught:
            scoped.acquire(u, "free")
        self.assertEqual(caught.exception.status, 403)
        scoped.acquire(u, "paid").release()

    def test_a_slot_belongs_to_the_caller_that_took_it(self) -> None:
        u = user()
        # The first heartbeat is due after the takeover below.
        first = self.new_client(self.url, heartbeat_interval=1.5)
        lease = first.acquire(u, "paid")
        other = self.new_client(self.url, token=env("LIMITER_TEST_SCOPED_TOKEN"))
        with self.assertRaises(NotSlotHolder) as caught:
            other.acquire(u, "paid", stream_id=lease.stream_id)
        self.assertEqual((caught.exception.status, caught.exception.code), (403, "not_slot_holder"))
        self.assertEqual(self.used(u), 1, "a refused acquire must change nothing")

        # Support frees the slot and the other caller takes the stream id.
        self.admin.release_all(u, "ticket 2: stream moved to another caller")
        taken = other.acquire(u, "paid", stream_id=lease.stream_id)
        self.assertTrue(lease.lost.wait(5 * INTERVAL + 1.5), "lost not set within five heartbeat intervals")
        self.assertIsInstance(lease.error, NotSlotHolder)
        self.assertEqual((lease.error.status, lease.error.code), (403, "not_slot_holder"))
        with self.assertRaises(NotSlotHolder):
            lease.release()
        self.assertEqual([s.stream_id for s in self.admin.slots(u).slots], [taken.stream_id], "a refused release must change nothing")
        taken.release()
        self.assertEqual(self.used(u), 0)

    def test_refusals_of_bad_input(self) -> None:
        with self.assertRaises(UnknownPlan) as caught:
            self.client.acquire(user(), "no-such-plan")
        self.assertEqual(caught.exception.status, 422)
        with self.assertRaises(InvalidRequest) as caught:
            self.client.acquire("a}b", "free")
        self.assertEqual(caught.exception.code, "invalid_user_id")
        with self.assertRaises(InvalidRequest) as caught:
            self.client.acquire(user(), "free", stream_id="not a stream id")
        self.assertEqual(caught.exception.code, "invalid_stream_id")

    def test_ids_not_of_utf8_are_invalid_requests(self) -> None:
        # A lone surrogate, as os.fsdecode (surrogateescape) makes of a byte
        # that is not UTF-8, is refused as the limiter refuses it for the Go
        # and TypeScript clients, not raised as a UnicodeEncodeError.
        cases = [
            ("user id", "a\udcffb", {}, "invalid_user_id"),
            ("stream id", user(), {"stream_id": "s\udcff"}, "invalid_stream_id"),
            ("pool key", user(), {"pools": {"model": "k\udcff"}}, "invalid_pool_key"),
            ("label", user(), {"label": "l\udcff"}, "invalid_label"),
        ]
        for what, user_id, options, code in cases:
            with self.subTest(what):
                with self.assertRaises(InvalidRequest) as caught:
                    self.client.acquire(user_id, "free", **options)
                self.assertEqual((caught.exception.status, caught.exception.code), (400, code))

    def test_admin_path_ids_not_of_utf8_are_invalid_requests(self) -> None:
        # The same in a path segment: quoting a lone surrogate would raise
        # UnicodeEncodeError; the limiter refuses the id instead.
        cases = [
            ("user id", lambda: self.admin.slots("a\udcffb"), "invalid_user_id"),
            ("user id, released", lambda: self.admin.release_all("a\ud800", "cleanup"), "invalid_user_id"),
            ("pool key", lambda: self.admin.pool_key("model", "k\udcff"), "invalid_pool_key"),
        ]
        for what, call, code in cases:
            with self.subTest(what):
                with self.assertRaises(InvalidRequest) as caught:
                    call()
                self.assertEqual((caught.exception.status, caught.exception.code), (400, code))

    def test_mutual_tls(self) -> None:
        url, ca = env("LIMITER_TEST_TLS_URL"), env("LIMITER_TEST_TLS_CA")
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(env("LIMITER_TEST_TLS_CERT"), env("LIMITER_TEST_TLS_KEY"))
        u = user()
        with mock.patch.dict(os.environ, {"LIMITER_TOKEN": ""}):
            by_certificate = self.new_client(url, ssl_context=context)
            by_certificate.acquire(u, "free").release()
            # The certificate's caller may use free only.
            with self.assertRaises(PlanNotAllowed):
                by_certificate.acquire(u, "paid")
        # Without a client certificate, the token names the caller.
        by_token = self.new_client(url, ssl_context=ssl.create_default_context(cafile=ca))
        by_token.acquire(u, "paid").release()
        # Without the CA, the server's certificate is not trusted.
        with self.assertRaises(Unavailable) as caught:
            self.new_client(url, acquire_retries=0).acquire(u, "paid")
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(caught.exception))

    def test_admin_over_tls(self) -> None:
        url, ca, token = env("LIMITER_TEST_TLS_ADMIN_URL"), env("LIMITER_TEST_TLS_CA"), env("LIMITER_TEST_ADMIN_TOKEN")
        self.assertTrue(url.startswith("https://"), url)
        # ssl_context trusts the CA of the admin listener's certificate.
        admin = Admin(url, token, ssl_context=ssl.create_default_context(cafile=ca))
        self.assertEqual(admin.slots(user()).used, 0)
        # Without the CA, the certificate is not trusted.
        with self.assertRaises(Unavailable) as caught:
            Admin(url, token).slots(user())
        self.assertIn("CERTIFICATE_VERIFY_FAILED", str(caught.exception))
        # Plain HTTP reaches no admin API.
        with self.assertRaises(LimiterError) as refused:
            Admin("http://" + url[len("https://") :], token).slots(user())
        self.assertEqual(refused.exception.status, 400, str(refused.exception))


if __name__ == "__main__":
    unittest.main()
