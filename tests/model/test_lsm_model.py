"""Model-based test of writer, fencing, merge, catch-up, snapshot refresh, GC and both LSM readers against
a plain dict of acknowledged writes (see machine.py for the rules and what is checked).

The number of sequences can be raised for a longer local run: MEMWAL_MODEL_EXAMPLES=2000 (or use
scripts/soak.py, which runs the same machine with random seeds for a given time).
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from machine import local_machine, s3_machine
from vector_machine import local_vector_machine

LOCAL_EXAMPLES = int(os.environ.get("MEMWAL_MODEL_EXAMPLES", "40"))
LOCAL_STEPS = 15
VECTOR_EXAMPLES = int(os.environ.get("MEMWAL_MODEL_VECTOR_EXAMPLES", "7"))
S3_EXAMPLES = 4
S3_STEPS = 10
COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "print_blob": True,
}


def _report(machine, label: str, steps: int, started: float, record_property, capsys) -> int:
    n = machine.stats["sequences"]
    detail = ", ".join(f"{k}={v}" for k, v in sorted(machine.stats.items()) if k != "sequences")
    line = f"[memwal model {label}] {n} sequences (<= {steps} steps) in {time.monotonic() - started:.1f}s; {detail}"
    record_property("sequences", n)
    record_property("summary", line)
    with capsys.disabled():
        print("\n" + line)
    return n


def test_lsm_model_local(tmp_path, record_property, capsys):
    machine = local_machine(str(tmp_path))
    started = time.monotonic()
    run_state_machine_as_test(
        machine, settings=settings(max_examples=LOCAL_EXAMPLES, stateful_step_count=LOCAL_STEPS, **COMMON))
    assert _report(machine, "local", LOCAL_STEPS, started, record_property, capsys) >= LOCAL_EXAMPLES


def test_lsm_model_vector_local(tmp_path, record_property, capsys):
    """The same machine on a table with IVF_PQ and FTS indexes: Lance's searches equal the model after every
    step (vector_machine.py)."""
    machine = local_vector_machine(str(tmp_path))
    started = time.monotonic()
    run_state_machine_as_test(
        machine, settings=settings(max_examples=VECTOR_EXAMPLES, stateful_step_count=LOCAL_STEPS, **COMMON))
    assert _report(machine, "vector", LOCAL_STEPS, started, record_property, capsys) >= VECTOR_EXAMPLES


APPLY_EXAMPLES = int(os.environ.get("MEMWAL_MODEL_APPLY_EXAMPLES", "14"))


def test_lsm_model_local_fragment_apply(tmp_path, monkeypatch, record_property, capsys):
    """The same machine with every merge applied fragment by fragment (memwal.merge_apply), its tasks
    pickled as on executors: the model, hence the two-pass merge's result, on every sequence."""
    from support.apply_runner import use_fragment_apply

    use_fragment_apply(monkeypatch)
    machine = local_machine(str(tmp_path))
    started = time.monotonic()
    run_state_machine_as_test(
        machine, settings=settings(max_examples=APPLY_EXAMPLES, stateful_step_count=LOCAL_STEPS, **COMMON))
    assert _report(machine, "local, fragment apply", LOCAL_STEPS, started, record_property, capsys) >= APPLY_EXAMPLES


@pytest.mark.s3
def test_lsm_model_s3(s3_location, record_property, capsys):
    machine = s3_machine(s3_location.uri, s3_location.storage_options)
    started = time.monotonic()
    run_state_machine_as_test(
        machine, settings=settings(max_examples=S3_EXAMPLES, stateful_step_count=S3_STEPS, **COMMON))
    assert _report(machine, "s3", S3_STEPS, started, record_property, capsys) >= S3_EXAMPLES
