# Two entry points a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve test lint bench install

# The C extension is compiled by the install: editing it must rebuild.
$(BIN)/raftline: pyproject.toml setup.py raftlog/_speedups.c raftlog/_columns.c raftlog/_record_reader.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

install: $(BIN)/raftline

serve: install
	$(BIN)/raftline serve

# pytest exits 5 when it collected nothing: that is a failure here, never a pass.
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -m "not slow" ; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
