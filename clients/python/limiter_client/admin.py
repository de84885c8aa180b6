"""Admin: the limiter's admin API, as support staff use it."""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Optional

from ._http import MAX_ADMIN_ANSWER_BYTES, SURROGATE, Endpoint
from .client import DEFAULT_REQUEST_TIMEOUT
from .schemas import (
    AdminPoolKeyResponse,
    AdminReleaseRequest,
    AdminReleaseResponse,
    AdminSlotsResponse,
    AuditResponse,
    Paths,
    encode,
)


class Admin:
    """Calls the admin API (/v1/admin/...) with one token.

    The API is served on the admin listener (admin.addr, e.g.
    "http://limiter-admin.default.svc:8081") when the service has
    admin.tokensFile set; over TLS ("https://...") when it has http.tls
    set: ssl_context (ssl.create_default_context(cafile=...)) then trusts
    the CA of its certificate, unless the system's roots do. Every call, refused ones included, is audited
    under the token's name. A refused call raises a LimiterError with code
    ``unauthorized`` (401), ``forbidden`` (403, a viewer's token on an
    operator's call) or an InvalidRequest (400); a service that cannot be
    reached raises Unavailable. Holds no thread; safe for use from many
    threads.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        ssl_context: Optional[ssl.SSLContext] = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        if not token or not token.strip():
            raise ValueError("token must not be empty")
        self._api = Endpoint(base_url, token.strip(), ssl_context, request_timeout, MAX_ADMIN_ANSWER_BYTES)

    def slots(self, user_id: str) -> AdminSlotsResponse:
        """The user's live slots, earliest expiry first (role viewer or
        operator)."""
        path = Paths.ADMIN_LIST_SLOTS.replace("{user_id}", segment(user_id))
        return self._api.call("GET", path, None, AdminSlotsResponse)

    def release_all(self, user_id: str, reason: str) -> AdminReleaseResponse:
        """Releases every slot of the user (role operator): the holders'
        next heartbeat is answered slot_lost. reason is required (at most
        500 characters) and recorded in the audit."""
        path = Paths.ADMIN_RELEASE_ALL.replace("{user_id}", segment(user_id))
        return self._api.call("POST", path, encode(AdminReleaseRequest(reason=reason)), AdminReleaseResponse)

    def pool_key(self, pool: str, key: str) -> AdminPoolKeyResponse:
        """Who holds key of pool (each holder's user_id, stream and record),
        its cap (limit, absent when the pool caps neither) and its override
        in force (role viewer or operator). A pool the service does not hold
        raises UnknownPool; a key outside 1-128 bytes of [A-Za-z0-9._:/@-]
        an InvalidRequest (invalid_pool_key). Keys are case-sensitive."""
        path = Paths.ADMIN_GET_POOL_KEY.replace("{pool}", segment(pool)).replace("{key}", segment(key))
        return self._api.call("GET", path, None, AdminPoolKeyResponse)

    def audit(self, limit: Optional[int] = None) -> AuditResponse:
        """The most recent admin calls, newest first: limit of them (1-1000),
        default the service's (50). Role viewer or operator."""
        path = Paths.ADMIN_READ_AUDIT
        if limit is not None:
            path += "?" + urllib.parse.urlencode({"limit": limit})
        return self._api.call("GET", path, None, AuditResponse)


def segment(value: str) -> str:
    """value (a user id, a pool's name or key) escaped as one path segment:
    a "/" is %2F. A dot-only one is written %2E...: a "." or ".." segment
    would be resolved away as a directory. A lone surrogate, which UTF-8
    cannot encode, is sent as U+FFFD, as json_body's escape of one is read:
    the limiter refuses the id holding it (invalid_user_id,
    invalid_pool_key) instead of this raising UnicodeEncodeError."""
    if value and not value.strip("."):
        return "%2E" * len(value)
    if SURROGATE.search(value):
        value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return urllib.parse.quote(value, safe="")
