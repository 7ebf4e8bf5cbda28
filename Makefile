# The two ways in: `make demo` shows the idea, `make test` checks it (`make check`: the quick part).
# Both need only Python 3.11+ and make; they create $(VENV) with $(PYTHON) when it is missing.

PYTHON ?= python3
VENV ?= .venv
DEMO_SECONDS ?= 20
export PYTHON VENV DEMO_SECONDS

.DEFAULT_GOAL := help
.PHONY: help demo test check

help:
	@echo "make demo   three scheduler nodes on the example project (SQLite) for $(DEMO_SECONDS)s"
	@echo "make test   ruff, Django checks, the tests on SQLite, and on PostgreSQL and MariaDB if reachable"
	@echo "make check  the static checks and the tests that start no process, on SQLite (minutes)"
	@echo "variables:  PYTHON=$(PYTHON) VENV=$(VENV) DEMO_SECONDS=$(DEMO_SECONDS)"
	@echo "            DATABASE_URL, REQUIRE_POSTGRES=1, MARIADB_URL, REQUIRE_MARIADB=1,"
	@echo "            SKIP_MARIADB=1, TESTS_SQLITE / TESTS_POSTGRES / TESTS_MARIADB=all|rest|timing|none,"
	@echo "            PYTEST_ARGS, CLUSTER_JOBS_TEST_TIME_SCALE (make test)"

demo:
	@bash scripts/demo.sh

test:
	@bash scripts/test.sh

check:
	@CHECK=1 bash scripts/test.sh
