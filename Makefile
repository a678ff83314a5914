# The two commands of the README: `make run` and `make test`.
.PHONY: setup run stop serve test test-fast lint

# The suite runs on every core (pytest-xdist), a file per worker at a time, the longest
# files first (tests/conftest.py); the tests that bring up the live stack on its fixed
# ports take a lock (tests/server_fixtures.py). One worker more than cores (at most 8):
# many tests wait on child processes, sockets and timers. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 8 ? n + 1 : 8 )))
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

setup:
	scripts/setup.sh

run: setup
	.venv/bin/inferd stack up

stop:
	.venv/bin/inferd stack down

serve: setup
	.venv/bin/inferd serve

test: setup
	.venv/bin/python -m pytest -q $(PYTEST_PARALLEL)

test-fast:
	.venv/bin/python -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

# ruff lint and format (pyproject.toml), the import contracts (.importlinter), mypy (pyproject.toml)
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy
