# Two commands on a fresh machine:  `make run`  and  `make test`  (see README.md).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8000

.PHONY: run test test-stress lint setup setup-run clean-var mutate lock
# Two environments in one .venv: what the storefront needs (`make run`), and on top of it what
# the tests drive (`make test`, `make lint`: pytest, Playwright, schemathesis, the agent...).
# Both install from the lock files (ADR 0024): every package, transitive ones included, at an
# exact version with its hashes, so every machine and the image get the same bytes; then the
# project itself, editable, without resolving anything. `make lock` regenerates the locks.
setup-run: $(VENV)/.installed-run
setup: $(VENV)/.installed

$(VENV)/.installed-run: requirements/run.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r requirements/run.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run requirements/test.lock
	$(BIN)/pip install -q --require-hashes -r requirements/test.lock
	touch $@

# ADR 0024: the locks from pyproject.toml (runtime; runtime + the test extras, held to the
# runtime lock's versions; the CLI's own), for CPython 3.11 on Linux as CI and the image run.
# uv keeps the versions already locked unless pyproject.toml asks otherwise; to move one:
# `make lock LOCK_ARGS="--upgrade-package NAME"` (or --upgrade: everything).
LOCK_ARGS ?=
UV_COMPILE = $(abspath $(BIN))/uv pip compile --quiet --generate-hashes --python-version 3.11 \
  --custom-compile-command "make lock" $(LOCK_ARGS)
lock: setup
	$(UV_COMPILE) pyproject.toml -o requirements/run.lock
	$(UV_COMPILE) pyproject.toml --extra test -c requirements/run.lock -o requirements/test.lock
	cd cli && $(UV_COMPILE) pyproject.toml -o requirements.lock

run: setup-run
	PORT=$(PORT) scripts/run.sh

test: setup
	scripts/test.sh

# Every test, three full runs in a row on PostgreSQL + Redis with a CPU hog on one core beside
# them (scripts/test-stress.sh; RUNS=, HOGS=, PG_SERVER=, REDIS_URL=, NODE_BOX=0 to change them).
test-stress: setup
	scripts/test-stress.sh

# Generated payment histories on real regtest chains (litecoind, anvil: tests/billing/payments/
# test_generated_histories.py; monerod with a view-only wallet: test_generated_histories_monero.py):
# N random sequences per file (CI runs a few fixed ones), STEPS rules each.
N ?= 2000
STEPS ?= 20
.PHONY: chain-histories
chain-histories: setup
	CHAIN_HISTORIES=$(N) CHAIN_HISTORY_STEPS=$(STEPS) CHAIN_HISTORIES_RANDOM=1 \
	  $(BIN)/python -m pytest -p no:xdist -q -s tests/billing/payments/test_generated_histories.py \
	  tests/billing/payments/test_generated_histories_monero.py

# Ruff, then the import contracts in pyproject.toml (layers, Django-free agent and CLI).
# ADR 0024: then the money rules' own checks (scripts/lint_rules.py: ledger rows, no network
# inside a transaction, row locks, test-module imports, module size; the locks match
# pyproject.toml), and mypy over the money and lease rules ([tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	PYTHONPATH=cli $(BIN)/lint-imports
	$(BIN)/python scripts/lint_rules.py
	$(BIN)/mypy

clean-var:
	rm -rf var

# Mutation testing of the rule modules, not CI. scripts/mutate.py runs mutmut one module
# at a time (its own test files, its own work directory var/mutate/<module>/, SQLite built from the
# models) and prints killed/survived per module. All: `make mutate`; one or some:
# `make mutate MUTATE_ARGS="sizing rules"`; the modules: `MUTATE_ARGS=--list`; a module's
# surviving diffs: `MUTATE_ARGS="--survivors rules"`.
mutate: setup
	$(BIN)/pip install -q -e '.[mutate]'
	nice -n 19 $(BIN)/python scripts/mutate.py $(MUTATE_ARGS)
