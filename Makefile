# Quick start: `make run` (install + optimise/inspect a default model), `make test` (install + tests),
# `make test-fast` (the edit loop: no XLA compile, no process, under 2 minutes).
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Every install takes its exact versions from a lock (setup.cfg states ranges). Python 3.12 with
# the newest jax: `make test PYTHON=python3.12 VENV=.venv312 LOCK=constraints/jax-0.12.0.1.txt`.
LOCK ?= constraints/py3.11.txt
PIP := $(BIN)/python -m pip install --quiet -c $(LOCK)
MODEL ?= mlp
PRESET ?= small
DEVICES ?= 8
BUDGET ?= 30

.PHONY: run test test-fast test-trax test-hooks lint docs install install-test install-gpu test-gpu-compile clean

# A PYTHON named on the command line must make the venv (a lock for jax >= 0.11 needs Python 3.12,
# and another interpreter would only fail later in pip's resolver); the default falls back to python3.
$(BIN)/python:
ifeq ($(origin PYTHON),command line)
	$(PYTHON) -m venv $(VENV) || { echo "make: PYTHON=$(PYTHON) could not make $(VENV); expected an interpreter on PATH or its full path (Python >= 3.12 for LOCK=constraints/jax-0.11.2.txt and newer)" >&2; exit 1; }
else
	$(PYTHON) -m venv $(VENV) || { echo "make: $(PYTHON) could not make $(VENV); using python3 ($$(python3 --version 2>&1))" >&2; python3 -m venv $(VENV); }
endif
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python setup.cfg pyproject.toml $(LOCK)
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test,service]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

run: install
	$(BIN)/disco optimize --model $(MODEL) --preset $(PRESET) --devices $(DEVICES) --budget $(BUDGET)

# The suite runs in TEST_WORKERS processes (pytest-xdist): 2 keeps it under 15 minutes on the 2-core
# machine it is meant for; TEST_WORKERS=0 runs it in this process (for a debugger).
TEST_WORKERS ?= 2

test: install-test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The tests marked `fast`: no XLA compile and no process (tests/conftest.py fails a fast test that
# compiles or starts one, naming it), for the edit loop; `make test` runs them too.
test-fast: install-test
	$(BIN)/python -m pytest -m "fast and not slow" $(PYTEST_ARGS)

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev]'
	touch $@

# Lint with the pinned ruff (newer ruff releases enable more rules by default), then the import
# contracts in setup.cfg (layers that point down only, no cycles; docs/architecture.md).
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports --config setup.cfg

$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) -e '.[docs]'
	touch $@

# The documentation site (mkdocs.yml; docs/ is its source) into site/; --strict fails on any warning
# (a broken link, a page missing from the nav's targets).
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

$(VENV)/.installed-trax: $(VENV)/.installed-test
	$(PIP) -e '.[trax]'
	touch $@

# The real-trax path: installs the trax extra (trax 1.4.1 pulls TensorFlow, ~3 GB) and runs
# the tests marked `trax`, which include `disco optimize --trax-model` on a tiny TransformerLM.
test-trax: $(VENV)/.installed-trax
	$(BIN)/python -m pytest -m trax tests/trax_models/test_trax_layer.py

# The XLA hooks' and the profiler's tests on another jax, in a second environment (Python 3.12:
# jax >= 0.11 needs it). CI runs the GPU image's 0.11.2, the oldest jax the hooks were tested
# on (`make test-hooks HOOKS_JAX=0.8.3`) and the newest (`HOOKS_JAX=0.12.0.1`).
HOOKS_JAX ?= 0.11.2
# The first Python 3.12 found: on PATH, else pyenv's (a pyenv shim with another global version fails).
HOOKS_PYTHON ?= $(shell for p in python3.12 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12 2>/dev/null); do \
	$$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1 && { echo $$p; break; }; done)
HOOKS_VENV := .venv-jax$(HOOKS_JAX)
HOOKS_LOCK := constraints/jax-$(HOOKS_JAX).txt
HOOK_TESTS ?= tests/xla_hooks/test_apply_plan.py tests/disco/ir/test_step_form.py tests/xla_hooks/test_hook.py tests/xla_hooks/test_agreement.py tests/xla_hooks/test_trials.py tests/xla_hooks/test_trials_job.py tests/disco/ir/test_gspmd.py tests/disco/plans/test_cuts.py tests/xla_hooks/test_profiling.py tests/disco/data/test_kernel_collect.py tests/disco/ir/test_loop_collectives.py tests/disco/plans/test_loop_gather_buckets.py

$(HOOKS_VENV)/.installed: setup.cfg pyproject.toml $(HOOKS_LOCK)
	@test -n "$(HOOKS_PYTHON)" || { echo "make test-hooks: no Python 3.12 found (jax $(HOOKS_JAX) needs it); set HOOKS_PYTHON=/path/to/python3.12" >&2; exit 2; }
	$(HOOKS_PYTHON) -m venv $(HOOKS_VENV)
	$(HOOKS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(HOOKS_VENV)/bin/python -m pip install --quiet -c $(HOOKS_LOCK) -e '.[test,service]'
	touch $@

test-hooks: $(HOOKS_VENV)/.installed
	$(HOOKS_VENV)/bin/python -c "import jax; assert jax.__version__ == '$(HOOKS_JAX)', jax.__version__"
	$(HOOKS_VENV)/bin/python -m pytest -n $(TEST_WORKERS) $(HOOK_TESTS)

# Deviceless XLA:GPU compilation (the simulator's compiled tier for GPU clusters, from a machine
# without a GPU): Python 3.12, jax[cuda12] at the GPU image's jax (GPU_JAX: the jax the shipped H100
# data were measured with, so that XLA forms the same kernels and reads the shipped autotuning
# results; about 4.5 GB of NVIDIA wheels), disco installed editable with its `disco` command. disco
# finds it at $(GPU_VENV)/bin/python (override: DISCO_GPU_PYTHON). `make test-gpu-compile` runs the
# tests marked gpu_compile in it.
GPU_VENV ?= .venv-gpu
GPU_JAX ?= 0.11.2
GPU_LOCK := constraints/jax-$(GPU_JAX).txt
GPU_CUDA_LOCK := constraints/jax-$(GPU_JAX)-cuda12.txt
GPU_TESTS ?= tests/xla_hooks/test_deviceless.py tests/disco/optimizer/test_predicted_gpu.py tests/service/test_service_tiers.py tests/disco/ir/test_loop_collectives.py tests/xla_hooks/test_gather_after.py tests/disco/plans/test_loop_gather_buckets.py

$(GPU_VENV)/.installed: setup.cfg pyproject.toml $(GPU_LOCK) $(GPU_CUDA_LOCK)
	@test -n "$(HOOKS_PYTHON)" || { echo "make install-gpu: no Python 3.12 found (jax $(GPU_JAX) needs it); set HOOKS_PYTHON=/path/to/python3.12" >&2; exit 2; }
	$(HOOKS_PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GPU_VENV)/bin/python -m pip install --quiet -c $(GPU_LOCK) -c $(GPU_CUDA_LOCK) -e '.[test,service]' 'jax[cuda12]==$(GPU_JAX)'
	$(GPU_VENV)/bin/python -c "import jax; assert jax.__version__ == '$(GPU_JAX)', jax.__version__"
	touch $@

install-gpu: $(GPU_VENV)/.installed

test-gpu-compile: $(GPU_VENV)/.installed
	JAX_PLATFORMS=cpu $(GPU_VENV)/bin/python -m pytest -m gpu_compile $(GPU_TESTS)

clean:
	rm -rf $(VENV) .venv-jax* .venv-gpu build site *.egg-info
