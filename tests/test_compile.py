import dataclasses
import subprocess
from pathlib import Path

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


def test_an_artifact_from_another_host_is_installed_only_with_the_sha256_its_builder_recorded(tmp_path):
    """The lab's store carries an artifact's bytes and metadata (``artifact_file``) to another host's cache
    (``install_artifact``): installed under its key, loadable from its new path; damaged bytes never are."""
    from farm.compile import artifact_file, install_artifact

    built = compile_model(load_model("mlp"), LOCAL, tmp_path / "builder")
    meta, data = artifact_file(built)
    with pytest.raises(BuildError, match="sha256"):
        install_artifact(tmp_path / "measurer", built.file_digest, meta, data[:-1] + bytes([data[-1] ^ 1]))
    assert not (tmp_path / "measurer").exists() or not any((tmp_path / "measurer").iterdir())
    installed = install_artifact(tmp_path / "measurer", built.file_digest, meta, data)
    assert installed.path.startswith(str(tmp_path / "measurer" / built.cache_key[:24]))
    assert (installed.cache_key, installed.file_digest, Path(installed.path).read_bytes()) == (
        built.cache_key, built.file_digest, data)
    assert install_artifact(tmp_path / "measurer", built.file_digest, meta, data).path == installed.path  # cached


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


BUILDER = """
import json, sys, time
from pathlib import Path
from farm.compile import compile_model
from farm.models import load_model
from farm.records import Device
ready = Path(sys.argv[2])  # the builders start their builds together, however long each took to import TVM
(ready / sys.argv[3]).touch()
deadline = time.monotonic() + 240
while len(list(ready.iterdir())) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
artifact = compile_model(load_model("mlp"), Device("cpu", "local", "cpu", {"kind": "llvm"}), Path(sys.argv[1]))
print(json.dumps([artifact.path, artifact.file_digest, artifact.cached]))
"""


def test_builders_of_one_key_at_once_publish_one_whole_artifact(tmp_path):
    """Three processes build the same artifact into one cache at once (a sweep and a `farm bench`, or two lab
    hosts sharing a cache): each builds in a folder of its own and publishes it by one rename, so none removes
    another's files; all three get a library that is there, with the digest its metadata records."""
    import hashlib
    import json
    import sys

    cache, ready = tmp_path / "cache", tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(cache), str(ready), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err[-2000:] for _, err in outs]
    built = [json.loads(out) for out, _ in outs]
    assert len({path for path, _, _ in built}) == 1
    path = Path(built[0][0])
    folders = sorted(p.name for p in cache.iterdir())
    assert folders == [path.parent.name], folders  # no builder's folder left behind
    meta = json.loads((path.parent / "artifact.json").read_text())
    assert meta["file_digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    again = compile_model(load_model("mlp"), Device("cpu", "local", "cpu", {"kind": "llvm"}), cache)
    assert again.cached and again.path == str(path)


def test_bench_kernels_times_each_call_of_main_on_the_threads_it_set(tmp_path):
    """tools/bench_kernels.py (where a tuned model's time goes): every kernel main calls is timed inside the model
    and alone (warm and cold), on the device's threads as TVM reports them; with no records, no kernel has one. With --reference,
    onnxruntime's nodes are timed by its profiler on the same threads, by op type and node."""
    import os
    import re
    import sys

    from tests.conftest import REPO

    from farm.store import Store

    with Store(tmp_path / "empty.db"):  # a store with no records
        pass
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "FARM_DB", "FARM_DEVICES")}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "bench_kernels.py"), "--devices", str(REPO / "devices.toml"),
                           "--device", "x86-local", "--model", "mlp", "--db", str(tmp_path / "empty.db"), "--runs", "3",
                           "--warmup", "1", "--reference", "--records", "2"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    reported, given = map(int, re.search(r"(\d+) TVM threads as runtime.NumThreads reports \((\d+) set\)",
                                         done.stdout).groups())
    assert reported == given >= 1, done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"[\w.]+ +\d+ +[\d.]+ ", line)]
    kernels = [row for row in rows if not row[0].startswith("vm.builtin")]  # the VM's own calls are not timed alone
    assert any(row[0].startswith("matmul") for row in kernels), done.stdout
    # in the model, alone, alone cold (weights flushed before each call), and no record
    assert all(len(k) == 6 and float(k[2]) > 0 and float(k[3]) > 0 and float(k[4]) > 0 and k[5] == "-"
               for k in kernels), done.stdout
    assert "the records' sum: 0.00 ms" in done.stdout and "\nno records to time\n" in done.stdout
    ours, theirs = done.stdout.split("\nonnxruntime ", 1)
    assert int(re.search(r" on (\d+) threads \(intra_op_num_threads\)", theirs).group(1)) == given, theirs
    op_types = {row[0]: (int(row[1]), float(row[2])) for row in
                (line.split() for line in theirs.split("\nits ", 1)[0].splitlines()[2:])}
    assert op_types and all(nodes >= 1 and micros > 0 for nodes, micros in op_types.values()), theirs
    assert {"MatMul", "Gemm", "FusedMatMul"} & set(op_types), theirs


def test_a_compile_apart_that_kills_its_process_is_a_build_error_and_the_next_compile_runs(tmp_path):
    """#61: a compile whose crash (here the linker kills the process that runs it, as an OOM kill would) took a lab
    worker down with all its slots. In its own process it fails that compile alone; the next one gets a new child."""
    from farm.compile.child import compile_apart
    from farm.errors import BuildError
    from farm.inventory import parse_inventory
    from farm.models import load_model

    killer = tmp_path / "killer-cc"
    killer.write_text("#!/bin/sh\nkill -9 $PPID\nsleep 5\n")
    killer.chmod(0o755)
    inventory = parse_inventory(f'[devices.crash]\nkind = "local"\nkey = "c"\ntarget = {{ kind = "llvm" }}\n'
                                f'cc = "{killer}"\n\n[devices.fine]\nkind = "local"\nkey = "f"\n'
                                'target = { kind = "llvm", mcpu = "x86-64" }\n'
                                '\n[devices.broken]\nkind = "local"\nkey = "b"\ntarget = { kind = "llvm" }\n'
                                'cc = "/nonexistent/g++"\n')
    mlp = load_model("mlp")
    with pytest.raises(BuildError, match="the compile of mlp for crash ended its process"):
        compile_apart(mlp, inventory.devices["crash"], tmp_path / "cache", None)
    artifact = compile_apart(mlp, inventory.devices["fine"], tmp_path / "cache", None)
    assert Path(artifact.path).exists() and artifact.model_digest == mlp.digest
    with pytest.raises(BuildError, match="/nonexistent/g\\+\\+"):  # the compile's own error, in its own words
        compile_apart(mlp, inventory.devices["broken"], tmp_path / "cache", None)


@pytest.mark.parametrize("cache_key, path", [
    ("../../../../root/.ssh", "x/authorized_keys"),  # #62: a stored key used as a path replaced ~/.ssh
    ("/root/.ssh/" + "0" * 40, "authorized_keys"),
    ("0" * 64, ".."),
    ("0" * 63 + "/", "mlp.so"),
])
def test_an_artifact_whose_stored_key_or_name_is_a_path_is_refused_and_nothing_is_written(tmp_path, cache_key, path):
    from farm.compile import artifact_file, install_artifact

    built = compile_model(load_model("mlp"), LOCAL, tmp_path / "builder")
    meta, data = artifact_file(built)
    hostile = {**meta, "cache_key": cache_key, "path": path}
    with pytest.raises(BuildError, match="not what farm makes, refused") as refused:
        install_artifact(tmp_path / "cache", built.file_digest, hostile, data)
    assert "check its users" in refused.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["builder"]  # nothing written, in the cache or beside it
