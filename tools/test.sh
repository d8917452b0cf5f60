#!/usr/bin/env bash
# Run farm's test suite from a fresh checkout: sets up what it needs, then pytest.
# Extra arguments go to pytest (e.g. bash tools/test.sh -m 'not slow').
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --test
exec .venv/bin/python -m pytest -q -ra "$@"
