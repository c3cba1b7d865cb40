"""A fault-injecting S3 endpoint for the suite: an HTTP proxy on 127.0.0.1 in front of the session's moto
server that misbehaves as real S3 does (issue 42), for our object store and Lance's alike.

Faults (`KINDS`): `503` (SlowDown), `500` (InternalError), `reset` (the connection is cut before the request
is forwarded), `stall` (the request waits `stall_s`, then is forwarded: a slow request) and `lost` (the
request is forwarded and lands, then the connection is cut: the client never sees the answer and retries).

Two ways to inject, both deterministic:
- `plan(kind, method=..., key=regex, times=n)`: the next `n` requests that match get that fault (a test
  forces one fault on one request, e.g. "the next PUT of a region manifest: forward, then drop the answer");
- `rates={kind: share}` with `seed`: each request draws once from a seeded generator (a soak).
`injected` counts the faults made per kind; `requests` every request by kind (`s3_requests.request_kind`;
a multi-object delete, as obstore deletes, is a DELETE).
"""

from __future__ import annotations

import html
import random
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from support.s3_requests import forward, read_body, request_kind, respond

KINDS = ("503", "500", "reset", "stall", "lost")
_ERRORS = {
    "503": (503, "Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
}


@dataclass
class _Planned:
    kind: str
    method: str | None  # GET, HEAD, PUT, POST, DELETE or LIST (request_kind); None: any
    key: re.Pattern[str] | None  # matched (search) against the decoded object key, bucket excluded
    times: int
    conditional: bool | None  # only create-if-absent PUTs (If-None-Match: *) when True
    action: Callable[[], None] | None  # run at the fault, before the request goes on (what happens meanwhile)
    until: Callable[[], bool] | None = None  # the plan ends (no fault) once this is true: the store recovers


class FaultProxy:
    """Forwards to `upstream` (http://host:port), injecting faults by plan first, then by seeded rates."""

    def __init__(self, upstream: str, *, rates: Mapping[str, float] | None = None, seed: int = 0,
                 stall_s: float = 0.2) -> None:
        unknown = set(rates or {}) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {KINDS}")
        self.rates = dict(rates or {})
        self.stall_s = stall_s
        self.injected: Counter = Counter()
        self.requests: Counter = Counter()
        self.log: list[tuple[str, str, str]] = []  # (request kind, key, fault or "") in arrival order
        self._planned: list[_Planned] = []
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        target = urlsplit(upstream)
        self._target = (target.hostname, target.port)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms ACK waits

            def _handle(self) -> None:
                body = read_body(self)
                kind = _kind(self.command, self.path)
                key = _object_key(self.path, body)
                fault, action = proxy._choose(kind, key, self.headers.get("If-None-Match") == "*")
                if action is not None:
                    action()
                if fault == "reset":
                    return _cut(self)
                if fault in _ERRORS:
                    return _error(self, *_ERRORS[fault])
                if fault == "stall":
                    time.sleep(proxy.stall_s)  # the fault itself (a slow request), not ordering a test
                status, reason, headers, data = forward(proxy._target, self.command, self.path, self.headers, body)
                if fault == "lost":
                    return _cut(self)  # the request landed upstream; its answer never arrives
                respond(self, status, reason, headers, data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault proxy", daemon=True)

    def plan(self, kind: str, *, method: str | None = None, key: str | None = None, times: int = 1,
             conditional: bool | None = None, action: Callable[[], None] | None = None,
             until: Callable[[], bool] | None = None) -> None:
        """The next `times` requests of `method` whose object key matches the regex `key` get fault `kind`
        (`conditional=True`: only create-if-absent PUTs). Plans are consumed in the order they were made.
        `action` runs at each planned fault before the request goes on: what others do while a request
        stalls (e.g. the lease expires and another job takes the lock), decided by the test, not a clock.
        `until`, checked at each matching request, ends the plan once true: a store that keeps failing
        (`times` large) until something happens, e.g. another process (an Airflow task) writes a flag file."""
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {KINDS}")
        with self._lock:
            self._planned.append(_Planned(kind, method, re.compile(key) if key else None, times, conditional,
                                          action, until))

    def pending(self) -> int:
        """How many planned faults have not been injected yet."""
        with self._lock:
            return sum(p.times for p in self._planned)

    def _choose(self, kind: str, key: str, conditional: bool) -> tuple[str, Callable[[], None] | None]:
        with self._lock:
            self.requests[kind] += 1
            fault, action = "", None
            for p in list(self._planned):
                if ((p.method is None or p.method == kind) and (p.key is None or p.key.search(key))
                        and (p.conditional is None or p.conditional == conditional)):
                    if p.until is not None and p.until():
                        self._planned.remove(p)
                        continue
                    fault, action = p.kind, p.action
                    p.times -= 1
                    if p.times == 0:
                        self._planned.remove(p)
                    break
            if not fault and self.rates:
                draw = self._random.random()
                for name in KINDS:
                    share = self.rates.get(name, 0.0)
                    if draw < share:
                        fault = name
                        break
                    draw -= share
            if fault:
                self.injected[fault] += 1
            self.log.append((kind, key, fault))
            return fault, action

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def options(self, storage_options: Mapping[str, str]) -> dict[str, str]:
        """The storage options with the endpoint replaced by this proxy's (for obstore and Lance alike)."""
        return {**storage_options, "aws_endpoint": self.endpoint}


@contextmanager
def fault_proxy(upstream: str, **kwargs: object) -> Iterator[FaultProxy]:
    with FaultProxy(upstream, **kwargs) as proxy:  # type: ignore[arg-type]
        yield proxy


def _kind(method: str, target: str) -> str:
    """`request_kind`, with a multi-object delete (POST ?delete, as obstore deletes) counted as DELETE."""
    if method == "POST" and "delete" in urlsplit(target).query.split("&"):
        return "DELETE"
    return request_kind(method, target)


def _object_key(target: str, body: bytes | None) -> str:
    """The object key of a path-style request (`/bucket/key`), decoded; a listing's prefix for LIST; the
    keys of a multi-object delete (from its XML body), one per line."""
    parts = urlsplit(target)
    key = unquote(parts.path.lstrip("/").partition("/")[2])
    if not key and "prefix=" in parts.query:
        key = unquote(parts.query.split("prefix=", 1)[1].split("&", 1)[0])
    if not key and body and b"<Delete" in body:
        key = "\n".join(html.unescape(k) for k in re.findall(r"<Key>(.*?)</Key>", body.decode("utf-8", "replace")))
    return key


def _cut(handler: BaseHTTPRequestHandler) -> None:
    """Close the client's connection with a TCP reset and no answer."""
    handler.close_connection = True
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    try:
        handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _error(handler: BaseHTTPRequestHandler, status: int, reason: str, code: str, message: str) -> None:
    body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
    respond(handler, status, reason, [("Content-Type", "application/xml")], body.encode())
