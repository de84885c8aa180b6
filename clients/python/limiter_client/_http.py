"""One limiter listener and how to call it: JSON in, a checked answer out."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Type, TypeVar

from .errors import LimiterError, ProtocolError, Unavailable, from_answer
from .schemas import DecodeError, decode

T = TypeVar("T")

USER_AGENT = "joishi-limiter-python-client"

# Bounds what is read of an answer: a full batch answer is about 100 KiB,
# an admin list of a user's slots can exceed 10 MiB.
MAX_ANSWER_BYTES = 4 << 20
MAX_ADMIN_ANSWER_BYTES = 16 << 20

ENV_TOKEN = "LIMITER_TOKEN"

# A surrogate code point, which UTF-8 cannot encode: a str holds one
# where os.fsdecode (surrogateescape) met a byte that is not UTF-8.
SURROGATE = re.compile(r"[\ud800-\udfff]")


def parse_base_url(raw: str) -> str:
    """Checks a base URL and returns it without a trailing slash."""
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("base URL must be http(s)://host[:port][/prefix], got %r" % raw)
    if parts.query or parts.fragment:
        raise ValueError("base URL must have no query or fragment, got %r" % raw)
    return raw.rstrip("/")


def caller_token(token: Optional[str]) -> str:
    """The bearer token to send: token, else LIMITER_TOKEN, else none ("")."""
    if token is None:
        return os.environ.get(ENV_TOKEN, "").strip()
    token = token.strip()
    if not token:
        raise ValueError("token must not be empty (pass None to read %s)" % ENV_TOKEN)
    return token


class Endpoint:
    """Calls one listener of the limiter with one token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        ssl_context: Optional[ssl.SSLContext],
        timeout: float,
        max_answer: int = MAX_ANSWER_BYTES,
    ) -> None:
        if timeout <= 0:
            raise ValueError("request_timeout must be > 0 seconds, got %r" % timeout)
        self.base = parse_base_url(base_url)
        self.timeout = timeout
        self._token = token
        self._max_answer = max_answer
        handlers: List[urllib.request.BaseHandler] = [_NoRedirect()]
        if ssl_context:
            handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
        self._opener = urllib.request.build_opener(*handlers)

    def call(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]],
        answer: Type[T],
        timeout: Optional[float] = None,
    ) -> T:
        """Sends body as JSON (none when None) and returns the 2xx answer
        decoded as answer. A non-2xx answer raises its LimiterError (a 3xx
        too: no redirect is followed, see _NoRedirect); no
        answer (refused, dropped, timed out) raises Unavailable; an answer
        that does not match the contract raises ProtocolError."""
        what = "%s %s" % (method, path)
        data = None if body is None else json_body(body)
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        if self._token:
            request.add_header("Authorization", "Bearer " + self._token)
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                status = response.status
                raw = self._read(response, what)
        except urllib.error.HTTPError as err:
            with err:
                if 300 <= err.code <= 399:
                    raise LimiterError(
                        "http_%d" % err.code,
                        "%s: redirected to %s: the client follows no redirect"
                        % (what, err.headers.get("Location") or "nowhere (no Location)"),
                        status=err.code,
                    ) from None
                raw = self._read(err, what)
                raise from_answer(err.code, raw, err.headers.get("Retry-After")) from None
        except (OSError, http.client.HTTPException, socket.timeout) as err:
            raise Unavailable(
                "limiter_unavailable", "%s: no answer: %s" % (what, _reason(err))
            ) from err
        try:
            return decode(answer, json.loads(raw.decode("utf-8")))
        except (ValueError, DecodeError) as err:
            raise ProtocolError(
                "invalid_answer", "%s: answer (HTTP %d) does not match the contract: %s" % (what, status, err),
                status=status,
            ) from err

    def _read(self, response: Any, what: str) -> bytes:
        try:
            raw = response.read(self._max_answer + 1)
        except (OSError, http.client.HTTPException) as err:
            raise Unavailable("limiter_unavailable", "%s: answer cut off: %s" % (what, _reason(err))) from err
        if len(raw) > self._max_answer:
            raise ProtocolError("invalid_answer", "%s: answer exceeds %d bytes" % (what, self._max_answer))
        return raw


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the 3xx comes back as an HTTPError. The
    limiter never redirects its routes, so a 3xx is something in between;
    following it would send the bearer token to whatever host and scheme
    it names, and a POST again as a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def json_body(body: Dict[str, Any]) -> bytes:
    """body as JSON in UTF-8. A surrogate is sent as its JSON escape, as
    JavaScript's JSON.stringify sends a lone one: the limiter reads it as
    U+FFFD and refuses the id, pool key or label holding it
    (invalid_user_id, invalid_stream_id, invalid_pool_key, invalid_label),
    as it does the same from the TypeScript client, where UTF-8 alone would
    raise UnicodeEncodeError here."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE.sub(lambda m: "\\u%04x" % ord(m.group()), text).encode("utf-8")


def utf8_size(text: str) -> int:
    """The bytes of UTF-8 text takes as the limiter reads it (see
    json_body): a lone surrogate as U+FFFD, a pair as the character it
    makes."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return len(text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode("utf-8"))


def _reason(err: BaseException) -> str:
    if isinstance(err, urllib.error.URLError) and not isinstance(err.reason, str):
        err = err.reason
    return str(err) or type(err).__name__
