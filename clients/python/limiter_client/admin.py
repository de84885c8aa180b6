"""Admin: the limiter's admin API, as support staff use it."""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Optional

from ._http import MAX_ADMIN_ANSWER_BYTES, Endpoint
from .client import DEFAULT_REQUEST_TIMEOUT
from .schemas import (
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
    admin.tokensFile set. Every call, refused ones included, is audited
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
        path = Paths.ADMIN_LIST_SLOTS.replace("{user_id}", user_segment(user_id))
        return self._api.call("GET", path, None, AdminSlotsResponse)

    def release_all(self, user_id: str, reason: str) -> AdminReleaseResponse:
        """Releases every slot of the user (role operator): the holders'
        next heartbeat is answered slot_lost. reason is required (at most
        500 characters) and recorded in the audit."""
        path = Paths.ADMIN_RELEASE_ALL.replace("{user_id}", user_segment(user_id))
        return self._api.call("POST", path, encode(AdminReleaseRequest(reason=reason)), AdminReleaseResponse)

    def audit(self, limit: Optional[int] = None) -> AuditResponse:
        """The most recent admin calls, newest first: limit of them (1-1000),
        default the service's (50). Role viewer or operator."""
        path = Paths.ADMIN_READ_AUDIT
        if limit is not None:
            path += "?" + urllib.parse.urlencode({"limit": limit})
        return self._api.call("GET", path, None, AuditResponse)


def user_segment(user_id: str) -> str:
    """user_id escaped as one path segment. A dot-only id is written %2E...:
    a "." or ".." segment would be resolved away as a directory."""
    if user_id and not user_id.strip("."):
        return "%2E" * len(user_id)
    return urllib.parse.quote(user_id, safe="")
