from __future__ import annotations

import calendar
import time
import unittest
from typing import Optional

from limiter_client.client import retry_wait
from limiter_client.errors import Unavailable, parse_retry_after


class RetryAfterTest(unittest.TestCase):
    """A Retry-After header is delay seconds of ASCII digits alone, or an
    HTTP date ahead in any of its three forms, read as UTC; anything else
    says nothing, and never raises (as the Go and TypeScript clients read
    it)."""

    def test_digits_and_dates(self) -> None:
        now = float(calendar.timegm((2026, 12, 7, 12, 0, 0)))
        cases: "list[tuple[str, Optional[float]]]" = [
            ("3", 3.0),
            (" 2 ", 2.0),
            ("+3", None),
            ("-1", None),
            ("\u00b2", None),  # a digit to str.isdigit, not to float
            ("3s", None),
            ("Mon, 07 Dec 2026 12:00:05 GMT", 5.0),
            ("Monday, 07-Dec-26 12:00:05 GMT", 5.0),
            ("Mon Dec  7 12:00:05 2026", 5.0),  # asctime, no zone: UTC
            ("Mon, 07 Dec 2026 11:59:55 GMT", None),
        ]
        for header, want in cases:
            with self.subTest(header=header):
                self.assertEqual(parse_retry_after(header, now=now), want)
        # A date far ahead, of no zone, reads without raising whatever the
        # local zone.
        self.assertIsNotNone(parse_retry_after("Fri, 31 Dec 9999 23:59:59 -0000", now=now))

    def test_a_negative_wait_of_the_body_is_the_backoff(self) -> None:
        err = Unavailable("limiter_unavailable", "down", status=503, retry_after=-5.0)
        wait = retry_wait(err, 0)
        self.assertIsNotNone(wait)
        assert wait is not None
        self.assertGreater(wait, 0)


if __name__ == "__main__":
    unittest.main()
