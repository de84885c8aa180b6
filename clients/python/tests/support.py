"""What the tests share: the servers e2e/clients_test.go started, a
recording server for request encoding, and a fault proxy that loses
answers on their way back from a real serve."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import secrets
import threading
import time
import unittest
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple


def required() -> bool:
    """Whether the test command demands the real servers (make test sets
    LIMITER_TEST_REQUIRE=1): then a missing one fails instead of skipping."""
    return os.environ.get("LIMITER_TEST_REQUIRE", "").lower() in ("1", "true")


def env(name: str) -> str:
    """The environment variable e2e/clients_test.go sets; missing, it
    fails the test under LIMITER_TEST_REQUIRE=1 and skips it otherwise."""
    value = os.environ.get(name, "")
    if not value:
        message = "%s is not set: run the suite through `make test` (e2e/clients_test.go starts the servers)" % name
        if required():
            raise AssertionError(message)
        raise unittest.SkipTest(message)
    return value


def user(prefix: str = "py") -> str:
    """A user id no other test uses."""
    return "%s-%s" % (prefix, secrets.token_hex(5))


def scrape(ops_url: str) -> Dict[str, float]:
    """The samples of a serve's /metrics, by series."""
    with urllib.request.urlopen(ops_url + "/metrics", timeout=5) as response:
        text = response.read().decode("utf-8")
    samples: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


def total(samples: Dict[str, float], name: str, **labels: str) -> float:
    """The sum of name's samples whose labels include labels."""
    want = ['%s="%s"' % (k, v) for k, v in labels.items()]
    found = 0.0
    for series, value in samples.items():
        if re.match(re.escape(name) + r"(\{|$)", series) and all(w in series for w in want):
            found += value
    return found


class Recorded:
    """One request a test server received."""

    def __init__(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> None:
        self.at = time.monotonic()  # when it arrived
        self.method = method
        self.path = path
        self.headers = headers
        self.raw = body
        self.json: Any = json.loads(body) if body else None


Answer = Tuple[int, Dict[str, str], bytes]


def json_answer(status: int, body: Any, **headers: str) -> Answer:
    return status, dict(headers, **{"Content-Type": "application/json"}), json.dumps(body).encode("utf-8")


class _Server:
    """A local HTTP server on its own thread, answering with handle."""

    def __init__(self, handle: Callable[["_Handler", Recorded], Optional[Answer]]) -> None:
        self.requests: List[Recorded] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(_Handler):
            def dispatch(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                rec = Recorded(self.command, self.path, dict(self.headers.items()), self.rfile.read(length))
                with outer._lock:
                    outer.requests.append(rec)
                answer = handle(self, rec)
                if answer is None:  # drop the connection without an answer
                    self.close_connection = True
                    return
                status, headers, body = answer
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def received(self, path: str) -> List[Recorded]:
        with self._lock:
            return [r for r in self.requests if urllib.parse.urlsplit(r.path).path == path]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def dispatch(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self.dispatch()

    def do_POST(self) -> None:
        self.dispatch()

    def log_message(self, *args: Any) -> None:
        pass


class RecordingServer(_Server):
    """Records every request and answers with answer(request)."""

    def __init__(self, answer: Callable[[Recorded], Answer]) -> None:
        super().__init__(lambda handler, rec: answer(rec))


class FaultProxy(_Server):
    """Forwards every request to a real serve and passes its answer back,
    except for the faults queued per path: "503" forwards the request (the
    slot is taken in Redis) and answers 503 limiter_unavailable, naming the
    stream id as serve does, in place of serve's answer; "drop" forwards it
    and closes the connection without an answer; "late" answers that 503
    at once and forwards the request LATE seconds later (an attempt that
    reaches Redis after the client gave it up and released its id)."""

    LATE = 0.3

    def __init__(self, upstream: str) -> None:
        self._upstream = urllib.parse.urlsplit(upstream)
        self._faults: Dict[str, List[str]] = {}
        self._fault_lock = threading.Lock()
        super().__init__(self._forward)

    def fail(self, path: str, *faults: str) -> None:
        with self._fault_lock:
            self._faults.setdefault(path, []).extend(faults)

    def _forward(self, handler: _Handler, rec: Recorded) -> Optional[Answer]:
        with self._fault_lock:
            queue = self._faults.get(urllib.parse.urlsplit(rec.path).path) or []
            fault = queue.pop(0) if queue else None
        if fault == "late":
            late = threading.Timer(self.LATE, self._send, args=(rec,))
            late.daemon = True
            late.start()
        else:
            answer = self._send(rec)
        if fault == "drop":
            return None
        if fault in ("503", "late"):
            stream_id = (rec.json or {}).get("stream_id")
            return json_answer(
                503,
                {"error": {"code": "limiter_unavailable", "message": "redis did not answer in time", "stream_id": stream_id}},
                **{"Retry-After": "1"},
            )
        return answer

    def _send(self, rec: Recorded) -> Answer:
        conn = http.client.HTTPConnection(self._upstream.hostname, self._upstream.port, timeout=10)
        try:
            headers = {k: v for k, v in rec.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
            conn.request(rec.method, rec.path, body=rec.raw or None, headers=headers)
            response = conn.getresponse()
            return response.status, {"Content-Type": response.getheader("Content-Type", "")}, response.read()
        finally:
            conn.close()
