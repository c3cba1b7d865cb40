"""Arrow types across Spark for the merge's Spark dedup: the Spark type that carries each Arrow type without
loss (wider where Spark lacks one: uint64 as DECIMAL(20,0), fixed-size lists as arrays; cast back on the
executors), the exact Arrow schema Spark expects back from `mapInArrow`, and a generation's rows shaped for
the shuffle (`rows_struct`, `conform`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from memwal import naming
from memwal.dedup import GEN_COLUMN, ROWADDR_COLUMN
from memwal.errors import MemWalError

__all__ = ["arrow_schema", "conform", "rows_struct", "spark_type", "struct"]


def spark_type(t: pa.DataType):
    """The Spark type that carries an Arrow type without loss (cast back on the executors)."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StructField,
        StructType,
    )

    wider = {pa.uint8(): ShortType(), pa.uint16(): IntegerType(), pa.uint32(): LongType(),
             pa.uint64(): DecimalType(20, 0), pa.float16(): FloatType()}
    if t in wider:
        return wider[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return ArrayType(spark_type(t.value_type), containsNull=True)
    if pa.types.is_struct(t):
        return StructType([StructField(f.name, spark_type(f.type), nullable=True) for f in t])
    if pa.types.is_map(t):
        return MapType(spark_type(t.key_type), spark_type(t.item_type), valueContainsNull=True)
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    return from_arrow_type(t)


def struct(fields: Sequence[tuple[str, object]]):
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, typ, nullable=True) for name, typ in fields])


def arrow_schema(spark, spark_struct) -> pa.Schema:
    """The exact Arrow schema Spark expects back from mapInArrow for this struct (Spark does not cast:
    an int64 column declared INT fails deep in the JVM)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false").lower() == "true"
    tz = spark.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(spark_struct, timezone=tz, prefers_large_types=large)


def rows_struct(schema: pa.Schema):
    from pyspark.sql.types import BooleanType, LongType

    fields = []
    for f in schema:
        if f.name == naming.TOMBSTONE_COLUMN:
            continue
        try:
            fields.append((f.name, spark_type(f.type)))
        except Exception as exc:
            raise MemWalError(
                f"column {f.name!r} of type {f.type} cannot go through Spark ({exc}); use the local merge"
            ) from exc
    fields += [(naming.TOMBSTONE_COLUMN, BooleanType()), (GEN_COLUMN, LongType()), (ROWADDR_COLUMN, LongType())]
    return struct(fields)


def conform(batch: pa.RecordBatch, generation: int, target: pa.Schema) -> pa.RecordBatch:
    """A generation's batch (with `_rowaddr`) in the Spark-side row schema; missing columns are NULL."""
    n = batch.num_rows
    names = batch.schema.names
    columns = []
    for f in target:
        if f.name == GEN_COLUMN:
            columns.append(pa.array(np.full(n, generation, np.int64)))
        elif f.name == ROWADDR_COLUMN:
            columns.append(batch.column("_rowaddr").cast(pa.int64()))
        elif f.name in names:
            columns.append(batch.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)
