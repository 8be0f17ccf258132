# The two commands the README promises: `make run` and `make test`. Both build .venv first.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install screenshots schemathesis vendor-docs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is required (found $(PYTHON))" >&2; exit 1; }
	@echo "Installing the dependencies into $(VENV): the first time downloads them (about 40 s)."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_dependencies.py
	touch $(STAMP)

install: $(STAMP)

## make run: migrate, seed the demo brand on first run, serve on 127.0.0.1:$PORT with one worker
run: $(STAMP)
	$(BIN)/python scripts/run.py

## make test: the whole suite (PostgreSQL and Redis on 127.0.0.1 when they answer, else embedded ones)
## in PYTEST_WORKERS parallel sessions (0: one), each with a database and Redis db of its own
PYTEST_WORKERS ?= 4
test: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

## make screenshots: rerun the browser tests and save docs/screenshots/*.png (needs Chromium)
screenshots: $(STAMP)
	BRAND_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest tests/test_dashboard_browser.py $(PYTEST_ARGS)

## make schemathesis: every schemathesis check against a real server of the demo brand (ST_ARGS passes options)
schemathesis: $(STAMP)
	$(BIN)/python scripts/schemathesis_run.py $(ST_ARGS)

## make vendor-docs: fetch the pinned Scalar release (npm) into static/vendor/ and record its checksum
vendor-docs: $(STAMP)
	$(BIN)/python scripts/vendor_scalar.py

## make lint: ruff's checks and formatting, then mypy over the product code ([tool.mypy])
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
