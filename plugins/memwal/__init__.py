"""MemWAL maintenance library: the spec core (storage, region manifests, WAL, MemWAL index, region
specs), the writer, the LSM reader and the background jobs (merge, index catch-up, snapshot refresh, GC).

Importing this package is cheap and has no side effects, so Airflow's plugin loader can scan it.
"""
