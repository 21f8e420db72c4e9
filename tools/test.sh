#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (slow tests included). Extra args go to pytest;
# `--fast` runs only the tests that need no export and no torch (tiny torch-free packages).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
# One worker per core (pytest-xdist), a test file's tests on one worker (its module fixtures
# built once); exported test packages are shared between the workers (tests/conftest.py).
# --no-loadscope-reorder: the files start in tests/conftest.py's order (the longest first), not
# by their number of tests (which started the few-test, minutes-long files last).
exec .venv/bin/python -m pytest -n auto --dist loadfile --no-loadscope-reorder "$@"
