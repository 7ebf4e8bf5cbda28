# shellcheck shell=bash
# Shared by scripts/demo.sh and scripts/test.sh: the virtual environment they run in.
# PYTHON (default python3) creates VENV (default .venv) when it is missing.

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

say() { printf '\n==> %s\n' "$*"; }
fail() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

# Print the interpreter's Python and Django versions.
versions() {
    "$1" -c 'import sys, django; print(f"Python {sys.version.split()[0]}, Django {django.get_version()}")'
}

# ensure_venv EXTRA: create $VENV if needed and install the project editable with that extra.
# The install is repeated only when pyproject.toml changed since the last one.
ensure_venv() {
    local extra=$1 stamp="$VENV/.cluster-jobs-installed-$1"
    if [ ! -x "$VENV/bin/python" ]; then
        command -v "$PYTHON" >/dev/null 2>&1 \
            || fail "no '$PYTHON' found; install Python 3.11+ or pass PYTHON=/path/to/python3"
        "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || fail "'$PYTHON' is $("$PYTHON" --version 2>&1); Python 3.11+ is needed (pass PYTHON=...)"
        say "Creating the virtual environment $VENV with $("$PYTHON" --version 2>&1)"
        "$PYTHON" -m venv "$VENV" || fail "could not create $VENV"
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        say "Installing django-cluster-jobs (editable) with the '$extra' extra into $VENV"
        "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet -e ".[$extra]" \
            || fail "pip could not install .[$extra]"
        touch "$stamp"
    fi
}
