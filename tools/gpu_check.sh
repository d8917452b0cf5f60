#!/usr/bin/env bash
# The GPU check: farm on a real NVIDIA GPU, from the kit tools/gpu_kit.py built (nothing else is reached).
#
#   bash tools/gpu_check.sh [KIT] [OUT]     # KIT: build/gpu-kit.tar.gz; OUT: $OUT, else ./gpu-check
#   MODELS=mlp BUDGET_S=150 bash tools/gpu_check.sh   # the rerun: mlp alone (docs/benchmarks.md, the budget)
#   VENV=/path/to/venv bash tools/gpu_check.sh   # install into that venv (it has numpy and onnxruntime) instead
#   PYTHON=/path/to/python3.12 bash tools/gpu_check.sh   # the Python whose numpy and onnxruntime farm uses
#   WITHOUT_GPU=1 bash tools/gpu_check.sh    # a host with no NVIDIA driver (the tests): go on past its absence
#
# 1. Preflight, in the first seconds (tools/gpu_preflight.py, standard library only): the interpreter and its
#    prefixes, numpy and onnxruntime, libcuda.so.1, the driver's CUDA against the bundle's (13) and each artifact's
#    note, the GPU's compute capability against the artifacts' arch, free disk and GPU memory. The first thing
#    missing is one `error:` line and a hint, before a second of the machine's time is spent on anything slow.
# 2. A venv of its own made from PYTHON (default python3: on the lent machine that is itself a venv holding numpy,
#    onnxruntime and torch), made --without-pip, with a .pth naming that interpreter's site-packages: the kit's
#    packages come first, the image's numpy, onnxruntime and torch are seen (a --system-site-packages venv made from
#    a venv would see the base interpreter's packages instead). The kit's wheels go in with the image's pip, no index
#    (TVM's runtime alone: TVM_USE_RUNTIME_LIB=1, no compiler); farm's torch hook is installed as setup.sh does.
# 3. A tracker and farm's native CUDA server (no Python on the device side: the artifacts carry cubins compiled by
#    the kit's builder), then per model farm bench (cold and warm first run: module load with no JIT; steady kernel
#    time on the GPU's clock and wall per call on the host's; memory; outputs checked against onnxruntime on the CPU),
#    the copy curve both ways, and the report.
# 4. What comes back: a device call returns at most 8 files, so OUT holds exactly FILES_BACK: the log, summary.json
#    (the preflight and each step's outcome and figures), report.html and results.db (checkpointed: no -wal or -shm)
#    whole, and everything else (the bench JSONs, the copy curve, nvidia-smi's view, versions) in extras.tar.gz. They
#    are written on every exit, a budget run out or a TERM included.
#
# Budget: every step is bounded, and all of them by BUDGET_S (default 330 s; the last 90 s are the results' and the
# report's); a step with no time left is skipped and says so; a model that fails is a stored failure, and the check
# goes on to the next. docs/benchmarks.md ("The GPU check's budget") gives the 15 minutes of a lent machine: its
# start, this run, and one rerun of mlp alone.
set -uo pipefail
deadline=$(( SECONDS + ${BUDGET_S:-330} ))
# bounded MAX_S CMD...: CMD under a timeout of MAX_S or what is left of the budget (less RESERVE_S, kept for the
# steps after it), whichever is less
bounded() {
  local max=$1 left=$(( deadline - ${RESERVE_S:-0} - SECONDS ))
  shift
  if (( left < 5 )); then echo "skipped, out of time: $*" >&2; return 124; fi
  timeout -k 10 "$(( left < max ? left : max ))" "$@"  # a step that ignores TERM is killed 10 s later
}
here="$(cd "$(dirname "$0")/.." && pwd)"
kit="${1:-$here/build/gpu-kit.tar.gz}"
out="$(mkdir -p "${2:-${OUT:-$PWD/gpu-check}}" && cd "${2:-${OUT:-$PWD/gpu-check}}" && pwd)"
extra="$out/extras"  # packed into extras.tar.gz at the end
mkdir -p "$extra"
log="$out/gpu-check.log"
# the log's tee ignores the TERM that stops the check (it must write the check's last lines), and a write to it after
# it is gone does not kill the check before its files are written
exec > >(trap '' TERM INT; exec tee -a "$log") 2>&1
trap '' PIPE
step() { printf '== %s (%s, %s s in)\n' "$1" "$(date -u +%H:%M:%S)" "$SECONDS"; }

python="${PYTHON:-python3}"  # the lent machine's python3: Python 3.12.3, /opt/torch/.venv (the device tool's KINDS.md)
[ -z "${VENV:-}" ] || python="$VENV/bin/python"
command -v "$python" >/dev/null || { echo "error: $python not found"; echo "hint: PYTHON=/path/to/python3.12 bash tools/gpu_check.sh"; exit 1; }
[ -f "$kit" ] || { echo "error: no kit at $kit"; echo "hint: build it where farm is set up: .venv/bin/python tools/gpu_kit.py"; exit 1; }
work="$(mktemp -d "${TMPDIR:-/tmp}/farm-gpu-check.XXXXXX")"

status=0
finished=0
finish() {  # everything OUT holds, whatever ended the check
  [ "$finished" = 1 ] && return
  finished=1
  [ -x "${farm:-}" ] && timeout 25 "$farm" down >/dev/null 2>&1
  "$python" - "$out" "$status" "$SECONDS" "${BUDGET_S:-330}" <<'EOF' || echo "warning: the summary was not written"
import json, sqlite3, sys
from pathlib import Path
out, status, elapsed, budget = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
db = out / "results.db"
if db.exists():  # its WAL folded in and removed: one file comes back whole
    with sqlite3.connect(db) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.execute("PRAGMA journal_mode=DELETE")
    con.close()
def read(name):
    try:
        return json.loads((out / "extras" / name).read_text())
    except (OSError, ValueError):
        return None
keep = ("status", "reason", "failed_step", "hint", "threads", "steady_clock", "load_s", "first_run_s", "load_warm_s",
        "first_run_warm_s", "steady_median_s", "check")
benches = {p.name[len("bench-"):-len(".json")]: read(p.name) for p in sorted((out / "extras").glob("bench-*.json"))}
preflight = read("preflight.json") or {}
summary = {"exit": status, "elapsed_s": elapsed, "budget_s": budget,
           "preflight": {v["check"]: {"ok": v["ok"], "line": v["line"]} for v in preflight.get("verdicts", [])},
           "versions": read("versions.json"),
           "benches": {name: ({k: b.get(k) for k in keep if k in b} if isinstance(b, dict) else None)
                       for name, b in benches.items()},
           "copies": (read("copies.json") or {}).get("status") if isinstance(read("copies.json"), dict) else None}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
EOF
  tar czf "$out/extras.tar.gz" -C "$out" extras && rm -rf "$extra"
  echo "== files back: $(cd "$out" && ls | tr '\n' ' ')"
}
trap 'finish; exit $status' EXIT
trap 'echo "error: stopped by a signal"; status=1; exit 1' TERM INT

step "preflight"
"$python" "$here/tools/gpu_preflight.py" "$kit" --work "$work" --json "$extra/preflight.json" \
  ${WITHOUT_GPU:+--without-gpu} || { status=1; exit 1; }

step "kit $kit into $work"
tar xzf "$kit" -C "$work" || { status=1; exit 1; }
venv="${VENV:-$work/venv}"
if [ -z "${VENV:-}" ]; then
  "$python" -m venv --without-pip "$venv" || { echo "error: could not make a venv with $python"; status=1; exit 1; }
  purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$python" -c 'import site; print("\n".join(site.getsitepackages()))' > "$purelib/farm-gpu-check-image.pth"
fi
# not byte-compiled by pip (its 3,800 modules: 15 s against 5.5 s of the device's time, one core): each module is
# compiled by its first import and written once, PYTHONDONTWRITEBYTECODE or not (into the venv the kit went into)
bounded 120 "$venv/bin/python" -m pip install -q --no-compile --no-index --no-deps --force-reinstall "$work"/wheels/*.whl \
  || { echo "error: the kit's wheels did not install into $venv"; echo "hint: the log above says why"; status=1; exit 1; }
unset PYTHONDONTWRITEBYTECODE
"$venv/bin/python" -m farm.tvm_private >/dev/null  # farm's torch hook, as tools/setup.sh installs it

export TVM_USE_RUNTIME_LIB=1 FARM_CACHE="$work/cache" FARM_HOME="$work/home" FARM_DEVICES="$work/devices.toml"
export FARM_DB="$out/results.db"
farm="$venv/bin/farm"
models="${MODELS:-mlp convnet onnx:squeezenet onnx:resnet50}"

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv \
  | tee "$extra/gpu.csv" || echo "warning: nvidia-smi did not answer"
nvidia-smi topo -m > "$extra/nvidia-topo.txt" 2>&1 || true
"$venv/bin/python" - <<'EOF' > "$extra/versions.json" || true
import json, platform, sys, importlib.metadata as m
said = {"python": platform.python_version(), "machine": platform.machine(), "prefix": sys.prefix}
for name in ("apache-tvm", "apache-tvm-ffi", "numpy", "onnxruntime", "torch", "farm"):
    try:
        said[name] = m.version(name)
    except m.PackageNotFoundError:
        said[name] = None
print(json.dumps(said))
EOF
cat "$extra/versions.json"

step "tracker and farm's native CUDA server"
port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
sed -i "s/^port = .*/port = $port/" "$FARM_DEVICES"  # a free port: never another tracker's
bounded 60 "$farm" tracker start || { echo "error: the tracker did not start"; status=1; exit 1; }
bounded 90 "$farm" serve || { echo "error: farm serve failed"; status=1; exit 1; }
bounded 30 "$farm" devices

for model in $models; do
  name="${model//[:\/]/-}"
  step "bench $model"
  RESERVE_S=90 bounded 120 "$farm" bench --device gpu --model "$model" --json > "$extra/bench-$name.json" || status=1
done
step "copy curve (both directions)"
RESERVE_S=90 bounded 90 "$farm" copies --device gpu --json > "$extra/copies.json" || status=1
step "results and report"
bounded 30 "$farm" results --json > "$extra/results.json" || status=1
bounded 60 "$farm" report --out "$out/report.html" || status=1
step "done (exit $status): $out"
exit $status
