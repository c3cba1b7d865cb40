"""moto's S3 server with S3's conditional writes made atomic: the tests' S3 endpoint (tests/conftest.py).

moto checks `If-None-Match: *` (and `If-Match`) and then stores the object as two steps of a threaded server,
so two concurrent create-if-absent PUTs of one key can both succeed; real S3 lets exactly one win. The MemWAL
index lock and Lance's commits rest on that guarantee, and the race tests (tests/concurrency) hit the window on
a loaded machine. One lock around each request that changes a key restores it. `start()` runs it as a child
process (`python atomic_moto.py -H 127.0.0.1 -p PORT`, as moto_server is run)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping

# For tests/library/test_conditional_writes.py only: a pause between moto's condition check and its store (so
# racing writers are certain to meet in that window) and, as its control, the server without the lock.
PAUSE_ENV, UNLOCKED_ENV = "ATOMIC_MOTO_PAUSE_S", "ATOMIC_MOTO_UNLOCKED"


def start(port: int, env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server on 127.0.0.1:port; return the process and its endpoint once it answers."""
    proc = subprocess.Popen([sys.executable, __file__, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)


def _patch() -> None:
    from moto.s3.models import S3Backend
    from moto.s3.responses import S3Response

    writes = threading.Lock()

    def atomic(method):
        @functools.wraps(method)
        def locked(*args, **kwargs):
            with writes:
                return method(*args, **kwargs)

        return locked

    def paused(method, pause_s: float):
        @functools.wraps(method)
        def later(*args, **kwargs):
            time.sleep(pause_s)
            return method(*args, **kwargs)

        return later

    # PUT (with its conditions), POST (a multipart upload's completion, If-None-Match too) and DELETE of a key.
    if os.environ.get(UNLOCKED_ENV) != "1":
        for name in ("put_object", "_key_response_post", "delete_object"):
            setattr(S3Response, name, atomic(getattr(S3Response, name)))
    if pause_s := float(os.environ.get(PAUSE_ENV, "0")):
        S3Backend.put_object = paused(S3Backend.put_object, pause_s)


if __name__ == "__main__":
    _patch()
    from moto.server import main

    sys.exit(main())
