"""The wheel installed the way a data-platform engineer adds it to their own Airflow, with nothing from this
checkout on the path:

- `python -m build` on a copy of the files a fresh clone has (git's tracked and not-ignored files), so a
  generated file that is not committed, or a package left out of pyproject.toml, shows up here;
- a fresh venv with nothing but `pip install memwal_platform-*.whl[airflow,spark] -c requirements.txt`
  (venv without pip of its own, installed by this venv's pip with --python, and --no-compile: the same
  packages, faster), run with a clean environment (no PYTHONPATH, no VIRTUAL_ENV, no AIRFLOW_*/PYSPARK_*);
- the `memwal` command, Airflow's provider and connection-type listings, the repository's dags/ parsed with
  an empty plugins folder, and a maintenance DAG's `dag.test()` on a Spark standalone cluster whose
  executors run a Python without memwal (tests/support/python_envs.py): the code reaches them with --py-files.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from memwal.reader import LsmReader

from support.jvm import FAST_JVM_OPTIONS
from support.maintenance import build_table
from support.python_envs import imports, python_without_memwal
from support.tables import open_base, sorted_rows

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from e2e_support import SparkStandalone  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DIST_NAME = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
EXTRAS = "airflow,spark"
DAG_RUNNER = REPO / "tests" / "airflow" / "dag_runner.py"
DAG_PROBE = REPO / "tests" / "airflow" / "dag_probe.py"
SPARK_CONN = "memwal_spark_cluster"
TIMEOUT_S = 900


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """A login-like environment for `venv`: its bin first on PATH, pip's settings (how this machine reaches
    its index), and nothing of this venv, this checkout, Airflow or Spark."""
    env = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "TZ") if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    return {**env, **extra}


def run(cmd: list, env: dict[str, str], cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def last_json(stdout: str):
    """The last stdout line that is JSON (Airflow may print warnings before it)."""
    for line in reversed(stdout.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON line in:\n{stdout[-3000:]}")


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and wheel of `python -m build` on the files of a fresh clone (the build backend pinned in
    requirements.txt, no build isolation: nothing downloaded, the same artifacts)."""
    root = tmp_path_factory.mktemp("build")
    src = root / "src"
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        path = REPO / rel
        if path.is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(path.read_bytes())
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", src], clean_env(root), root)
    wheels, sdists = list((root / "dist").glob("*.whl")), list((root / "dist").glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list((root / "dist").iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel and its extras installed, constrained by requirements.txt."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], clean_env(venv), root)
    run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet", "--no-compile",
         f"{dist['wheel']}[{EXTRAS}]", "-c", REPO / "requirements.txt"], clean_env(venv), root)
    return venv


@pytest.fixture(scope="module")
def airflow_home(venv, tmp_path_factory) -> dict[str, str]:
    """The environment of a migrated Airflow home (SQLite) with this repository's dags/ as DAG folder and an
    empty plugins folder."""
    root = tmp_path_factory.mktemp("airflow")
    (root / "plugins").mkdir()
    env = clean_env(venv, AIRFLOW_HOME=str(root / "home"),
                    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{root}/home/airflow.db",
                    AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"), AIRFLOW__CORE__PLUGINS_FOLDER=str(root / "plugins"),
                    AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__CORE__UNIT_TEST_MODE="False")
    run([venv / "bin" / "airflow", "db", "migrate"], env, root)
    return env


def test_the_wheel_declares_its_dependencies_and_carries_the_generated_code(dist):
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        info = f"{DIST_NAME.replace('-', '_')}-{VERSION}.dist-info"
        meta = Parser().parsestr(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert {"memwal/_proto/memwal_pb2.py", "memwal/jobs.py", "memwal/airflow/hooks/memwal.py",
            "memwal/airflow/ui/templates/page.html", "spark_jobs/merge.py", "spark_jobs/log4j2.properties"} <= names
    assert "provider_info = memwal.airflow:get_provider_info" in entry_points
    assert "memwal = memwal.cli:main" in entry_points
    assert not DIST_NAME.startswith("apache-airflow-providers-"), "that prefix is the Airflow community's"
    requires = meta.get_all("Requires-Dist")
    assert sorted(meta.get_all("Provides-Extra")) == sorted(EXTRAS.split(","))
    declared = {_dist_key(r.split(";")[0]) for r in requires}
    # Every third-party module the library and the jobs import comes from a declared distribution (or from
    # Airflow itself, declared by the airflow extra: its web stack serves the MemWAL page).
    with_airflow = {_dist_key(d) for d in ("fastapi", "jinja2", "sqlalchemy", "apache-airflow-core",
                                           "apache-airflow-task-sdk")}
    providers = metadata.packages_distributions()
    for module in sorted(_third_party_imports()):
        # a lone extension module (siphash24's .so) is in no package map: its distribution bears its name
        dists = {_dist_key(d) for d in providers.get(module, [module])}
        assert dists & (declared | with_airflow), f"`import {module}` ({dists or 'unknown'}) is not declared"
    assert not [r for r in requires if "==" in r.split(";")[0]], f"ranges, not pins (requirements.txt pins): {requires}"
    with tarfile.open(dist["sdist"]) as sdist:
        members = {m.split("/", 1)[1] for m in sdist.getnames() if "/" in m}
    assert {"protos/memwal.proto", "plugins/memwal/_proto/memwal_pb2.py", "pyproject.toml"} <= members


def test_memwal_command_and_package_come_from_the_wheel(venv, tmp_path):
    env = clean_env(venv)
    out = run([venv / "bin" / "memwal", "--help"], env, tmp_path).stdout
    assert "merge" in out and "status" in out
    where = run([venv / "bin" / "python", "-c", "import memwal, spark_jobs, memwal._proto.memwal_pb2 as pb; "
                 "print(memwal.__file__); print(spark_jobs.__file__); print(pb.__file__)"], env, tmp_path).stdout
    site = run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env,
               tmp_path).stdout.strip()
    for line in where.split():
        assert line.startswith(site + "/"), f"{line} is not from the fresh venv's site-packages {site}"
    assert not list(Path(site).glob("__editable__*")), "the fresh venv must not see this checkout"


def test_airflow_lists_the_provider_and_the_memwal_connection_type(venv, airflow_home, tmp_path):
    providers = last_json(run([venv / "bin" / "airflow", "providers", "list", "-o", "json"], airflow_home,
                              tmp_path).stdout)
    ours = [p for p in providers if p["package_name"] == DIST_NAME]
    assert len(ours) == 1 and ours[0]["version"] == VERSION, providers
    hooks = last_json(run([venv / "bin" / "airflow", "providers", "hooks", "-o", "json"], airflow_home,
                          tmp_path).stdout)
    memwal = [h for h in hooks if h.get("connection_type") == "memwal"]
    assert memwal and memwal[0]["class"] == "memwal.airflow.hooks.memwal.MemWalHook", hooks
    assert memwal[0]["package_name"] == DIST_NAME


def test_the_repository_dags_parse_without_plugins_on_the_path(venv, airflow_home, tmp_path):
    """No MEMWAL_TABLES_FILE: the tables file is memwal_tables.yaml in the DAG folder (the installed default)."""
    report = last_json(run([venv / "bin" / "python", DAG_PROBE], airflow_home, tmp_path).stdout)
    assert report["import_errors"] == {}, report["import_errors"]
    dags = set(report["dags"])
    assert {"memwal_merge", "memwal_backfill", "memwal_lag_monitor"} <= dags, dags
    tables = yaml.safe_load((REPO / "dags" / "memwal_tables.yaml").read_text())["tables"]
    assert {f"memwal_maintenance__{t}" for t in tables} <= dags, dags


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark"), cores=1, memory="1g").start()
    try:
        cluster.wait_alive()
        yield cluster
    finally:
        cluster.stop()


def test_a_maintenance_dag_runs_on_spark_with_the_code_shipped_to_the_executors(venv, airflow_home, spark_cluster,
                                                                                local_location, tmp_path):
    worker_python = python_without_memwal(tmp_path / "worker-python")
    assert imports(worker_python, "lance", tmp_path), "the executors' Python has the dependencies"
    assert not imports(worker_python, "memwal", tmp_path), "control: the executors' Python has no memwal"

    loc = local_location
    regions = build_table(loc, regions=2, generations=3)
    expected = sorted_rows(LsmReader(loc.uri).scan())
    spark_conf = {"spark.pyspark.python": str(worker_python), "spark.driver.host": "127.0.0.1",
                  "spark.driver.extraJavaOptions": FAST_JVM_OPTIONS,
                  "spark.executor.extraJavaOptions": FAST_JVM_OPTIONS,
                  "spark.executor.memory": "512m", "spark.cores.max": "1", "spark.ui.enabled": "false"}
    tables = {"tables": {"shipped": {"uri": loc.uri, "engine": "spark", "spark_conn_id": SPARK_CONN,
                                     "spark_conf": spark_conf, "schedule": None, "max_merge_applications": 1}}}
    tables_file = tmp_path / "memwal_tables.yaml"
    tables_file.write_text(yaml.safe_dump(tables))
    conn = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": spark_cluster.port})
    env = {**airflow_home, "MEMWAL_TABLES_FILE": str(tables_file), f"AIRFLOW_CONN_{SPARK_CONN.upper()}": conn}

    proc = run([venv / "bin" / "python", DAG_RUNNER, "memwal_maintenance__shipped"], env, tmp_path)
    report = last_json(proc.stdout)
    log = proc.stdout + proc.stderr
    assert report["state"] == "success", f"{report}\n{log[-6000:]}"
    states = {(t["task_id"], t["map_index"]): t["state"] for t in report["tasks"]}
    assert set(states.values()) == {"success"} and ("merge", 0) in states, states
    merged = [x["value"] for x in report["xcoms"] if x["task_id"] == "merge" and x["key"] == "return_value"]
    assert merged and merged[0]["spark_application_id"].startswith("app-"), merged
    assert sorted(r["region_id"] for r in merged[0]["regions"] if r["generations"]) == sorted(regions), merged
    assert "--py-files" in log, "the Spark provider's command ships the code"
    assert sorted_rows(open_base(loc).to_table()) == expected, "the base table holds what the LSM view showed"


def _dist_key(name: str) -> str:
    return name.strip().split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip().lower() \
        .replace("_", "-")


def _third_party_imports() -> set[str]:
    """Top-level modules imported by plugins/memwal and spark_jobs that are neither stdlib nor ours."""
    ours = {"memwal", "spark_jobs"}
    found: set[str] = set()
    for root in (REPO / "plugins" / "memwal", REPO / "spark_jobs"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ours and m != "__future__"}
