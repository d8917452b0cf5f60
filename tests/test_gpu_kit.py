"""The GPU check's kit (tools/gpu_kit.py, tools/gpu_check.sh), everything but the GPU: the kit fits what a device call
carries, installs with no index into a fresh Python 3.12 venv that has only numpy and onnxruntime (what the lent
machine has), runs TVM's runtime alone (no libtvm_compiler.so), starts the tracker and farm's native CUDA server,
finds the carried artifact without compiling, and stores the GPU's absence here as a failure with its reason; the
same runtime-only farm measures a CPU model end to end."""

import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from farm.rpc.processes import free_port
from farm.tvm_private import runtime_only_env
from tests.conftest import REPO

# pyenv's own 3.12 first: its shim answers "command not found" where 3.12 is not the selected version
PYTHON_312 = next(iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))),
                  None) or shutil.which("python3.12")
pytestmark = pytest.mark.skipif(PYTHON_312 is None, reason="needs Python 3.12 (the GPU machine's)")


@pytest.fixture(scope="module")
def kit_and_host(tmp_path_factory):
    """The kit with mlp, and a 'host' venv of Python 3.12 with numpy and onnxruntime only."""
    work = tmp_path_factory.mktemp("gpu-kit")
    kit = work / "kit.tar.gz"
    built = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_kit.py"), "--models", "mlp", "--out", str(kit)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    host = work / "host"
    subprocess.run([PYTHON_312, "-m", "venv", str(host)], check=True, timeout=120)
    installed = subprocess.run([str(host / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "numpy",
                                "onnxruntime"],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return kit, host, built.stderr


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_", "TVM_", "PYTHON"))}
    return {**env, **extra}


def test_the_kit_fits_a_device_call_and_carries_no_compiler(kit_and_host):
    kit, _, said = kit_and_host
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from gpu_kit import COMPILER, LIMIT_BYTES
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert kit.stat().st_size < LIMIT_BYTES
    assert "gpu: cubin sm_90, CUDA 13.0 (NVRTC 13.0 (PyPI))" in said  # the artifact compiled here, for the H100
    import tarfile
    import zipfile

    with tarfile.open(kit) as tar:
        names = tar.getnames()
        (wheel,) = [n for n in names if Path(n).name.startswith("apache_tvm-")]
        with zipfile.ZipFile(tar.extractfile(wheel)) as tvm_wheel:
            libraries = [n for n in tvm_wheel.namelist() if "/lib/" in n]
    assert not any(n.endswith(COMPILER) for n in libraries) and any(n.endswith("libtvm_runtime.so") for n in libraries)
    assert any(n.endswith("/libtvm_runtime_cuda.so") for n in names) and any(n.endswith("/libcudart.so.13") for n in names)


def test_the_check_runs_from_the_kit_without_an_index_and_stores_the_missing_gpu_as_a_failure(kit_and_host, tmp_path):
    kit, host, _ = kit_and_host
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), str(kit), str(out)], capture_output=True,
                          text=True, timeout=900, env=_clean_env(VENV=str(host), MODELS="mlp"))
    log = (out / "gpu-check.log").read_text()
    assert done.returncode == 1, log[-3000:]  # no GPU here: the bench and the copy curve fail, and say why
    versions = json.loads((out / "versions.json").read_text())
    assert (versions["python"][:4], versions["apache-tvm"], versions["torch"]) == ("3.12", "0.27.0.post1", None)
    assert not list(host.glob("lib/python3.12/site-packages/tvm/lib/libtvm_compiler.so"))
    assert "1 server(s) started, 1 running" in log
    refusal = ("no CUDA device on this server (key gpu): libcuda.so.1: cannot open shared object file: "
               "No such file or directory (the NVIDIA driver is not installed)")
    assert log.count(f"error: {refusal}") == 2  # farm bench, farm copies
    with sqlite3.connect(out / "results.db") as db:
        runs = db.execute("SELECT device, model, status, reason FROM runs WHERE runtime = 'tvm'").fetchall()
    assert [(d, m, s) for d, m, s, _ in runs] == [("gpu", "mlp", "failed")] and refusal in runs[0][3]
    assert (out / "report.html").stat().st_size > 0


def test_the_kit_s_runtime_only_farm_measures_a_cpu_model_end_to_end(kit_and_host, tmp_path):
    """What the GPU check does after the GPU's session opens, here on the CPU: load, first runs, steady, copies,
    memory and the output check, with TVM's runtime alone and an artifact compiled by the full TVM."""
    _, host, _ = kit_and_host
    inventory = tmp_path / "devices.toml"
    inventory.write_text(f'[tracker]\nhost = "127.0.0.1"\nport = {free_port()}\n\n[devices.cpu]\nkind = "local"\n'
                         'key = "kit-cpu"\ntarget = { kind = "llvm", mcpu = "x86-64", num-cores = 2 }\nthreads = 2\n')
    env = _clean_env(FARM_HOME=str(tmp_path / "home"), FARM_DEVICES=str(inventory), FARM_DB=str(tmp_path / "r.db"))
    compiled = subprocess.run([str(REPO / ".venv" / "bin" / "farm"), "compile", "--device", "cpu", "--model", "mlp"],
                              capture_output=True, text=True, timeout=300, env=env)
    assert compiled.returncode == 0, compiled.stderr
    farm, runtime_only = str(host / "bin" / "farm"), {**env, **runtime_only_env()}
    try:
        for verb in (["tracker", "start"], ["serve"]):
            started = subprocess.run([farm, *verb], capture_output=True, text=True, timeout=120, env=runtime_only)
            assert started.returncode == 0, started.stderr
        bench = subprocess.run([farm, "bench", "--device", "cpu", "--model", "mlp", "--json"], capture_output=True,
                               text=True, timeout=300, env=runtime_only)
    finally:
        subprocess.run([farm, "down"], capture_output=True, timeout=120, env=runtime_only)
    assert bench.returncode == 0, bench.stderr[-2000:]
    result = json.loads(bench.stdout)
    assert result["status"] == "ok" and result["check"]["status"] == "passed", result
    assert result["threads"] == 2 and result["reference"]["status"] == "ok"
