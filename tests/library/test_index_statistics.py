"""memwal.index_statistics: a search plan reads Lance's index statistics without the IVF centroids (megabytes of
JSON per snapshot on a real index), the catch-up's model rebuild with them, whichever came first in the process."""

from __future__ import annotations

import os

import lance
import numpy as np
import pyarrow as pa

from memwal.index_build import vector_model
from memwal.index_statistics import CENTROIDS_VARIABLE, index_statistics
from memwal.reader import LsmReader
from memwal.search_plan import index_partitions, source_index, unindexed_rows
from memwal.vector_search import is_vector_index

from support.tables import PK


def _table(uri: str) -> lance.LanceDataset:
    v = np.random.default_rng(0).standard_normal((600, 16)).astype(np.float32)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata=PK),
                        pa.field("vec", pa.list_(pa.float32(), 16))])
    t = pa.table({"id": pa.array(np.arange(600), pa.int64()),
                  "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 16)}, schema=schema)
    ds = lance.write_dataset(t, uri)
    ds.create_index("vec", "IVF_FLAT", name="vec_idx", num_partitions=2)
    lance.write_dataset(t.slice(0, 50), uri, mode="append")  # 50 rows the index does not cover
    return lance.dataset(uri)


def test_centroids_only_when_asked_in_either_order(tmp_path):
    ds = _table(str(tmp_path / "t.lance"))
    for order in ([False, True, False], [True, False, True]):
        for centroids in order:
            segments = index_statistics(ds, "vec_idx", centroids=centroids)["indices"]
            assert all(("centroids" in s) == centroids for s in segments), f"centroids={centroids} in {order}"
    assert vector_model(ds, "vec_idx")["ivf_centroids"].shape == (2, 16)  # after a call without them


def test_the_search_plan_reads_partitions_and_unindexed_rows_without_centroids(tmp_path, monkeypatch):
    uri = str(tmp_path / "t.lance")
    ds = _table(uri)
    ds.initialize_mem_wal(unsharded=True)
    asked = []
    stats = type(ds.stats)
    real = stats.index_stats
    monkeypatch.setattr(stats, "index_stats",
                        lambda self, name: asked.append(os.environ.get(CENTROIDS_VARIABLE)) or real(self, name))
    reader = LsmReader(uri)
    index = source_index(reader, 0, "vec", is_vector_index)
    assert index_partitions(reader, 0, index) == 2
    assert unindexed_rows(reader, 0, index) == 50
    assert asked == ["false"], asked  # one read per snapshot, without centroids
