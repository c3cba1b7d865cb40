#!/usr/bin/env bash
# `make demo`: write a MemWAL table (with a vector and a text column, indexed) through our writer, then run the
# maintenance jobs on it (merge through spark-submit on local[*]), search it (vector and full text) between merge
# and index catch-up, and show the table before and after.
#
# DEMO_TABLE=PATH writes the table at PATH instead of demo/table.lance. Each run starts afresh by removing
# only what an earlier run wrote: by default the project's demo/ directory; with DEMO_TABLE, PATH, its model
# PATH.model.json and PATH.memwal-demo/ (the demo's marker, holding the table's tables file), and never
# anything else in PATH's directory. A PATH (or PATH.model.json) that exists without that marker is not the
# demo's: the demo stops, names it and deletes nothing.
# `scripts/demo.sh --reset-only` does that first step alone and exits (tests/scripts/test_demo_script.py).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
TABLE="${DEMO_TABLE:-demo/table.lance}"
TABLE="${TABLE%/}"
if [ -z "${DEMO_TABLE:-}" ]; then
    rm -rf demo  # the project's own directory (.gitignore; `make clean` removes it too)
    mkdir -p demo
else
    case "$(basename "$TABLE")" in
        "" | . | .. | /) echo "make demo: DEMO_TABLE=$DEMO_TABLE does not name a table directory" >&2; exit 2 ;;
    esac
    OWN="$TABLE.memwal-demo"
    for p in "$TABLE" "$TABLE.model.json"; do
        if { [ -e "$p" ] || [ -L "$p" ]; } && [ ! -d "$OWN" ]; then
            echo "make demo: DEMO_TABLE: $p exists and was not written by the demo (no $OWN): nothing deleted;" \
                 "remove it yourself or choose another DEMO_TABLE" >&2
            exit 2
        fi
    done
    echo "make demo: removing what an earlier demo run wrote (if any): $TABLE, $TABLE.model.json, $OWN"
    rm -rf "$TABLE" "$TABLE.model.json" "$OWN"
    mkdir -p "$OWN"
fi
if [ "${1:-}" = "--reset-only" ]; then
    exit 0
fi

echo "== 1. writer: a bucket-partitioned table (4 regions) with a vector and a text column (IVF_FLAT and INVERTED"
echo "   indexes, maintained by the MemWAL: each flushed generation carries them), updates and deletes, several generations"
$BIN/python -m memwal.demo write "$TABLE"
echo; echo "== 2. status before maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 3. merge (spark-submit, local[*])"
$BIN/memwal merge "$TABLE" --spark
echo; echo "== 4. search (vector and full text) while the merged generations sit in the index gap (before catch-up)"
$BIN/python -m memwal.demo search "$TABLE"
echo; echo "== 5. index catch-up"
$BIN/memwal catchup "$TABLE"
echo; echo "== 6. snapshot refresh"
$BIN/memwal snapshot "$TABLE"
echo; echo "== 7. compaction (when due), version retention, GC"
echo "   GC keeps what retained table versions (time travel) still need:"
$BIN/memwal gc "$TABLE" --dry-run
$BIN/memwal compaction "$TABLE" --max-small-fragments 4
echo "   the demo table's retention policy (dags/memwal_tables.yaml): versions older than 0 s, keep the newest 2"
$BIN/memwal retention "$TABLE" --older-than-s 0 --keep-versions 2 --dry-run
$BIN/memwal retention "$TABLE" --older-than-s 0 --keep-versions 2
$BIN/memwal gc "$TABLE"
echo; echo "== 8. status after maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 9. check: the LSM view still equals the model of every write"
$BIN/python -m memwal.demo verify "$TABLE"

# --- Airflow (airflow-core): the same maintenance as a DAG, on embedded defaults ---------------------------
# dags/memwal_tables.yaml's `demo` table is this one (demo/table.lance); another DEMO_TABLE gets its own file.
if [ -n "${DEMO_TABLE:-}" ]; then
    export MEMWAL_TABLES_FILE="$OWN/memwal_tables.yaml"
    printf 'tables:\n  demo: {uri: "%s", engine: spark_connect, spark_connect_conn_id: memwal_spark_connect_local, spark_conn_id: memwal_spark_local, max_merge_applications: 2, retention: {older_than_s: 0, keep_versions: 2}, compaction: {max_small_fragments: 4}}\n' \
        "$(cd "$(dirname "$TABLE")" && pwd)/$(basename "$TABLE")" > "$MEMWAL_TABLES_FILE"
fi
echo; echo "== 10. more writes arrive"
$BIN/python scripts/demo_airflow.py write-more "$TABLE"
echo; echo "== 11. region lag before Airflow maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 12. Airflow: memwal_maintenance__demo (SQLite metadata in demo/airflow, Spark local[*], local files)"
$BIN/python scripts/demo_airflow.py maintain
echo; echo "== 13. region lag after Airflow maintenance"
$BIN/memwal status "$TABLE"
echo; echo "== 14. check: the LSM view still equals the model of every write"
$BIN/python -m memwal.demo verify "$TABLE"
