"""The GPU check's kit (tools/gpu_kit.py, tools/gpu_check.sh, tools/gpu_preflight.py), everything but the GPU.

The lent machine is played by a stand-in for its image: a Python 3.12 venv holding numpy and onnxruntime (not
farm's), first on PATH as python3 and python3.12, no index reached. The kit fits what a device call carries; the
check's preflight stops in its first seconds at what is missing (no driver, another Python, no numpy; an older
driver and a wrong arch are judged from literal facts); with ``WITHOUT_GPU=1`` it goes on: the kit installs into a
venv of its own that sees the image's packages, runs TVM's runtime alone (no libtvm_compiler.so), starts the tracker
and farm's native CUDA server, finds the carried artifact without compiling, stores the GPU's absence here as a
failure with its reason, and leaves at most 8 files to come back. The same runtime-only farm measures a CPU model end
to end, and the kit's farm wheel builds from a venv as plain as tools/setup.sh makes."""

import glob
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from farm.procs.supervise import free_port
from farm.tvm_private import runtime_only_env
from tests.conftest import REPO

# pyenv's own 3.12 first: its shim answers "command not found" where 3.12 is not the selected version
PYTHON_312 = next(iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))),
                  None) or shutil.which("python3.12")
pytestmark = pytest.mark.skipif(PYTHON_312 is None, reason="needs Python 3.12 (the GPU machine's)")


sys.path.insert(0, str(REPO / "tools"))
try:
    import gpu_preflight
    from gpu_kit import COMPILER, FILES_BACK, LIMIT_BYTES
finally:
    sys.path.remove(str(REPO / "tools"))


@pytest.fixture(scope="module")
def kit_and_host(tmp_path_factory):
    """The kit with mlp, and a stand-in for the lent machine's image: a venv of Python 3.12 with numpy and
    onnxruntime only, whose bin/ a test puts first on PATH."""
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


def _as_image(host: Path, **extra: str) -> dict[str, str]:
    """The environment of a call on the lent machine: its image's venv first on PATH, no farm settings."""
    return _clean_env(PATH=f"{host / 'bin'}:{os.environ['PATH']}", **extra)


def test_the_kit_fits_a_device_call_and_carries_no_compiler(kit_and_host):
    kit, _, said = kit_and_host
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


@pytest.fixture(scope="module")
def checked(kit_and_host, tmp_path_factory):
    """The check run once as on the lent machine (no VENV, no index: the image's python3 first on PATH), on this
    host without a GPU: (its exit code, OUT, the venv it made)."""
    kit, host, _ = kit_and_host
    work = tmp_path_factory.mktemp("gpu-check")
    out = work / "out"
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), str(kit), str(out)], capture_output=True,
                          text=True, timeout=900, env=_as_image(host, MODELS="mlp", WITHOUT_GPU="1", TMPDIR=str(work)))
    (venv,) = work.glob("farm-gpu-check.*/venv")
    return done.returncode, out, venv


def test_the_check_runs_as_on_the_lent_machine_and_stores_the_missing_gpu_as_a_failure(kit_and_host, checked):
    _, host, _ = kit_and_host
    returncode, out, venv = checked
    log = (out / "gpu-check.log").read_text()
    assert returncode == 1, log[-3000:]  # no GPU here: the bench and the copy curve fail, and say why
    assert f"interpreter  ok       {host / 'bin' / 'python3'} (Python 3.12; prefix {host}," in log and "numpy        ok" in log
    assert "warning: no NVIDIA driver: libcuda.so.1 does not load" in log
    # the kit's venv is its own, and sees the image's numpy and onnxruntime through its .pth
    site = venv / "lib" / "python3.12" / "site-packages"
    assert (site / "farm-gpu-check-image.pth").read_text().split() == [str(host / "lib" / "python3.12" / "site-packages")]
    assert (site / "farm-tvm-without-torch.pth").exists()  # farm's torch hook, as tools/setup.sh installs it
    assert not (site / "numpy").exists() and not list(site.glob("tvm/lib/libtvm_compiler.so"))
    assert "1 server(s) started, 1 running" in log
    assert re.search(r"^gpu +cuda +gpu +cuda +online +1 ", log, re.M)  # farm devices: the native CUDA server listed
    refusal = ("no CUDA device on this server (key gpu): libcuda.so.1: cannot open shared object file: "
               "No such file or directory (the NVIDIA driver is not installed)")
    assert log.count(f"error: {refusal}") == 2  # farm bench, farm copies
    # what comes back: at most 8 files, the database checkpointed, everything else in one archive
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES_BACK) and len(FILES_BACK) <= 8
    with sqlite3.connect(out / "results.db") as db:
        runs = db.execute("SELECT device, model, status, reason FROM runs WHERE runtime = 'tvm'").fetchall()
    assert [(d, m, s) for d, m, s, _ in runs] == [("gpu", "mlp", "failed")] and refusal in runs[0][3]
    assert (out / "report.html").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit"] == 1 and summary["benches"]["mlp"]["status"] == "failed"
    assert summary["preflight"]["driver"]["ok"] is False and summary["preflight"]["numpy"]["ok"] is True
    import tarfile

    with tarfile.open(out / "extras.tar.gz") as tar:
        extras = {Path(n).name: n for n in tar.getnames()}
        versions = json.loads(tar.extractfile(extras["versions.json"]).read())  # type: ignore[union-attr]
    assert {"bench-mlp.json", "copies.json", "results.json", "preflight.json", "gpu.csv"} <= set(extras)
    assert (versions["python"][:4], versions["apache-tvm"], versions["torch"]) == ("3.12", "0.27.0.post1", None)
    assert versions["prefix"] == str(venv)


@pytest.mark.parametrize("case", ["no driver", "another python", "no numpy"])
def test_the_preflight_stops_in_its_first_seconds_with_one_error_line(kit_and_host, tmp_path, case):
    """Before the kit is unpacked: nothing slow has started when it stops."""
    kit, host, _ = kit_and_host
    extra: dict[str, str] = {"TMPDIR": str(tmp_path)}
    if case == "another python":
        extra["PYTHON"] = sys.executable  # farm's own 3.11
    elif case == "no numpy":
        bare = tmp_path / "bare"
        subprocess.run([PYTHON_312, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
        extra["PYTHON"] = str(bare / "bin" / "python3")
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh"), str(kit), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env=_as_image(host, **extra))
    said = done.stdout
    errors = [line for line in said.splitlines() if line.startswith("error: ")]
    expected = {"no driver": "error: no NVIDIA driver: libcuda.so.1 does not load",
                "another python": "error: the kit's wheels are for Python 3.12, this interpreter is Python 3.11",
                "no numpy": "error: numpy does not import in"}[case]
    assert done.returncode == 1 and len(errors) == 1 and errors[0].startswith(expected), said
    assert [line for line in said.splitlines() if line.startswith("hint: ")][:1], said
    assert "Traceback" not in said + done.stderr and "== kit" not in said  # stopped before unpacking anything
    # its files are written all the same: the log, the summary (the preflight's verdicts), the archive
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["extras.tar.gz", "gpu-check.log", "summary.json"]


KIT = {"python": "3.12", "bundle_cuda": "13.0", "arch": "sm_90",
       "artifacts": [{"model": "mlp", "arch": "sm_90", "cuda_version": "13.0", "min_driver": "580.65.06"}]}


def _facts(**read) -> "gpu_preflight.Facts":
    facts = gpu_preflight.Facts("/opt/torch/.venv/bin/python3", "3.12", "/opt/torch/.venv", "/usr",
                                {"numpy": "2.5.2", "onnxruntime": "1.30.0", "torch": "2.11.0"},
                                libcuda="libcuda.so.1", driver_cuda="13.0", driver_version="580.159",
                                gpu_name="NVIDIA H200", compute_capability="9.0", gpu_free_mib=140000,
                                disk_free_bytes=50 * 2**30, disk_path="/tmp")
    for name, value in read.items():
        setattr(facts, name, value)
    return facts


@pytest.mark.parametrize("read, failed, error", [
    ({}, [], ""),
    ({"driver_cuda": "12.6", "driver_version": "560.35"}, ["driver"],
     "the driver's CUDA is 12.6, older than the CUDA 13.0 the kit needs"),
    ({"compute_capability": "8.7", "gpu_name": "Orin"}, ["gpu"],
     "the GPU (compute capability 8.7) cannot run cubins for sm_90"),
    ({"compute_capability": "10.0"}, ["gpu"], "the GPU (compute capability 10.0) cannot run cubins for sm_90"),
    ({"gpu_free_mib": 100}, ["gpu_memory"], "only 100 MiB of GPU memory free (needs 1024)"),
    ({"python": "3.11"}, ["interpreter"], "the kit's wheels are for Python 3.12, this interpreter is Python 3.11"),
])
def test_the_preflight_judges_the_driver_the_arch_and_the_python_from_literal_facts(read, failed, error):
    verdicts = gpu_preflight.judge(_facts(**read), KIT)
    assert [v.check for v in verdicts if not v.ok] == failed
    assert [v.error for v in verdicts if not v.ok][:1] == ([error] if error else [])


def test_a_cubin_runs_on_its_own_major_at_its_minor_or_later():
    assert [gpu_preflight.runs_cubin(cc, "sm_86") for cc in ("8.6", "8.9", "8.0", "9.0")] == [True, True, False, False]
    assert gpu_preflight.runs_cubin("9.0", "sm_90a") and not gpu_preflight.runs_cubin("8.7", "sm_90")


def test_the_kit_s_farm_wheel_builds_from_a_venv_as_plain_as_setup_makes(tmp_path):
    """tools/setup.sh's venv is ``python -m venv``: Python 3.11's bundled setuptools 65.5, no ``wheel``."""
    plain = tmp_path / "plain"
    subprocess.run([sys.executable, "-m", "venv", str(plain)], check=True, timeout=120)
    setuptools = subprocess.run([str(plain / "bin" / "python"), "-c", "import setuptools; print(setuptools.__version__)"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert tuple(int(p) for p in setuptools.split(".")[:2]) < (70, 1)  # the old one: this test means something
    built = subprocess.run([str(plain / "bin" / "python"), "-c",
                            "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                            "from gpu_kit import _farm_wheel; _farm_wheel(Path(sys.argv[2]), print)",
                            str(REPO / "tools"), str(tmp_path / "wheels")],
                           capture_output=True, text=True, timeout=300, env=_clean_env())
    assert built.returncode == 0, built.stderr[-2000:]
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == ["farm-0.1.0-py3-none-any.whl"]


def test_the_kit_s_runtime_only_farm_measures_a_cpu_model_end_to_end(checked, tmp_path):
    """What the GPU check does after the GPU's session opens, here on the CPU: load, first runs, steady, copies,
    memory and the output check, with TVM's runtime alone (the check's own venv) and an artifact compiled by the full
    TVM."""
    _, _, venv = checked
    inventory = tmp_path / "devices.toml"
    inventory.write_text(f'[tracker]\nhost = "127.0.0.1"\nport = {free_port()}\n\n[devices.cpu]\nkind = "local"\n'
                         'key = "kit-cpu"\ntarget = { kind = "llvm", mcpu = "x86-64", num-cores = 2 }\nthreads = 2\n')
    env = _clean_env(FARM_HOME=str(tmp_path / "home"), FARM_DEVICES=str(inventory), FARM_DB=str(tmp_path / "r.db"))
    compiled = subprocess.run([str(REPO / ".venv" / "bin" / "farm"), "compile", "--device", "cpu", "--model", "mlp"],
                              capture_output=True, text=True, timeout=300, env=env)
    assert compiled.returncode == 0, compiled.stderr
    farm, runtime_only = str(venv / "bin" / "farm"), {**env, **runtime_only_env()}
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
