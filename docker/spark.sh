#!/usr/bin/env bash
# Run a Spark standalone master or worker from the pyspark distribution of this image (the Spark version
# pinned in requirements.txt): `spark.sh master`, `spark.sh worker spark://spark-master:7077`, or
# `spark.sh connect spark://spark-master:7077`: a Spark Connect server (port 15002) whose executors run on
# that cluster (the Connect jar ships in pyspark/jars; clients ship our code as session artifacts).
set -euo pipefail
SPARK_HOME="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
export SPARK_HOME SPARK_NO_DAEMONIZE=1
case "${1:-}" in
  master) exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
            --host 0.0.0.0 --port 7077 --webui-port 8081 ;;
  worker) exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
            --cores "${SPARK_WORKER_CORES:-2}" --memory "${SPARK_WORKER_MEMORY:-2g}" --webui-port 8082 "$2" ;;
  connect) JAR="$(ls "$SPARK_HOME"/jars/spark-connect_*.jar | head -n 1)"
          exec "$SPARK_HOME/bin/spark-submit" --master "$2" --name memwal-spark-connect \
            --class org.apache.spark.sql.connect.service.SparkConnectServer \
            --conf spark.connect.grpc.binding.address=0.0.0.0 --conf spark.connect.grpc.binding.port=15002 \
            --conf spark.driver.host="${SPARK_DRIVER_HOST:-spark-connect}" --conf spark.driver.bindAddress=0.0.0.0 \
            --conf spark.pyspark.python=python --conf spark.cores.max="${SPARK_CONNECT_CORES:-2}" "$JAR" ;;
  *) echo "usage: spark.sh master | worker MASTER_URL | connect MASTER_URL" >&2; exit 2 ;;
esac
