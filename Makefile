# `make demo`, `make test` and `make bench` each build .venv when missing: the CPU torch wheel first
# (a plain `torch` requirement resolved from scratch would pull a multi-GB CUDA build), then hasten.
# The demo needs only hasten and its runtime dependencies; tests and benchmarks add the test tools and the
# reference library they compare against.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP := $(VENV)/.installed-test
TEST_EXTRAS ?= test,reference,stateful,fp8,deepspeed,bnb,trackers,report,ecosystem,ray

.PHONY: demo test test-fast bench venv clean

venv: $(TEST_STAMP)

$(RUNTIME_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e .
	touch $(RUNTIME_STAMP)

# DeepSpeed with its CPU ops compiled in, from a wheel built once per machine (build_support/deepspeed_cpu_ops.py):
# otherwise every fresh clone compiles them again on first use
# The test extras go in through uv, which installs the same releases as pip (same resolution, checked side by side)
# in about 20 s against pip's 130 s here; torch stays pip's (pip's configuration picks the local CPU wheel) and
# uv keeps it. --compile-bytecode as pip does: with PYTHONDONTWRITEBYTECODE set (as on CI) nothing would ever write
# the .pyc files, and every process would compile transformers & co. again. Where uv cannot be installed or cannot
# reach its index, pip installs them as before.
$(TEST_STAMP): $(RUNTIME_STAMP)
	$(if $(findstring deepspeed,$(TEST_EXTRAS)),$(PY) build_support/deepspeed_cpu_ops.py)
	( $(PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e ".[$(TEST_EXTRAS)]" ) \
	    || $(PY) -m pip install -q -e ".[$(TEST_EXTRAS)]"
	touch $(TEST_STAMP)

demo: $(RUNTIME_STAMP)
	$(VENV)/bin/hasten launch -n 2 examples/demo.py

# Were DeepSpeed's CPU ops not prebuilt, DeepSpeed would compile them on first use: the tests keep such builds in
# torch's extension cache, one folder per checkout (tests/helpers.py, torch_extensions_dir)

test: $(TEST_STAMP)
	$(PY) -m pytest tests

# the inner loop: the tests that start no process and import no large optional library (tests/suite_markers.py)
test-fast: $(TEST_STAMP)
	$(PY) -m pytest tests -m "not launches and not heavy"

bench: $(TEST_STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build src/*.egg-info
