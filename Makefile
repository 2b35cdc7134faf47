# engram: the two entry points of the README, and what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 3
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

COMPILED := $(VENV)/.compiled-stamp

.PHONY: demo test test-kafka test-crash lint bench clean

# The dependencies, with the package installed in place (editable) as plain Python.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	ENGRAM_PURE_PYTHON=1 $(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The fold's modules and the wire codec compiled by mypyc (setup.py, about one minute
# on 2 cores), again whenever one of them changes: an extension left older than its
# source would run the old code (tests/unit/test_compiled_fold.py fails if one is).
$(COMPILED): $(STAMP) setup.py $(wildcard processors/*.py) schemas/wire.py schemas/uuids.py \
		schemas/reader.py schemas/_bare.c schemas/_avro.c processors/_text.c \
		processors/_summary.c processors/_ids.c
	@echo "== compiling the fold and the wire codec with mypyc (setup.py)"
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(COMPILED)

## Set everything up and run the demo on the embedded stack.
demo: $(COMPILED)
	$(BIN)/engram demo

## Set everything up and run lint, types and every test (on the embedded Tansu broker),
## then the integration tests again on Apache Kafka. Three pytest workers (PYTEST_WORKERS)
## on two cores, each test file on one of them: most integration tests wait on
## subprocesses (the integration and end-to-end tests took 420 s on three workers and
## about 530 s on two). The files go out longest first, by the seconds their tests took
## in the runs before (tests/conftest.py, LongestFilesFirst; xdist's own order, by number
## of tests, left the slow files of one or two tests for last), or in a fresh clone by the
## seconds committed in tests/durations.json (python -m tests.durations). Each pass ends with its
## 15 slowest tests, so a slow CI machine shows where the time goes.
test: $(COMPILED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	ENGRAM_TEST_BROKER=tansu $(BIN)/pytest -q $(PARALLEL)
	@$(MAKE) --no-print-directory test-kafka

## The integration tests that use the session broker (marker `broker`, set by
## tests/conftest.py), on Apache Kafka (jars from Maven Central, see ops/kafka/); the
## others do not change with the broker and ran in the first pass. Skipped, saying why,
## where Java >= 17 or Maven is missing (`python -m ops.kafka --check` exits 3).
test-kafka: $(COMPILED)
	@status=0; reason=$$($(BIN)/python -m ops.kafka --check) || status=$$?; \
	if [ $$status -eq 3 ]; then \
		echo "SKIPPED the integration tests on Apache Kafka: $$reason"; \
	elif [ $$status -ne 0 ]; then \
		echo "python -m ops.kafka --check failed ($$status): $$reason"; exit $$status; \
	else \
		echo "== the integration tests again, on Apache Kafka (ENGRAM_TEST_BROKER=kafka)"; \
		ENGRAM_TEST_BROKER=kafka $(BIN)/pytest -q $(PARALLEL) -m broker tests/integration; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

## The ingest benchmark (see BENCHMARKS.md).
bench: $(COMPILED)
	$(BIN)/python -m ops.bench.ingest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build *.so processors/*.so schemas/*.so

## kill -9 crash tests on Apache Kafka (marker `crash`, about 3 minutes: left out of
## `make test` to keep it short; `python -m ops.crash --points 20` is the long version).
test-crash: $(COMPILED)
	$(BIN)/pytest -q -m crash tests/integration/test_crash.py
