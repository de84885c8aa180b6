"""Client: acquire stream slots as Leases, kept alive together."""

from __future__ import annotations

import logging
import random
import secrets
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ._heartbeat import MAX_IN_FLIGHT, Keeper
from ._http import Endpoint, caller_token, utf8_size
from .errors import ClientClosed, LimiterError, NotSlotHolder, ProtocolError, Unavailable, definite
from .lease import Lease
from .schemas import AcquireRequest, AcquireResponse, Paths, ReleaseRequest, ReleaseResponse, encode

log = logging.getLogger("limiter_client")

DEFAULT_REQUEST_TIMEOUT = 5.0  # seconds
DEFAULT_ACQUIRE_RETRIES = 2
# The most bytes of UTF-8 a label may take.
MAX_LABEL_BYTES = 128
# Waits between the attempts of an unanswered acquire whose answer carries
# no Retry-After: doubling from the first, in seconds.
FIRST_ACQUIRE_BACKOFF = 0.2
MAX_ACQUIRE_BACKOFF = 2.0
# The longest Retry-After an acquire's retry waits out, in seconds, as long
# as the longest backoff: the limiter's own 503s ask for 1s. An answer
# asking for longer (a maintenance page of a proxy in front of the
# limiter) ends the retries at once, rather than hold acquire that long
# per retry.
MAX_RETRY_AFTER = MAX_ACQUIRE_BACKOFF
# How long after the release of an unanswered acquire it is sent once
# more, in seconds: the lost attempt may still be on its way to Redis, and
# reach it after the release (the limiter's Redis client sends an acquire
# script again after a broken connection).
RELEASE_AGAIN_AFTER = 1.0
# Applies when an acquire answer names neither a heartbeat interval nor a
# TTL (it always should).
FALLBACK_HEARTBEAT_INTERVAL = 10.0


class Client:
    """A client of one limiter service; safe for use from many threads.

    All leases of one Client are kept alive together, by one thread: one
    POST /v1/slots/heartbeats per interval for up to 1000 leases, so 10,000
    streams in a process cost ten requests per interval, not 10,000.

    base_url: the API listener, e.g. "http://limiter.default.svc:8080" (a
      path prefix is kept).
    token: the caller's bearer token (a token of the service's
      api.tokensFile). Default: the LIMITER_TOKEN environment variable; none
      when that is empty too (a service without api.tokensFile needs none).
    ssl_context: for an https:// base URL, the CAs trusted for the service's
      certificate and, for mutual TLS, the client certificate that names the
      caller (ssl.create_default_context(cafile=...) then
      load_cert_chain(...)). Default: the system's roots, no certificate.
    request_timeout: seconds each call may wait on the service (to connect,
      and for each read). Default 5.
    heartbeat_interval: seconds between heartbeat rounds. Default: the
      smallest heartbeat_interval_ms among held leases, as the limiter
      answered at acquire. An interval longer than a tier's TTL loses its
      slots.
    acquire_retries: how many times acquire sends an acquire again, under the
      same stream id, after an attempt went unanswered (no answer, 503
      limiter_unavailable): such an attempt may have taken the slot with
      only its answer lost, and the retry is then granted that slot, not a
      second one. Between attempts it waits the answer's Retry-After (up to
      half as long again, for jitter), else 0.2s doubling up to 2s (from
      half of each, for jitter); a Retry-After above 2s (something in front
      of the limiter asking for a long pause: the limiter's own 503s ask
      for 1s) is not waited, and acquire gives up at once, raising that
      answer's error. When it gives up it releases the
      stream id, so that a slot a lost attempt took does not count against
      the user for a whole TTL, and, when the id is the client's own, once
      more a second later, in the background, for an attempt that reached
      Redis after the first release. 0 disables retrying, not the release.
      Default 2.

    Close it (or use it as a context manager) to stop its thread and
    release the leases it still holds (it also waits for the releases sent
    once more).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        heartbeat_interval: Optional[float] = None,
        acquire_retries: int = DEFAULT_ACQUIRE_RETRIES,
    ) -> None:
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ValueError("heartbeat_interval must be > 0 seconds, got %r" % heartbeat_interval)
        if acquire_retries < 0:
            raise ValueError("acquire_retries must be >= 0, got %r" % acquire_retries)
        self._api = Endpoint(base_url, caller_token(token), ssl_context, request_timeout)
        self._retries = acquire_retries
        self._closing = threading.Event()  # cuts retry waits short at close
        self._close_lock = threading.Lock()
        self._close_failures: Optional[int] = None
        # The releases of given-up acquires to send once more (see
        # _release_unanswered); close waits for them.
        self._again: List[threading.Thread] = []
        self._again_lock = threading.Lock()
        self._again_closed = False
        # The stream ids those releases are for: an acquire under one (the
        # caller retrying under the id an Unavailable names) calls its
        # release off, or waits for it, before it is sent.
        self._again_for: Dict[Tuple[str, str], _Again] = {}
        self._keeper = Keeper(self._api, heartbeat_interval, self._reacquire, heartbeat_interval_of)

    def acquire(
        self,
        user_id: str,
        plan: str,
        *,
        stream_id: Optional[str] = None,
        label: Optional[str] = None,
        pools: Optional[Mapping[str, str]] = None,
    ) -> Lease:
        """Takes a stream slot for user_id under plan and heartbeats it until
        it is released or lost.

        stream_id names the slot (1-128 characters of [A-Za-z0-9._:-]);
        default: a random 128-bit id of the client's own. Every acquire is
        sent under a stream id, so that an attempt whose answer is lost can
        be retried without taking a second slot.
        label is recorded with the slot for support (a pod, a model, a
        request id; at most 128 bytes of UTF-8); sent only when given.
        pools names the pool keys the stream joins, pool to key
        (``{"model": "gpt-4o", "org": "acme"}``, at most 4): each capped
        key must have room too, or the acquire raises PoolLimitReached and
        takes nothing. The limiter keeps the stream's memberships with its
        slot: the heartbeats and the release cover them. Sent only when not
        empty.

        Raises LimitReached (with used, limit, retry_after),
        PoolLimitReached (with pool, key, and the key's used, limit,
        retry_after), UnknownPlan, UnknownPool, PlanNotAllowed,
        NotSlotHolder (a stream_id another caller holds), Unauthenticated,
        InvalidRequest (also for a malformed pool key or label),
        Unavailable (also when the limiter cannot be reached), ClientClosed
        after close, and ValueError for a label over 128 bytes. Acquiring a
        stream id this client already holds returns the held Lease. A grant
        made while the limiter could not reach Redis (a tier failing open)
        is a Lease with degraded True. The Lease says what the grant
        answered: used, limit, pools, and would_refuse when a plan or pool in
        shadow mode would have refused the stream and did not; an acquire of
        a held stream id updates the held Lease with its answer.
        """
        if self._keeper.closed:
            raise ClientClosed("client_closed", "the limiter client is closed")
        body = encode(AcquireRequest(user_id=user_id, plan=plan, stream_id=stream_id or new_stream_id()))
        generated = not stream_id
        if label:
            size = utf8_size(label)
            if size > MAX_LABEL_BYTES:
                raise ValueError("label must be at most %d bytes of UTF-8, got %d" % (MAX_LABEL_BYTES, size))
            body["label"] = label
        if pools:
            body["pools"] = dict(pools)
        if stream_id:
            self._call_off_again(user_id, stream_id)  # once the acquire is sure to be sent
        out = self._acquire_retrying(body, generated)
        lease = Lease(
            self,
            user_id,
            plan,
            out.stream_id,
            label or None,
            heartbeat_interval_of(out),
            out,
            body.get("pools"),
        )
        held = self._keeper.add(lease)
        if held is None:
            # Closed while the request was in flight: give the slot back.
            try:
                lease._release()
            except LimiterError:
                pass
            raise ClientClosed("client_closed", "the limiter client is closed")
        if held is not lease:
            held._acquired(out, extension=True)
            self._keeper.set_interval(held, lease.interval)
        return held

    def close(self) -> int:
        """Stops the heartbeat thread and releases every lease still held,
        in parallel (a lease it cannot release expires after its TTL); their
        ``lost`` is set with ClientClosed. acquire raises ClientClosed
        afterwards. Returns how many releases failed (each is logged);
        calling it again returns the same."""
        with self._close_lock:
            if self._close_failures is not None:
                return self._close_failures
            held = self._keeper.stop()
            self._closing.set()

            def release(lease: Lease) -> Optional[LimiterError]:
                try:
                    lease._release()
                    return None
                except LimiterError as err:
                    return err
                finally:
                    lease._mark_lost(ClientClosed("client_closed", "the limiter client was closed"))

            errors: List[LimiterError] = []
            if held:
                with ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="limiter-close") as pool:
                    errors = [err for err in pool.map(release, held) if err is not None]
            self._keeper.join()
            with self._again_lock:
                again, self._again, self._again_closed = self._again, [], True
            for thread in again:
                thread.join()
            if errors:
                log.warning(
                    "limiter: releasing %d of %d leases failed (they expire after their TTL); first: %s",
                    len(errors),
                    len(held),
                    errors[0],
                )
            self._close_failures = len(errors)
            return self._close_failures

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # Internals used by Lease.

    def _forget(self, lease: Lease) -> None:
        self._keeper.remove(lease)

    # Acquiring.

    def _acquire_once(self, body: Dict[str, Any], timeout: Optional[float] = None) -> AcquireResponse:
        out = self._api.call("POST", Paths.ACQUIRE, body, AcquireResponse, timeout=timeout)
        if not out.granted or not out.stream_id:
            # The contract refuses with 429; a 200 without a grant is a server bug.
            raise ProtocolError(
                "invalid_answer", "POST %s: answer 200 without a granted stream_id" % Paths.ACQUIRE, status=200
            )
        return out

    def _acquire_retrying(self, body: Dict[str, Any], generated: bool) -> AcquireResponse:
        """Sends body (whose stream_id is set) until it is answered, at most
        1 + acquire_retries times; releases the stream id when it gives up
        after an unanswered attempt (once more later when the id was made
        for this acquire, generated)."""
        unanswered = False
        attempt = 0
        while True:
            try:
                return self._acquire_once(body)
            except LimiterError as err:
                if definite(err) and not unanswered:
                    raise  # refused: no attempt can have taken a slot
                if isinstance(err, NotSlotHolder):
                    # Another caller holds the id: no attempt of ours holds
                    # it, and the limiter would refuse our release of it too.
                    raise
                if not definite(err):
                    unanswered = True
                    wait = retry_wait(err, attempt)
                    if attempt < self._retries and isinstance(err, Unavailable) and wait is not None and self._pause(wait):
                        attempt += 1
                        continue
                self._release_unanswered(body, generated)
                raise

    def _pause(self, seconds: float) -> bool:
        """Waits seconds unless the client closes first; whether it waited."""
        return not self._closing.wait(seconds)

    def _release_unanswered(self, body: Dict[str, Any], generated: bool) -> None:
        """Frees the slot an unanswered acquire of body may have taken,
        unless this client holds a lease of that stream id (the acquire was
        a re-acquire of a slot in use), before the acquire raises, so that
        the caller's next acquire finds the slot free. When the id was made
        for this acquire (generated), no one else can hold it, so the
        release is sent once more RELEASE_AGAIN_AFTER later, on a thread of
        its own, for an attempt that reached Redis after the first; close
        waits for it. Best effort: if a release fails, the slot frees itself
        after its TTL."""
        user_id, stream_id = body["user_id"], body["stream_id"]
        if self._keeper.holds_key(user_id, stream_id):
            return

        def release() -> None:
            try:
                self._api.call(
                    "POST", Paths.RELEASE, encode(ReleaseRequest(user_id=user_id, stream_id=stream_id)), ReleaseResponse
                )
            except LimiterError as err:
                log.warning(
                    "limiter: releasing stream %s of an unanswered acquire failed; a slot it took expires after its TTL: %s",
                    stream_id,
                    err,
                )

        release()
        if not generated:
            return

        key = (user_id, stream_id)
        pending = _Again()

        def again() -> None:
            time.sleep(RELEASE_AGAIN_AFTER)
            with pending.lock:
                if not pending.off:
                    release()
                pending.off = True
            with self._again_lock:
                if self._again_for.get(key) is pending:
                    del self._again_for[key]

        thread = threading.Thread(target=again, name="limiter-release-again", daemon=True)
        with self._again_lock:
            if self._again_closed:
                return  # closed: nothing would wait for it
            self._again = [t for t in self._again if t.is_alive()] + [thread]
            self._again_for[key] = pending
            thread.start()

    def _call_off_again(self, user_id: str, stream_id: str) -> None:
        """Calls off the release sent once more for user_id's stream_id
        (see _release_unanswered), or waits for it if it is on its way: an
        acquire under that id (the caller's retry under the id an
        Unavailable names) would be granted, then freed by it. The id is
        the caller's from then on: a late attempt that took a slot under it
        took the retry's, which its lease releases."""
        with self._again_lock:
            pending = self._again_for.pop((user_id, stream_id), None)
        if pending is not None:
            with pending.lock:
                pending.off = True

    def _reacquire(self, lease: Lease, timeout: float) -> AcquireResponse:
        """Acquires a degraded lease's slot again under its stream id, the
        call bounded by timeout (what is left of the heartbeat round)."""
        body = encode(AcquireRequest(user_id=lease.user_id, plan=lease.plan, stream_id=lease.stream_id))
        if lease.label:
            body["label"] = lease.label
        if lease._pool_keys:
            body["pools"] = dict(lease._pool_keys)
        return self._acquire_once(body, timeout)


class _Again:
    """A release sent once more (see Client._release_unanswered): off once
    sent, or called off by an acquire of its stream id; lock is held while
    it is sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.off = False


def new_stream_id() -> str:
    """A random 128-bit stream id, as hex."""
    return secrets.token_hex(16)


def heartbeat_interval_of(out: AcquireResponse) -> float:
    """The heartbeat interval an acquire answer asks for, in seconds."""
    if out.heartbeat_interval_ms > 0:
        return out.heartbeat_interval_ms / 1000.0
    if out.ttl_ms > 0:
        return out.ttl_ms / 3000.0
    return FALLBACK_HEARTBEAT_INTERVAL


def retry_wait(err: LimiterError, attempt: int) -> Optional[float]:
    """How long to wait after the attempt-th unanswered attempt failed with
    err: at least the answer's Retry-After, up to half as long again;
    without one, a doubling backoff drawn from its upper half. The jitter
    keeps clients cut off by one outage from all coming back at once.
    None when the answer's Retry-After is above MAX_RETRY_AFTER: no retry."""
    if err.retry_after and err.retry_after > 0:  # none, or below 0 (not of the contract): the backoff
        if err.retry_after > MAX_RETRY_AFTER:
            return None
        return err.retry_after + random.uniform(0, err.retry_after / 2)
    wait = min(FIRST_ACQUIRE_BACKOFF * (2**attempt), MAX_ACQUIRE_BACKOFF)
    return wait / 2 + random.uniform(0, wait / 2)
