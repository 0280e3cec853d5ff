# Two commands on a fresh machine:
#   make demo   installs what it needs, then runs the example job with an injected worker crash
#   make test   installs what it needs, then runs the checks (ruff, import contracts, mypy) and then
#               every test in one pytest run on TEST_WORKERS pytest-xdist workers (docs/testing.md)
# While working:
#   make test-fast  the unit tests (tests/unit) on WORKERS xdist workers, under a minute
#   make test-e2e   the end-to-end tests (tests/e2e) on TEST_WORKERS xdist workers
#   make lint       ruff format --check, ruff check, the import contracts (.importlinter)
#   make typecheck  mypy over platform/ and operators/
#   make flakes TEST=... RUNS=10 LOAD=2   run a test many times, under CPU load, to find flakes
# pre-commit (.pre-commit-config.yaml) runs the same ruff, import contracts and mypy at each commit.
# tests/conftest.py keeps each xdist worker's processes and shared memory apart, and the tests that
# share a module-scoped run on one worker (--dist loadgroup). WORKERS=0 runs in one process.
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

# 3 workers: fewer leave the cores idle while tests wait on processes, more pay each worker's
# collection again (docs/testing.md compares 2, 3 and 4).
WORKERS      ?= 3
# The end-to-end tests mostly wait on processes (leases, restarts, step delays), so make test runs
# more workers than the machine has cores.
TEST_WORKERS ?= 4

# Python writes its bytecode caches (and pytest its rewritten test modules) even where the shell
# says not to: without them every pytest worker compiles and rewrites the suite again.
unexport PYTHONDONTWRITEBYTECODE
xdist = $(if $(filter 0,$(1)),,-n $(1) --dist loadgroup)

.PHONY: install browser demo demo-clean test test-fast test-e2e lint typecheck format flakes clean

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
	$(BIN)/python -m pytest tests/unit -q $(call xdist,$(WORKERS))

test-e2e: install
	$(BIN)/python -m pytest tests/e2e $(call xdist,$(TEST_WORKERS))

# Run a test many times, optionally beside busy processes, to find flakes (docs/testing.md):
#   make flakes TEST=tests/e2e/operator/test_operator_e2e.py RUNS=5 LOAD=2
RUNS ?= 10
LOAD ?= 0
flakes: $(STAMP)
	$(BIN)/python tests/support/flakes.py $(TEST) --runs $(RUNS) --load $(LOAD)

test: lint typecheck install
	$(BIN)/python -m pytest tests $(call xdist,$(TEST_WORKERS))

clean:
	rm -rf $(VENV) .stalwart .pytest_cache
