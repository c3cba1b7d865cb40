"""Helpers for the lag tests (airflow-lag): MemWAL tables written by Lance core's writer, a loopback
webhook receiver, and a tables file."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tables import create_base, open_base, rows


def lance_core_table(location, regions: int = 1, generations: int = 3) -> list[str]:
    """A base table with MemWAL; each region gets `generations` flushed generations from Lance core's
    ShardWriter (8 rows each). Returns the region ids."""
    create_base(location, ids=range(6))
    open_base(location).initialize_mem_wal(bucket_column="id", num_buckets=2)
    ids = [str(uuid.uuid4()) for _ in range(regions)]
    for n, region in enumerate(ids):
        add_generations(location, region, generations, start=1000 * (n + 1))
    return ids


def add_generations(location, region: str, generations: int, start: int = 5000) -> None:
    """Lance core writes `generations` more flushed generations (8 rows each) to the region."""
    with open_base(location).mem_wal_writer(region, max_memtable_rows=8) as w:
        for g in range(generations):
            w.put(rows(range(start + 8 * g, start + 8 * g + 8), f"g{g}-"))


def write_tables_file(path: Path, tables: dict) -> Path:
    """A tables file (JSON is YAML) with the given entries."""
    path.write_text(json.dumps({"tables": tables}))
    return path


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records every JSON POST; `fail_with` makes it answer that status."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.paths: list[str] = []
        self.fail_with: int | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver.fail_with or 200
                if status == 200:
                    receiver.posts.append(json.loads(body))
                    receiver.paths.append(self.path)
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"nope")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = "/hook/T000/B000/s3cr3t") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
