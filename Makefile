# The two front-door commands: `make demo` and `make test`. Both build .venv from requirements.txt
# when it is missing or stale and generate the protobuf code from protos/.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_OUT := plugins/memwal/_proto
PROTOS := $(wildcard protos/*.proto)
PROTO_GEN := $(patsubst protos/%.proto,$(PROTO_OUT)/%_pb2.py,$(PROTOS))
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup proto test lint demo bench bench-merge clean

setup: $(STAMP) $(PROTO_GEN)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

$(PROTO_OUT)/%_pb2.py: protos/%.proto $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) $<

proto: $(PROTO_GEN)

lint: setup
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: setup
	bash scripts/demo.sh

bench: setup
	$(BIN)/python bench/writer.py

bench-merge: setup
	$(BIN)/python bench/merge.py

clean:
	rm -rf $(VENV) $(PROTO_GEN) demo
