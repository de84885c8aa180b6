"""Lease: one held stream slot."""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Optional

from .errors import LimiterError
from .schemas import Paths, ReleaseRequest, ReleaseResponse, encode

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("limiter_client")


class Lease:
    """One held stream slot. Its Client heartbeats it until it is released,
    the client is closed, or the limiter says the slot is gone; then
    ``lost`` is set and ``error`` says why.

    Use it as a context manager to release it however the stream ends::

        with client.acquire("user-42", "paid") as lease:
            for chunk in stream():
                if lease.lost.is_set():
                    break
                send(chunk)
    """

    def __init__(
        self,
        client: "Client",
        user_id: str,
        plan: str,
        stream_id: str,
        label: Optional[str],
        interval: float,
        expires_at: datetime,
        degraded: bool,
        pools: Optional[Dict[str, str]] = None,
    ) -> None:
        self._client = client
        self._user_id = user_id
        self._plan = plan
        self._stream_id = stream_id
        self._label = label
        self._pools = pools  # sent again on a re-acquire
        self.interval = interval  # seconds between heartbeats; guarded by the client
        self._lock = threading.Lock()
        self._expires_at = expires_at
        self._degraded = degraded
        self._released = False
        self._error: Optional[LimiterError] = None
        self.lost = threading.Event()
        """Set when the lease is lost: the limiter answered that the slot no
        longer exists (expired, released by support) or cannot be
        heartbeated (unknown plan, plan not allowed, a slot another caller
        holds, invalid ids), or the client was closed. ``error`` says which.
        Release does not set it."""

    @property
    def user_id(self) -> str:
        """The user the slot counts against."""
        return self._user_id

    @property
    def plan(self) -> str:
        """The plan the slot was acquired under."""
        return self._plan

    @property
    def stream_id(self) -> str:
        """The slot's stream id (given to acquire, or made by the client)."""
        return self._stream_id

    @property
    def label(self) -> Optional[str]:
        """The label sent with the acquire, if any."""
        return self._label

    @property
    def expires_at(self) -> datetime:
        """When the slot stops counting unless heartbeated, as of the latest
        answer (acquire or heartbeat); heartbeats move it forward."""
        with self._lock:
            return self._expires_at

    @property
    def degraded(self) -> bool:
        """Whether the latest answer about the slot was degraded: the limiter
        could not reach Redis and, its tier failing open, granted or kept the
        slot without counting it. A degraded lease the limiter later reports
        lost is acquired again under its stream id, and only lost if that
        acquire is refused."""
        with self._lock:
            return self._degraded

    @property
    def error(self) -> Optional[LimiterError]:
        """Why the lease was lost: SlotLost, UnknownPlan, PlanNotAllowed,
        NotSlotHolder, InvalidRequest, LimitReached or PoolLimitReached (a
        degraded lease refused on re-acquire), or ClientClosed. None while
        ``lost`` is not set."""
        with self._lock:
            return self._error

    def release(self) -> None:
        """Stops heartbeating the lease and frees its slot. Idempotent: once
        a release succeeded, later calls send nothing; after a failure
        (raised as a LimiterError), calling it again retries. A slot that is
        never released expires after its TTL."""
        self._client._forget(self)
        self._release()

    def _release(self, *, force: bool = False, timeout: Optional[float] = None) -> None:
        """Sends the release, unless one succeeded already. force sends it
        regardless: a re-acquire answered after the release took the slot
        anew, and only another release frees it. timeout bounds the call
        (default: the client's request_timeout)."""
        with self._lock:
            if self._released and not force:
                return
        self._client._api.call(
            "POST",
            Paths.RELEASE,
            encode(ReleaseRequest(user_id=self._user_id, stream_id=self._stream_id)),
            ReleaseResponse,
            timeout=timeout,
        )
        with self._lock:
            self._released = True

    def _mark_lost(self, error: LimiterError) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = error
        self.lost.set()

    def _update(self, expires_at: Optional[datetime], degraded: bool) -> None:
        with self._lock:
            if expires_at is not None:
                self._expires_at = expires_at
            self._degraded = degraded

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        # Never raise over the stream's own outcome: a slot that cannot be
        # released now expires after its TTL. Call release() to see errors.
        try:
            self.release()
        except LimiterError as err:
            log.warning("limiter: releasing stream %s failed; it expires after its TTL: %s", self._stream_id, err)

    def __repr__(self) -> str:
        return "Lease(user_id=%r, plan=%r, stream_id=%r, lost=%s)" % (
            self._user_id,
            self._plan,
            self._stream_id,
            self.lost.is_set(),
        )
