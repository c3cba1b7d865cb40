"""Spark entry points for the MemWAL background jobs (merge, index catch-up, snapshot refresh, GC).

Each job is a thin script run with `spark-submit spark_jobs/<job>.py TABLE [options]`: it parses the
shared options (`spark_jobs.common`), builds the SparkSession, calls the library (`memwal.*`) and prints
one JSON summary line on stdout. `spark_jobs.submit` builds and runs those spark-submit command lines
for the `memwal` CLI and the Airflow operators. The library itself never imports Spark: Spark only
supplies hooks such as the merge's parallel dedup (`spark_jobs.merge_dedup`).
"""
