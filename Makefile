# Two commands for a fresh machine:
#   make demo   set up .venv, build, run a tree verify on the best device present
#   make test   set up .venv, build, run the whole suite (GPU tests skip without a GPU)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.14.1
# torch guesses CUDA_HOME from the nvcc on PATH; point it at the toolkit root.
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda
endif
export PIP_DISABLE_PIP_VERSION_CHECK := 1
SOURCES := $(shell find csrc -type f) setup.py pyproject.toml

.PHONY: demo test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PIP) install -q "$(TORCH_PIN)" setuptools wheel ninja numpy
	touch $@

$(VENV)/.built: $(SOURCES) | $(VENV)/.torch
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

$(VENV)/.demo-deps: | $(VENV)/.torch
	$(PIP) install -q matplotlib
	touch $@

# The test extras with the project itself: one build, which also counts as .built.
$(VENV)/.test-deps: $(SOURCES) | $(VENV)/.torch
	$(PIP) install -q --no-build-isolation -e ".[test]"
	touch $@ $(VENV)/.built

demo: $(VENV)/.demo-deps $(VENV)/.built
	$(PY) -m bench.demo --out demo_out

test: $(VENV)/.test-deps
	$(PY) -m pytest -q

clean:
	rm -rf build demo_out verify_ops/*.so *.egg-info
