# Two entry points a new machine needs: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test slow-tests test-slow bench faults schemas clean

setup: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,onnx]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trustbeam demo

# One worker more than the cores (at most 4; why: tests/conftest.py), each with one PyTorch/OpenMP thread.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --numprocesses=auto --maxprocesses=4

# The slow tier with what is installed: CI runs it after `make test` (the ns-3 tests skip without the ns3 extra).
slow-tests: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --numprocesses=auto --maxprocesses=4 -m slow

test-slow: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,onnx,ns3]'
	$(MAKE) slow-tests

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,onnx,bench]'
	$(PY) -m bench.simulator_bench
	$(PY) -m bench.scan_bench
	$(PY) -m bench.pipeline_bench
	$(PY) -m bench.onnx_bench
	$(PY) -m bench.capacity_bench

faults: $(STAMP)
	$(PY) -m bench.fault_harness --soak-minutes 10

schemas: $(STAMP)
	$(PY) -m schemas.jsonschema

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis *.egg-info
