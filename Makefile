# Two commands on a fresh machine:  `make run`  and  `make test`  (see README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: run test test-stress lint setup setup-run clean-var mutate
# Two environments in one .venv: what the storefront needs (`make run`), and on top of it what
# the tests drive (`make test`, `make lint`: pytest, Playwright, schemathesis, the agent...).
setup-run: $(VENV)/.installed-run
setup: $(VENV)/.installed

$(VENV)/.installed-run: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: setup-run
	PORT=$(PORT) scripts/run.sh

test: setup
	scripts/test.sh

# Every test, three full runs in a row on PostgreSQL + Redis with a CPU hog on one core beside
# them (scripts/test-stress.sh; RUNS=, HOGS=, PG_SERVER=, REDIS_URL=, NODE_BOX=0 to change them).
test-stress: setup
	scripts/test-stress.sh

# Generated payment histories on real regtest chains (litecoind, anvil; tests/billing/
# test_money_histories.py): N random sequences (CI runs a few fixed ones), STEPS rules each.
N ?= 2000
STEPS ?= 20
.PHONY: chain-histories
chain-histories: setup
	CHAIN_HISTORIES=$(N) CHAIN_HISTORY_STEPS=$(STEPS) CHAIN_HISTORIES_RANDOM=1 \
	  $(BIN)/python -m pytest -p no:xdist -q -s tests/billing/test_money_histories.py

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
