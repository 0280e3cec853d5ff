# Two commands on a fresh machine:
#   make demo   installs what it needs, then runs the example job with an injected worker crash
#   make test   installs what it needs, then runs the checks (ruff, mypy, import contracts) and every test
#               (mypy and the unit tests beside the end-to-end tests, then the tests that mostly wait:
#               tests/support/suite.py)
# While working:
#   make test-fast  the unit tests (tests/unit), under a minute
#   make lint       ruff format --check, ruff check, the import contracts (.importlinter)
#   make typecheck  mypy over platform/ and operators/
#   make flakes TEST=... RUNS=10 LOAD=2   run a test many times, under CPU load, to find flakes
#   make durations  make test, recording the tests' durations (tests/durations.json: longest first)
# The unit tests run on WORKERS pytest-xdist processes (tests/conftest.py keeps each worker's
# processes, shared memory and data apart); the end-to-end tests on E2E_WORKERS (2: one per core;
# E2E_WORKERS=0 runs them in this process).
# The interpreter: Debian's python3.11 where it is installed with venv, else the first python3.11 on
# PATH. Debian builds it with profile-guided and link-time optimization, which a pyenv build skips
# by default: the same job takes about 9% fewer CPU-seconds in a virtual environment made from it.
# `make clean` first to switch an existing .venv.
SYSTEM_PYTHON := /usr/bin/python3.11
PYTHON ?= $(shell if $(SYSTEM_PYTHON) -c 'import ensurepip, venv' 2>/dev/null; then echo $(SYSTEM_PYTHON); \
	else command -v python3.11 || command -v python3; fi)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
UV_VERSION := 0.13.9

SHARDS := examples/data/shards/stories-00000.stok examples/data/shards/logs-00000.stok

# The console serves htmx itself (no CDN): npm installs the version platform/console/package-lock.json pins.
CONSOLE := platform/console
HTMX    := $(CONSOLE)/static/vendor/htmx.min.js

# mypy and import-linter look packages up by import name; the platform's folder is not named
# `stalwart` (DESIGN.md), so they read it through links under build/packages.
PACKAGES := build/packages

WORKERS     ?= 3

# Python writes its bytecode caches (and pytest its rewritten test modules) even where the shell
# says not to: without them every pytest worker compiles and rewrites the suite again, a sixth of
# `make test-fast` (docs/testing.md).
unexport PYTHONDONTWRITEBYTECODE
E2E_WORKERS ?= 2
xdist        = $(if $(filter 0,$(1)),,-n $(1) --dist loadgroup)
XDIST       := $(call xdist,$(WORKERS))
E2E_XDIST   := $(call xdist,$(E2E_WORKERS))

.PHONY: install browser demo demo-clean test durations test-fast test-e2e lint typecheck format flakes clean

# The package's own metadata takes ranges (Python 3.10-3.12, torch>=2.5: docs/install.md); this
# machine's exact versions come from the constraints file, passed to pip and uv alike.
CONSTRAINTS := constraints/cpu.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Stalwart needs Python 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned by the constraints file (torch==2.13.0), with pip: pip's configuration on this
	# machine names the local CPU wheel (uv does not read it), where a plain resolver fetches CUDA builds.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-compile -c $(CONSTRAINTS) torch uv==$(UV_VERSION)
	# The rest with uv, under the same constraints, which keep the installed torch 2.13.0: it resolves,
	# installs and compiles the bytecode (torch's too) on every core, in 15 s where pip took 100
	# (docs/testing.md). The test extra is everything: control plane, operator, worker side.
	$(BIN)/uv pip install --quiet --python $(BIN)/python --compile-bytecode -c $(CONSTRAINTS) -e '.[test]'
	# promtool and prometheus (Debian's package) for the alert-rule and dashboard tests: only when
	# missing, and only as root (apt-get needs it); otherwise those tests say what to install.
	@if ! command -v promtool >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; fi
	@touch $(STAMP)

install: $(STAMP) $(HTMX) browser

$(HTMX): $(CONSOLE)/package.json $(CONSOLE)/package-lock.json
	@command -v npm >/dev/null || { echo "npm is needed to install htmx for the console (apt-get install npm)"; exit 1; }
	npm ci --prefix $(CONSOLE) --no-audit --no-fund --silent
	mkdir -p $(dir $@)
	cp $(CONSOLE)/node_modules/htmx.org/dist/htmx.min.js $@

# The console's browser test drives Debian's Chromium: installed here when missing and we are root
# (apt waits for another apt to finish instead of failing on its lock).
browser:
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium for the console's browser test"; \
		apt-get -o DPkg::Lock::Timeout=600 update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium; \
	fi

# The example's data: two text sources tokenized into shards (built, never committed).
examples/data/shards/%-00000.stok: examples/data/%.txt $(STAMP)
	$(BIN)/stalwart data build examples/data/shards $< --prefix $* --overwrite

demo: $(STAMP) $(SHARDS)
	$(BIN)/stalwart run examples/pretrain-tiny.yaml --inject kill-worker:rank=1,step=40

demo-clean: $(STAMP) $(SHARDS)
	$(BIN)/stalwart run examples/pretrain-tiny.yaml

$(PACKAGES)/stalwart:
	mkdir -p $(PACKAGES)
	ln -sfn ../../platform $(PACKAGES)/stalwart
	ln -sfn ../../operators $(PACKAGES)/stalwart_operator

lint: $(STAMP) $(PACKAGES)/stalwart
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	PYTHONPATH=$(PACKAGES) $(BIN)/lint-imports --no-cache --no-logo

typecheck: $(STAMP) $(PACKAGES)/stalwart
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q $(XDIST)

test-e2e: install
	$(BIN)/python -m pytest tests/e2e $(E2E_XDIST)

# Run a test many times, optionally beside busy processes, to find flakes (docs/testing.md):
#   make flakes TEST=tests/e2e/operator/test_operator_e2e.py RUNS=5 LOAD=2
RUNS ?= 10
LOAD ?= 0
flakes: $(STAMP)
	$(BIN)/python tests/support/flakes.py $(TEST) --runs $(RUNS) --load $(LOAD)

# mypy and the unit tests run beside the end-to-end tests, niced, in the CPU those leave idle
# (tests/support/suite.py; their logs go to .stalwart/test-logs/). Beside them the unit tests need
# no third worker: each worker's collection costs 9 CPU-seconds, and the idle time is what they use.
# Once they are done, a late lane runs the end-to-end modules that mostly wait (suite.py's LATE).
BESIDE_WORKERS ?= 2
BESIDE_NICE ?= 10
test: lint install
	$(BIN)/python tests/support/suite.py --workers $(BESIDE_WORKERS) --e2e-workers $(E2E_WORKERS) --nice $(BESIDE_NICE)

# `make test`, recording every test's duration in tests/durations.json: xdist starts the longest
# work first from it (tests/support/schedule.py). Run it when tests were added or got much longer.
durations: lint install
	$(BIN)/python tests/support/suite.py --workers $(BESIDE_WORKERS) --e2e-workers $(E2E_WORKERS) --nice $(BESIDE_NICE) \
		--record-durations tests/durations.json

clean:
	rm -rf $(VENV) .stalwart .pytest_cache
