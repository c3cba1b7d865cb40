"""One small interface over the local filesystem and object stores (obstore).

Contract (the whole MemWAL protocol rests on it):
- `put_if_not_exists` is the compare-and-swap: it either creates the object or raises
  AlreadyExistsError, never overwrites. Region manifests, WAL entries and lock objects are written only
  with it. (On S3 a lost race surfaces as 412 Precondition Failed; both map to AlreadyExistsError.)
  A 412 may also answer the client's own retry of a create that landed but whose answer was lost, so
  a 412 is read back: the object holding exactly our bytes is our create. Every caller therefore writes
  bytes no other writer could write (a region manifest carries a commit token, a lock object its
  owner, a WAL entry its writer's epoch and rows).
- A request the store keeps failing after the client's retries raises ObjectStoreError naming the table,
  operation, object and fault (docs/safety.md: what each path does on each fault).
- `put` overwrites and is used only for best-effort hints (version_hint.json).
- Paths are relative to the table root, with `/` separators.

Table URIs are the ones users give Lance: a plain path, `file://...` or `s3://bucket/prefix`, with the
same storage options (`aws_endpoint`, `aws_access_key_id`, `aws_secret_access_key`, `aws_region`,
`allow_http`, ...), read as Lance reads them (`normalize_uri`: percent escapes decoded, as Lance does).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import obstore
from obstore import exceptions as obx
from obstore.store import LocalStore, S3Store

from memwal.errors import AlreadyExistsError, BadInputError, MemWalError, ObjectStoreError, one_line
from memwal.job_config import is_true

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Storage option keys that obstore takes as client options rather than S3 config.
_CLIENT_OPTION_KEYS = {
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "timeout",
    "pool_idle_timeout",
    "proxy_url",
    "user_agent",
}
# Retry options, under the keys Lance reads them (lance-io), so one set of storage options sets both
# clients' retries: how many retries of a failed request, and for how long (seconds) at most.
RETRY_OPTION_KEYS = {"client_max_retries": "max_retries", "client_retry_timeout": "retry_timeout"}


@dataclass(frozen=True)
class ObjectMeta:
    path: str
    size: int
    last_modified: datetime


def normalize_uri(uri: str) -> str:
    """The table URI as Lance reads it, the one reading every component uses (Lance, obstore, the jobs).

    Lance decodes percent escapes in a `file://` or `s3://` URI (`s3://b/a%20b` is the prefix `a b`) and
    takes a plain path literally; obstore takes a prefix literally. So a `file://` URI becomes its decoded
    absolute path, a plain path an absolute path as written, an `s3://` URI its decoded form. An `s3://`
    URI whose decoded path still holds a `%` is refused (Lance would decode it once more), and so is a URI
    with a query or fragment (`?`, `#`: Lance would not read them as part of the path)."""
    text = str(uri)
    parsed = urlparse(text)
    if parsed.scheme == "":
        return os.path.abspath(text)
    if parsed.query or parsed.fragment or text.endswith(("?", "#")):
        raise BadInputError(f"table URI {text!r}: a '?' or '#' is not part of a table path; percent-encode "
                            "it (%3F, %23) or rename the table's directory")
    if parsed.scheme == "file":
        return os.path.abspath(unquote(parsed.path))
    if parsed.scheme in ("s3", "s3a"):
        path = unquote(parsed.path)
        if "%" in path:
            raise BadInputError(
                f"table URI {text!r}: its path reads as {path!r} once percent-decoded, as Lance reads an s3:// "
                "URI, and still holds a '%' that Lance would decode again; a table path on S3 cannot contain "
                "'%' (rename the prefix)")
        return f"s3://{parsed.netloc}{path}".rstrip("/")
    raise BadInputError(f"unsupported table URI scheme {parsed.scheme!r} in {text!r} (use a path, file:// or s3://)")


def join_uri(uri: str, *parts: str) -> str:
    """The URI of a path below a table, e.g. a generation directory, as Lance opens it."""
    base = normalize_uri(uri).rstrip("/")
    rel = "/".join(p.strip("/") for p in parts if p)
    return f"{base}/{rel}" if rel else base


# What the value of a secret option is named, matched on the key as lower-case words joined by `_`
# (`spark.hadoop.fs.s3a.secret.key` -> `spark_hadoop_fs_s3a_secret_key`, `keyPassword` -> `key_password`).
# It covers every credential key of obstore / Lance (S3, Azure, GCS, with their aliases: the secret access
# key, session token, SSE-C customer key, account / master / SAS keys, client secret, bearer token, the
# service account key and its path) and Spark / Hadoop's (`fs.s3a.access.key`, `fs.azure.account.key.*`,
# `fs.azure.sas.*`, `*.private.key`, `*Password`); tests/library/test_secret_options.py checks it against obstore's.
_SECRET_KEY = re.compile(
    r"secret|passw(or)?d|token(?!_service_url)"  # Azure's fabric_token_service_url is where tokens come from
    r"|(^|_)(access|account|master|sas|customer|encryption|private|api)_key(_|$)"
    r"|(^|_)sas(_|$)"
    r"|(^|_)service_account(_key|_path)?$"
    r"|(^|_)credentials?$"
)


def is_secret_option(key: str) -> bool:
    """Whether a storage option, connection field or Spark conf named `key` holds a secret: never log or
    show its value. Region, endpoint, bucket and the like stay readable."""
    words = re.sub(r"[^a-z0-9]+", "_", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key)).lower())
    return _SECRET_KEY.search(words) is not None


# A URL with credentials in it, anywhere in a value: `scheme://user:password@host...` (a proxy_url, an
# endpoint, `-Dhttp.proxy=...` in Java options); the userinfo ends at the last `@` before the path.
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)@")


def url_credentials(value: str) -> str | None:
    """The first `user:password` of a URL in the value, or None: a secret whatever the key's name."""
    return next((m.group(2) for m in _URL_USERINFO.finditer(str(value)) if ":" in m.group(2)), None)


def redact_value(key: str, value: str) -> str:
    """What may be logged of an option's value: *** for a secret key, else the value with the userinfo of
    every URL in it (`scheme://user:pass@host`) replaced by *** (the rest stays readable)."""
    if is_secret_option(key):
        return "***"
    return _URL_USERINFO.sub(r"\1***@", str(value))


def redact_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Storage options (or Spark confs) as they may be logged (`redact_value` of each)."""
    return {str(k): redact_value(str(k), str(v)) for k, v in (options or {}).items()}


def lance_storage_options(storage_options: dict[str, str] | None) -> dict[str, str] | None:
    """Storage options as Lance takes them (all values strings)."""
    if not storage_options:
        return None
    return {k: str(v) for k, v in storage_options.items()}


class ObjectStore:
    """get / head / list / put_if_not_exists / put / delete under one table root."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri = normalize_uri(uri)
        self.storage_options = dict(storage_options or {})
        self._store = self._open()

    def _open(self) -> Any:
        if not self.uri.startswith("s3://"):
            # A table root that does not exist yet is created on the first write, not by opening:
            # reading a mistyped path must not leave a directory behind.
            return None if not os.path.isdir(self.uri) else LocalStore(self.uri)
        parsed = urlparse(self.uri)
        config: dict[str, Any] = {}
        client: dict[str, Any] = {}
        retry: dict[str, Any] = {}
        for key, value in self.storage_options.items():
            lower = key.lower()
            if lower in _CLIENT_OPTION_KEYS:
                client[lower] = is_true(value) if lower.startswith("allow") else value
            elif lower in RETRY_OPTION_KEYS:
                retry[RETRY_OPTION_KEYS[lower]] = _retry_value(lower, value)
            else:
                config[lower] = str(value)
        try:
            return S3Store(
                parsed.netloc, prefix=parsed.path.strip("/") or None, config=config, client_options=client,
                **({"retry_config": retry} if retry else {}),
            )
        except (obx.UnknownConfigurationKeyError, obx.GenericError, ValueError) as exc:
            raise MemWalError(f"invalid storage options for {self.uri}: {exc}") from exc

    @property
    def _s(self) -> Any:
        if self._store is None:
            if not os.path.isdir(self.uri):
                raise FileNotFoundError(f"{self.uri} does not exist")
            self._store = LocalStore(self.uri)
        return self._store

    def _w(self) -> Any:
        """The store for a write: creates a local table root that does not exist yet."""
        if self._store is None:
            os.makedirs(self.uri, exist_ok=True)
        return self._s

    def _call(self, operation: str, path: str, call: Callable[[], _T]) -> _T:
        """Run one store call; a fault left after the client's retries becomes ObjectStoreError naming the
        table, operation, object and fault. Not-found and precondition answers pass through unchanged."""
        try:
            return call()
        except (FileNotFoundError, obx.NotFoundError, obx.AlreadyExistsError, obx.PreconditionError):
            raise
        except obx.BaseError as exc:
            raise ObjectStoreError(self.uri, operation, path, _fault(exc)) from exc

    def get(self, path: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""
        return bytes(self.get_buffer(path))

    def local_path(self, path: str) -> str | None:
        """The file of object `path` when the table is on a local filesystem (None on S3)."""
        return None if self.uri.startswith("s3://") else os.path.join(self.uri, path)

    def get_buffer(self, path: str) -> Any:
        """The object's bytes as a buffer (the buffer protocol), not copied again into a `bytes`."""
        return self._call("get", path, lambda: obstore.get(self._s, path).bytes())

    def head(self, path: str) -> ObjectMeta | None:
        """The object's metadata, or None if it does not exist."""
        try:
            meta = self._call("head", path, lambda: obstore.head(self._s, path))
        except FileNotFoundError:
            return None
        return ObjectMeta(meta["path"], meta["size"], meta["last_modified"])

    def exists(self, path: str) -> bool:
        return self.head(path) is not None

    def list(self, prefix: str) -> list[ObjectMeta]:
        """Every object below prefix (recursively)."""

        def listing() -> list[ObjectMeta]:
            out: list[ObjectMeta] = []
            for chunk in obstore.list(self._s, prefix.rstrip("/") + "/"):
                out.extend(ObjectMeta(m["path"], m["size"], m["last_modified"]) for m in chunk)
            return out

        try:
            return self._call("list", prefix, listing)
        except FileNotFoundError:
            return []

    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories of prefix."""
        try:
            result = self._call("list", prefix, lambda: obstore.list_with_delimiter(self._s, prefix.rstrip("/") + "/"))
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"])

    def list_files(self, prefix: str) -> list[ObjectMeta]:
        """The objects directly in prefix (not recursive)."""
        try:
            result = self._call("list", prefix, lambda: obstore.list_with_delimiter(self._s, prefix.rstrip("/") + "/"))
        except FileNotFoundError:
            return []
        return [ObjectMeta(m["path"], m["size"], m["last_modified"]) for m in result["objects"]]

    def put_if_not_exists(self, path: str, data: bytes) -> None:
        """Create the object; raise AlreadyExistsError if it exists. Never overwrites.

        When the answer is ambiguous (a 412 that may answer the client's retry of our own landed create,
        or a fault left after the retries), the object is read back: holding exactly `data`, it is ours."""
        try:
            self._call("put", path, lambda: obstore.put(self._w(), path, data, mode="create"))
        except (obx.AlreadyExistsError, obx.PreconditionError) as exc:
            if self._holds(path, data):
                log.info("%s/%s: create answered 'exists' but holds our bytes: our create landed (its answer "
                         "was lost and the client retried)", self.uri, path)
                return
            raise AlreadyExistsError(path) from exc
        except ObjectStoreError as exc:
            try:
                ours = self._holds(path, data)
            except (ObjectStoreError, FileNotFoundError):
                raise exc from None  # still ambiguous: the caller must not assume either way
            if ours:
                log.info("%s/%s: create failed (%s) but the object holds our bytes: it landed", self.uri, path,
                         exc.fault)
                return
            if self.exists(path):
                raise AlreadyExistsError(path) from exc
            raise

    def _holds(self, path: str, data: bytes) -> bool:
        """Whether the object exists and holds exactly `data`."""
        try:
            return self.get(path) == data
        except FileNotFoundError:
            return False

    def put(self, path: str, data: bytes) -> None:
        """Create or overwrite the object (best-effort hints only)."""
        self._call("put", path, lambda: obstore.put(self._w(), path, data))

    def delete(self, path: str) -> None:
        """Delete one object; deleting a missing object is not an error (so neither is a retried delete
        that finds its own first attempt already done)."""
        try:
            self._call("delete", path, lambda: obstore.delete(self._s, path))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object below prefix; returns the bytes removed."""
        removed = 0
        for meta in self.list(prefix):
            self.delete(meta.path)
            removed += meta.size
        if not self.uri.startswith("s3://"):
            _remove_empty_dirs(os.path.join(self.uri, prefix))
        return removed

    def uri_of(self, path: str) -> str:
        return join_uri(self.uri, path)


def _retry_value(key: str, value: object) -> Any:
    """A retry option's value as obstore takes it; BadInputError naming the option when it is not a number."""
    try:
        number = float(str(value))
    except ValueError:
        raise BadInputError(f"storage option {key}={value!r} is not a number") from None
    if number < 0:
        raise BadInputError(f"storage option {key}={value!r} must not be negative")
    return int(number) if key == "client_max_retries" else timedelta(seconds=number)


def _fault(exc: BaseException) -> str:
    """obstore's message without its debug dump, on one line: the request, the retries, the last answer."""
    return one_line(str(exc).split("Debug source:", 1)[0], limit=1500)


def _remove_empty_dirs(root: str) -> None:
    """Local filesystems keep empty directories after their files are deleted; remove them."""
    if not os.path.isdir(root):
        return
    for dirpath, _dirnames, _filenames in os.walk(root, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
