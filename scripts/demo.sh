#!/usr/bin/env bash
# make demo: three scheduler nodes side by side on the example project's SQLite file.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

SECONDS_TO_RUN=${DEMO_SECONDS:-20}
NODES=(node-1 node-2 node-3)

ensure_venv example
py="$VENV/bin/python"
export DJANGO_SETTINGS_MODULE=example_project.settings

say "Migrating the example database"
"$py" manage.py migrate --noinput --verbosity 0

if [ -n "${DJANGO_SUPERUSER_PASSWORD:-}" ]; then
    export DJANGO_SUPERUSER_USERNAME=${DJANGO_SUPERUSER_USERNAME:-admin}
    export DJANGO_SUPERUSER_EMAIL=${DJANGO_SUPERUSER_EMAIL:-admin@example.com}
    if "$py" manage.py createsuperuser --noinput >/dev/null 2>&1; then
        echo "Created the superuser '$DJANGO_SUPERUSER_USERNAME' from DJANGO_SUPERUSER_PASSWORD."
    else
        echo "Superuser '$DJANGO_SUPERUSER_USERNAME' not created (it probably exists already)."
    fi
fi

since=$("$py" -c 'from datetime import UTC, datetime; print(datetime.now(UTC).isoformat())')
say "Starting ${NODES[*]} for ${SECONDS_TO_RUN}s (Ctrl-C stops all three)"
cat <<'TEXT'
Every node carries the same demo jobs (example_project/demo/jobs.py) and computes the same
occurrences. Each line starts with the node that wrote it: "won demo.tick @ <second>" appears on
exactly one node per second; the others silently lose the claim. demo.hello (startup) and
demo.local_housekeeping (every node) run on all three by design.

TEXT

pids=()
interrupts=0
# shellcheck disable=SC2317  # called by the trap below
stop_nodes() {
    interrupts=$((interrupts + 1))
    if [ "$interrupts" -gt 1 ]; then
        echo "Second interrupt: killing the nodes." >&2
        kill -KILL "${pids[@]}" 2>/dev/null || true
    else
        echo "Stopping the nodes (they finish running jobs first)..." >&2
        kill -TERM "${pids[@]}" 2>/dev/null || true
    fi
}
trap stop_nodes INT TERM

for node in "${NODES[@]}"; do
    "$py" manage.py runscheduler --node-id "$node" --duration "$SECONDS_TO_RUN" &
    pids+=($!)
done

status=0
for pid in "${pids[@]}"; do
    while :; do
        rc=0
        wait "$pid" || rc=$?
        # wait returns early (>128) when a trapped signal arrives; wait again while it lives.
        if [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
        break
    done
    [ "$rc" -eq 0 ] || status=$rc
done
trap - INT TERM

say "What the ledger says (runs created since the nodes started)"
"$py" manage.py demosummary --since "$since"
cat <<TEXT

Look closer in the admin: $py manage.py createsuperuser (or run make demo with
DJANGO_SUPERUSER_PASSWORD set), then $py manage.py runserver and open
http://127.0.0.1:8000/admin/ (jobs, runs and worker nodes).
TEXT
exit "$status"
