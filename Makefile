# The two commands of the README: `make demo` (main job) and `make test` (default test suite).
# Both run scripts/bootstrap.sh first, which installs whatever is missing and is quick when not.
.PHONY: setup demo test test-all bench clean

VENV := .venv/bin
# The default suite runs in TEST_WORKERS pytest-xdist processes, a test file per process at a
# time (module-scoped engines and services start once). Most of its time is real services in real
# time (sleeps, polls, 1-s control loops), which overlap well even on 2 cores. `make test-all` stays
# in one process: its Ray cluster test ends with `ray stop --force`, which would kill another
# worker's Ray.
TEST_WORKERS ?= 2

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(VENV)/samm demo

test: setup
	$(VENV)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-all: setup
	$(VENV)/python -m pytest $(PYTEST_ARGS)

bench: setup
	$(VENV)/samm sim bench --envs 8 --steps 4000 --json

clean:
	rm -rf java/target .pytest_cache
