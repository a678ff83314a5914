# The two commands of the README: `make run` and `make test`.
.PHONY: setup run stop serve test test-fast

setup:
	scripts/setup.sh

run: setup
	.venv/bin/inferd stack up

stop:
	.venv/bin/inferd stack down

serve: setup
	.venv/bin/inferd serve

test: setup
	.venv/bin/python -m pytest -q

test-fast:
	.venv/bin/python -m pytest -q -m "not slow"
