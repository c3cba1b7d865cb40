"""Region ids named after region values: the id our TableWriter gives the region of a value tuple.

A region value tuple maps to a region id deterministically, so independent writer processes agree on the
region of a key without coordinating. For the specs LanceDB writes (one bucket, identity or unsharded
field) the id is LanceDB's shard id, so that our writer and LanceDB put a key in the same region; for
other specs it is a UUID v5 of the spec id and values (region_id_for, also the form of older tables).
Both are UUID v5, which a region created by hand (a UUID v4, as the spec says) never is: `named_by_values`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence

import pyarrow as pa

from memwal.region_spec import RegionSpec

__all__ = ["lancedb_shard_id", "named_by_values", "region_id_for", "region_ids_of", "writer_region_id"]

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


def region_ids_of(spec: RegionSpec, values: Sequence[object]) -> set[str]:
    """Every id a region named after this value tuple may have: ours now, and the older region_id_for form."""
    return {writer_region_id(spec, values), region_id_for(spec.spec_id, values)}


def named_by_values(region_id: str) -> bool:
    """Whether the id is of the value-named kind (UUID v5): its values decide which rows belong there."""
    try:
        return uuid.UUID(region_id).version == 5
    except ValueError:
        return False
