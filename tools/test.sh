#!/usr/bin/env bash
# Run farm's test suite from a fresh checkout: sets up what it needs, then pytest.
# Extra arguments go to one plain pytest run instead (e.g. bash tools/test.sh -m 'not slow' -n 2).
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite's processes write the bytecode of what they import, once: with PYTHONDONTWRITEBYTECODE (this
# workplace's machines) set, the set-up would compile all of the venv ahead instead (45 s), half of it never imported
unset PYTHONDONTWRITEBYTECODE
bash tools/setup.sh --test
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -ra "$@"
fi
# Checks first, each seconds, not a red suite after 15 minutes: lint (pyflakes, bugbear, line length:
# pyproject's [tool.ruff]), types (pyproject's [tool.mypy]), and no block of code written twice in farm/
# (pylint's similarity checker alone, pyproject's [tool.pylint.similarities]).
.venv/bin/ruff check farm tools tests
.venv/bin/pylint --disable=all --enable=duplicate-code --score=n farm &  # beside mypy: a core each
pylint=$!
checks=0
.venv/bin/mypy || checks=$?
wait $pylint || checks=$?
[ $checks = 0 ] || exit $checks
# Three workers on CI's 2 cores (a third fills the cores while a test waits on a lab's timeouts or a server: they
# were 94 % busy with two, 99 % with three; docs/benchmarks.md), a test file each at a time (module fixtures start
# once), the longest files first (conftest's LONGEST_FIRST, kept in that order); then, alone, the tests
# marked quiet (a regression baseline needs a machine that is not running the other workers).
status=0
.venv/bin/python -m pytest -q -ra -n 3 --dist loadfile --no-loadscope-reorder -m "not quiet" || status=$?
.venv/bin/python -m pytest -q -ra -m quiet || status=$?
exit $status
