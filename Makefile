# `make demo`, `make test` and `make bench` each build .venv when missing: the CPU torch wheel first
# (a plain `torch` requirement resolved from scratch would pull a multi-GB CUDA build), then hasten.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_EXTRAS ?= test,reference,stateful

.PHONY: demo test test-unit test-distributed bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hasten launch -n 2 examples/demo.py

test: $(STAMP)
	$(PY) -m pytest tests

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info
