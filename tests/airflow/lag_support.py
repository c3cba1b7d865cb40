"""Helpers for the lag tests (airflow-lag): a loopback webhook receiver and the child-process runner
(tables and the Airflow home come from airflow_support)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from airflow.sdk import BaseNotifier

RUNNER = Path(__file__).resolve().with_name("lag_airflow_run.py")


def lag_run(env: dict, *args: str) -> dict:
    """tests/airflow/lag_airflow_run.py in a child process with `env` (an Airflow home); its RESULT."""
    proc = subprocess.run([sys.executable, str(RUNNER), *args], env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"lag_airflow_run printed nothing (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


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



class FileNotifier(BaseNotifier):
    """A notifier of the test's own (any Airflow notifier works in place of the webhook): appends one
    rendered line per call to a file. Configured by dotted path `lag_support.FileNotifier`."""

    template_fields = ("path", "line")

    def __init__(self, *, path: str, line: str = "{{ memwal_alert.state }} {{ memwal_alert.table }}") -> None:
        super().__init__()
        self.path, self.line = path, line

    def notify(self, context) -> None:
        with open(self.path, "a") as f:
            f.write(self.line + "\n")
