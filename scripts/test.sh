#!/usr/bin/env bash
# make test: lint, types and Django checks, then the test suite on SQLite, on PostgreSQL and on
# MariaDB / MySQL.
#
# The SQLite run ignores DATABASE_URL (tests/settings.py then uses an SQLite file). PostgreSQL:
# DATABASE_URL when it is a postgres URL (an unreachable one is an error), else
# postgres://postgres@127.0.0.1:5432/test when that server answers, else the run is skipped with a
# notice. REQUIRE_POSTGRES=1 turns that skip into a failure (CI sets it).
# MariaDB / MySQL likewise: MARIADB_URL, else DATABASE_URL when it is a mysql URL (either one, if
# unreachable, is an error), else mysql://root@127.0.0.1:3306/test when that server answers.
# REQUIRE_MARIADB=1 turns its skip into a failure; SKIP_MARIADB=1 leaves the run out, and
# SKIP_SQLITE=1 / SKIP_POSTGRES=1 leave theirs out (CI runs MariaDB as a job of its own).
# PYTEST_ARGS is passed on to pytest (e.g. PYTEST_ARGS="-k claim -x").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/lib.sh

LOCAL_POSTGRES=postgres://postgres@127.0.0.1:5432/test
LOCAL_MARIADB=mysql://root@127.0.0.1:3306/test
ensure_venv test
py="$VENV/bin/python"
results=()

# Print the URL with any password hidden.
shown() { printf '%s' "$1" | sed -E 's#(://[^:/@]+):[^@]*@#\1:***@#'; }

# True when the PostgreSQL server behind the URL accepts a connection within 3 seconds.
postgres_reachable() {
    "$py" - "$1" <<'PY'
import sys

import psycopg

url = sys.argv[1].replace("pgsql://", "postgresql://", 1)
error = None
for extra in ({}, {"dbname": "postgres"}):  # the named database may not exist yet
    try:
        psycopg.connect(url, connect_timeout=3, **extra).close()
        sys.exit(0)
    except psycopg.Error as exc:
        error = exc
print(f"    {str(error).strip()}", file=sys.stderr)
sys.exit(1)
PY
}

# True when the MariaDB / MySQL server behind the URL accepts a connection within 3 seconds.
mariadb_reachable() {
    "$py" - "$1" <<'PY'
import sys

import environ
import pymysql

db = environ.Env.db_url_config(sys.argv[1])
try:  # without the database: it may not exist yet
    pymysql.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 3306),
        user=db["USER"],
        password=db["PASSWORD"],
        connect_timeout=3,
    ).close()
except pymysql.Error as exc:
    print(f"    {exc}", file=sys.stderr)
    sys.exit(1)
PY
}

# unreachable NAME URL VARIABLE: the loud failure of a database run that is required.
unreachable() {
    local rule="######################################################################"
    {
        printf '\n%s\n' "$rule"
        echo "ERROR: $1 not reachable at $(shown "$2"), and this run requires it"
        echo "($3). Start the server or fix the URL."
        printf '%s\n' "$rule"
    } >&2
    results+=("pytest on $1: FAILED (not reachable)")
    failed=1
}

# run_pytest LABEL [DATABASE_URL]: run the suite; "no tests collected" (exit 5) is a failure.
run_pytest() {
    local label=$1 url=${2:-} rc=0
    say "pytest on $label"
    local args
    read -r -a args <<<"${PYTEST_ARGS:-}"
    if [ -n "$url" ]; then
        DATABASE_URL=$url "$py" -m pytest "${args[@]}" || rc=$?
    else
        env -u DATABASE_URL "$py" -m pytest "${args[@]}" || rc=$?
    fi
    case $rc in
        0) results+=("pytest on $label: passed") ;;
        5) results+=("pytest on $label: FAILED (no tests were collected)") ;;
        *) results+=("pytest on $label: FAILED (pytest exit code $rc)") ;;
    esac
    return "$rc"
}

say "Static checks: ruff, import contracts, mypy, Django system checks, missing migrations"
static_ok=1
static() {
    env -u DATABASE_URL DJANGO_SETTINGS_MODULE=tests.settings "$@" || {
        echo "FAILED: $*" >&2
        static_ok=0
    }
}
static "$VENV/bin/ruff" check .
static "$VENV/bin/lint-imports"
static "$VENV/bin/mypy" django_cluster_jobs
static "$py" -m django check --fail-level WARNING
static "$py" -m django makemigrations --check --dry-run

failed=0
if [ "$static_ok" = 1 ]; then
    results+=("static checks: passed")
else
    echo "Static checks FAILED (see above); the tests run anyway, but make test will fail." >&2
    results+=("static checks: FAILED")
    failed=1
fi

if [ "${SKIP_SQLITE:-0}" = 1 ]; then
    echo "SKIP_SQLITE=1: the SQLite run is left out"
    results+=("pytest on SQLite: left out (SKIP_SQLITE=1)")
else
    run_pytest SQLite || failed=1
fi

# An explicit PostgreSQL DATABASE_URL must work; the local server is used only if it answers.
candidate=$LOCAL_POSTGRES
required=${REQUIRE_POSTGRES:-0}
case ${DATABASE_URL:-} in
    postgres://* | postgresql://* | pgsql://*) candidate=$DATABASE_URL required=1 ;;
    "" | mysql://* | mysql2://*) ;;
    *) echo "DATABASE_URL is not a PostgreSQL URL: the SQLite run ignored it, and so does this." ;;
esac

if [ "${SKIP_POSTGRES:-0}" = 1 ]; then
    echo "SKIP_POSTGRES=1: the PostgreSQL run is left out"
    results+=("pytest on PostgreSQL: left out (SKIP_POSTGRES=1)")
else
    say "Looking for PostgreSQL at $(shown "$candidate")"
    if postgres_reachable "$candidate"; then
        run_pytest "PostgreSQL ($(shown "$candidate"))" "$candidate" || failed=1
    elif [ "$required" = 1 ]; then
        unreachable PostgreSQL "$candidate" "REQUIRE_POSTGRES=1 or a PostgreSQL DATABASE_URL"
    else
        echo "PostgreSQL not reachable: skipped the PostgreSQL run"
        echo "(set DATABASE_URL=postgres://... or start a server on 127.0.0.1:5432 to include it)"
        results+=("pytest on PostgreSQL: skipped (not reachable)")
    fi
fi

# MariaDB / MySQL: an explicit URL must work; the local server is used only if it answers.
candidate=${MARIADB_URL:-$LOCAL_MARIADB}
required=${REQUIRE_MARIADB:-0}
[ -z "${MARIADB_URL:-}" ] || required=1
if [ -z "${MARIADB_URL:-}" ]; then
    case ${DATABASE_URL:-} in
        mysql://* | mysql2://*) candidate=$DATABASE_URL required=1 ;;
    esac
fi

if [ "${SKIP_MARIADB:-0}" = 1 ]; then
    echo "SKIP_MARIADB=1: the MariaDB / MySQL run is left out"
    results+=("pytest on MariaDB / MySQL: left out (SKIP_MARIADB=1)")
else
    say "Looking for MariaDB / MySQL at $(shown "$candidate")"
    if mariadb_reachable "$candidate"; then
        run_pytest "MariaDB / MySQL ($(shown "$candidate"))" "$candidate" || failed=1
    elif [ "$required" = 1 ]; then
        unreachable "MariaDB / MySQL" "$candidate" \
            "REQUIRE_MARIADB=1, MARIADB_URL or a mysql DATABASE_URL"
    else
        echo "MariaDB / MySQL not reachable: skipped the MariaDB run"
        echo "(set MARIADB_URL=mysql://... or start a server on 127.0.0.1:3306 to include it)"
        results+=("pytest on MariaDB / MySQL: skipped (not reachable)")
    fi
fi

say "Summary ($(versions "$py"))"
printf '  %s\n' "${results[@]}"
exit "$failed"
