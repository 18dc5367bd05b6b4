# Two commands on a fresh machine: `make run` (set up + main job) and `make test` (set up + tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# `make run` installs what running needs (numpy, rich, aiconfigurator-core, and mypy for the
# compiled engine); `make test` adds the test tooling (pytest, hypothesis, ray, the live
# servers' stack, playwright, matplotlib), which is most of the .venv's size.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed-test

.PHONY: setup setup-run native run test bench lint clean scoreboard

setup-run: $(RUN_STAMP)
setup: $(STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[native]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[test,report]'
	touch $(STAMP)

# The compiled engine (src/fleetsim/native.py): the hot modules compiled by mypyc into
# build/native, rebuilt whenever a source changes; fleetsim falls back to pure Python if the
# build fails or is stale.
NATIVE := build/native/MANIFEST.json
SOURCES := $(shell find src/fleetsim -name '*.py')

native: $(NATIVE)

$(NATIVE): $(RUN_STAMP) $(SOURCES) tools/build_native.py
	FLEETSIM_PURE=1 $(PY) tools/build_native.py

run: setup-run native
	$(VENV)/bin/fleetsim run --out results/default --force

# Every test twice: on the pure-Python sources (the reference) and on the compiled engine.
# Bytecode caches are written even where the environment sets PYTHONDONTWRITEBYTECODE: in a
# fresh copy (.ci/run) every xdist worker and every fleetsim subprocess a test starts would
# compile the whole package again (+0.24 s CPU, +46%, for a 100-request run; +45% for
# test_startup.py and test_cli.py), and pytest would rewrite every test module in every worker.
# --dist worksteal: each worker starts on half of the collection (the tests marked slow first:
# tests/conftest.py) and one that runs out takes half of what the other has left, so both cores
# stay busy to the end.
#
# The tests marked `wiring` (the live gateway and its servers, Ray, the README's commands in
# subprocesses) run once, in the second pass: what they test (HTTP, processes, the CLI's
# plumbing) is not compiled, and most of their time is real time and process start-up
# (117 s of wall time run alone in one process, pure, on a shared machine); the engine's two
# builds are compared result for result by the rest of the suite (tests/unit/test_native.py
# among them).
test: setup native
	PYTHONDONTWRITEBYTECODE= FLEETSIM_PURE=1 $(PY) -m pytest -n 2 --dist worksteal -m "not wiring" tests
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n 2 --dist worksteal tests

# Re-record docs/scoreboard.json from a full run of every reproduction (5-10 minutes on two
# busy cores) and regenerate the table of docs/reproductions.md from it.
scoreboard: setup native
	$(VENV)/bin/fleetsim repro all --record docs/scoreboard.json
	$(PY) -m fleetsim.repro.scoreboard docs/scoreboard.json docs/reproductions.md

# `make bench VIDUR=~/vidur VIDUR_PYTHON=~/vidur/env/bin/python` also runs Vidur on the same work
# and prints the ratio (benchmarks/vidur_compare.py).
bench: setup native
	$(PY) benchmarks/startup.py
	$(PY) benchmarks/azure_conv_replay.py
	$(PY) benchmarks/cluster_scale.py
	$(PY) benchmarks/vidur_compare.py $(if $(VIDUR),--vidur $(VIDUR) --vidur-python $(or $(VIDUR_PYTHON),$(PY)))

lint: setup
	$(PY) -m pip install --quiet ruff
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/mypy --strict src/fleetsim/core src/fleetsim/models src/fleetsim/policies
	-$(VENV)/bin/mypy src/fleetsim  # advisory: the other packages are not clean yet

clean:
	rm -rf $(VENV) results build .pytest_cache .hypothesis
