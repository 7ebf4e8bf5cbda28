#!/usr/bin/env bash
# The timing tests on a loaded machine: two CPU-bound busy loops run beside them the whole time,
# as the other suites of a CI run (or a busy CI host) would. Each argument is DATABASE:ROUNDS, the
# rounds run one after another and the script stops at the first failure, naming the round.
#
#   bash scripts/under_load.sh                          # sqlite:5 postgresql:5 mariadb:1
#   bash scripts/under_load.sh postgresql:2             # two rounds on PostgreSQL only
#
# Databases: sqlite (a file), postgresql (POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/
# test), mariadb (MARIADB_URL, default mysql://root@127.0.0.1:3306/test). PYTEST_ARGS is passed on
# (e.g. PYTEST_ARGS="tests/multinode -x"); BUSY_LOOPS (default 2) sets the load. Run nothing else
# meanwhile: the point is a known load.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. scripts/lib.sh

ensure_venv test
py="$VENV/bin/python"
read -r -a user_args <<<"${PYTEST_ARGS:-}"
[ "$#" -gt 0 ] || set -- sqlite:5 postgresql:5 mariadb:1

url_of() {
    case $1 in
        sqlite) echo "" ;;
        postgresql) echo "${POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}" ;;
        mariadb) echo "${MARIADB_URL:-mysql://root@127.0.0.1:3306/test}" ;;
        *) fail "unknown database '$1': sqlite, postgresql or mariadb" ;;
    esac
}

busy=()
stop_busy() { [ "${#busy[@]}" = 0 ] || kill "${busy[@]}" 2>/dev/null; }
trap stop_busy EXIT
say "Load average before the busy loops: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "${BUSY_LOOPS:-2}"); do
    bash -c 'while :; do :; done' &
    busy+=("$!")
done

report=()
for target in "$@"; do
    database=${target%%:*} rounds=${target#*:}
    [ "$rounds" != "$target" ] || rounds=1
    [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || fail "'$target': the rounds must be a whole number (sqlite:5)"
    url=$(url_of "$database") || exit 1
    for round in $(seq "$rounds"); do
        say "Timing tests on $database, round $round of $rounds, beside ${#busy[@]} busy loops"
        started=$SECONDS
        if [ -n "$url" ]; then
            DATABASE_URL=$url "$py" -m pytest -m timing -p no:cacheprovider "${user_args[@]}"
        else
            env -u DATABASE_URL "$py" -m pytest -m timing -p no:cacheprovider "${user_args[@]}"
        fi
        rc=$?
        line="$database round $round/$rounds: $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")"
        line+=" in $((SECONDS - started))s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
        report+=("$line")
        if [ "$rc" != 0 ]; then
            say "Summary"
            printf '  %s\n' "${report[@]}"
            exit 1
        fi
    done
done
say "Summary: every round passed"
printf '  %s\n' "${report[@]}"
