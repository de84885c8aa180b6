"""The generated bodies (limiter_client.schemas): decode checks answers
against the contract, encode writes requests."""

from __future__ import annotations

import unittest
from datetime import datetime, timedelta, timezone

from limiter_client.schemas import (
    AcquireRequest,
    AcquireResponse,
    DecodeError,
    ErrorCode,
    HeartbeatRequest,
    HeartbeatsRequest,
    HeartbeatsResponse,
    decode,
    encode,
    format_time,
    parse_time,
)

ANSWER = {
    "granted": True,
    "stream_id": "chat-1",
    "used": 1,
    "limit": 3,
    "expires_at": "2030-01-02T03:04:05.678Z",
    "ttl_ms": 120000,
    "heartbeat_interval_ms": 20000,
    "pruned": 0,
    "degraded": False,
}


class SchemasTest(unittest.TestCase):
    def test_decode_builds_the_dataclass_and_ignores_unknown_fields(self) -> None:
        got = decode(AcquireResponse, dict(ANSWER, added_later={"x": 1}))
        self.assertEqual(got.stream_id, "chat-1")
        self.assertEqual(got.expires_at, datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc))

    def test_decode_refuses_what_breaks_the_contract(self) -> None:
        cases = {
            "a required field missing": ({k: v for k, v in ANSWER.items() if k != "used"}, "AcquireResponse.used: required"),
            "a required field null": (dict(ANSWER, ttl_ms=None), "AcquireResponse.ttl_ms: required"),
            "a string for an integer": (dict(ANSWER, limit="3"), "AcquireResponse.limit: want an integer, got a string"),
            "a boolean for an integer": (dict(ANSWER, used=True), "AcquireResponse.used: want an integer, got a boolean"),
            "a time that is not RFC 3339": (dict(ANSWER, expires_at="tomorrow"), "AcquireResponse.expires_at: want an RFC 3339"),
            "not an object": ([ANSWER], "AcquireResponse: want a JSON object, got an array"),
        }
        for name, (data, want) in cases.items():
            with self.subTest(name):
                with self.assertRaisesRegex(DecodeError, want.replace(".", r"\.")):
                    decode(AcquireResponse, data)

    def test_decode_walks_arrays_of_objects(self) -> None:
        got = decode(HeartbeatsResponse, {"results": [{"stream_id": "a", "alive": False, "degraded": False, "error": {"code": "unknown_plan", "message": "m"}}]})
        self.assertEqual(got.results[0].error.code, ErrorCode.UNKNOWN_PLAN)
        with self.assertRaisesRegex(DecodeError, r"HeartbeatsResponse\.results\[1\]\.alive: required"):
            decode(HeartbeatsResponse, {"results": [{"stream_id": "a", "alive": True, "degraded": False}, {"stream_id": "b", "degraded": False}]})

    def test_encode_leaves_out_optional_fields_left_none(self) -> None:
        self.assertEqual(encode(AcquireRequest(user_id="u", plan="paid")), {"user_id": "u", "plan": "paid"})
        self.assertEqual(
            encode(HeartbeatsRequest(slots=[HeartbeatRequest(user_id="u", plan="paid", stream_id="s")])),
            {"slots": [{"user_id": "u", "plan": "paid", "stream_id": "s"}]},
        )
        with self.assertRaisesRegex(ValueError, "HeartbeatRequest.stream_id is required"):
            encode(HeartbeatRequest(user_id="u", plan="paid", stream_id=None))

    def test_times(self) -> None:
        utc = timezone.utc
        cases = {
            "2030-01-02T03:04:05Z": datetime(2030, 1, 2, 3, 4, 5, tzinfo=utc),
            "2030-01-02T03:04:05.123456789Z": datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=utc),
            "2030-01-02t03:04:05.5+02:00": datetime(2030, 1, 2, 3, 4, 5, 500000, tzinfo=timezone(timedelta(hours=2))),
        }
        for text, want in cases.items():
            with self.subTest(text):
                self.assertEqual(parse_time(text), want)
        for bad in ("2030-01-02", "2030-01-02 03:04:05Z", "2030-13-02T03:04:05Z", "2030-01-02T03:04:05"):
            with self.subTest(bad):
                self.assertIsNone(parse_time(bad))
        self.assertEqual(format_time(datetime(2030, 1, 2, 3, 4, 5, 6, tzinfo=utc)), "2030-01-02T03:04:05.000006Z")

    def test_error_codes_are_the_contracts(self) -> None:
        self.assertIn("stream_limit_reached", ErrorCode.VALUES)
        self.assertEqual(ErrorCode.SLOT_LOST, "slot_lost")


if __name__ == "__main__":
    unittest.main()
