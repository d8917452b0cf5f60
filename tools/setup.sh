#!/usr/bin/env bash
# Set farm up on a fresh machine: a virtualenv in .venv with the pinned dependencies.
#   bash tools/setup.sh          # what `farm demo` needs, with its OpenCL device where it can be had (see --opencl)
#   bash tools/setup.sh --emulation  # plus Debian's qemu-user and aarch64 cross g++ (the emulated board), and
#                                    # Debian's arm64 POCL as the emulated phone's GPU driver (cached in ~/.cache/farm)
#   bash tools/setup.sh --opencl     # an OpenCL implementation (Debian's POCL) and TVM's OpenCL runtime, built from
#                                    # TVM's sources (TVM_SOURCE_DIR, else ../shared/tvm-src) against the wheel; the
#                                    # default tries it too and goes on without it (--no-opencl skips it)
#   bash tools/setup.sh --test       # everything the tests need: the above, pytest, playwright, chromium, file, adb,
#                                    # postgresql, and the checks tools/test.sh runs first (ruff, mypy, pylint)
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
want_emulation=0
want_opencl=1
need_opencl=0  # --opencl / --test: a failure to get it is an error, not a warning
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1; want_emulation=1; need_opencl=1 ;;
    --emulation) want_emulation=1 ;;
    --opencl) need_opencl=1 ;;
    --no-opencl) want_opencl=0 ;;
    *) echo "usage: bash tools/setup.sh [--emulation] [--opencl | --no-opencl] [--test]" >&2; exit 2 ;;
  esac
done

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.farm-installed-$(sha256sum pyproject.toml | cut -c1-16)-$want_test"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # xgboost-cpu replaced xgboost (pyproject.toml): the two install the same files, so an earlier set-up's goes first
  if .venv/bin/python -m pip show -q xgboost >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall -q -y xgboost nvidia-nccl-cu12
  fi
  # pip byte-compiles what it installs one file at a time (torch's thousands of modules: 121 s on 2 cores): never.
  # Where imports write bytecode, each module is compiled by its first import, once (the whole suite imports half of
  # the venv's 10,000 modules; what farm's commands import compiles in 8 s of CPU, the whole venv in 45 s on 2 cores
  # with compileall). Where PYTHONDONTWRITEBYTECODE is set (this workplace's machines), every process would compile
  # every module it imports, every time: compileall does them all ahead, on every core
  if [ "$want_test" = 1 ]; then
    .venv/bin/python -m pip install -q --no-compile -e '.[test,torch,tflite]'
  else
    .venv/bin/python -m pip install -q --no-compile -e .
  fi
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    # packages' own test suites left out (pandas', scipy's, sympy's: a quarter of the files), nothing imports them
    .venv/bin/python -m compileall -q -j 0 -x '/tests/' .venv/lib >/dev/null || true  # a few files do not parse
  fi
  rm -f .venv/.farm-installed-*
  touch "$stamp"
fi
# farm's own modules too, on every run (they change): where imports write no bytecode, every command compiled them
# (`farm devices --help`: 0.40 s of CPU, 0.33 s with them compiled)
.venv/bin/python -m compileall -q -j 0 farm >/dev/null
# TVM's own worker processes import TVM without PyTorch when farm started them (farm/tvm_private.py, STARTUP_PTH)
.venv/bin/python -m farm.tvm_private >/dev/null

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
[ "$need_opencl" = 1 ] && want_opencl=1
optional=()
if [ "$want_opencl" = 1 ]; then
  # POCL: a real OpenCL 1.2 implementation on the CPU; the ICD loader and headers to build TVM's OpenCL runtime
  [ -f /etc/OpenCL/vendors/pocl.icd ] || optional+=(pocl-opencl-icd)
  ls /usr/lib/*/libOpenCL.so >/dev/null 2>&1 || optional+=(ocl-icd-opencl-dev)
  [ -f /usr/include/CL/cl.h ] || optional+=(opencl-headers)
  if [ "$need_opencl" = 1 ]; then missing+=("${optional[@]}"); optional=(); fi
fi
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if [ ${#optional[@]} -gt 0 ] && [ ${#missing[@]} -eq 0 ]; then
  # the default setup: the demo's OpenCL device is a bonus, not a requirement
  { [ -z "$sudo" ] || sudo -n true 2>/dev/null; } && { $sudo apt-get update -q && \
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${optional[@]}"; } >&2 \
    || echo "warning: could not install ${optional[*]}; the demo runs without its OpenCL device (bash tools/setup.sh --opencl)" >&2
elif [ ${#optional[@]} -gt 0 ]; then
  missing+=("${optional[@]}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  $sudo apt-get update -q
  # policy-rc.d 101: packages must not start services (openssh-server would listen on port 22)
  printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
  $sudo chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" || status=$?
  $sudo rm -f /usr/sbin/policy-rc.d
  [ "${status:-0}" = 0 ] || exit "$status"
fi
if [ "$want_opencl" = 1 ] && [ -f /usr/include/CL/cl.h ]; then
  # TVM's OpenCL runtime from TVM's sources, against the installed wheel; cached in ~/.cache/farm (about 12 s once)
  # Without TVM's sources there is nothing to build: a warning (OpenCL devices and tests are skipped), not a failure.
  .venv/bin/python -c "import sys; from farm.devices.opencl_runtime import main; sys.exit(main())" >&2 \
    || { [ "$need_opencl" = 0 ] && echo "warning: TVM's OpenCL runtime was not built (see above); the demo runs without its OpenCL device" >&2; } \
    || exit 1
fi
if [ "$want_emulation" = 1 ]; then
  # The emulated phone's GPU driver: Debian's arm64 POCL in a sysroot for qemu-user (about 50 MB of packages,
  # downloaded once into ~/.cache/farm with a private arm64 package list; nothing is installed on this host)
  .venv/bin/python -m farm.devices.pocl_arm64 >&2 \
    || { [ "$want_test" = 0 ] && echo "warning: no arm64 POCL (see above): emulated OpenCL devices fail and fall back to their CPU" >&2; } \
    || exit 1
fi
if [ "$want_test" = 1 ]; then
  # CUDA device code is compiled ahead (farm/compile/cuda.py) with NVRTC from PyPI's wheels, CUDA 12.9's and 13.0's,
  # and farm's native server carries CUDA 13's libcudart: fetched once into ~/.cache/farm (about 10 s from a mirror)
  .venv/bin/python -m farm.devices.nvidia_wheels >&2
fi
echo "farm is set up: .venv/bin/farm --help" >&2
