"""Bytes each Spark task of the merge's fragment apply receives, for issue 32's mixed commit: a 3-key region
(inline) and a 60,000-row region (staged) in one commit, the Spark dedup with production `inline_bytes`, the
apply on `local[2]` (scan path, then lookup path). Prints, per task function, the closure every Spark task
deserializes and the largest task pickle (the figures of bench/README.md). Runs on any revision:

    .venv/bin/python bench/merge_task_payload.py
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "plugins"), str(HERE.parent), str(HERE.parent / "tests"),
                str(HERE.parent / "tests" / "spark")]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from spark_helpers import FAST_JVM  # noqa: E402

from memwal import merge_apply  # noqa: E402
from memwal.merge import MergeConfig, merge_table  # noqa: E402
from memwal.storage import ObjectStore  # noqa: E402
from spark_jobs import common  # noqa: E402
from spark_jobs.merge_dedup import spark_dedup  # noqa: E402
from spark_jobs.task_runner import spark_runner  # noqa: E402

from support.maintenance import write_generations  # noqa: E402
from support.tables import create_base, open_base  # noqa: E402


def one(spark, root: str, path: str) -> None:
    loc = SimpleNamespace(uri=f"{root}/{uuid.uuid4().hex}", storage_options=None)
    loc.store = lambda: ObjectStore(loc.uri)
    create_base(loc, ids=range(10_000))
    open_base(loc).initialize_mem_wal(unsharded=True)
    write_generations(loc, str(uuid.uuid4()), [([1, 2, 3], "a", [])])
    write_generations(loc, str(uuid.uuid4()), [(list(range(5_000, 65_000)), "large-region-row-" * 2, [])])
    merge_apply.use_index = lambda ds, keys, pk=(): path == "index"
    real = spark_runner(spark, "payload")

    def runner(fn, tasks):
        from pyspark import cloudpickle

        blobs = [len(pickle.dumps(t)) for t in tasks]
        out = real(fn, tasks)
        stats = getattr(real, "stats", None)  # the closure: its own count, or (before) every pickle in it
        closure = stats["closure_bytes"] if stats else len(cloudpickle.dumps(fn)) + sum(blobs)
        most = closure + max(blobs) if stats else closure  # before, each task's input was its closure
        print(f"{path:5s} {fn.__name__:18s} tasks {len(tasks)}  closure {closure:>9,d} B  "
              f"largest task pickle {max(blobs):>9,d} B  a Spark task receives <= {most:>9,d} B")
        return out

    summary = merge_table(loc.uri, config=MergeConfig(apply="fragments"), dedup=spark_dedup(spark), runner=runner,
                          parallelism=2)
    assert not summary.failed_regions, summary


if __name__ == "__main__":
    spark, _ = common.build_spark("payload", master="local[2]", conf=FAST_JVM)
    with tempfile.TemporaryDirectory() as root:
        for p in ("scan", "index"):
            one(spark, root, p)
    spark.stop()
