#!/usr/bin/env bash
# `make demo`: write a MemWAL table through our writer, then run the maintenance jobs on it
# (merge through spark-submit on local[*]) and show the table before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
TABLE="${DEMO_TABLE:-demo/table.lance}"
rm -rf "$(dirname "$TABLE")"
mkdir -p "$(dirname "$TABLE")"

echo "== 1. writer: a bucket-partitioned table (4 regions), updates and deletes, several generations"
$BIN/python -m memwal.demo write "$TABLE"
echo; echo "== 2. status before maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 3. merge (spark-submit, local[*])"
$BIN/memwal merge "$TABLE" --spark
echo; echo "== 4. index catch-up"
$BIN/memwal catchup "$TABLE"
echo; echo "== 5. snapshot refresh"
$BIN/memwal snapshot "$TABLE"
echo; echo "== 6. compaction (when due), version retention, GC"
echo "   GC keeps what retained table versions (time travel) still need:"
$BIN/memwal gc "$TABLE" --dry-run
$BIN/memwal compaction "$TABLE" --max-small-fragments 4
echo "   the demo table's retention policy (dags/memwal_tables.yaml): versions older than 0 s, keep the newest 2"
$BIN/memwal retention "$TABLE" --older-than-s 0 --keep-versions 2 --dry-run
$BIN/memwal retention "$TABLE" --older-than-s 0 --keep-versions 2
$BIN/memwal gc "$TABLE"
echo; echo "== 7. status after maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 8. check: the LSM view still equals the model of every write"
$BIN/python -m memwal.demo verify "$TABLE"

# --- Airflow (airflow-core): the same maintenance as a DAG, on embedded defaults ---------------------------
# dags/memwal_tables.yaml's `demo` table is this one (demo/table.lance); another DEMO_TABLE gets its own file.
if [ -n "${DEMO_TABLE:-}" ]; then
    export MEMWAL_TABLES_FILE="$(dirname "$TABLE")/memwal_tables.yaml"
    printf 'tables:\n  demo: {uri: "%s", engine: spark, spark_conn_id: memwal_spark_local, max_merge_applications: 2, retention: {older_than_s: 0, keep_versions: 2}, compaction: {max_small_fragments: 4}}\n' \
        "$(cd "$(dirname "$TABLE")" && pwd)/$(basename "$TABLE")" > "$MEMWAL_TABLES_FILE"
fi
echo; echo "== 9. more writes arrive"
$BIN/python scripts/demo_airflow.py write-more "$TABLE"
echo; echo "== 10. region lag before Airflow maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 11. Airflow: memwal_maintenance__demo (SQLite metadata in demo/airflow, Spark local[*], local files)"
$BIN/python scripts/demo_airflow.py maintain
echo; echo "== 12. region lag after Airflow maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 13. check: the LSM view still equals the model of every write"
$BIN/python -m memwal.demo verify "$TABLE"
