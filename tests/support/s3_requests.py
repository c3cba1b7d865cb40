"""Test helper: count the S3 requests a step makes, Lance's own and ours alike, by putting a counting
HTTP proxy in front of the session's moto server. Lance's reads go through its Rust object store, which no
Python hook sees; a proxy on the endpoint sees every request of every client that uses it."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


def request_kind(method: str, target: str) -> str:
    """LIST (a bucket listing), GET, HEAD, PUT, POST or DELETE."""
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    if method == "GET" and ("list-type" in query or "delimiter" in query or "prefix" in query):
        return "LIST"
    return method


def read_body(handler: BaseHTTPRequestHandler) -> bytes | None:
    """The request's body (chunked or Content-Length), None when it has none."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                handler.rfile.readline()
                return out
            out += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else None


def forward(target: tuple[str, int], method: str, path: str, headers: Mapping[str, str],
            body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
    """The request sent on to the upstream at `target`; its (status, reason, headers, body)."""
    conn = http.client.HTTPConnection(*target, timeout=60)
    try:
        conn.request(method, path, body=body, headers={k: v for k, v in headers.items()
                                                       if k.lower() not in _HOP_BY_HOP})
        resp = conn.getresponse()
        return resp.status, resp.reason, resp.getheaders(), resp.read()
    finally:
        conn.close()


def respond(handler: BaseHTTPRequestHandler, status: int, reason: str, headers: list[tuple[str, str]],
            data: bytes) -> None:
    """Answer the client with an upstream's (or a made-up) answer, framed by Content-Length."""
    handler.send_response(status, reason)
    for key, value in headers:
        if key.lower() in _HOP_BY_HOP or (key.lower() == "content-length" and handler.command != "HEAD"):
            continue
        handler.send_header(key, value)
    if handler.command != "HEAD":
        handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)


class CountingProxy:
    """Forwards every request to `upstream` (http://host:port) and counts them by kind (`request_kind`);
    `paths` keeps (kind, path) of each, in order."""

    def __init__(self, upstream: str) -> None:
        self.counts: Counter = Counter()
        self.paths: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms ACK waits

            def _forward(self) -> None:
                body = read_body(self)
                kind = request_kind(self.command, self.path)
                with proxy._lock:
                    proxy.counts[kind] += 1
                    proxy.paths.append((kind, urlsplit(self.path).path))
                respond(self, *forward((target.hostname, target.port), self.command, self.path, self.headers, body))

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.paths.clear()

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def counting_proxy(upstream: str) -> Iterator[CountingProxy]:
    with CountingProxy(upstream) as proxy:
        yield proxy
