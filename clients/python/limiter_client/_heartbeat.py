"""The heartbeat thread: every held lease of a Client, one batch request
(POST /v1/slots/heartbeats, up to 1000 slots) per interval."""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

from ._http import Endpoint
from .errors import LimiterError, SlotLost, definite, from_wire, slot_fatal
from .lease import Lease
from .schemas import (
    AcquireResponse,
    ErrorCode,
    HeartbeatRequest,
    HeartbeatsRequest,
    HeartbeatsResponse,
    Paths,
    encode,
)

log = logging.getLogger("limiter_client")

MAX_BATCH = HeartbeatsRequest.SLOTS_MAX_ITEMS
# Bounds the concurrent requests of one tick, and of a close.
MAX_IN_FLIGHT = 4

Key = Tuple[str, str]  # user id, stream id


class Keeper:
    """Holds a Client's leases and heartbeats them on its own thread: once
    per interval, the smallest among held leases (or the fixed one), idle
    while none is held. A failed round (no answer, 5xx) never loses a lease:
    the slots keep their TTL and the next round retries. Only the limiter's
    answer that a slot is gone loses it. A round takes no longer than the
    interval, re-acquiring degraded leases included: they run MAX_IN_FLIGHT
    at a time in what is left of it, and the next round retries those that
    do not finish."""

    def __init__(
        self,
        api: Endpoint,
        fixed_interval: Optional[float],
        reacquire: Callable[[Lease, float], AcquireResponse],  # lease, timeout
        interval_of: Callable[[AcquireResponse], float],
    ) -> None:
        self._api = api
        self._fixed = fixed_interval
        self._reacquire_call = reacquire
        self._interval_of = interval_of
        self._cond = threading.Condition()
        self._leases: Dict[Key, Lease] = {}
        # Held leases by interval, so that the smallest is found in
        # O(tiers), not O(leases), whenever a lease comes or goes.
        self._intervals: Dict[float, int] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="limiter-heartbeats", daemon=True)
        self._thread.start()

    # The registry.

    def add(self, lease: Lease) -> Optional[Lease]:
        """Starts heartbeating lease, or returns the lease already held for
        the same user and stream. None once closed."""
        with self._cond:
            if self._closed:
                return None
            key = (lease.user_id, lease.stream_id)
            held = self._leases.get(key)
            if held is not None:
                return held
            self._leases[key] = lease
            self._count(lease.interval, 1)
            self._cond.notify_all()
            return lease

    def remove(self, lease: Lease) -> bool:
        """Stops heartbeating lease; whether it was held."""
        with self._cond:
            key = (lease.user_id, lease.stream_id)
            if self._leases.get(key) is not lease:
                return False
            del self._leases[key]
            self._count(lease.interval, -1)
            self._cond.notify_all()
            return True

    def holds(self, lease: Lease) -> bool:
        with self._cond:
            return self._leases.get((lease.user_id, lease.stream_id)) is lease

    def holds_key(self, user_id: str, stream_id: str) -> bool:
        with self._cond:
            return (user_id, stream_id) in self._leases

    def holds_another(self, lease: Lease) -> bool:
        """Whether a lease other than lease is held for its user and stream
        id: one an acquire of the id took after lease was lost or released,
        which now holds the slot."""
        with self._cond:
            held = self._leases.get((lease.user_id, lease.stream_id))
            return held is not None and held is not lease

    def set_interval(self, lease: Lease, interval: float) -> None:
        with self._cond:
            if self._leases.get((lease.user_id, lease.stream_id)) is not lease or lease.interval == interval:
                return
            self._count(lease.interval, -1)
            lease.interval = interval
            self._count(interval, 1)
            self._cond.notify_all()

    def lose(self, lease: Lease, error: LimiterError, vacant: bool = False) -> bool:
        """Stops heartbeating lease and sets its lost with error, unless it
        was released meanwhile; whether it was lost. vacant says the limiter
        answered that it holds no slot under the lease's stream id (see
        Lease._mark_lost)."""
        if not self.remove(lease):
            return False
        lease._mark_lost(error, vacant)
        return True

    def stop(self) -> List[Lease]:
        """Stops the thread (after its round in flight) and returns the
        leases still held, forgetting them."""
        with self._cond:
            self._closed = True
            held = list(self._leases.values())
            self._leases.clear()
            self._intervals.clear()
            self._cond.notify_all()
        return held

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def _count(self, interval: float, delta: int) -> None:
        n = self._intervals.get(interval, 0) + delta
        if n > 0:
            self._intervals[interval] = n
        else:
            self._intervals.pop(interval, None)

    def _every(self) -> float:
        """The interval rounds run at; 0 while no lease is held."""
        if not self._leases:
            return 0.0
        return self._fixed or min(self._intervals)

    # The thread.

    def _run(self) -> None:
        last: Optional[float] = None  # start of the latest round, or when leases appeared
        while True:
            with self._cond:
                if self._closed:
                    return
                every = self._every()
                if every == 0:
                    # The first heartbeat of new leases is due one interval
                    # after they appear.
                    last = None
                    self._cond.wait()
                    continue
                now = time.monotonic()
                if last is None:
                    last = now
                # Measured from the latest round, so that leases coming and
                # going (each wakes the thread) never postpone a round.
                if now < last + every:
                    self._cond.wait(last + every - now)
                    continue
                last = now
                leases = list(self._leases.values())
            # A round may take no longer than the interval: a request hung on
            # a dead connection must not hold up the next round while the
            # slots' TTLs run out.
            try:
                self._round(leases, min(every, self._api.timeout))
            except Exception:  # a bug must not stop the heartbeats of every lease
                log.exception("limiter: heartbeat round failed; retrying next round")

    def _round(self, leases: List[Lease], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        batches = [leases[i : i + MAX_BATCH] for i in range(0, len(leases), MAX_BATCH)]
        if len(batches) == 1:
            again = self._beat(batches[0], timeout)
        else:
            with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="limiter-heartbeats") as pool:
                again = [lease for found in pool.map(lambda b: self._beat(b, timeout), batches) for lease in found]
        if not again:
            return
        # Many degraded leases and a slow limiter must not stretch the round
        # past the interval, or every held slot's TTL runs out meanwhile:
        # the re-acquires share what is left of it. Shuffled, so that when
        # not all fit, the ones left for the next round differ each round.
        random.shuffle(again)
        if len(again) == 1:
            tried = [self._reacquire(again[0], deadline)]
        else:
            with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="limiter-heartbeats") as pool:
                tried = list(pool.map(lambda l: self._reacquire(l, deadline), again))
        left_out = tried.count(False)
        if left_out and not self.closed:
            log.warning("limiter: %d degraded leases not re-acquired within the round; retrying next round", left_out)

    def _beat(self, batch: List[Lease], timeout: float) -> List[Lease]:
        """Sends one batch and applies its results; returns the degraded
        leases the limiter no longer holds, to acquire again."""
        body = HeartbeatsRequest(
            slots=[HeartbeatRequest(user_id=l.user_id, plan=l.plan, stream_id=l.stream_id) for l in batch]
        )
        try:
            out = self._api.call("POST", Paths.HEARTBEATS, encode(body), HeartbeatsResponse, timeout=timeout)
        except LimiterError as err:
            if not self.closed:
                log.warning("limiter: heartbeat batch of %d slots failed; they keep their TTL, retrying next round: %s", len(batch), err)
            return []
        if len(out.results) != len(batch):
            log.error("limiter: heartbeat batch of %d slots answered %d results; retrying next round", len(batch), len(out.results))
            return []
        again: List[Lease] = []
        lost = unconfirmed = 0
        for lease, result in zip(batch, out.results):
            if result.stream_id != lease.stream_id:
                unconfirmed += 1
            elif result.error is not None:
                if not slot_fatal(result.error.code):
                    unconfirmed += 1  # e.g. limiter_unavailable: the slot keeps its TTL
                elif self.lose(lease, from_wire(result.error), vacant=result.error.code == ErrorCode.SLOT_LOST):
                    lost += 1
            elif result.alive:
                lease._update(result.expires_at, result.degraded)
            elif lease.degraded:
                # Granted or kept while Redis was unreachable, so Redis never
                # held it: count it again rather than end the stream over the
                # limiter's own outage.
                again.append(lease)
            elif self.lose(lease, SlotLost("slot_lost", "the limiter no longer holds this slot", status=410), vacant=True):
                lost += 1
        if unconfirmed:
            log.warning("limiter: %d heartbeats not confirmed; the slots keep their TTL, retrying next round", unconfirmed)
        if lost:
            log.info("limiter: %d leases lost", lost)
        return again

    def _reacquire(self, lease: Lease, deadline: float) -> bool:
        """Acquires a degraded lease again, by deadline (time.monotonic());
        False when the round left it no time: it stays degraded, and the
        next round retries it."""
        if not self.holds(lease):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            out = self._reacquire_call(lease, left)
        except LimiterError as err:
            if definite(err):
                # The heartbeat found no slot, and a refused acquire takes none.
                if self.lose(lease, err, vacant=True):
                    log.info("limiter: degraded lease %s refused on re-acquire: %s", lease.stream_id, err)
            elif not self.closed:
                log.warning("limiter: re-acquiring degraded lease %s failed; retrying next round: %s", lease.stream_id, err)
            return True
        # Redis did not hold the slot: the stream was taken anew.
        lease._acquired(out, extension=False)
        self.set_interval(lease, self._interval_of(out))
        if not self.holds(lease):
            # Released (or the client closed) while the acquire was in
            # flight: that release reached the limiter first, and the acquire
            # took the slot anew.
            self._give_back(lease, deadline)
        return True

    def _give_back(self, lease: Lease, deadline: float) -> None:
        """Releases the slot a re-acquire took for a lease released
        meanwhile, by deadline like the re-acquire: sent though the lease
        counts as released, since that release came before the slot was
        taken again."""
        left = deadline - time.monotonic()
        failure = "no time left in the round"
        if left > 0:
            try:
                lease._release(force=True, timeout=left)
                return
            except LimiterError as err:
                failure = str(err)
        log.warning(
            "limiter: giving back the slot re-acquired for released lease %s failed; it expires after its TTL: %s",
            lease.stream_id,
            failure,
        )
