"""`farm compile` for every device kind gives the artifact that kind needs, checked with `file`."""

import json
import shutil
import subprocess
import tarfile

import pytest

from tests.conftest import run_farm

FILE = shutil.which("file")

INVENTORY = """
[devices.x86]
kind = "local"
key = "x86"
target = { kind = "llvm" }

[devices.android-cpu]
kind = "android"
key = "android-cpu"
target = { kind = "llvm", mtriple = "aarch64-linux-android", mattr = ["+neon"] }
export = "tar"

[devices.android-gpu]
kind = "android"
key = "android-gpu"
target = { kind = "opencl", device = "mali" }
host = { kind = "llvm", mtriple = "aarch64-linux-android", mattr = ["+neon"] }
export = "tar"

[devices.iphone]
kind = "ios"
key = "iphone"
target = { kind = "metal" }
host = { kind = "llvm", mtriple = "arm64-apple-darwin" }
export = "system-lib"

[devices.jetson]
kind = "linux"
key = "jetson"
target = { tag = "nvidia/jetson-tx2" }
export = "so"

[devices.board]
kind = "qemu"
key = "board"
target = { kind = "llvm", mtriple = "aarch64-linux-gnu" }
export = "so"
"""

EXPECTED = {  # device -> (what `file` says of every object, embedded device code)
    "x86": ("ELF 64-bit LSB shared object, x86-64", ""),
    "android-cpu": ("ELF 64-bit LSB relocatable, ARM aarch64", ""),
    "android-gpu": ("ELF 64-bit LSB relocatable, ARM aarch64", "opencl"),
    "iphone": ("Mach-O 64-bit arm64 object", "metal"),
    "jetson": ("ELF 64-bit LSB shared object, ARM aarch64", "cuda"),
    "board": ("ELF 64-bit LSB shared object, ARM aarch64", ""),
}


def _file_outputs(path, tmp_path):
    if tarfile.is_tarfile(path):
        out = tmp_path / "untar"
        with tarfile.open(path) as tar:
            tar.extractall(out, filter="data")
        paths = sorted(p for p in out.rglob("*") if p.is_file())
    else:
        paths = [path]
    return [subprocess.run([FILE, "-b", str(p)], capture_output=True, text=True).stdout for p in paths]


@pytest.mark.skipif(FILE is None or shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="needs `file` and g++-aarch64-linux-gnu (bash tools/setup.sh --test)")
def test_compile_every_kind_gives_expected_artifact(tmp_path, farm_env):
    inventory = tmp_path / "devices.toml"
    inventory.write_text(INVENTORY)
    proc = run_farm("--devices", str(inventory), "compile", "--model", "mlp", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    artifacts = {a["device"]: a for a in json.loads(proc.stdout)}
    assert set(artifacts) == set(EXPECTED)
    for device, (described, device_code) in EXPECTED.items():
        outputs = _file_outputs(artifacts[device]["path"], tmp_path / device)
        assert outputs and all(o.startswith(described) for o in outputs), (device, outputs)
        assert artifacts[device]["device_code"] == device_code, device
    assert artifacts["jetson"]["target"]["host"]["mcpu"] == "cortex-a57"  # the tag has no host: farm fixes it
    assert artifacts["jetson"]["toolchain"] == "aarch64-linux-gnu-g++"


def test_android_so_without_ndk_and_ios_dylib_on_linux_explain_themselves(tmp_path, farm_env, monkeypatch):
    inventory = tmp_path / "devices.toml"
    inventory.write_text(INVENTORY)
    env = {**farm_env, "TVM_NDK_CC": ""}
    android = run_farm("--devices", str(inventory), "compile", "--device", "android-gpu", "--model", "mlp",
                       "--export", "so", env=env)
    assert android.returncode == 1
    assert android.stderr.splitlines()[0] == (
        "error: device 'android-gpu' targets aarch64-linux-android and no Android NDK compiler is configured")
    ios = run_farm("--devices", str(inventory), "compile", "--device", "iphone", "--model", "mlp", "--export", "so", env=env)
    assert ios.returncode == 1
    assert "needs macOS with Xcode" in ios.stderr and 'export = "system-lib"' in ios.stderr
