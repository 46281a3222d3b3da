# One-command set-up on a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gatekeeper estimate meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --allow-untyped-defs --allow-incomplete-defs tests $(wildcard bench/*.py)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/estimator_accuracy.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
