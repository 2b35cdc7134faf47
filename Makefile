# engram: the two entry points of the README, and what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 3
PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

.PHONY: demo test test-kafka test-crash lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Set everything up and run the demo on the embedded stack.
demo: $(STAMP)
	$(BIN)/engram demo

## Set everything up and run lint, types and every test (on the embedded Tansu broker),
## then the integration tests again on Apache Kafka. Three pytest workers (PYTEST_WORKERS)
## on two cores, each test file on one of them: most integration tests wait on
## subprocesses (the integration and end-to-end tests took 420 s on three workers and
## about 530 s on two). The files go out longest first, by the seconds their tests took
## in the runs before (tests/conftest.py, LongestFilesFirst; xdist's own order, by number
## of tests, left the slow files of one or two tests for last). Each pass ends with its
## 15 slowest tests, so a slow CI machine shows where the time goes.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	ENGRAM_TEST_BROKER=tansu $(BIN)/pytest -q $(PARALLEL)
	@$(MAKE) --no-print-directory test-kafka

## The integration tests that use the session broker (marker `broker`, set by
## tests/conftest.py), on Apache Kafka (jars from Maven Central, see ops/kafka/); the
## others do not change with the broker and ran in the first pass. Skipped, saying why,
## where Java >= 17 or Maven is missing (`python -m ops.kafka --check` exits 3).
test-kafka: $(STAMP)
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
bench: $(STAMP)
	$(BIN)/python -m ops.bench.ingest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

## kill -9 crash tests on Apache Kafka (marker `crash`, about 3 minutes: left out of
## `make test` to keep it short; `python -m ops.crash --points 20` is the long version).
test-crash: $(STAMP)
	$(BIN)/pytest -q -m crash tests/integration/test_crash.py
