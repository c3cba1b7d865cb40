"""Test-only JVM flags: the suite's JVMs live for seconds to minutes on a CPU-bound 2-core machine, so the client
JIT alone (C1) and the serial collector start them faster and cost about a quarter less CPU per spark-submit.
Not a production default: long merges want C2."""

FAST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# A job's own driver and executors, as Spark configuration.
FAST_JVM = {"spark.driver.extraJavaOptions": FAST_JVM_OPTIONS, "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS}
