#!/usr/bin/env bash
# make test: lint, types and Django checks, then the test suite on SQLite, on PostgreSQL and on
# MariaDB / MySQL. make check (CHECK=1): the static checks and the tests marked neither `timing`
# nor `browser`, on SQLite only: the inner loop, a few minutes.
#
# Each database's suite runs in two parts: the rest, then the tests marked `timing` (their outcome
# depends on wall-clock time; tests/timing.py). TESTS_SQLITE, TESTS_POSTGRES and TESTS_MARIADB say
# which parts run on each: all (the default: rest,timing), none, or the parts in the order to run
# them (rest, timing, timing,rest). TIMING_LOCK=FILE makes every
# timing part hold `flock FILE` while it runs, so that suites started side by side (CI) never run
# their timing parts at the same time. CLUSTER_JOBS_TEST_TIME_SCALE (default 1) multiplies every
# deadline of the suite, for a slower machine.
#
# The SQLite run ignores DATABASE_URL (tests/settings.py then uses an SQLite file). PostgreSQL:
# DATABASE_URL when it is a postgres URL (an unreachable one is an error), else
# postgres://postgres@127.0.0.1:5432/test when that server answers, else the run is skipped with a
# notice. REQUIRE_POSTGRES=1 turns that skip into a failure (CI sets it).
# MariaDB / MySQL likewise: MARIADB_URL, else DATABASE_URL when it is a mysql URL (either one, if
# unreachable, is an error), else mysql://root@127.0.0.1:3306/test when that server answers.
# REQUIRE_MARIADB=1 turns its skip into a failure. SKIP_SQLITE=1, SKIP_POSTGRES=1 and
# SKIP_MARIADB=1 are TESTS_...=none; SKIP_STATIC=1 leaves out the static checks.
# PYTEST_ARGS is passed on to pytest (e.g. PYTEST_ARGS="-k claim -x"); with a -m of its own, each
# database runs once with that selection instead of in two parts. Without PYTEST_ARGS a part that
# collects no test fails; with it, a part it leaves empty is only reported as such.
# For CI: JUNIT_DIR=DIR writes a JUnit XML report per pytest run there, and STEPS_FILE=FILE appends
# one line per step (status|step|seconds|first error line) for scripts/ci_report.py.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/lib.sh

LOCAL_POSTGRES=postgres://postgres@127.0.0.1:5432/test
LOCAL_MARIADB=mysql://root@127.0.0.1:3306/test
ensure_venv test
py="$VENV/bin/python"
results=()
failed=0
read -r -a user_args <<<"${PYTEST_ARGS:-}"

if [ "${CHECK:-0}" = 1 ]; then  # make check: no process started, SQLite only
    TESTS_SQLITE=rest TESTS_POSTGRES=none TESTS_MARIADB=none
    REST_MARK="not timing and not browser"
fi
REST_MARK=${REST_MARK:-not timing}
[ "${SKIP_SQLITE:-0}" = 1 ] && TESTS_SQLITE=none
[ "${SKIP_POSTGRES:-0}" = 1 ] && TESTS_POSTGRES=none
[ "${SKIP_MARIADB:-0}" = 1 ] && TESTS_MARIADB=none

# Print the URL with any password hidden.
shown() { printf '%s' "$1" | sed -E 's#(://[^:/@]+):[^@]*@#\1:***@#'; }

# step STATUS NAME SECONDS [DETAIL]: one line of the summary, and of STEPS_FILE when set.
step() {
    results+=("$2: $1 (${3}s)${4:+ — $4}")
    [ -z "${STEPS_FILE:-}" ] || printf '%s|%s|%s|%s\n' "$1" "$2" "$3" "${4:-}" >>"$STEPS_FILE"
}

# first_error FILE: the first line of a failed tool's output that names the error.
first_error() {
    local line  # file:line: message (ruff --output-format concise, mypy), else a word of failure
    line=$(grep -m 1 -E '^[^ ]+:[0-9]+(:[0-9]+)?: ' "$1")
    [ -n "$line" ] || line=$(grep -m 1 -E 'error|Error|ERROR|FAILED|Migrations for|broken' "$1")
    [ -n "$line" ] || line=$(grep -v '^[[:space:]]*$' "$1" | tail -n 1)
    printf '%s' "${line:0:200}"
}

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
    step FAILED "pytest on $1" 0 "not reachable at $(shown "$2")"
    failed=1
}

# pytest_part LABEL SLUG PART [URL]: one pytest run (PART: rest, timing or selected); "no tests
# collected" (exit 5) is a failure; a timing part holds TIMING_LOCK when that is set.
pytest_part() {
    local label="$1 ($3)" slug=$2 part=$3 url=${4:-} rc=0 started=$SECONDS args=()
    case $part in
        rest) args=(-m "$REST_MARK") ;;
        timing) args=(-m timing) ;;
    esac
    [ -z "${JUNIT_DIR:-}" ] || args+=(--junitxml="$JUNIT_DIR/$slug-$part.xml" -o junit_family=xunit1)
    args+=(-p no:cacheprovider)  # suites side by side share no cache
    local run=(env -u DATABASE_URL)
    [ -z "$url" ] || run=(env DATABASE_URL="$url")
    if [ "$part" = timing ] && [ -n "${TIMING_LOCK:-}" ]; then
        say "pytest on $label: waiting for $TIMING_LOCK (one timing part at a time)"
        run=(flock -o "$TIMING_LOCK" "${run[@]}")  # -o: the scheduler processes hold nothing
    else
        say "pytest on $label"
    fi
    "${run[@]}" "$py" -m pytest "${args[@]}" "${user_args[@]}" || rc=$?
    case $rc in
        0) step passed "pytest on $label" $((SECONDS - started)) ;;
        5) if [ "${#user_args[@]}" -gt 0 ]; then
               step passed "pytest on $label" $((SECONDS - started)) "PYTEST_ARGS selects none"
               rc=0
           else
               step FAILED "pytest on $label" $((SECONDS - started)) "no tests were collected"
           fi ;;
        *) step FAILED "pytest on $label" $((SECONDS - started)) "pytest exit code $rc" ;;
    esac
    [ "$rc" = 0 ] || failed=1
}

# suite LABEL SLUG PARTS [URL]: the database's suite in the parts asked for, in their order
# (PARTS: all, none, or a comma-separated list of rest and timing).
suite() {
    local parts=$3 part
    [ "$parts" = all ] && parts=rest,timing
    if printf '%s\n' "${user_args[@]}" | grep -qx -- '-m'; then
        [ "$parts" = none ] || parts=selected
    fi
    [ "$parts" = none ] && { results+=("pytest on $1: left out"); return; }
    for part in ${parts//,/ }; do
        case $part in
            rest | timing | selected) pytest_part "$1" "$2" "$part" "${4:-}" ;;
            *) fail "TESTS_... takes all, none or a list of rest and timing, not '$3'" ;;
        esac
    done
}

# static NAME COMMAND...: one static check, its output shown and kept for the summary.
static() {
    local name=$1 started=$SECONDS out
    shift
    out=$(mktemp)
    if env -u DATABASE_URL DJANGO_SETTINGS_MODULE=tests.settings "$@" 2>&1 | tee "$out"; then
        step passed "$name" $((SECONDS - started))
    else
        step FAILED "$name" $((SECONDS - started)) "$(first_error "$out")"
        failed=1
    fi
    rm -f "$out"
}

if [ "${SKIP_STATIC:-0}" = 1 ]; then
    results+=("static checks: left out (SKIP_STATIC=1)")
else
    say "Static checks: ruff, import contracts, mypy, Django system checks, missing migrations"
    static "ruff check" "$VENV/bin/ruff" check --output-format concise .
    static "import contracts" "$VENV/bin/lint-imports" --no-cache
    static "mypy" "$VENV/bin/mypy" --cache-dir "$VENV/.mypy_cache" django_cluster_jobs
    static "Django system checks" "$py" -m django check --fail-level WARNING
    static "migrations check" "$py" -m django makemigrations --check --dry-run
fi

suite SQLite sqlite "${TESTS_SQLITE:-all}"

# An explicit PostgreSQL DATABASE_URL must work; the local server is used only if it answers.
candidate=$LOCAL_POSTGRES
required=${REQUIRE_POSTGRES:-0}
case ${DATABASE_URL:-} in
    postgres://* | postgresql://* | pgsql://*) candidate=$DATABASE_URL required=1 ;;
    "" | mysql://* | mysql2://*) ;;
    *) echo "DATABASE_URL is not a PostgreSQL URL: the SQLite run ignored it, and so does this." ;;
esac

if [ "${TESTS_POSTGRES:-all}" = none ]; then
    results+=("pytest on PostgreSQL: left out")
else
    say "Looking for PostgreSQL at $(shown "$candidate")"
    if postgres_reachable "$candidate"; then
        suite "PostgreSQL ($(shown "$candidate"))" postgresql "${TESTS_POSTGRES:-all}" "$candidate"
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

if [ "${TESTS_MARIADB:-all}" = none ]; then
    results+=("pytest on MariaDB / MySQL: left out")
else
    say "Looking for MariaDB / MySQL at $(shown "$candidate")"
    if mariadb_reachable "$candidate"; then
        suite "MariaDB / MySQL ($(shown "$candidate"))" mariadb "${TESTS_MARIADB:-all}" "$candidate"
    elif [ "$required" = 1 ]; then
        unreachable "MariaDB / MySQL" "$candidate" \
            "REQUIRE_MARIADB=1, MARIADB_URL or a mysql DATABASE_URL"
    else
        echo "MariaDB / MySQL not reachable: skipped the MariaDB run"
        echo "(set MARIADB_URL=mysql://... or start a server on 127.0.0.1:3306 to include it)"
        results+=("pytest on MariaDB / MySQL: skipped (not reachable)")
    fi
fi

say "Summary ($(versions "$py"), time scale ${CLUSTER_JOBS_TEST_TIME_SCALE:-1})"
printf '  %s\n' "${results[@]}"
exit "$failed"
