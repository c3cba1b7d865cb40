"""The table writer: routes rows to regions by the table's region spec, one RegionWriter per region.

A region value tuple maps to a region id deterministically, so independent writer processes agree on the
region of a key without coordinating. For the specs LanceDB writes (one bucket, identity or unsharded
field) the id is LanceDB's shard id, so that our writer and LanceDB put a key in the same region; for
other specs it is a UUID v5 of the spec id and values (region_id_for). A table that already has a region
under the region_id_for form keeps writing there.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence

import pyarrow as pa

from memwal.errors import MemWalError
from memwal.field_ids import source_names_from_schema
from memwal.mem_wal_index import load_index
from memwal.region_manifest import list_regions
from memwal.region_spec import RegionSpec
from memwal.storage import ObjectStore
from memwal.transforms import route
from memwal.writer import RegionWriter, WriterConfig

__all__ = ["TableWriter", "lancedb_shard_id", "region_id_for", "writer_region_id"]

_NAMESPACE = uuid.UUID("6f1d8a52-5d0e-4c1e-9a8e-6d656d77616c")
# LanceDB 0.40 names a shard UUID v5(namespace "LSMWRITE_SHARD01", name) (measured on its files).
_LANCEDB_NAMESPACE = uuid.UUID(bytes=b"LSMWRITE_SHARD01")


def region_id_for(spec_id: int, values: Sequence[object]) -> str:
    """The region id of a region value tuple under a spec LanceDB does not write (and of older tables)."""
    return str(uuid.uuid5(_NAMESPACE, f"{spec_id}/{json.dumps(list(values), default=str)}"))


def _identity_bytes(result_type: str, value: object) -> bytes | None:
    """The bytes LanceDB hashes for an identity value: UTF-8 of a string, little-endian at the integer
    type's width; None for other types (LanceDB refuses them as shard keys) and NULL (it refuses those)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            t = pa.type_for_alias(result_type)
        except (ValueError, KeyError):
            return None
        if pa.types.is_integer(t):
            return value.to_bytes(t.bit_width // 8, "little", signed=pa.types.is_signed_integer(t))
    return None


def lancedb_shard_id(spec: RegionSpec, values: Sequence[object]) -> str | None:
    """LanceDB's shard id for a region value tuple: `bucket-{b}`, `identity-` + the value's bytes or
    `unsharded`; None when the spec is not one LanceDB writes."""
    if len(spec.fields) != 1 or len(values) != 1:
        return None
    fld, value = spec.fields[0], values[0]
    if fld.transform == "unsharded":
        name = b"unsharded"
    elif fld.transform == "bucket" and isinstance(value, int):
        name = f"bucket-{value}".encode()
    elif fld.transform == "identity" and (raw := _identity_bytes(fld.result_type, value)) is not None:
        name = b"identity-" + raw
    else:
        return None
    return str(uuid.UUID(bytes=hashlib.sha1(_LANCEDB_NAMESPACE.bytes + name).digest()[:16], version=5))


def writer_region_id(spec: RegionSpec, values: Sequence[object]) -> str:
    """The region id our writer uses: LanceDB's shard id where LanceDB has one, else region_id_for."""
    return lancedb_shard_id(spec, values) or region_id_for(spec.spec_id, values)


class TableWriter:
    """Writes to every region of a table; close() flushes and releases all region writers."""

    def __init__(self, table_uri: str, *, storage_options: dict[str, str] | None = None,
                 config: WriterConfig | None = None):
        self.table_uri = table_uri
        self.storage_options = storage_options
        self.config = config
        details = load_index(table_uri, storage_options).details
        if not details.newest_region_spec_id:
            raise MemWalError(f"table {table_uri} has no region spec: use RegionWriter with explicit regions")
        self.spec: RegionSpec = details.region_spec(details.newest_region_spec_id)
        self.writers: dict[str, RegionWriter] = {}
        self._names: dict[int, str] | None = None
        self._existing = set(list_regions(ObjectStore(table_uri, storage_options)))

    def _writer(self, values: tuple) -> RegionWriter:
        legacy = region_id_for(self.spec.spec_id, values)
        region_id = legacy if legacy in self._existing else writer_region_id(self.spec, values)
        if region_id not in self.writers:
            self.writers[region_id] = RegionWriter(
                self.table_uri, region_id, storage_options=self.storage_options, config=self.config,
                region_spec_id=self.spec.spec_id,
            )
        return self.writers[region_id]

    def _route(self, table: pa.Table) -> dict[tuple, pa.Table]:
        if self._names is None:
            self._names = source_names_from_schema(next(iter(self.writers.values())).schema if self.writers
                                                   else _base_schema(self.table_uri, self.storage_options))
        return route(self.spec, table, self._names)

    def put(self, data: pa.Table) -> None:
        for values, part in self._route(data).items():
            self._writer(values).put(part)

    def delete(self, keys: pa.Table) -> None:
        for values, part in self._route(keys).items():
            self._writer(values).delete(part)

    def flush(self) -> None:
        for w in self.writers.values():
            w.flush()

    def close(self) -> None:
        for w in self.writers.values():
            w.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


def _base_schema(uri: str, storage_options: dict[str, str] | None) -> pa.Schema:
    import lance

    from memwal.storage import lance_storage_options

    return lance.dataset(uri, storage_options=lance_storage_options(storage_options)).schema
