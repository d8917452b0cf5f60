#!/usr/bin/env bash
# Set farm up on a fresh machine: a virtualenv in .venv with the pinned dependencies.
#   bash tools/setup.sh          # what `farm demo` needs
#   bash tools/setup.sh --test   # plus what the tests need: pytest, playwright, Debian's chromium and file
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.farm-installed-$(sha256sum pyproject.toml | cut -c1-16)-$want_test"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [ "$want_test" = 1 ]; then
    .venv/bin/python -m pip install -q -e '.[test]'
  else
    .venv/bin/python -m pip install -q -e .
  fi
  rm -f .venv/.farm-installed-*
  touch "$stamp"
fi

if [ "$want_test" = 1 ]; then
  missing=()
  command -v chromium >/dev/null || missing+=(chromium)
  command -v file >/dev/null || missing+=(file)
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi
echo "farm is set up: .venv/bin/farm --help" >&2
