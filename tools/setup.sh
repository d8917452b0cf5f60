#!/usr/bin/env bash
# Set farm up on a fresh machine: a virtualenv in .venv with the pinned dependencies.
#   bash tools/setup.sh          # what `farm demo` needs
#   bash tools/setup.sh --emulation  # plus Debian's qemu-user and aarch64 cross g++ (the emulated board)
#   bash tools/setup.sh --test       # everything the tests need: the above, pytest, playwright, chromium, file, adb, postgresql
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
want_emulation=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1; want_emulation=1 ;;
    --emulation) want_emulation=1 ;;
    *) echo "usage: bash tools/setup.sh [--emulation] [--test]" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.farm-installed-$(sha256sum pyproject.toml | cut -c1-16)-$want_test"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if [ "$want_test" = 1 ]; then
    .venv/bin/python -m pip install -q -e '.[test,torch,tflite]'
  else
    .venv/bin/python -m pip install -q -e .
  fi
  rm -f .venv/.farm-installed-*
  touch "$stamp"
fi

missing=()
if [ "$want_test" = 1 ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v file >/dev/null || missing+=(file)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)  # the SSH bring-up test runs its own sshd on loopback
  command -v adb >/dev/null || missing+=(adb)  # the Android test runs its own adb server against the stand-in phone
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)  # the store's PostgreSQL tests start their own server
fi
if [ "$want_emulation" = 1 ]; then
  command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
  command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q
  # policy-rc.d 101: packages must not start services (openssh-server would listen on port 22)
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
  $sudo rm -f /usr/sbin/policy-rc.d
  [ "${status:-0}" = 0 ] || exit "$status"
fi
echo "farm is set up: .venv/bin/farm --help" >&2
