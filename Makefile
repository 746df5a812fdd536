# Quick start: `make run` (install + optimise/inspect a default model), `make test` (install + tests).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= mlp
PRESET ?= small
DEVICES ?= 8
BUDGET ?= 30

.PHONY: run test test-trax lint install install-test clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,service]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

run: install
	$(BIN)/disco optimize --model $(MODEL) --preset $(PRESET) --devices $(DEVICES) --budget $(BUDGET)

test: install-test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# Lint with the pinned ruff (newer ruff releases enable more rules by default), then the import
# contracts in setup.cfg (layers that point down only, no cycles; docs/architecture.md).
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports --config setup.cfg

$(VENV)/.installed-trax: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e '.[trax]'
	touch $@

# The real-trax path: installs the trax extra (trax 1.4.1 pulls TensorFlow, ~3 GB) and runs
# the tests marked `trax`, which include `disco optimize --trax-model` on a tiny TransformerLM.
test-trax: $(VENV)/.installed-trax
	$(BIN)/python -m pytest -m trax tests/test_trax_layer.py

clean:
	rm -rf $(VENV) build *.egg-info
