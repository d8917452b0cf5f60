#!/usr/bin/env bash
# The GPU check: farm on a real NVIDIA GPU, from the kit tools/gpu_kit.py built (nothing else is reached).
#
#   bash tools/gpu_check.sh [KIT] [OUT]     # KIT: build/gpu-kit.tar.gz; OUT: $OUT, else ./gpu-check
#   VENV=/path/to/venv bash tools/gpu_check.sh   # install into that venv (it has numpy and onnxruntime) instead
#   MODELS="mlp convnet" bash tools/gpu_check.sh  # fewer models
#
# Needs Python 3.12 with numpy and onnxruntime (a venv with --system-site-packages sees them, and torch where it is
# installed), the NVIDIA driver, and the kit. It installs the kit's wheels with pip --no-index into a venv of its own
# (TVM's runtime alone: TVM_USE_RUNTIME_LIB=1, no compiler), starts a tracker and farm's native CUDA server (no
# Python on the device side: the artifacts carry cubins compiled by the kit's builder), then per model farm bench
# (cold and warm first run: module load with no JIT; steady kernel time on the GPU's clock and wall per call on the
# host's; memory; outputs checked against onnxruntime on the CPU), the copy curve both ways, and the report.
# Everything lands in OUT: results.db, report.html, one JSON per bench, the log, nvidia-smi's view of the GPU.
# Each step is bounded, and all of them by BUDGET_S (default 330 s: the check ends within 6 minutes, its 25 s of
# teardown included; the last 90 s are the results' and the report's); a step with no time left is skipped and says
# so. A model that fails is a stored failure, and the check goes on to the next.
set -uo pipefail
deadline=$(( SECONDS + ${BUDGET_S:-330} ))
# bounded MAX_S CMD...: CMD under a timeout of MAX_S or what is left of the budget (less RESERVE_S, kept for the
# steps after it), whichever is less
bounded() {
  local max=$1 left=$(( deadline - ${RESERVE_S:-0} - SECONDS ))
  shift
  if (( left < 5 )); then echo "skipped, out of time: $*" >&2; return 124; fi
  timeout "$(( left < max ? left : max ))" "$@"
}
here="$(cd "$(dirname "$0")/.." && pwd)"
kit="${1:-$here/build/gpu-kit.tar.gz}"
out="$(mkdir -p "${2:-${OUT:-$PWD/gpu-check}}" && cd "${2:-${OUT:-$PWD/gpu-check}}" && pwd)"
python="${PYTHON:-python3.12}"
log="$out/gpu-check.log"
exec > >(tee -a "$log") 2>&1
step() { printf '== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

[ -f "$kit" ] || { echo "error: no kit at $kit"; echo "hint: build it where farm is set up: .venv/bin/python tools/gpu_kit.py"; exit 2; }
[ -n "${VENV:-}" ] || command -v "$python" >/dev/null || { echo "error: $python not found"; echo "hint: PYTHON=/path/to/python3.12 bash tools/gpu_check.sh"; exit 2; }
work="$(mktemp -d /tmp/farm-gpu-check.XXXXXX)"
step "kit $kit into $work"
tar xzf "$kit" -C "$work" || exit 2
venv="${VENV:-$work/venv}"
[ -n "${VENV:-}" ] || "$python" -m venv --system-site-packages "$venv" || exit 2
# not byte-compiled by pip (its 3,800 modules: 15 s against 5.5 s of the device's time, one core): each module is
# compiled by its first import and written once, PYTHONDONTWRITEBYTECODE or not (into the venv the kit went into)
bounded 120 "$venv/bin/python" -m pip install -q --no-compile --no-index --no-deps --force-reinstall "$work"/wheels/*.whl \
  || exit 2
unset PYTHONDONTWRITEBYTECODE

export TVM_USE_RUNTIME_LIB=1 FARM_CACHE="$work/cache" FARM_HOME="$work/home" FARM_DEVICES="$work/devices.toml"
export FARM_DB="$out/results.db"
farm="$venv/bin/farm"
models="${MODELS:-mlp convnet onnx:squeezenet onnx:resnet50}"
status=0

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv \
  | tee "$out/gpu.csv" || echo "warning: nvidia-smi did not answer"
nvidia-smi topo -m > "$out/nvidia-topo.txt" 2>&1 || true
"$venv/bin/python" - <<'EOF' > "$out/versions.json" || true
import json, platform, importlib.metadata as m
said = {"python": platform.python_version(), "machine": platform.machine()}
for name in ("apache-tvm", "apache-tvm-ffi", "numpy", "onnxruntime", "torch", "farm"):
    try:
        said[name] = m.version(name)
    except m.PackageNotFoundError:
        said[name] = None
print(json.dumps(said))
EOF
cat "$out/versions.json"

step "tracker and farm's native CUDA server"
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
sed -i "s/^port = .*/port = $port/" "$FARM_DEVICES"  # a free port: never another tracker's
trap 'timeout 25 "$farm" down >/dev/null 2>&1' EXIT
bounded 60 "$farm" tracker start || { echo "error: the tracker did not start"; exit 1; }
bounded 90 "$farm" serve || { echo "error: farm serve failed"; exit 1; }
bounded 30 "$farm" devices

for model in $models; do
  name="${model//[:\/]/-}"
  step "bench $model"
  RESERVE_S=90 bounded 120 "$farm" bench --device gpu --model "$model" --json > "$out/bench-$name.json" || status=1
done
step "copy curve (both directions)"
RESERVE_S=90 bounded 90 "$farm" copies --device gpu --json > "$out/copies.json" || status=1
step "results and report"
bounded 30 "$farm" results --json > "$out/results.json" || status=1
bounded 60 "$farm" report --out "$out/report.html" || status=1
step "done (exit $status): $out"
exit $status
