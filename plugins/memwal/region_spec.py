"""Region specs (memwal-spec.txt "Region Spec"): the spec model (fields, transforms and their
parameters), validated and converted to and from protobuf. Evaluating a spec is `memwal.transforms`; its
bucket hash `memwal.murmur3`; region pruning `memwal.pruning`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memwal._proto import memwal_pb2
from memwal.errors import RegionSpecError
from memwal.naming import REGION_FIELD_PREFIX

DATE_PARTS = ("year", "month", "day", "hour")
# "unsharded" is not in the spec: Lance core writes it for initialize_mem_wal(unsharded=True); every row -> 0.
TRANSFORMS = frozenset({"identity", *DATE_PARTS, "bucket", "multi_bucket", "truncate", "unsharded"})
INT32_RESULT = frozenset({*DATE_PARTS, "bucket", "multi_bucket", "unsharded"})
_NUM_BUCKETS = "num_buckets"
_WIDTH = "width"
# Lance core: a non-blank `column` parameter names the batch column directly, overriding source_ids.
_COLUMN = "column"
I32_MAX = 2**31 - 1
_U32 = 0xFFFFFFFF


def _positive_int_param(field_id: str, transform: str, params: Mapping[str, str], name: str) -> int:
    """A parameter parsed as Lance core parses num_buckets (Rust `str::parse::<i32>`), required > 0."""
    if name not in params:
        raise RegionSpecError(f"region field {field_id!r}: transform {transform!r} needs parameter {name!r}")
    raw = params[name]
    if not re.fullmatch(r"[+-]?[0-9]+", raw or ""):
        raise RegionSpecError(
            f"region field {field_id!r}: parameter {name!r} of transform {transform!r} is not an integer: "
            f"{raw!r}"
        )
    value = int(raw)
    if value <= 0 or value > I32_MAX:
        raise RegionSpecError(
            f"region field {field_id!r}: parameter {name!r} of transform {transform!r} must be a positive "
            f"32-bit integer, got {raw!r}"
        )
    return value


@dataclass(frozen=True)
class RegionField:
    """One region field: a transform (or a DataFusion SQL expression) over source fields, by field id."""

    field_id: str
    source_ids: tuple[int, ...]
    transform: str | None
    expression: str | None
    result_type: str
    parameters: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source_ids", tuple(int(s) for s in self.source_ids))
        object.__setattr__(self, "parameters", {str(k): str(v) for k, v in dict(self.parameters).items()})
        self.validate()

    def __hash__(self) -> int:
        return hash(
            (
                self.field_id,
                self.source_ids,
                self.transform,
                self.expression,
                self.result_type,
                tuple(sorted(self.parameters.items())),
            )
        )

    def validate(self) -> None:
        """Raise RegionSpecError unless the field is well formed (evaluability is checked by evaluate)."""
        fid = self.field_id
        if not isinstance(fid, str) or not fid:
            raise RegionSpecError(f"region field has an empty or non-string field_id: {fid!r}")
        if (self.transform is None) == (self.expression is None):
            raise RegionSpecError(
                f"region field {fid!r}: exactly one of transform / expression must be set "
                f"(transform={self.transform!r}, expression={self.expression!r})"
            )
        if self.expression is not None:
            if not self.expression.strip():
                raise RegionSpecError(f"region field {fid!r}: empty expression")
            return
        if self.transform not in TRANSFORMS:
            raise RegionSpecError(
                f"region field {fid!r}: unknown transform {self.transform!r} (known: {sorted(TRANSFORMS)})"
            )
        if self.transform in ("bucket", "multi_bucket"):
            _positive_int_param(fid, self.transform, self.parameters, _NUM_BUCKETS)
        elif self.transform == "truncate":
            _positive_int_param(fid, self.transform, self.parameters, _WIDTH)
        if self.transform != "unsharded" and not self.source_ids and not self._column_param():
            raise RegionSpecError(f"region field {fid!r}: transform {self.transform!r} needs source_ids")

    def _column_param(self) -> str | None:
        col = self.parameters.get(_COLUMN, "")
        return col if col.strip() and self.transform not in ("multi_bucket", "unsharded") else None

    @property
    def num_buckets(self) -> int:
        return _positive_int_param(self.field_id, str(self.transform), self.parameters, _NUM_BUCKETS)

    @property
    def width(self) -> int:
        return _positive_int_param(self.field_id, str(self.transform), self.parameters, _WIDTH)

    @property
    def column_name(self) -> str:
        """Name of this field's column in evaluate's output: region_field_{field_id}."""
        return f"{REGION_FIELD_PREFIX}{self.field_id}"

    def to_proto(self) -> memwal_pb2.RegionField:
        msg = memwal_pb2.RegionField(
            field_id=self.field_id, source_ids=list(self.source_ids), result_type=self.result_type
        )
        if self.transform is not None:
            msg.transform = self.transform
        if self.expression is not None:
            msg.expression = self.expression
        msg.parameters.update(self.parameters)
        return msg

    @classmethod
    def from_proto(cls, msg: memwal_pb2.RegionField) -> RegionField:
        return cls(
            field_id=msg.field_id,
            source_ids=tuple(msg.source_ids),
            transform=msg.transform if msg.HasField("transform") else None,
            expression=msg.expression if msg.HasField("expression") else None,
            result_type=msg.result_type,
            parameters=dict(msg.parameters),
        )

    def to_lance_dict(self) -> dict[str, Any]:
        return {
            "field_id": self.field_id,
            "source_ids": list(self.source_ids),
            "transform": self.transform,
            "expression": self.expression,
            "result_type": self.result_type,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_lance_dict(cls, d: Mapping[str, Any]) -> RegionField:
        return cls(
            field_id=d["field_id"],
            source_ids=tuple(d.get("source_ids") or ()),
            transform=d.get("transform"),
            expression=d.get("expression"),
            result_type=d.get("result_type") or "",
            parameters=dict(d.get("parameters") or {}),
        )


@dataclass(frozen=True)
class RegionSpec:
    """How rows map to regions: a spec id (>= 1; 0 means "manual region, no spec") and its fields."""

    spec_id: int
    fields: tuple[RegionField, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.spec_id, int) or not 1 <= self.spec_id <= _U32:
            raise RegionSpecError(f"region spec id must be an integer in [1, 2^32), got {self.spec_id!r}")
        seen: set[str] = set()
        for f in self.fields:
            if not isinstance(f, RegionField):
                raise RegionSpecError(f"region spec {self.spec_id}: {f!r} is not a RegionField")
            if f.field_id in seen:
                raise RegionSpecError(f"region spec {self.spec_id}: duplicate field_id {f.field_id!r}")
            seen.add(f.field_id)

    def to_proto(self) -> memwal_pb2.RegionSpec:
        return memwal_pb2.RegionSpec(spec_id=self.spec_id, fields=[f.to_proto() for f in self.fields])

    @classmethod
    def from_proto(cls, msg: memwal_pb2.RegionSpec) -> RegionSpec:
        return cls(spec_id=msg.spec_id, fields=tuple(RegionField.from_proto(f) for f in msg.fields))

    def to_lance_dict(self) -> dict[str, Any]:
        """The dict `lance.mem_wal.evaluate_sharding_spec` accepts (every key present, as it requires)."""
        return {"spec_id": self.spec_id, "fields": [f.to_lance_dict() for f in self.fields]}

    @classmethod
    def from_lance_dict(cls, d: Mapping[str, Any]) -> RegionSpec:
        """From one entry of `LanceDataset.mem_wal_index_details()["sharding_specs"]`."""
        fields = tuple(RegionField.from_lance_dict(f) for f in d["fields"])
        return cls(spec_id=int(d["spec_id"]), fields=fields)
