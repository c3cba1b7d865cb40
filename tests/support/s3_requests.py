"""Test helper: count the S3 requests a step makes, Lance's own and ours alike, by putting a counting
HTTP proxy in front of the session's moto server. Lance's reads go through its Rust object store, which no
Python hook sees; a proxy on the endpoint sees every request of every client that uses it."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
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
                body = self._body()
                kind = request_kind(self.command, self.path)
                with proxy._lock:
                    proxy.counts[kind] += 1
                    proxy.paths.append((kind, urlsplit(self.path).path))
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response(resp.status, resp.reason)
                for key, value in resp.getheaders():
                    if key.lower() in _HOP_BY_HOP or (key.lower() == "content-length" and self.command != "HEAD"):
                        continue
                    self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self) -> bytes | None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

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
