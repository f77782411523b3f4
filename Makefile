# The two commands of the README. Each creates or refreshes .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: run test lint bench

$(STAMP): requirements.txt requirements-test.txt requirements-vllm.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	# vLLM's samplers are pure Python + Triton: its code and their import closure, no dependency resolution
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-vllm.txt
	touch $(STAMP)

run: $(STAMP)  ## the main job: verify the reference on the CPU default, report in reports/latest/
	$(PY) -m harness run --profile ci --out reports/latest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint  ## lint, then the CPU suite (GPU tests skip with their reason)
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest suites/ -m "not gpu" -n $(PYTEST_WORKERS) --durations=40

bench: $(STAMP)
	$(PY) benchmarks/bench_reference.py
