# Two commands on a fresh machine:  `make run`  and  `make test`  (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: run test lint setup clean-var mutate
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: setup
	PORT=$(PORT) scripts/run.sh

test: setup
	scripts/test.sh

# issue 33: ruff, then the import contracts in pyproject.toml (layers, Django-free agent and CLI).
lint: setup
	$(BIN)/ruff check .
	PYTHONPATH=cli $(BIN)/lint-imports

clean-var:
	rm -rf var

# issue 34: mutation testing of the rule modules, not CI. scripts/mutate.py runs mutmut one module
# at a time (its own test files, its own work directory var/mutate/<module>/, SQLite built from the
# models) and prints killed/survived per module. All: `make mutate`; one or some:
# `make mutate MUTATE_ARGS="sizing rules"`; the modules: `MUTATE_ARGS=--list`; a module's
# surviving diffs: `MUTATE_ARGS="--survivors rules"`.
mutate: setup
	$(BIN)/pip install -q -e '.[mutate]'
	nice -n 19 $(BIN)/python scripts/mutate.py $(MUTATE_ARGS)
