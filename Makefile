# One-command set-up on a fresh machine: `make run` (the main job) and `make test`.
# `make run` installs what `gatekeeper serve` needs (`pip install -e .`); `make test` adds
# the test extras. Measured on fresh venvs (Python 3.11, pip's newest wheels):
# `du -sh` 338 MiB runtime only, 806 MiB with the test extras (`du -sb` 325,763,022 and
# 749,417,857 bytes).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run plan vllm-cpu test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test]'
	touch $(TEST_STAMP)

run: $(STAMP)
	$(BIN)/gatekeeper serve --rehearsal

plan: $(STAMP)
	$(BIN)/gatekeeper estimate meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB
	$(BIN)/gatekeeper plan deploy/examples/plan.toml || true

vllm-cpu:
	bash scripts/vllm-cpu-env.sh

test: $(TEST_STAMP)
	bash scripts/test-deps.sh
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs tests bench
	$(BIN)/pytest

bench: $(TEST_STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python bench/estimator_accuracy.py
	$(BIN)/python bench/mechanisms.py
	$(BIN)/python bench/snapshot_latency.py
	$(BIN)/python bench/placement.py
	$(BIN)/python -m bench.metrics_scrape
	$(BIN)/python -m bench.fuzz --cases 3000
	$(BIN)/python -m bench.soak --duration 180
	$(BIN)/python -m bench.storm --admissions 1000 --clients 50
	bash scripts/bench-deps.sh
	$(BIN)/python -m bench.proxy
	$(BIN)/python -m bench.upstream_clients

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
