# The two commands of the README: `make demo` (main job) and `make test` (default test suite).
# Both run scripts/bootstrap.sh first, which installs whatever is missing and is quick when not.
.PHONY: setup demo test test-all bench clean

VENV := .venv/bin

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(VENV)/samm demo

test: setup
	$(VENV)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: setup
	$(VENV)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(VENV)/samm sim bench --envs 8 --steps 4000 --json

clean:
	rm -rf java/target .pytest_cache
