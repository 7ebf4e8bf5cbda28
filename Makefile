# The two ways in: `make demo` shows the idea, `make test` checks it.
# Both need only Python 3.11+ and make; they create $(VENV) with $(PYTHON) when it is missing.

PYTHON ?= python3
VENV ?= .venv
DEMO_SECONDS ?= 20
export PYTHON VENV DEMO_SECONDS

.DEFAULT_GOAL := help
.PHONY: help demo test

help:
	@echo "make demo   three scheduler nodes on the example project (SQLite) for $(DEMO_SECONDS)s"
	@echo "make test   ruff, Django checks, the tests on SQLite, and on PostgreSQL and MariaDB if reachable"
	@echo "variables:  PYTHON=$(PYTHON) VENV=$(VENV) DEMO_SECONDS=$(DEMO_SECONDS)"
	@echo "            DATABASE_URL, REQUIRE_POSTGRES=1, MARIADB_URL, REQUIRE_MARIADB=1,"
	@echo "            SKIP_MARIADB=1, PYTEST_ARGS (make test)"

demo:
	@bash scripts/demo.sh

test:
	@bash scripts/test.sh
