import dataclasses
import subprocess

import pytest

from farm.compile import compile_model, effective_target, host_cpu
from farm.errors import BuildError
from farm.models import load_model
from farm.records import Device

LOCAL = Device("x", "local", "x", {"kind": "llvm"})


def test_effective_target_fills_host_cpu_for_local_only():
    assert effective_target(LOCAL)["mcpu"] == host_cpu()
    remote = dataclasses.replace(LOCAL, kind="remote")
    assert "mcpu" not in effective_target(remote)


def test_compile_exports_x86_shared_library_and_caches(tmp_path):
    model = load_model("mlp")
    first = compile_model(model, LOCAL, tmp_path)
    assert first.cached is False and first.export == "so"
    assert "ELF 64-bit" in subprocess.run(["file", "-b", first.path], capture_output=True, text=True).stdout \
        or open(first.path, "rb").read(4) == b"\x7fELF"
    again = compile_model(model, LOCAL, tmp_path)
    assert again.cached is True and again.path == first.path and again.file_digest == first.file_digest


def test_cache_key_follows_target(tmp_path):
    model = load_model("mlp")
    generic = dataclasses.replace(LOCAL, target={"kind": "llvm", "mcpu": "x86-64"})
    assert compile_model(model, generic, tmp_path).cache_key != compile_model(model, LOCAL, tmp_path).cache_key


def test_bad_target_is_build_error(tmp_path):
    bad = dataclasses.replace(LOCAL, target={"kind": "llvm", "mcpu": "not-a-cpu", "bogus-option": 3})
    with pytest.raises(BuildError) as info:
        compile_model(load_model("mlp"), bad, tmp_path)
    assert "TVM refused target" in info.value.message


def test_android_without_ndk_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    phone = Device("p", "android", "p", {"kind": "llvm", "mtriple": "aarch64-linux-android"})
    with pytest.raises(BuildError) as info:
        compile_model(load_model("mlp"), phone, tmp_path)
    assert "TVM_NDK_CC" in info.value.hint
