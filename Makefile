# The two front-door commands: `make demo` and `make test`. Both build .venv from requirements.txt
# when it is missing or stale. The protobuf code (plugins/memwal/_proto) is checked in, so a wheel needs no
# protoc: `make proto` regenerates it after a change to protos/ (tests/library/test_proto_code.py checks it matches).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_OUT := plugins/memwal/_proto
PROTOS := $(wildcard protos/*.proto)
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup proto dist test test-fast lint demo bench bench-merge clean

# Both cores (pytest-xdist --dist loadgroup): the tests sharing a server or a session's Spark run in order in
# their xdist_group on one worker (tests/conftest.py), the rest spread over the others. `make test` has one worker
# more than cores: the real Airflow's e2e module (mostly waiting on its servers) holds one for about half the
# run. TEST_WORKERS=1 runs the suite in one process. `make test-fast` is the inner loop: the suite on
# local files without the S3, Spark, Airflow, model, crash/race and end-to-end tiers (docs/testing.md).
TEST_WORKERS ?= 3
FAST_WORKERS ?= 2
xdist = $(if $(filter-out 1,$(1)),-n $(1) --dist loadgroup --no-loadscope-reorder,-p no:xdist)
FAST := not slow and not spark and not model and not airflow and not s3

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt 'moto[server]'
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) $(PROTOS)

# The wheel and sdist of "Install into your Airflow" (README), in dist/.
dist: $(STAMP)
	$(BIN)/python -m build --outdir dist .

lint: setup
	$(BIN)/ruff check .

# One pass: each module of the server tier (a real Airflow on PostgreSQL, the wheel installs: tests that build on
# one another's state) is an xdist group ("server-<module>"), run in order on one worker beside the rest.
test: setup lint
	$(BIN)/python -m pytest $(call xdist,$(TEST_WORKERS)) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest $(call xdist,$(FAST_WORKERS)) -m "$(FAST)" $(PYTEST_ARGS)

demo: setup
	bash scripts/demo.sh

bench: setup
	$(BIN)/python bench/writer.py

bench-merge: setup
	$(BIN)/python bench/merge.py

# Issue 10: the merge of 1/16/64 regions in process and on Spark, scaling, and bench/merge.py; every ratio.
.PHONY: bench-maintenance
bench-maintenance: setup
	$(BIN)/python bench/maintenance.py

# Issue 17: one commit of a fixed backlog into bases of 1M, 8M and 32M rows; ours against today's single commit.
.PHONY: bench-merge-scale
bench-merge-scale: setup
	$(BIN)/python bench/merge_scale.py

# Issue 16: 40 cycles of writes + the maintenance jobs with retention and compaction on and off, compaction
# on Spark against in process, and issue 10's scaling on a task-heavy workload (bench/README.md).
# Issue 25: per-job overhead on each engine, a small table's run, a fleet's wall/CPU, freshness (bench/README.md).
.PHONY: bench-engines
bench-engines: setup
	$(BIN)/python bench/engines.py

.PHONY: bench-health
bench-health: setup
	$(BIN)/python bench/health.py --scaling

# Issue 24: index catch-up (IVF_PQ and FTS) in process and with segments built on Spark (local[1], local[2],
# a standalone 2 x 1-core cluster): times, local[2]/local[1], recall@10, driver peak RSS (bench/README.md).
.PHONY: bench-index
bench-index: setup
	$(BIN)/python bench/index.py --rss-check

clean:
	rm -rf $(VENV) demo dist build

# --- Operators' view (issue 9): the browser the MemWAL page test drives, and a local Airflow in one command.
.PHONY: browser airflow

# Debian's chromium for tests/ui/test_browser.py (driven by Playwright with executable_path, never
# `playwright install`). Installed when run as root; otherwise the browser test skips and says why.
browser:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	else echo "make browser: /usr/bin/chromium is missing and this is not root: the browser test will skip"; fi

test: browser

# A local Airflow (api-server, scheduler, dag-processor, triggerer; PostgreSQL on 127.0.0.1:5432 when it
# answers, else SQLite) with the demo table written; prints the URL and logins; Ctrl-C stops it all.
airflow: setup
	$(BIN)/python scripts/make_airflow.py

# --- End to end on a real Airflow (issue 8): tests/e2e (Airflow + PostgreSQL or SQLite + Spark standalone + moto).
.PHONY: e2e
e2e: setup
	$(BIN)/python -m pytest tests/e2e -q -rs $(PYTEST_ARGS)
