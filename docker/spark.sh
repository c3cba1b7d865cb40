#!/usr/bin/env bash
# Run a Spark standalone master or worker from the pyspark distribution of this image (the Spark version
# pinned in requirements.txt): `spark.sh master` or `spark.sh worker spark://spark-master:7077`.
set -euo pipefail
SPARK_HOME="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_NO_DAEMONIZE=1
case "${1:-}" in
  master) exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host 0.0.0.0 --port 7077 --webui-port 8081 ;;
  worker) exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
            --cores "${SPARK_WORKER_CORES:-2}" --memory "${SPARK_WORKER_MEMORY:-2g}" --webui-port 8082 "$2" ;;
  *) echo "usage: spark.sh master | worker MASTER_URL" >&2; exit 2 ;;
esac
