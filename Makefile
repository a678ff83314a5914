# The two commands of the README: `make run` and `make test`.
.PHONY: setup setup-test run stop serve test test-fast lint

# The suite runs on every core (pytest-xdist), a file per worker at a time, the longest
# files first (tests/conftest.py); the tests that bring up the live stack on its fixed
# ports take a lock (tests/server_fixtures.py). One worker more than cores (at most 8):
# many tests wait on child processes, sockets and timers. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 8 ? n + 1 : 8 )))
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# setup: what `make run` runs; setup-test: that and the test extras (pytest, ruff, mypy,
# lm-eval, triton, ...) for make test and make lint.
setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

run: setup
	.venv/bin/inferd stack up

stop:
	.venv/bin/inferd stack down

serve: setup
	.venv/bin/inferd serve

test: setup-test
	.venv/bin/python -m pytest -q $(PYTEST_PARALLEL)

test-fast: setup-test
	.venv/bin/python -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

# ruff lint and format (pyproject.toml), the import contracts (.importlinter), mypy (pyproject.toml)
lint: setup-test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy
