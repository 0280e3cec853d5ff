# Two commands on a fresh machine:
#   make demo   installs what it needs, then runs the example job with an injected worker crash
#   make test   installs what it needs, then runs the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

SHARDS := examples/data/shards/stories-00000.stok examples/data/shards/logs-00000.stok

.PHONY: install demo demo-clean test clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Stalwart needs Python 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: pip takes the local CPU wheel instead of fetching CUDA builds.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

# The example's data: two text sources tokenized into shards (built, never committed).
examples/data/shards/%-00000.stok: examples/data/%.txt $(STAMP)
	$(BIN)/stalwart data build examples/data/shards $< --prefix $* --overwrite

demo: $(STAMP) $(SHARDS)
	$(BIN)/stalwart run examples/pretrain-tiny.yaml --inject kill-worker:rank=1,step=40

demo-clean: $(STAMP) $(SHARDS)
	$(BIN)/stalwart run examples/pretrain-tiny.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .stalwart .pytest_cache
