# Two entry points a new machine needs: `make demo` (the main job) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow bench faults schemas clean

setup: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,onnx]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trustbeam demo

# One worker per core (at most 4), each with one PyTorch/OpenMP thread: two workers on two cores, not four threads
# contending for them (on 2 cores 440 s, against 911 s for one process with two threads).
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --numprocesses=auto --maxprocesses=4

test-slow: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,onnx,ns3]'
	$(PY) -m pytest -q -m slow

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
