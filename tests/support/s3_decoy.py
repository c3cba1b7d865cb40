"""The S3 decoy of the test environment (issue 18): S3 tests see S3 only through what the code under test
passes. tests/conftest.py calls isolate_environment() once per test process; positive controls use the rest."""

from __future__ import annotations

import http.server
import os
import re
import threading

DECOY_MESSAGE = "decoy S3 endpoint of the test environment: the code under test did not pass its own endpoint"


class _Decoy(http.server.BaseHTTPRequestHandler):
    """Answers every request at once with an S3 error naming itself, so a client that fell back to the
    environment fails fast and says why (a closed port would be retried for minutes)."""

    def _refuse(self) -> None:
        body = f"<Error><Code>InvalidAccessKeyId</Code><Message>{DECOY_MESSAGE}</Message></Error>".encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _refuse

    def log_message(self, *args: object) -> None:
        pass


def _start_decoy() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Decoy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def isolate_environment() -> str:
    """Point this process's environment (inherited by every child: Airflow, spark-submit, Spark workers, the
    CLI) at a loopback decoy that refuses everything, with no keys, so a connection, hook or job that drops
    its endpoint or keys fails. Instance metadata is off (boto3, Lance) or at the decoy (obstore), never a
    real address. Once per process; returns the decoy's URL."""
    endpoint = os.environ.get("MEMWAL_TEST_S3_DECOY") or _start_decoy()
    os.environ["MEMWAL_TEST_S3_DECOY"] = endpoint
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ALLOW_HTTP", "AWS_PROFILE"):
        os.environ.pop(k, None)
    os.environ.update({
        "AWS_ENDPOINT": endpoint, "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_METADATA_ENDPOINT": endpoint, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    })
    return endpoint


#: What a positive control removes from S3 storage options (or from a connection: host, login/password).
S3_REMOVALS = {"endpoint": ("aws_endpoint",), "keys": ("aws_access_key_id", "aws_secret_access_key")}
#: How S3 access without the removed part fails: the decoy refuses it, or no credentials are found.
NOT_REACHED = re.compile(r"decoy S3 endpoint|credential", re.IGNORECASE)


def s3_options_without(options: dict[str, str], removed: str) -> dict[str, str]:
    """The storage options with the endpoint or the keys removed (for a positive control)."""
    return {k: v for k, v in options.items() if k not in S3_REMOVALS[removed]}
