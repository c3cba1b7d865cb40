"""Every path, suffix and metadata key of the MemWAL storage layout, in one place.

Layout under a base table (memwal-spec.txt, Storage Layout):
    _mem_wal/{region_id}/manifest/{bit_reversed_version}.binpb, version_hint.json
    _mem_wal/{region_id}/wal/{bit_reversed_position}.arrow
    _mem_wal/{region_id}/{8 hex}_gen_{generation}/      a Lance table (flushed MemTable)
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable

MEM_WAL_DIR = "_mem_wal"
STAGING_DIR = f"{MEM_WAL_DIR}/_staging"  # scratch files of merges (dedup, apply); GC removes abandoned ones
MANIFEST_DIR = "manifest"
WAL_DIR = "wal"
VERSION_HINT = "version_hint.json"
MANIFEST_SUFFIX = ".binpb"
# The spec's prose says .lance in one place and .arrow in its example; Lance core writes .arrow.
WAL_SUFFIX = ".arrow"
PK_INDEX_DIR = "_pk_index"
BLOOM_FILTER_FILE = "bloom_filter.bin"  # a generation's key bloom filter (memwal.bloom_filter)
FLUSH_FAILURE_FILE = "flush_failure.json"  # ours, not the spec's: why a region's writer cannot flush

MEM_WAL_INDEX_NAME = "__lance_mem_wal"
MEM_WAL_DETAILS_TYPE_URL = "/lance.table.MemWalIndexDetails"

TOMBSTONE_COLUMN = "_tombstone"
WRITER_EPOCH_KEY = b"writer_epoch"
GENERATION_KEY = b"generation"
PRIMARY_KEY_METADATA = b"lance-schema:unenforced-primary-key"
# LanceDB marks its key with the position alone (memwal.primary_key has the rule).
PRIMARY_KEY_POSITION_METADATA = b"lance-schema:unenforced-primary-key:position"
REGION_FIELD_PREFIX = "region_field_"

_BITS = 64
_GEN_DIR_RE = re.compile(r"^([0-9a-f]{8})_gen_([1-9][0-9]*)$")


def bit_reversed_name(n: int) -> str:
    """The 64-character binary name of n with its bits reversed (5 -> '101000...0')."""
    if not 0 <= n < 1 << _BITS:
        raise ValueError(f"{n} is not an unsigned 64-bit integer")
    return format(n, f"0{_BITS}b")[::-1]


def parse_bit_reversed_name(name: str) -> int:
    """Inverse of bit_reversed_name; accepts the name with or without its suffix."""
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    if len(stem) != _BITS or set(stem) - {"0", "1"}:
        raise ValueError(f"{name!r} is not a bit-reversed 64-bit name")
    return int(stem[::-1], 2)


def list_bit_reversed(objects: Iterable[object], suffix: str) -> list[int]:
    """The numbers behind the bit-reversed names with this suffix among listed objects, ascending."""
    numbers = []
    for meta in objects:
        path = meta.path
        if path.endswith(suffix):
            try:
                numbers.append(parse_bit_reversed_name(path))
            except ValueError:
                continue
    return sorted(numbers)


def region_dir(region_id: str) -> str:
    return f"{MEM_WAL_DIR}/{region_id}"


def flush_failure_path(region_id: str) -> str:
    return f"{region_dir(region_id)}/{FLUSH_FAILURE_FILE}"


def manifest_dir(region_id: str) -> str:
    return f"{region_dir(region_id)}/{MANIFEST_DIR}"


def manifest_path(region_id: str, version: int) -> str:
    return f"{manifest_dir(region_id)}/{bit_reversed_name(version)}{MANIFEST_SUFFIX}"


def version_hint_path(region_id: str) -> str:
    return f"{manifest_dir(region_id)}/{VERSION_HINT}"


def wal_dir(region_id: str) -> str:
    return f"{region_dir(region_id)}/{WAL_DIR}"


def wal_entry_path(region_id: str, position: int) -> str:
    return f"{wal_dir(region_id)}/{bit_reversed_name(position)}{WAL_SUFFIX}"


def new_generation_dir_name(generation: int) -> str:
    """A fresh `{8 random hex}_gen_{generation}` name; a retried flush gets a different one."""
    if generation < 1:
        raise ValueError(f"generation must be >= 1, got {generation}")
    return f"{secrets.token_hex(4)}_gen_{generation}"


def parse_generation_dir_name(name: str) -> int | None:
    """The generation of a `{8 hex}_gen_{i}` directory name, or None if the name is not one."""
    m = _GEN_DIR_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(2)) if m else None


def generation_dir(region_id: str, dir_name: str) -> str:
    return f"{region_dir(region_id)}/{dir_name}"
