"""What the client sends and how it reads answers, against a local server
that records requests and answers as the contract allows, including what a
real serve cannot be made to answer on demand (degraded grants, answers
that break the contract, and the label as sent; serve records it, see test_serve)."""

from __future__ import annotations

import re
import threading
import time
import unittest
from typing import Callable, Dict, List, Optional, Union

from limiter_client import (
    Admin,
    Client,
    InvalidRequest,
    LimiterError,
    LimitReached,
    NotSlotHolder,
    PlanNotAllowed,
    PoolLimitReached,
    ProtocolError,
    SlotLost,
    Unavailable,
    UnknownPlan,
    UnknownPool,
)
from limiter_client.schemas import Paths, PoolGrant

from .support import Answer, Recorded, RecordingServer, json_answer

STREAM_ID = re.compile(r"^[0-9a-f]{32}$")


def granted(rec: Recorded, *, degraded: bool = False, interval_ms: int = 50) -> Answer:
    return json_answer(
        200,
        {
            "granted": True,
            "stream_id": rec.json["stream_id"],
            "used": 0 if degraded else 1,
            "limit": 3,
            "expires_at": "2030-01-02T03:04:05.678901234Z",
            "ttl_ms": 3 * interval_ms,
            "heartbeat_interval_ms": interval_ms,
            "pruned": 0,
            "degraded": degraded,
        },
    )


def pool_limit_reached() -> Answer:
    return json_answer(
        429,
        {
            "error": {
                "code": "pool_limit_reached",
                "message": "pool model=gpt-4o holds 1 of its 1 concurrent streams",
                "used": 1,
                "limit": 1,
                "retry_after_ms": 1500,
                "pool": "model",
                "key": "gpt-4o",
            }
        },
        **{"Retry-After": "2"},
    )


def not_slot_holder(user_id: str, stream_id: str) -> Dict:
    return {"code": "not_slot_holder", "message": "stream %s of user %s is held by another caller" % (stream_id, user_id)}


class Fake:
    """Answers acquires with grants (or acquire_answers first, in turn: an
    answer, or a function of the request that returns one; None drops the
    connection), releases with released (or
    release_answer), and heartbeat batches with results[stream_id] (alive
    by default). A stream it grants is held again, so its batch result is
    forgotten: alive. While acquire_gate is set to an Event, acquires wait
    for it (at most 5s) before answering: a slow limiter, or an acquire
    held in flight."""

    def __init__(self) -> None:
        self.results: Dict[str, Dict] = {}
        self.degraded = False
        self.acquire_answer = None
        self.acquire_answers: List[Union[Optional[Answer], Callable[[Recorded], Answer]]] = []
        self.acquire_gate: Optional[threading.Event] = None
        self.release_answer = None
        self.batches: List[Recorded] = []
        self.batch_times: List[float] = []  # time.monotonic() of each batch's arrival
        self.batch_seen = threading.Event()

    def answer(self, rec: Recorded) -> Optional[Answer]:
        if rec.path == Paths.ACQUIRE:
            gate = self.acquire_gate
            if gate is not None:
                gate.wait(5)
            if self.acquire_answers:
                answer = self.acquire_answers.pop(0)
                return answer(rec) if callable(answer) else answer
            if self.acquire_answer is not None:
                return self.acquire_answer
            self.results.pop(rec.json["stream_id"], None)
            return granted(rec, degraded=self.degraded)
        if rec.path == Paths.RELEASE:
            if self.release_answer is not None:
                return self.release_answer
            return json_answer(200, {"released": True, "degraded": False})
        if rec.path == Paths.HEARTBEATS:
            self.batch_times.append(time.monotonic())
            self.batches.append(rec)
            self.batch_seen.set()
            results = []
            for slot in rec.json["slots"]:
                res = {"stream_id": slot["stream_id"], "alive": True, "degraded": False, "expires_at": "2030-01-02T03:04:06Z"}
                res.update(self.results.get(slot["stream_id"], {}))
                results.append(res)
            return json_answer(200, {"results": results})
        return json_answer(404, {"error": {"code": "not_found", "message": "no route"}})


class RequestTest(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = Fake()
        self.server = RecordingServer(self.fake.answer)
        self.addCleanup(self.server.close)

    def client(self, **options) -> Client:
        options.setdefault("token", "caller-token")
        client = Client(self.server.url, **options)
        self.addCleanup(client.close)
        return client

    def test_acquire_sends_label_only_when_set(self) -> None:
        client = self.client()
        client.acquire("user-1", "paid")
        client.acquire("user-1", "paid", label="pod-7/model-x")
        client.acquire("user-1", "paid", label="é" * 64)  # 128 bytes of UTF-8
        bodies = [r.json for r in self.server.received(Paths.ACQUIRE)]
        self.assertEqual(sorted(bodies[0]), ["plan", "stream_id", "user_id"])
        self.assertEqual((bodies[0]["user_id"], bodies[0]["plan"]), ("user-1", "paid"))
        self.assertRegex(bodies[0]["stream_id"], STREAM_ID)
        self.assertEqual(bodies[1]["label"], "pod-7/model-x")
        self.assertEqual(bodies[2]["label"], "é" * 64)

    def test_acquire_sends_pools_as_given_only_when_not_empty(self) -> None:
        client = self.client()
        client.acquire("user-1", "paid")
        client.acquire("user-1", "paid", pools={})
        client.acquire("user-1", "paid", pools={"model": "meta-llama/Llama-3.1-70B-Instruct", "org": "acme"})
        bodies = [r.json for r in self.server.received(Paths.ACQUIRE)]
        self.assertEqual(sorted(bodies[0]), ["plan", "stream_id", "user_id"])
        self.assertEqual(sorted(bodies[1]), ["plan", "stream_id", "user_id"])
        self.assertEqual(bodies[2]["pools"], {"model": "meta-llama/Llama-3.1-70B-Instruct", "org": "acme"})

    def test_pool_limit_reached_is_its_own_error(self) -> None:
        self.fake.acquire_answer = pool_limit_reached()
        with self.assertRaises(PoolLimitReached) as caught:
            self.client().acquire("user-1", "paid", pools={"model": "gpt-4o"})
        err = caught.exception
        self.assertIsInstance(err, LimiterError)
        self.assertNotIsInstance(err, LimitReached, "a pool's cap is not the user's limit")
        self.assertEqual(
            (err.status, err.code, err.pool, err.key, err.used, err.limit, err.retry_after),
            (429, "pool_limit_reached", "model", "gpt-4o", 1, 1, 1.5),
        )
        self.assertIn("(pool model=gpt-4o, used 1 of 1, retry after 1.5s)", str(err))
        self.assertEqual(len(self.server.received(Paths.ACQUIRE)), 1, "a refusal is not retried")
        self.assertEqual(self.server.received(Paths.RELEASE), [])

    def test_label_over_128_bytes_is_refused_before_sending(self) -> None:
        client = self.client()
        with self.assertRaisesRegex(ValueError, "at most 128 bytes of UTF-8, got 130"):
            client.acquire("user-1", "paid", label="é" * 65)
        self.assertEqual(self.server.received(Paths.ACQUIRE), [])

    def test_requests_carry_json_and_the_bearer_token(self) -> None:
        self.client().acquire("user-1", "paid", stream_id="chat-1")
        rec = self.server.received(Paths.ACQUIRE)[0]
        self.assertEqual(rec.json["stream_id"], "chat-1")
        self.assertEqual(rec.headers["Content-Type"], "application/json")
        self.assertEqual(rec.headers["Authorization"], "Bearer caller-token")
        self.assertEqual(rec.headers["User-Agent"], "joishi-limiter-python-client")

    def test_one_batch_per_round_for_every_lease(self) -> None:
        # The first round is due one interval after the first lease: long
        # enough for all five acquires.
        client = self.client(heartbeat_interval=0.3)
        leases = [client.acquire("user-%d" % i, "paid") for i in range(5)]
        self.assertTrue(self.fake.batch_seen.wait(2))
        first = self.fake.batches[0].json["slots"]
        self.assertEqual(
            sorted((s["user_id"], s["plan"], s["stream_id"]) for s in first),
            sorted((l.user_id, "paid", l.stream_id) for l in leases),
        )
        deadline = time.time() + 2
        while leases[0].expires_at.second != 6 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(leases[0].expires_at.second, 6, "a heartbeat's expires_at should update the lease")

    def test_batch_results_lose_only_the_lost_slots(self) -> None:
        client = self.client()
        lost, unavailable, alive = (client.acquire("user-1", "paid") for _ in range(3))
        self.fake.results[lost.stream_id] = {"alive": False, "expires_at": None}
        self.fake.results[unavailable.stream_id] = {
            "alive": False,
            "expires_at": None,
            "error": {"code": "limiter_unavailable", "message": "redis down"},
        }
        with self.assertLogs("limiter_client", "WARNING") as logged:
            self.assertTrue(lost.lost.wait(2))
            time.sleep(0.2)  # a few more rounds
        self.assertIn("heartbeats not confirmed; the slots keep their TTL", "\n".join(logged.output))
        self.assertIsInstance(lost.error, SlotLost)
        self.assertEqual(lost.error.status, 410)
        self.assertFalse(unavailable.lost.is_set(), "limiter_unavailable must not lose a slot: it keeps its TTL")
        self.assertFalse(alive.lost.is_set())
        beaten = [s["stream_id"] for s in self.fake.batches[-1].json["slots"]]
        self.assertNotIn(lost.stream_id, beaten, "a lost lease is heartbeated no more")

    def test_degraded_lease_not_held_is_acquired_again(self) -> None:
        client = self.client()
        self.fake.degraded = True
        # The re-acquire's answer: counted again, the stream is over its
        # plan's limit in shadow mode.
        def over_the_limit(rec: Recorded) -> Answer:
            self.fake.results.pop(rec.json["stream_id"], None)  # held again
            return json_answer(
                200,
                {
                    "granted": True,
                    "stream_id": rec.json["stream_id"],
                    "used": 2,
                    "limit": 1,
                    "expires_at": "2030-01-02T03:04:05Z",
                    "ttl_ms": 150,
                    "heartbeat_interval_ms": 50,
                    "pruned": 0,
                    "degraded": False,
                    "pools": [{"pool": "model", "key": "gpt-4o", "used": 1, "limit": 1}],
                    "would_refuse": "stream_limit_reached",
                },
            )

        lease = client.acquire("user-1", "paid", label="pod-7", pools={"model": "gpt-4o"})
        self.assertEqual((lease.degraded, lease.used, lease.pools, lease.would_refuse), (True, 0, [], None))
        self.fake.degraded = False
        self.fake.acquire_answers = [over_the_limit]
        self.fake.results[lease.stream_id] = {"alive": False, "expires_at": None}
        deadline = time.time() + 2
        while len(self.server.received(Paths.ACQUIRE)) < 2 and time.time() < deadline:
            time.sleep(0.01)
        again = self.server.received(Paths.ACQUIRE)[1].json
        self.assertEqual(
            (again["stream_id"], again["label"], again["pools"]),
            (lease.stream_id, "pod-7", {"model": "gpt-4o"}),
        )
        # Rounds after the re-acquire find it held: the lease goes on. A
        # round starts once the one before it is applied, so the second is
        # the proof.
        after = len(self.fake.batches)

        def beaten() -> int:
            return sum(1 for b in self.fake.batches[after:] if any(s["stream_id"] == lease.stream_id for s in b.json["slots"]))

        deadline = time.time() + 2
        while beaten() < 2 and time.time() < deadline:
            time.sleep(0.01)
        self.assertGreaterEqual(beaten(), 2, "no two rounds after the re-acquire")
        self.assertFalse(lease.lost.is_set())
        # The lease says what the re-acquire answered.
        self.assertEqual(
            (lease.degraded, lease.used, lease.limit, lease.pools, lease.would_refuse, lease.would_refuse_by),
            (False, 2, 1, [PoolGrant(pool="model", key="gpt-4o", used=1, limit=1)], "stream_limit_reached", None),
        )

    def test_degraded_lease_refused_by_its_pool_on_reacquire_is_lost(self) -> None:
        client = self.client()
        self.fake.degraded = True
        lease = client.acquire("user-1", "paid", pools={"model": "gpt-4o"})
        self.fake.acquire_answer = pool_limit_reached()
        self.fake.results[lease.stream_id] = {"alive": False, "expires_at": None}
        self.assertTrue(lease.lost.wait(2))
        self.assertIsInstance(lease.error, PoolLimitReached)
        self.assertEqual((lease.error.pool, lease.error.key), ("model", "gpt-4o"))

    def test_degraded_lease_released_during_its_reacquire_is_given_back(self) -> None:
        # A fixed interval long enough for the release to happen while the
        # round's re-acquire is held in flight.
        client = self.client(heartbeat_interval=1.0)
        self.fake.degraded = True
        lease = client.acquire("user-1", "paid")
        self.fake.degraded = False
        self.fake.acquire_gate = gate = threading.Event()
        self.addCleanup(gate.set)
        self.fake.results[lease.stream_id] = {"alive": False, "expires_at": None}
        deadline = time.time() + 3
        while len(self.server.received(Paths.ACQUIRE)) < 2 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(len(self.server.received(Paths.ACQUIRE)), 2, "no re-acquire")
        # The release reaches the limiter first; the re-acquire then takes
        # the slot again, which the client must free once more.
        lease.release()
        gate.set()
        deadline = time.time() + 2
        while len(self.server.received(Paths.RELEASE)) < 2 and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(
            [r.json["stream_id"] for r in self.server.received(Paths.RELEASE)],
            [lease.stream_id] * 2,
            "the slot the re-acquire took again must be released",
        )

    def test_slow_reacquires_hold_up_no_round(self) -> None:
        client = self.client(heartbeat_interval=0.2)
        self.fake.degraded = True
        leases = [client.acquire("user-%d" % i, "paid") for i in range(12)]
        self.fake.degraded = False
        # Every re-acquire hangs until the test ends: one after the other,
        # twelve of them would hold up the round far past the interval.
        self.fake.acquire_gate = gate = threading.Event()
        self.addCleanup(gate.set)
        for lease in leases:
            self.fake.results[lease.stream_id] = {"alive": False, "expires_at": None}
        start = len(self.fake.batches)
        with self.assertLogs("limiter_client", "WARNING") as logged:
            deadline = time.time() + 3
            while len(self.fake.batches) < start + 5 and time.time() < deadline:
                time.sleep(0.01)
            self.assertGreaterEqual(len(self.fake.batches), start + 5, "rounds held up by the re-acquires")
        # Four rounds: 0.8s. Were each re-acquire given the whole round, its
        # three waves of MAX_IN_FLIGHT would make them 2.4s.
        span = self.fake.batch_times[start + 4] - self.fake.batch_times[start]
        self.assertLess(span, 4 * 0.2 + 0.4, "a round must take no longer than the interval: 4 rounds took %.2fs" % span)
        self.assertIn("retrying next round", "\n".join(logged.output))
        # Unfinished re-acquires are retried, and the leases kept degraded.
        sent = [r.json["stream_id"] for r in self.server.received(Paths.ACQUIRE)[len(leases) :]]
        self.assertGreater(len(sent), len(set(sent)), "an unfinished re-acquire is retried next round")
        for lease in leases:
            self.assertFalse(lease.lost.is_set())
            self.assertTrue(lease.degraded)

    def test_retry_after_of_zero_falls_back_to_the_header(self) -> None:
        self.fake.acquire_answer = json_answer(
            429,
            {"error": {"code": "stream_limit_reached", "message": "3 of 3", "used": 3, "limit": 3, "retry_after_ms": 0}},
            **{"Retry-After": "1"},
        )
        with self.assertRaises(LimitReached) as caught:
            self.client().acquire("user-1", "paid")
        self.assertEqual(caught.exception.retry_after, 1.0)

    def test_invalid_label_is_an_invalid_request(self) -> None:
        self.fake.acquire_answer = json_answer(400, {"error": {"code": "invalid_label", "message": "label has a space"}})
        with self.assertRaises(InvalidRequest) as caught:
            self.client().acquire("user-1", "paid", label="pod 7")
        self.assertEqual((caught.exception.status, caught.exception.code), (400, "invalid_label"))
        # In a batch too: the limiter answers the same on every heartbeat.
        self.fake.acquire_answer = None
        lease = self.client().acquire("user-1", "paid")
        self.fake.results[lease.stream_id] = {
            "alive": False,
            "expires_at": None,
            "error": {"code": "invalid_label", "message": "label has a space"},
        }
        self.assertTrue(lease.lost.wait(2))
        self.assertIsInstance(lease.error, InvalidRequest)
        self.assertEqual(lease.error.status, 400)

    def test_error_answers_become_typed_errors(self) -> None:
        cases = [
            (
                "429 with the limit's fields",
                json_answer(429, {"error": {"code": "stream_limit_reached", "message": "3 of 3", "used": 3, "limit": 3, "retry_after_ms": 1500}}),
                LimitReached,
                {"status": 429, "used": 3, "limit": 3, "retry_after": 1.5},
            ),
            (
                "422 of a pool the limiter does not hold",
                json_answer(422, {"error": {"code": "unknown_pool", "message": "no pool region; the pools are model"}}),
                UnknownPool,
                {"status": 422, "code": "unknown_pool", "pool": None, "key": None},
            ),
            (
                "400 of a malformed pool key",
                json_answer(400, {"error": {"code": "invalid_pool_key", "message": "pool model: key has a space"}}),
                InvalidRequest,
                {"status": 400, "code": "invalid_pool_key"},
            ),
            (
                "a proxy's 502 page",
                (502, {"Content-Type": "text/html", "Retry-After": "3"}, b"<html>bad gateway</html>"),
                Unavailable,
                {"status": 502, "code": "limiter_unavailable", "retry_after": 3.0},
            ),
            (
                "a code this client does not know",
                json_answer(409, {"error": {"code": "stream_conflict", "message": "not a code of this contract"}}),
                LimiterError,
                {"status": 409, "code": "stream_conflict", "message": "not a code of this contract"},
            ),
            ("a status without a body", (418, {}, b""), LimiterError, {"status": 418, "code": "http_418"}),
        ]
        for name, answer, cls, fields in cases:
            with self.subTest(name):
                self.fake.acquire_answer = answer
                with self.assertRaises(cls) as caught:
                    self.client(acquire_retries=0).acquire("user-1", "paid")
                for key, want in fields.items():
                    self.assertEqual(getattr(caught.exception, key), want, key)

    def test_a_redirect_is_not_followed(self) -> None:
        # The limiter never redirects its routes: a 3xx comes from something
        # in between, and following it would hand the bearer token to the
        # host it names, or send a POST again as a GET.
        elsewhere = RecordingServer(lambda rec: json_answer(200, {"records": []}))
        self.addCleanup(elsewhere.close)
        for status in (301, 302, 303, 307, 308):
            with self.subTest(status=status):
                to = elsewhere.url + Paths.ACQUIRE
                self.fake.acquire_answer = (status, {"Location": to}, b"")
                with self.assertRaises(LimiterError) as caught:
                    self.client().acquire("user-1", "paid")
                err = caught.exception
                self.assertEqual((err.status, err.code), (status, "http_%d" % status))
                self.assertIn(to, err.message)
        self.assertEqual(len(self.server.received(Paths.ACQUIRE)), 5, "a redirect is not retried")
        self.assertEqual(self.server.received(Paths.RELEASE), [], "a redirected acquire took no slot")

        redirecting = RecordingServer(lambda rec: (302, {"Location": elsewhere.url + rec.path}, b""))
        self.addCleanup(redirecting.close)
        with self.assertRaises(LimiterError) as caught:
            Admin(redirecting.url, "admin-token").audit()
        self.assertEqual((caught.exception.status, caught.exception.code), (302, "http_302"))
        self.assertIn(elsewhere.url + Paths.ADMIN_READ_AUDIT, str(caught.exception))
        self.assertEqual(len(redirecting.requests), 1)
        self.assertEqual(elsewhere.requests, [], "the server a redirect names received nothing")

    def test_acquire_of_another_callers_stream_id_is_not_slot_holder(self) -> None:
        self.fake.acquire_answer = json_answer(403, {"error": not_slot_holder("user-1", "s")})
        with self.assertRaises(NotSlotHolder) as caught:
            self.client().acquire("user-1", "paid", stream_id="s")
        err = caught.exception
        self.assertIsInstance(err, LimiterError)
        self.assertEqual((err.status, err.code), (403, "not_slot_holder"))
        self.assertEqual(len(self.server.received(Paths.ACQUIRE)), 1, "a refusal is not retried")
        self.assertEqual(self.server.received(Paths.RELEASE), [])

    def test_lease_keeps_the_verdict_on_the_acquire_that_took_its_stream(self) -> None:
        # The limiter answers an extension (the retry of an acquire whose
        # answer was lost, an acquire of a held stream id) with the verdict
        # on the acquire that took the stream; the lease keeps it, and an
        # answer without one leaves it as it is.
        def over_the_limit(rec: Recorded) -> Answer:
            return json_answer(
                200,
                {
                    "granted": True,
                    "stream_id": rec.json["stream_id"],
                    "used": 2,
                    "limit": 1,
                    "expires_at": "2030-01-02T03:04:05Z",
                    "ttl_ms": 150,
                    "heartbeat_interval_ms": 50,
                    "pruned": 0,
                    "degraded": False,
                    "would_refuse": "stream_limit_reached",
                },
            )

        client = self.client()
        self.fake.acquire_answers = [None, over_the_limit, over_the_limit, granted]
        lease = client.acquire("user-1", "paid", stream_id="s")
        self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.ACQUIRE)], ["s", "s"])
        self.assertEqual(lease.would_refuse, "stream_limit_reached", "the retry's answer")
        for answered in ("an extension saying it", "an extension saying none"):
            self.assertIs(client.acquire("user-1", "paid", stream_id="s"), lease, answered)
            self.assertEqual(lease.would_refuse, "stream_limit_reached", answered)

    def test_unanswered_acquire_whose_retry_is_not_slot_holder_sends_no_release(self) -> None:
        # The first answer is lost; by the retry, another caller holds the id.
        self.fake.acquire_answers = [None, json_answer(403, {"error": not_slot_holder("user-1", "s")})]
        with self.assertRaises(NotSlotHolder):
            self.client().acquire("user-1", "paid", stream_id="s")
        self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.ACQUIRE)], ["s", "s"])
        self.assertEqual(self.server.received(Paths.RELEASE), [], "the id is another caller's: its release would be refused")

    def test_given_up_acquire_is_released_once_more_only_under_an_id_of_the_clients_own(self) -> None:
        unavailable = json_answer(503, {"error": {"code": "limiter_unavailable", "message": "redis did not answer in time"}})
        for given in (None, "s"):
            with self.subTest(stream_id=given):
                self.server.requests.clear()
                self.fake.acquire_answers = [unavailable]
                client = self.client(acquire_retries=0)
                with self.assertRaises(Unavailable):
                    client.acquire("user-1", "paid", stream_id=given)
                sent = [r.json["stream_id"] for r in self.server.received(Paths.ACQUIRE)]
                self.assertEqual(len(sent), 1)
                self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.RELEASE)], sent, "released before acquire raised")
                client.close()  # waits for the release sent once more
                # An id the caller gave may be another acquire's by the
                # second release: only the client's own is released twice.
                want = sent if given else sent * 2
                self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.RELEASE)], want)

    def test_a_retry_after_past_the_cap_ends_the_retries_at_once(self) -> None:
        # Something in front of the limiter (a maintenance page) asks for
        # more than the 2s the client waits between retries: acquire raises
        # that answer's error at once, having released its stream id,
        # rather than wait that long per retry.
        for retry_after, attempts in (("10", 1), ("3", 1), ("2", 2)):
            with self.subTest(retry_after=retry_after):
                self.server.requests.clear()
                self.fake.acquire_answers = [
                    json_answer(503, {"error": {"code": "limiter_unavailable", "message": "down for maintenance"}}, **{"Retry-After": retry_after})
                ]
                client = self.client()
                start = time.monotonic()
                if attempts > 1:
                    client.acquire("user-1", "paid").release()
                else:
                    with self.assertRaises(Unavailable):
                        client.acquire("user-1", "paid")
                    self.assertLess(time.monotonic() - start, 1.0, "acquire waited for a Retry-After past the cap")
                sent = [r.json["stream_id"] for r in self.server.received(Paths.ACQUIRE)]
                self.assertEqual(len(sent), attempts)
                if attempts == 1:
                    self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.RELEASE)], sent, "released before acquire raised")

    def test_release_of_a_slot_another_caller_holds_is_not_slot_holder(self) -> None:
        lease = self.client().acquire("user-1", "paid", stream_id="s")
        self.fake.release_answer = json_answer(403, {"error": not_slot_holder("user-1", "s")})
        with self.assertRaises(NotSlotHolder) as caught:
            lease.release()
        self.assertEqual(caught.exception.status, 403)
        with self.assertRaises(NotSlotHolder):
            lease.release()  # refused, so not done: asked again
        self.assertEqual(len(self.server.received(Paths.RELEASE)), 2)
        self.assertFalse(lease.lost.is_set(), "a refused release is not a loss")

    def test_heartbeat_refused_as_not_slot_holder_loses_the_lease(self) -> None:
        client = self.client()
        taken, kept = client.acquire("user-1", "paid"), client.acquire("user-1", "paid")
        self.fake.results[taken.stream_id] = {
            "alive": False,
            "expires_at": None,
            "error": not_slot_holder("user-1", taken.stream_id),
        }
        self.assertTrue(taken.lost.wait(2))
        self.assertIsInstance(taken.error, NotSlotHolder)
        self.assertEqual((taken.error.status, taken.error.code), (403, "not_slot_holder"))
        rounds = len(self.fake.batches)
        deadline = time.time() + 2
        while len(self.fake.batches) < rounds + 2 and time.time() < deadline:
            time.sleep(0.01)
        for batch in self.fake.batches[rounds:]:
            self.assertEqual([s["stream_id"] for s in batch.json["slots"]], [kept.stream_id], "a lost lease is heartbeated no more")
        self.assertFalse(kept.lost.is_set())

    def test_release_of_a_lost_lease_is_sent_only_where_its_slot_may_be_held(self) -> None:
        # A lost lease's release frees what the limiter may still hold under
        # its stream id for it: not when it answered that it holds nothing
        # (slot_lost, a degraded lease refused on re-acquire), and never
        # once the client holds a lease acquired under the id since, whose
        # slot it is.
        gone = {"alive": False, "expires_at": None}

        def refused(code: str) -> Dict:
            return dict(gone, error={"code": code, "message": "refused"})

        cases = [
            ("alive false", False, gone, None, SlotLost, False),
            ("per-slot slot_lost", False, refused("slot_lost"), None, SlotLost, False),
            ("per-slot unknown_plan", False, refused("unknown_plan"), None, UnknownPlan, True),
            ("per-slot plan_not_allowed", False, refused("plan_not_allowed"), None, PlanNotAllowed, True),
            ("degraded, refused on re-acquire", True, gone, pool_limit_reached(), PoolLimitReached, False),
        ]
        for name, degraded, result, reacquire_answer, error, sent_when_released in cases:
            for reacquired in (False, True):
                with self.subTest(name, reacquired=reacquired):
                    fake = Fake()
                    server = RecordingServer(fake.answer)
                    self.addCleanup(server.close)
                    client = Client(server.url, token="caller-token")
                    self.addCleanup(client.close)
                    fake.degraded = degraded
                    lease = client.acquire("user-1", "paid", stream_id="s")
                    fake.acquire_answer = reacquire_answer
                    fake.results["s"] = result
                    self.assertTrue(lease.lost.wait(2), "not lost")
                    self.assertIsInstance(lease.error, error)
                    want = 1 if sent_when_released else 0
                    if reacquired:
                        fake.degraded, fake.acquire_answer = False, None
                        current = client.acquire("user-1", "paid", stream_id="s")
                        self.assertIsNot(current, lease)
                        want = 0
                    before = len(server.received(Paths.RELEASE))
                    lease.release()
                    self.assertEqual(len(server.received(Paths.RELEASE)) - before, want, "releases sent by the lost lease's release")

    def test_answer_breaking_the_contract_is_refused_and_released(self) -> None:
        self.fake.acquire_answer = json_answer(200, {"granted": True, "stream_id": "s", "used": 1})
        with self.assertRaisesRegex(ProtocolError, r"AcquireResponse\.limit: required"):
            self.client().acquire("user-1", "paid", stream_id="s")
        self.assertEqual([r.json["stream_id"] for r in self.server.received(Paths.RELEASE)], ["s"])
        self.assertEqual(len(self.server.received(Paths.ACQUIRE)), 1, "an answer not of the contract is not retried")


if __name__ == "__main__":
    unittest.main()
