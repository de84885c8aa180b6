"""The errors of the limiter client: one class per outcome a caller acts on.

Every error is a LimiterError carrying the limiter's stable ``code`` and the
HTTP ``status``; catch the subclass you act on::

    try:
        lease = client.acquire("user-42", "paid")
    except LimitReached as err:
        show(f"{err.used} of {err.limit} streams in use, retry in {err.retry_after}s")
"""

from __future__ import annotations

import datetime
import email.utils
import json
import time
from typing import Optional

from .schemas import DecodeError, ErrorCode, ErrorResponse, decode
from .schemas import Error as WireError


class LimiterError(Exception):
    """A refusal or failure of the limiter.

    ``code`` is stable (an ErrorCode value, or ``http_<status>`` when the
    answer was not the limiter's JSON, e.g. a proxy's page, or was a 3xx,
    whose Location the client does not follow and ``message`` names);
    ``message`` is for humans. ``status`` is the HTTP status, 0 when there
    was no answer. ``used``, ``limit`` and ``retry_after`` (seconds, float)
    are set on ``stream_limit_reached``, and on ``pool_limit_reached`` as
    the pool key's; ``retry_after`` also from a Retry-After header, when the
    body gives none or 0. ``pool`` and ``key`` name the pool key of a
    ``pool_limit_reached``. ``stream_id`` names the stream id of an acquire
    answered ``limiter_unavailable``.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int = 0,
        used: Optional[int] = None,
        limit: Optional[int] = None,
        retry_after: Optional[float] = None,
        stream_id: Optional[str] = None,
        pool: Optional[str] = None,
        key: Optional[str] = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.status = status
        self.used = used
        self.limit = limit
        self.retry_after = retry_after
        self.stream_id = stream_id
        self.pool = pool
        self.key = key

    def __str__(self) -> str:
        text = "limiter: " + self.code
        if self.status:
            text += " (HTTP %d)" % self.status
        if self.message:
            text += ": " + self.message
        if self.code == ErrorCode.POOL_LIMIT_REACHED:
            text += " (pool %s=%s, used %s of %s, retry after %ss)" % (
                self.pool,
                self.key,
                self.used,
                self.limit,
                self.retry_after,
            )
        if self.code == ErrorCode.STREAM_LIMIT_REACHED:
            text += " (used %s of %s, retry after %ss)" % (self.used, self.limit, self.retry_after)
        return text


class LimitReached(LimiterError):
    """429 stream_limit_reached: the user holds as many streams as the plan
    allows. A result to show the user, never an outage."""


class PoolLimitReached(LimiterError):
    """429 pool_limit_reached: a pool key the acquire named (``pools=``)
    holds its cap of streams, whoever's they are. ``pool`` and ``key`` name
    it; ``used``, ``limit`` and ``retry_after`` are the key's. Not a
    LimitReached: the user's own limit did not refuse it. The acquire took
    nothing."""


class UnknownPool(LimiterError):
    """422 unknown_pool: an acquire named a pool the limiter does not hold."""


class SlotLost(LimiterError):
    """410 slot_lost: the slot expired or was released by someone else
    (support, an admin release). A Lease's error once it is lost so."""


class Unavailable(LimiterError):
    """The limiter could not decide: 503 limiter_unavailable (a tier failing
    closed while Redis is down), 502/503/504 of anything in between, or no
    answer at all (connection refused or dropped, timeout: status 0)."""


class UnknownPlan(LimiterError):
    """422 unknown_plan: the plan is not in the limiter's tier table."""


class Unauthenticated(LimiterError):
    """401 unauthenticated: the service authenticates its callers and the
    client sent no token it knows (``token=``, LIMITER_TOKEN)."""


class PlanNotAllowed(LimiterError):
    """403 plan_not_allowed: the caller may not use the plan asked for."""


class NotSlotHolder(LimiterError):
    """403 not_slot_holder: the service authenticates its callers and the
    stream id is held by another caller; a slot belongs to the caller that
    took it, and the limiter changed nothing. Raised by acquire (a
    ``stream_id`` another caller holds) and by a lease's release (a slot
    another caller took over); a Lease whose heartbeat is refused so is lost
    with it. Support releases any slot through the admin API."""


class InvalidRequest(LimiterError):
    """400 invalid_request, invalid_user_id, invalid_stream_id,
    invalid_label or invalid_pool_key."""


class ProtocolError(LimiterError):
    """An answer that does not match the contract (code ``invalid_answer``):
    not JSON, or a required field missing or of the wrong type."""


class ClientClosed(LimiterError):
    """The Client was closed (code ``client_closed``, never sent by the
    limiter): acquire raises it afterwards, and it is the error of the leases
    the client still held at close."""


_BY_CODE = {
    ErrorCode.STREAM_LIMIT_REACHED: LimitReached,
    ErrorCode.POOL_LIMIT_REACHED: PoolLimitReached,
    ErrorCode.SLOT_LOST: SlotLost,
    ErrorCode.LIMITER_UNAVAILABLE: Unavailable,
    ErrorCode.UNKNOWN_PLAN: UnknownPlan,
    ErrorCode.UNKNOWN_POOL: UnknownPool,
    ErrorCode.UNAUTHENTICATED: Unauthenticated,
    ErrorCode.PLAN_NOT_ALLOWED: PlanNotAllowed,
    ErrorCode.NOT_SLOT_HOLDER: NotSlotHolder,
    ErrorCode.INVALID_REQUEST: InvalidRequest,
    ErrorCode.INVALID_USER_ID: InvalidRequest,
    ErrorCode.INVALID_STREAM_ID: InvalidRequest,
    ErrorCode.INVALID_LABEL: InvalidRequest,
    ErrorCode.INVALID_POOL_KEY: InvalidRequest,
}

# The status a single-slot call answers for a code, so that a batch's
# per-slot error reads like the single call's.
_STATUS = {
    ErrorCode.SLOT_LOST: 410,
    ErrorCode.UNKNOWN_PLAN: 422,
    ErrorCode.PLAN_NOT_ALLOWED: 403,
    ErrorCode.NOT_SLOT_HOLDER: 403,
    ErrorCode.LIMITER_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_USER_ID: 400,
    ErrorCode.INVALID_STREAM_ID: 400,
    ErrorCode.INVALID_LABEL: 400,
    ErrorCode.INVALID_POOL_KEY: 400,
}

INVALID_CODES = frozenset(
    (
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_USER_ID,
        ErrorCode.INVALID_STREAM_ID,
        ErrorCode.INVALID_LABEL,
        ErrorCode.INVALID_POOL_KEY,
    )
)


def from_wire(err: WireError, status: Optional[int] = None) -> LimiterError:
    """The LimiterError of a wire error; status defaults to the one the
    single-slot call answers for its code."""
    cls = _BY_CODE.get(err.code, LimiterError)
    if status is None:
        status = _STATUS.get(err.code, 0)
    retry_after = None if err.retry_after_ms is None else err.retry_after_ms / 1000.0
    return cls(
        err.code,
        err.message,
        status=status,
        used=err.used,
        limit=err.limit,
        retry_after=retry_after,
        stream_id=err.stream_id,
        pool=err.pool,
        key=err.key,
    )


def from_answer(status: int, body: bytes, retry_after_header: Optional[str]) -> LimiterError:
    """The LimiterError of a non-2xx answer."""
    try:
        err = from_wire(decode(ErrorResponse, json.loads(body.decode("utf-8"))).error, status)
    except (ValueError, DecodeError):  # not the limiter's JSON: a proxy's page
        message = body.decode("utf-8", "replace").strip()
        if len(message) > 200:
            message = message[:200] + "…"
        code = ErrorCode.LIMITER_UNAVAILABLE if status in (502, 503, 504) else "http_%d" % status
        cls = Unavailable if code == ErrorCode.LIMITER_UNAVAILABLE else LimiterError
        err = cls(code, message or "HTTP %d" % status, status=status)
    if not err.retry_after:
        # A body's retry_after_ms of 0 (a slot expiring within the
        # millisecond) would retry at once, only to be refused again; the
        # header rounds up to whole seconds, at least 1 (as the Go client).
        header = parse_retry_after(retry_after_header)
        if header is not None:
            err.retry_after = header
    return err


def parse_retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds of a Retry-After header (delay seconds, ASCII digits only,
    or an HTTP date, read as UTC when it names no zone); None for anything
    else, or a date not ahead."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        at = email.utils.parsedate_to_datetime(value)
        if at.tzinfo is None:  # asctime, or -0000: HTTP dates are UTC
            at = at.replace(tzinfo=datetime.timezone.utc)
        wait = at.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return wait if wait > 0 else None


def definite(err: Exception) -> bool:
    """Whether err is the limiter's answer about the request itself, as
    opposed to a failure to get one (no answer, 5xx, an answer not of the
    contract), after which the same request may well succeed."""
    if not isinstance(err, LimiterError) or isinstance(err, (Unavailable, ProtocolError, ClientClosed)):
        return False
    return 0 < err.status < 500


def slot_fatal(code: str) -> bool:
    """Whether a per-slot batch error means the slot cannot be kept: the
    limiter will answer the same on every later heartbeat."""
    return (
        code in (ErrorCode.SLOT_LOST, ErrorCode.UNKNOWN_PLAN, ErrorCode.PLAN_NOT_ALLOWED, ErrorCode.NOT_SLOT_HOLDER)
        or code in INVALID_CODES
    )
