# Two commands on a fresh machine: `make run` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,report]'
	touch $(STAMP)

run: setup
	$(VENV)/bin/fleetsim run --out results/default

test: setup
	$(PY) -m pytest -n 2 tests

bench: setup
	$(PY) benchmarks/azure_conv_replay.py

lint: setup
	$(PY) -m pip install --quiet ruff
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy --strict src/fleetsim/core src/fleetsim/models src/fleetsim/policies
	-$(VENV)/bin/mypy src/fleetsim  # advisory: the other packages are not clean yet

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
