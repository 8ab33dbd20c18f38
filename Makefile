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

# issue 34: mutation testing of the rule modules ([tool.mutmut] in pyproject.toml), not CI:
# hours for all of them. `make mutate` prints killed/survived; survivors: mutmut results.
mutate: setup
	$(BIN)/pip install -q -e '.[mutate]'
	$(BIN)/mutmut run $(MUTATE_ARGS) ; $(BIN)/mutmut results
