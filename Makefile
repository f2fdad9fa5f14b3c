# aistack: `make setup` prepares everything, `make test` runs the tests,
# both from nothing on a fresh machine. Every step is idempotent and quick
# when nothing changed.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
UV := $(or $(shell command -v uv 2>/dev/null),$(HOME)/.local/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
# Optional dependency groups installed by `make setup` (see pyproject.toml).
# GPU=1: TensorFlow's CUDA build (tensorflow[and-cuda]) instead of
# tensorflow-cpu for the trainer and the model server; PyPI's Linux torch is
# the CUDA build either way.
GPU ?=
FRAMEWORKS := $(if $(filter-out 0,$(GPU)),trainer-gpu model-gpu,trainer model)
EXTRAS ?= dev ingest transform monitor tuner tuner-gp $(FRAMEWORKS) client dashboard report bench docs
STAMPS := .setup-stamps
PROTOS := $(shell find proto -name '*.proto')

.PHONY: help demo setup system-deps venv proto native bytecode jars test test-unit test-integration lint bench gpu-check docs docs-serve infra-up infra-down clean

help:
	@echo "make demo     set up, then run the whole stack end to end (DEMO_ARGS=--keep leaves it up)"
	@echo "make setup    virtualenv, dependencies, generated code, Kafka's jars, redis-server"
	@echo "make test     set up, then run every test (unit + integration on a real Kafka and Redis; TEST_WORKERS=2 processes)"
	@echo "make lint     ruff and mypy"
	@echo "make bench    benchmarks against their peers, then one table of every figure (needs: aistack infra up; PROFILE=1: py-spy profiles into bench/out/)"
	@echo "make gpu-check  every training strategy on this machine's GPUs (GPU=1 for TensorFlow's CUDA build)"
	@echo "make docs     the documentation site (docs/, MkDocs) into site/; make docs-serve serves it while you edit"
	@echo "make proto    regenerate shared/contracts from proto/"

setup: system-deps venv proto native jars bytecode

# Java 17 (Kafka's broker, Spark; the JDK compiles svc_transform's functions),
# Maven (fetches the jars once), redis-server and gcc (svc_ingest's C path):
# installed from Debian's packages where we can, else one line says how.
system-deps:
	@missing=""; \
	command -v javac >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then \
	    echo "installing$$missing (sudo)"; \
	    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing; install them with your package manager" >&2; exit 1; \
	  fi; \
	fi
	@# Chromium, headless, for the tests that look at the report and the dashboards
	@# in a real browser; without it they skip, saying so.
	@if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	      || echo "chromium could not be installed: the browser tests will skip" >&2; \
	  elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then \
	    echo "installing chromium (sudo)"; \
	    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	      || echo "chromium could not be installed: the browser tests will skip" >&2; \
	  else \
	    echo "no chromium: the browser tests will skip (install Debian's chromium to run them)" >&2; \
	  fi; \
	fi

$(UV):
	$(PYTHON) -m pip install --quiet --user uv==$(UV_VERSION) \
	  || $(PYTHON) -m pip install --quiet --user --break-system-packages uv==$(UV_VERSION)

# Bytecode compiled once, here: where PYTHONDONTWRITEBYTECODE is set (this
# build machine sets it) nothing else writes it, and every process then
# compiled each module it imported (importing sklearn, torch and optuna took
# 6.0 s, 2.6 s with the venv compiled). uv compiles the venv; compileall the
# project's own code, generated contracts included.
venv: | $(UV)
	@UV_PYTHON_DOWNLOADS=never $(UV) sync --quiet --frozen --compile-bytecode --python $(PYTHON) $(addprefix --extra ,$(EXTRAS))

# svc_ingest's compiled paths: the common sensor reading (svc_ingest/sensor_bytes.py)
# and the dedup window's index of ids (svc_ingest/id_index.py); each rebuilt
# when its source is newer.
native: | venv
	@$(PY) -m svc_ingest.sensor_bytes_build

bytecode: proto
	@$(PY) -m compileall -q -j 0 shared aistack compose demo loadgen bench $(wildcard svc_*)

proto: $(STAMPS)/proto

$(STAMPS)/proto: $(PROTOS) shared/contracts/codegen.py uv.lock | venv
	$(PY) -m shared.contracts.codegen
	@mkdir -p $(STAMPS) && touch $@

# The Kafka broker's jars, then svc_transform's own build (svc_transform/jars.py:
# its Spark connectors and JVM functions), into the cache directory.
jars: | venv
	@$(VENV)/bin/aistack infra fetch

# The README's main command: the whole stack on this machine, end to end.
demo: setup
	$(VENV)/bin/aistack demo $(DEMO_ARGS)

# The test files run on TEST_WORKERS processes (pytest-xdist), a file at a
# time on one (its module fixtures, a Spark session or a stack, start once);
# each process starts its own Kafka, Redis and object store. Most tests wait
# on servers and JVMs more than they compute: on 2 cores, 2 processes took
# the suite from 33.5 to 22.7 minutes; 3 took 34.2 minutes against 2's 33.5
# (docs/tests.md). TEST_WORKERS=0 runs it in one.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest $(PYTEST_PARALLEL)

test-unit: setup
	$(PY) -m pytest tests/unit

test-integration: setup
	$(PY) -m pytest $(PYTEST_PARALLEL) tests/integration

# mypy's cache lives in the cache directory, not the checkout: a clean clone
# (CI's) checked in 97 s with a cold cache and in 15 s with one another
# checkout left (it rereads sources whose times changed, by their hashes).
MYPY_CACHE = $${AISTACK_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/aistack}/mypy

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --cache-dir "$(MYPY_CACHE)" shared aistack compose demo loadgen svc_ingest svc_transform svc_tuner svc_trainer svc_model svc_score svc_monitor bench

# Every strategy on the GPUs, and the trainer against a plain loop; on a
# machine without a GPU it says so and exits 0.
gpu-check: setup
	$(PY) -m bench.trainer_gpu

bench: setup
	$(PY) -m bench.all $(if $(PROFILE),--profile)

# The documentation site: docs/ into site/, strict (a broken link or a page
# missing from the nav fails the build; --quiet would hide what strict counts).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup
	$(VENV)/bin/mkdocs serve

infra-up: setup
	$(VENV)/bin/aistack infra up

infra-down:
	$(VENV)/bin/aistack infra down

clean:
	rm -rf $(VENV) $(STAMPS) shared/contracts/aistack shared/contracts/inference shared/contracts/*.binpb
