# The README's commands. Each target installs what it needs (a virtualenv; Debian packages when root).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PYTHONPATH := $(CURDIR)/testbed

.PHONY: demo test unit lint typecheck bench sandbox-up sandbox-down clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

system-deps:
	@testbed/install-system-deps.sh

## demo: bring up the local simulated fleet and deploy qwen35-nvfp4 to the simulated blackwell box
demo: $(VENV)/.installed system-deps
	$(BIN)/python -m fleet_testbed.demo

## test: every test (unit, real sshd, simulated hosts), plus lint and type checks
test: $(VENV)/.installed system-deps lint typecheck
	$(BIN)/pytest -q

## unit: the pure-core tests only (seconds)
unit: $(VENV)/.installed
	$(BIN)/pytest -q -m "not ssh"

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests testbed

typecheck: $(VENV)/.installed
	$(BIN)/mypy

## bench: round trips and timings against plain OpenSSH on the simulated fleet
bench: $(VENV)/.installed system-deps
	$(BIN)/python -m fleet_testbed.bench

sandbox-up: $(VENV)/.installed system-deps
	$(BIN)/python -m fleet_testbed up

sandbox-down:
	$(BIN)/python -m fleet_testbed down

clean: sandbox-down
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
