# Every target bootstraps .venv when it is missing or pyproject.toml changed.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bootstrapped
PYTEST_ARGS ?=
# Test processes: the suite runs in two (tests/conftest.py says how it is split).
TEST_JOBS ?= 2

.PHONY: bootstrap test test-fast lint format demo bench schemas clean

bootstrap: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[runtime,backend,dashboard,dev]"
	touch $(STAMP)

test: $(STAMP) lint
	$(PY) -m pytest -m "not gpu" -n $(TEST_JOBS) --dist loadfile --durations=30 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not gpu and not browser" -x -q $(PYTEST_ARGS)

# The folders that hold Python (src/pipestudio links the top-level ones into the package).
CODE := src backend runtime dashboard planner alembic tests bench

# The same checks as .pre-commit-config.yaml (a test keeps the two alike).
lint: $(STAMP)
	$(VENV)/bin/ruff check $(CODE)
	$(VENV)/bin/ruff format --check $(CODE)
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff check --fix $(CODE)
	$(VENV)/bin/ruff format $(CODE)

# make demo ARGS="--port 8080" (or --no-workers, --state-dir DIR): python -m pipestudio.demo --help
demo: $(STAMP)
	$(PY) -m pipestudio.demo $(ARGS)

bench: $(STAMP)
	$(PY) bench/run.py

# Regenerate docs/schemas after changing a format; a test checks they match the code.
schemas: $(STAMP)
	for name in profile cluster plan simresult proposal; do \
		$(VENV)/bin/pipestudio schema $$name > docs/schemas/$$name.schema.json; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
