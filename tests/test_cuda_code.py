"""CUDA device code compiled when farm compiles (farm/compile/cuda.py): a cubin for the device's arch in the library,
its arch read back from the cubin's own ELF header, the CUDA that compiled it and the oldest driver that loads it from
farm's note; an arch the chosen compiler cannot target is an error at compile time, with the compiler to use."""

import json
import re
import struct
from pathlib import Path

import pytest

from farm.compile.artifacts import cubin_archs, inspect_artifact
from farm.compile.cuda import MIN_DRIVER
from tests.conftest import REPO, run_farm

NVCC_13 = Path("/usr/local/cuda-13.0/bin/nvcc")


def _compile(inventory: Path, device: str, env: dict, *extra: str):
    return run_farm("--devices", str(inventory), "compile", "--device", device, "--model", "mlp", "--json", *extra,
                    env=env)


def test_the_jetson_tx2_compiles_to_an_aarch64_library_with_sm62_device_code_read_back_from_its_bytes(farm_env):
    done = _compile(REPO / "devices.toml", "tx2", farm_env)  # the repository's own inventory: tag nvidia/jetson-tx2
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    data = Path(row["path"]).read_bytes()
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<H", data, 18)[0] == 0xB7  # the host code: aarch64
    assert cubin_archs(data) == ["sm_62"]  # device code, from the embedded cubin's own e_flags
    assert b'extern "C" __global__' not in data  # no CUDA source left for the device to compile when it loads
    assert row["cuda"] == {"format": "cubin", "archs": ["sm_62"], "cuda_version": "12.9", "compiler": "NVRTC 12.9 (PyPI)",
                           "min_driver": MIN_DRIVER["12"],
                           "described": f"cubin sm_62, CUDA 12.9 (NVRTC 12.9 (PyPI)), driver >= {MIN_DRIVER['12']}"}
    table = run_farm("--devices", str(REPO / "devices.toml"), "compile", "--device", "tx2", "--model", "mlp", env=farm_env)
    assert f"tx2: cubin sm_62, CUDA 12.9 (NVRTC 12.9 (PyPI)), driver >= {MIN_DRIVER['12']}" in table.stdout.splitlines()


def test_a_tar_export_carries_the_cubin_in_its_c_file_and_says_so(farm_env):
    done = _compile(REPO / "devices.toml", "tx2", farm_env, "--export", "tar")
    assert done.returncode == 0, done.stderr
    info = inspect_artifact(json.loads(done.stdout)[0]["path"])
    assert info.cuda is not None and (info.cuda.archs, info.cuda.cuda_version) == (("sm_62",), "12.9")


def test_a_hopper_gpu_gets_cuda_13_s_nvrtc(tmp_path, farm_env):
    inventory = tmp_path / "devices.toml"
    inventory.write_text('[devices.h100]\nkind = "remote"\nkey = "h100"\ntarget = { kind = "cuda", arch = "sm_90" }\n')
    done = _compile(inventory, "h100", farm_env)
    assert done.returncode == 0, done.stderr
    cuda = json.loads(done.stdout)[0]["cuda"]
    assert (cuda["archs"], cuda["cuda_version"], cuda["min_driver"]) == (["sm_90"], "13.0", MIN_DRIVER["13"])


@pytest.mark.skipif(not NVCC_13.exists(), reason="needs CUDA 13's nvcc at /usr/local/cuda-13.0")
def test_a_named_toolkit_compiles_what_it_targets_and_refuses_at_compile_time_what_it_cannot(tmp_path, farm_env):
    inventory = tmp_path / "devices.toml"
    inventory.write_text(
        '[devices.h100]\nkind = "remote"\nkey = "h100"\ntarget = { kind = "cuda", arch = "sm_90" }\n'
        'cuda_toolkit = "/usr/local/cuda-13.0"\n\n'
        '[devices.tx2]\nkind = "linux"\nkey = "tx2"\ntarget = { tag = "nvidia/jetson-tx2" }\n'
        'cuda_toolkit = "/usr/local/cuda-13.0"\n')
    done = _compile(inventory, "h100", farm_env)
    assert done.returncode == 0, done.stderr
    cuda = json.loads(done.stdout)[0]["cuda"]
    assert (cuda["archs"], cuda["compiler"]) == (["sm_90"], f"nvcc 13.0 ({NVCC_13})")
    refused = _compile(inventory, "tx2", farm_env)
    assert refused.returncode == 1 and refused.stdout == ""
    error, hint = refused.stderr.strip().splitlines()[-2:]
    assert error == f"error: device 'tx2': {NVCC_13} (CUDA 13.0) cannot compile for sm_62; it targets sm_75 to sm_121"
    assert hint.startswith("hint: leave cuda_toolkit out and farm compiles sm_62 with CUDA 12.9's NVRTC from PyPI")


def test_an_arch_no_pypi_compiler_targets_fails_before_tvm_compiles(tmp_path, farm_env):
    inventory = tmp_path / "devices.toml"
    inventory.write_text('[devices.k80]\nkind = "remote"\nkey = "k80"\ntarget = { kind = "cuda", arch = "sm_37" }\n')
    refused = _compile(inventory, "k80", farm_env)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == ("error: device 'k80': no CUDA compiler on PyPI targets sm_37 "
                                              "(CUDA 12 dropped archs below sm_50)")
    assert 'cuda_toolkit = "/usr/local/cuda-11.8"' in refused.stderr


def test_cuda_toolkit_on_a_cpu_target_is_an_inventory_error(tmp_path, farm_env):
    inventory = tmp_path / "devices.toml"
    inventory.write_text('[devices.x86]\nkind = "local"\nkey = "x86"\ntarget = { kind = "llvm" }\n'
                         'cuda_toolkit = "/usr/local/cuda"\n')
    done = run_farm("--devices", str(inventory), "devices", env=farm_env)
    assert done.returncode == 1
    assert "device 'x86': cuda_toolkit needs a CUDA target, not 'llvm'" in done.stderr.splitlines()[0]


JETPACK_4_6 = ('[devices.tx2]\nkind = "linux"\nkey = "tx2-refused"\ntarget = { tag = "nvidia/jetson-tx2" }\n'
               'cuda_driver = "10.2"\n')
REFUSED = ("device 'tx2': its driver is CUDA 10.2 (cuda_driver in the inventory), and TVM 0.27's CUDA runtime as "
           "shipped (libtvm_runtime_cuda.so, linked to libcudart.so.13) needs a driver of CUDA 13.0 or newer")


def test_a_jetson_on_a_driver_older_than_cuda_13_is_refused_by_farm_bench_before_the_upload(farm_net, tmp_path,
                                                                                             farm_env):
    """No server is asked for: the refusal is stored as the run's failure at its first step, and the compile that
    came before it stands (someone with their own runtime can use it)."""
    import sqlite3

    from tests.conftest import write_inventory

    inventory = write_inventory(tmp_path / "devices.toml", JETPACK_4_6, farm_net.tracker.port)
    bench = run_farm("--devices", str(inventory), "bench", "--device", "tx2", "--model", "mlp", env=farm_env)
    assert bench.returncode == 1 and f"error: {REFUSED}" in bench.stderr, bench.stderr
    assert "hint: farm compile still works for it" in bench.stderr
    with sqlite3.connect(farm_env["FARM_DB"]) as db:
        (row,) = db.execute("SELECT status, failed_step, reason FROM runs").fetchall()
    assert row == ("failed", "driver", REFUSED)  # final: no retry, and a resume leaves it
    assert list(Path(farm_env["FARM_HOME"]).glob("cache/*/mlp.so"))  # compiled all the same
    devices = run_farm("--devices", str(inventory), "devices", "--json", env=farm_env)
    assert devices.returncode == 0, devices.stderr
    assert json.loads(devices.stdout)["devices"][0]["cannot_run"] == REFUSED
    table = run_farm("--devices", str(inventory), "devices", env=farm_env)
    assert f"cannot run: {REFUSED}" in table.stdout.splitlines()


@pytest.mark.parametrize("line, error", [
    ('cuda_driver = "12.6"', None),
    ('cuda_driver = "13"', "'13' is not a CUDA version"),
    ("cuda_driver = 12.6", "cuda_driver 12.6 must be a string"),
])
def test_cuda_driver_is_a_cuda_version_on_a_cuda_target(tmp_path, line, error):
    from farm.errors import InventoryError
    from farm.inventory import load_inventory

    path = tmp_path / "devices.toml"
    path.write_text(f'[devices.orin]\nkind = "linux"\nkey = "orin"\ntarget = {{ kind = "cuda", arch = "sm_87" }}\n{line}\n'
                    '[devices.cpu]\nkind = "local"\nkey = "cpu"\ntarget = { kind = "llvm" }\n')
    if error is None:
        assert load_inventory(path).devices["orin"].options["cuda_driver"] == "12.6"
        path.write_text(path.read_text() + 'cuda_driver = "13.0"\n')  # on the CPU device
        error = "needs a CUDA target, not 'llvm'"
    with pytest.raises(InventoryError, match=re.escape(error)):
        load_inventory(path)
