"""docker-compose.yaml checked without a container engine: every service, volume, mount and image, the Spark
version against requirements.txt, connections pointing at compose services, and the mounted DAG folder
loading (DagBag) with the compose environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
DOCKERFILE = REPO / "docker" / "Dockerfile"
SERVICES = {"postgres", "minio", "minio-init", "airflow-init", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "spark-master", "spark-worker", "spark-connect"}
AIRFLOW_SERVICES = {"airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer"}
AIRFLOW_COMMANDS = {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                    "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$\$")


def interpolate(value, env: dict[str, str]):
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, $$ (a literal $), recursively."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), {})


def pinned(name: str) -> str:
    """The version pinned in requirements.txt for a package."""
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}(\[[^]]*\])?==([^\s#]+)", line.strip())
        if m:
            return m.group(2)
    raise AssertionError(f"{name} is not pinned in requirements.txt")


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def project_image(compose: dict) -> str:
    return compose["services"]["airflow-apiserver"]["image"]


def test_every_service_is_there(compose):
    assert set(compose["services"]) == SERVICES
    for name, command in AIRFLOW_COMMANDS.items():
        assert compose["services"][name]["command"] == command, f"{name} must run `airflow {command}`"
    init = "\n".join(compose["services"]["airflow-init"]["command"])
    assert "airflow db migrate" in init and "memwal-demo-table --if-missing" in init
    assert "mc mb --ignore-existing memwal/memwal" in compose["services"]["minio-init"]["command"][0], \
        "MinIO's bucket must be created at start"


def test_every_image_is_pinned(compose):
    for name, service in compose["services"].items():
        image = service.get("image")
        assert image, f"service {name} names no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and "/" not in tag, f"service {name}: image {image!r} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"service {name}: image {image!r} is not pinned"
    base = re.search(r"^ARG AIRFLOW_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)
    assert base.startswith(f"apache/airflow:{pinned('apache-airflow')}-"), base
    assert re.search(r"^FROM \$\{AIRFLOW_IMAGE\}$", DOCKERFILE.read_text(), re.M)


def test_the_airflow_image_is_built_from_this_project(compose):
    text = DOCKERFILE.read_text()
    assert "openjdk-17-jre-headless" in text, "spark-submit needs a Java runtime"
    assert "pip install --no-cache-dir -r /opt/airflow/requirements.txt" in text
    for src in ("requirements.txt", "pyproject.toml", "protos", "plugins", "spark_jobs", "docker/spark.sh",
                "docker/write_demo_table.py"):
        assert re.search(rf"^COPY .*\b{re.escape(src)} ", text, re.M), f"the image must copy {src}"
        assert (REPO / src).exists()
    for name in AIRFLOW_SERVICES:
        service = compose["services"][name]
        assert service["build"] == {"context": ".", "dockerfile": "docker/Dockerfile"}
        assert service["image"] == project_image(compose)


def test_the_image_installs_the_project_from_what_it_copies(tmp_path):
    """The Dockerfile's `pip install -e /opt/airflow` builds from the files its COPY lines put there (the
    editable build of the same backend, on a copy of exactly those files)."""
    from build import ProjectBuilder

    opt = tmp_path / "opt"
    for line in DOCKERFILE.read_text().splitlines():
        words = [w for w in line.split()[1:] if not w.startswith("--")] if line.startswith("COPY ") else []
        if not words or not words[-1].startswith("/opt/airflow"):
            continue
        *sources, dest = words
        for src in sources:
            target = opt / dest.lstrip("/") / Path(src).name if dest.endswith("/") or len(sources) > 1 \
                else opt / dest.lstrip("/")
            if (REPO / src).is_dir():
                shutil.copytree(REPO / src, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / src, target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = ProjectBuilder(opt / "opt" / "airflow").build("editable", tmp_path / "out")
    assert Path(built).name.startswith("memwal_platform-"), built
    missing = [str(w.message) for w in caught if "cannot be found" in str(w.message)]
    assert not missing, f"the image does not copy what pyproject.toml names: {missing}"


def test_spark_is_the_pinned_pyspark(compose):
    version = pinned("pyspark")
    import pyspark

    assert pyspark.__version__ == version, "the venv's pyspark differs from requirements.txt"
    for name in ("spark-master", "spark-worker"):
        service = compose["services"][name]
        # The Spark daemons run from the pyspark distribution of the project image (docker/spark.sh), so
        # master, worker, driver and executors are one Spark version: the pinned pyspark.
        assert service["image"] == project_image(compose), f"{name} must run the project image"
        assert service["entrypoint"][0] == "memwal-spark"
        assert env_of(service)["SPARK_VERSION"] == version, f"{name}: SPARK_VERSION != pinned pyspark {version}"
    script = (REPO / "docker" / "spark.sh").read_text()
    assert "import os, pyspark" in script and "org.apache.spark.deploy.master.Master" in script
    assert compose["services"]["spark-worker"]["entrypoint"][2] == "spark://spark-master:7077"


def test_volumes_and_mounts(compose):
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in compose["services"].items():
        for mount in service.get("volumes") or []:
            source, target = mount.split(":")[:2]
            assert target.startswith("/"), f"{name}: {mount}"
            if source.startswith((".", "/")):
                assert (REPO / source).resolve().exists(), f"{name}: bind mount source {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {declared - used}"
    mounts = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["airflow-scheduler"]["volumes"]}
    for folder in ("dags", "plugins", "spark_jobs"):
        assert mounts[f"/opt/airflow/{folder}"] == f"./{folder}", f"{folder}/ must be mounted"
    worker = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["spark-worker"]["volumes"]}
    assert worker["/opt/airflow/plugins"] == "./plugins", "executors import memwal from the mounted plugins/"


def _ports(service: dict) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in service.get("ports") or []}


def test_connections_point_at_compose_services(compose):
    services = compose["services"]
    env = env_of(services["airflow-scheduler"])
    for name in AIRFLOW_SERVICES:
        assert {k: v for k, v in env_of(services[name]).items() if k.startswith("AIRFLOW")} .items() >= \
            {k: v for k, v in env.items() if k.startswith("AIRFLOW_CONN_")}.items(), f"{name} lacks a connection"

    db = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    pg = env_of(services["postgres"])
    assert (db.hostname, db.port, db.path.strip("/")) == ("postgres", 5432, pg["POSTGRES_DB"])
    assert (db.username, db.password) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])

    s3 = json.loads(env["AIRFLOW_CONN_MEMWAL_MINIO"])
    minio = env_of(services["minio"])
    endpoint = urlsplit(s3["host"])
    assert s3["conn_type"] == "memwal" and endpoint.hostname == "minio" and endpoint.port in _ports(services["minio"])
    assert (s3["login"], s3["password"]) == (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    assert s3["extra"]["allow_http"] is True

    spark = json.loads(env["AIRFLOW_CONN_SPARK_COMPOSE"])
    assert spark["conn_type"] == "spark" and spark["host"] == "spark://spark-master" and spark["port"] == 7077
    assert services["spark-master"]["hostname"] == "spark-master"
    connect = json.loads(env["AIRFLOW_CONN_SPARK_CONNECT_COMPOSE"])
    assert connect["conn_type"] == "spark_connect" and connect["host"] == "spark-connect"
    assert services["spark-connect"]["hostname"] == "spark-connect" and connect["port"] == 15002
    assert services["spark-connect"]["entrypoint"] == ["memwal-spark", "connect", "spark://spark-master:7077"]

    execution = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert execution.hostname == "airflow-apiserver" and execution.port in _ports(services["airflow-apiserver"])
    assert services["airflow-scheduler"]["hostname"] == "airflow-scheduler"


def test_tables_file_uses_the_defined_connections(compose):
    from memwal.airflow.config import parse_tables

    env = env_of(compose["services"]["airflow-scheduler"])
    mounts = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["airflow-scheduler"]["volumes"]}
    host_file = REPO / mounts[env["MEMWAL_TABLES_FILE"]]
    good, bad = parse_tables(yaml.safe_load(host_file.read_text()), str(host_file), host_file.parent)
    assert not bad and good
    conns = {k.removeprefix("AIRFLOW_CONN_").lower() for k in env if k.startswith("AIRFLOW_CONN_")}
    for cfg in good.values():
        assert cfg.conn_id in conns and cfg.spark_conn_id in conns, cfg.name
        assert cfg.engine != "spark_connect" or cfg.spark_connect_conn_id in conns, cfg.name
        assert cfg.uri.startswith("s3://memwal/"), "compose tables live in the MinIO bucket created at start"
        assert cfg.spark_conf.get("spark.driver.host") == "airflow-scheduler"


def test_mounted_dag_folder_loads_with_the_compose_environment(compose, tmp_path):
    """DagBag over dags/ with the compose services' environment (container paths mapped to the repository)."""
    service = compose["services"]["airflow-scheduler"]
    mounts = {m.split(":")[1]: str((REPO / m.split(":")[0]).resolve())
              for m in service["volumes"] if m.split(":")[0].startswith(".")}

    def to_host(value: str) -> str:
        for target, source in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if value == target or value.startswith(target + "/"):
                return source + value[len(target):]
        return value

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MEMWAL_"))}
    env.update({k: to_host(v) for k, v in env_of(service).items()})
    env.update({"AIRFLOW_HOME": str(tmp_path),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db",
                "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"})
    code = ("import json, sys; from airflow.dag_processing.dagbag import DagBag; b = DagBag(dag_folder=sys.argv[1]); "
            "from memwal.airflow.config import load_tables; "
            "print(json.dumps({'errors': {k: str(v) for k, v in b.import_errors.items()}, "
            "'dag_ids': sorted(b.dag_ids), 'uris': {n: t.uri for n, t in load_tables(False).items()}}))")
    out = subprocess.run([sys.executable, "-c", code, env["AIRFLOW__CORE__DAGS_FOLDER"]], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert {"memwal_maintenance__demo", "memwal_merge", "memwal_backfill", "memwal_lag_monitor"} <= \
        set(result["dag_ids"]), result["dag_ids"]
    assert result["uris"] == {"demo": "s3://memwal/demo.lance"}, "the DAGs must see the compose tables file"


@pytest.mark.s3
def test_init_writes_the_demo_table_with_the_compose_connection(compose, s3_endpoint, tmp_path):
    """airflow-init's `memwal-demo-table --if-missing` on S3 (moto standing in for MinIO), with the compose
    connection and tables file; a second run leaves the table alone."""
    import boto3

    from memwal.status import table_status
    from memwal.table import MemWalTable

    env_c = env_of(compose["services"]["airflow-init"])
    conn = json.loads(env_c["AIRFLOW_CONN_MEMWAL_MINIO"])
    conn["host"] = s3_endpoint  # minio:9000 -> the moto server on loopback
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id=conn["login"],
                 aws_secret_access_key=conn["password"], region_name="us-east-1").create_bucket(Bucket="memwal")
    mounts = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["airflow-init"]["volumes"]}
    # Without the AWS_* variables the session fixture exports: the connection alone must carry the options.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW_CONN_MEMWAL_MINIO": json.dumps(conn),
                "MEMWAL_TABLES_FILE": str(REPO / mounts[env_c["MEMWAL_TABLES_FILE"]])})
    script = [sys.executable, str(REPO / "docker" / "write_demo_table.py"), "--if-missing",
              "--base-rows", "1000", "--batches", "2", "--batch-rows", "200"]
    first = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "wrote s3://memwal/demo.lance" in first.stdout
    options = {"aws_endpoint": s3_endpoint, "aws_access_key_id": conn["login"],
               "aws_secret_access_key": conn["password"], "aws_region": "us-east-1", "allow_http": "true"}
    status = table_status(MemWalTable("s3://memwal/demo.lance", options)).to_dict()
    assert status["num_regions"] == 4 and status["unmerged_generations"] > 0
    second = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "exists" in second.stdout, second.stderr[-3000:]
    assert table_status(MemWalTable("s3://memwal/demo.lance", options)).table_version == status["table_version"]
