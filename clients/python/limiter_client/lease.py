"""Lease: one held stream slot."""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .errors import LimiterError
from .schemas import AcquireResponse, Paths, PoolGrant, ReleaseRequest, ReleaseResponse, encode

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

    It also says what its acquire answered: the user's ``used`` and
    ``limit``, the pool keys joined (``pools``), and ``would_refuse`` when a
    plan or pool in shadow mode would have refused the stream and did not.
    """

    def __init__(
        self,
        client: "Client",
        user_id: str,
        plan: str,
        stream_id: str,
        label: Optional[str],
        interval: float,
        granted: AcquireResponse,
        pool_keys: Optional[Dict[str, str]] = None,
    ) -> None:
        self._client = client
        self._user_id = user_id
        self._plan = plan
        self._stream_id = stream_id
        self._label = label
        self._pool_keys = pool_keys  # sent again on a re-acquire
        self.interval = interval  # seconds between heartbeats; guarded by the client
        self._lock = threading.Lock()
        self._expires_at = granted.expires_at
        self._degraded = granted.degraded
        self._used = 0
        self._limit = 0
        self._pools: List[PoolGrant] = []
        self._would_refuse: Optional[str] = None
        self._would_refuse_by: Optional[PoolGrant] = None
        self._acquired(granted, extension=False)
        self._released = False
        # The limiter answered that it holds no slot under the stream id
        # for the lease (see _mark_lost): its release has nothing to free,
        # and would free the slot of an acquire of the id since.
        self._vacant = False
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
    def used(self) -> int:
        """How many live slots the user holds, this one included, as of the
        latest acquire answer about the slot: acquire's, that of an acquire
        of its stream id again (an extension), or that of a degraded lease's
        re-acquire. 0 when that answer was degraded (not counted).
        Heartbeats answer no counts, so it does not follow the user's other
        streams coming and going in between. Above ``limit`` when a plan in
        shadow mode let the stream in over its limit (see would_refuse), or
        when the limit was lowered while the user's streams were held."""
        with self._lock:
            return self._used

    @property
    def limit(self) -> int:
        """The limit the latest acquire answer about the slot was judged by
        (see used): the plan's max_concurrent_streams, or the user's support
        override while one is in force."""
        with self._lock:
            return self._limit

    @property
    def pools(self) -> List[PoolGrant]:
        """The capped pool keys the stream joined (acquire's ``pools=``), in
        the order of the pools' names, each a limiter_client.schemas.PoolGrant
        with the key's live memberships (``used``) and cap (``limit``) as of
        the latest acquire answer about the slot (see used); empty when it
        joined none. A key its pool does not cap is not listed: the stream
        joins nothing there. A key's used is 0 when the answer was
        degraded."""
        with self._lock:
            return list(self._pools)

    @property
    def would_refuse(self) -> Optional[str]:
        """The refusal a scope in shadow mode (a plan's or a pool's
        ``enforce: false``) would have answered to the acquire that took the
        stream, and did not: "stream_limit_reached" (the plan's limit; that
        answer's used counted the stream, above its limit) or
        "pool_limit_reached" (a pool key's cap: would_refuse_by). None when
        no scope would have refused, and always when every scope enforces
        (an enforcing scope refuses: acquire raises). It is the stream's
        admission that is judged: an acquire of the stream id again extends
        the held stream whatever the limits, so its answer keeps what the
        first said; a degraded lease's re-acquire takes the stream anew,
        and says it again."""
        with self._lock:
            return self._would_refuse

    @property
    def would_refuse_by(self) -> Optional[PoolGrant]:
        """For a would_refuse of "pool_limit_reached", the pool key in
        shadow mode that would have refused the stream (the first in the
        order of the pools' names), with its live memberships and cap as
        that acquire answered; None otherwise."""
        with self._lock:
            return self._would_refuse_by

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
        never released expires after its TTL.

        It sends nothing where the slot under the stream id is no longer the
        lease's: when the client holds another Lease of that user and stream
        id (an acquire of the id after this lease was lost, or after its
        release failed: the slot is that Lease's now), or when the limiter
        answered that it holds no slot under the id (the lease lost with
        SlotLost, or a degraded lease refused on re-acquire). A lease lost
        for another reason (UnknownPlan, PlanNotAllowed, NotSlotHolder,
        InvalidRequest, ClientClosed) may still hold its slot: its release
        is sent."""
        self._client._forget(self)
        self._release()

    def _release(self, *, force: bool = False, timeout: Optional[float] = None) -> None:
        """Sends the release, unless one succeeded already. force sends it
        regardless: a re-acquire answered after the release took the slot
        anew, and only another release frees it. timeout bounds the call
        (default: the client's request_timeout). Nothing is sent, and the
        lease counts as released, when the slot under the stream id is not
        the lease's (see release)."""
        with self._lock:
            if self._released and not force:
                return
            vacant = self._vacant
        if not vacant and not self._client._keeper.holds_another(self):
            self._client._api.call(
                "POST",
                Paths.RELEASE,
                encode(ReleaseRequest(user_id=self._user_id, stream_id=self._stream_id)),
                ReleaseResponse,
                timeout=timeout,
            )
        with self._lock:
            self._released = True

    def _mark_lost(self, error: LimiterError, vacant: bool = False) -> None:
        """Sets lost with error, once. vacant says the limiter answered that
        it holds no slot under the stream id: a heartbeat's slot_lost, or a
        degraded lease's re-acquire refused (the heartbeat before it found
        no slot, and a refused acquire takes none)."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
            self._vacant = vacant
        self.lost.set()

    def _acquired(self, answer: AcquireResponse, *, extension: bool) -> None:
        """Records an acquire's answer about the slot. extension says it
        answers an acquire of a stream the lease held already, which the
        limiter extends whatever the limits: its answer says the
        would_refuse of the acquire that took the stream, and one that says
        none (a release before this one) leaves the lease's as it is."""
        with self._lock:
            self._expires_at = answer.expires_at
            self._degraded = answer.degraded
            self._used, self._limit = answer.used, answer.limit
            self._pools = list(answer.pools or [])
            if not extension or answer.would_refuse:
                self._would_refuse, self._would_refuse_by = answer.would_refuse, answer.would_refuse_by

    def _update(self, expires_at: Optional[datetime], degraded: bool) -> None:
        """Records a heartbeat's answer about the slot: heartbeats answer
        neither counts nor would_refuse (see used)."""
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
