"""The table writer: routes rows to regions by the table's region spec, one RegionWriter per region.

Each region value tuple has its own region, named after the values (memwal.region_ids), so independent
writer processes agree on the region of a key without coordinating, and LanceDB's writer puts a key in the
same region. A table that already has a region under the older region_id_for form keeps writing there.
"""

from __future__ import annotations

import pyarrow as pa

from memwal.errors import MemWalError
from memwal.field_ids import source_names_from_schema
from memwal.mem_wal_index import load_index
from memwal.region_ids import lancedb_shard_id, region_id_for, writer_region_id
from memwal.region_manifest import list_regions
from memwal.region_spec import RegionSpec
from memwal.storage import ObjectStore
from memwal.transforms import route
from memwal.writer import RegionWriter, WriterConfig

__all__ = ["TableWriter", "lancedb_shard_id", "region_id_for", "writer_region_id"]


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
