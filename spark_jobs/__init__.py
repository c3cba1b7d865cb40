"""Spark entry points for the MemWAL background jobs (merge, index catch-up, snapshot refresh, GC,
compaction, retention).

Each job is a thin script run with `spark-submit spark_jobs/<job>.py TABLE [options]`: its `main()` parses
the shared options (`spark_jobs.common`), builds the SparkSession and calls its typed
`run(spark, table, options, regions)`, which calls the library (`memwal.*`); it prints one JSON summary
line on stdout. The Spark Connect engine calls the same `run` with an open handle (`spark_jobs.connect`).
`spark_jobs.submit` builds and runs those spark-submit command lines for the `memwal` CLI and the Airflow
operators. `spark_jobs.submit.SparkSubmitRunner` and `spark_jobs.connect.ConnectRunner` are the runners
`memwal.engines.dispatch` takes (entry point group `memwal.runners`). The library itself never imports
Spark: Spark only supplies hooks such as the merge's parallel dedup (`spark_jobs.merge_dedup`).
"""
