"""Parse the DAG folder with Airflow's DagBag and report, as one JSON line (last stdout line): import errors,
warnings, per-file parse time, the DAGs and their tasks, and Params validation of the given run confs.

    python tests/airflow/dag_probe.py '[["memwal_merge", {"table": "t1"}], ...]'
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import warnings


def main() -> int:
    confs = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
    from airflow.dag_processing.dagbag import DagBag

    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    total = time.monotonic() - started
    ours = [w for w in caught if "/dags/" in str(w.filename) or "memwal" in str(w.filename)]
    checks = []
    for dag_id, conf in confs:
        params = copy.deepcopy(bag.dags[dag_id].params)
        try:
            for key, value in conf.items():
                params[key] = value
            resolved = params.validate()
            checks.append({"dag": dag_id, "conf": conf, "ok": True, "resolved": resolved})
        except Exception as exc:
            checks.append({"dag": dag_id, "conf": conf, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    out = {
        "import_errors": bag.import_errors,
        "captured_warnings": {k: list(v) for k, v in bag.captured_warnings.items()},
        "python_warnings": [f"{w.filename}:{w.lineno}: {w.message}" for w in ours],
        "parse_s": {os.path.basename(s.file): s.duration.total_seconds() if hasattr(s.duration, "total_seconds")
                    else float(s.duration) for s in bag.dagbag_stats},
        "total_s": total,
        "dags": {d.dag_id: {"tasks": sorted(t.task_id for t in d.tasks), "fileloc": d.fileloc,
                            "max_active_runs": d.max_active_runs, "params": sorted(d.params),
                            "pools": sorted({t.pool for t in d.tasks}),
                            "timetable": type(d.timetable).__name__}
                 for d in bag.dags.values()},
        "params": checks,
    }
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
