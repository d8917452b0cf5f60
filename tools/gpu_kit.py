"""Assemble the GPU check's kit: everything ``tools/gpu_check.sh`` needs on a Linux host with an NVIDIA GPU, Python
3.12, numpy and onnxruntime, and nothing reachable (no registry, no TVM, no compiler needed).

    .venv/bin/python tools/gpu_kit.py                      # build/gpu-kit.tar.gz: mlp, convnet, squeezenet, resnet50
    .venv/bin/python tools/gpu_kit.py --models mlp --out /tmp/kit.tar.gz

What it holds (``--list`` prints it with sizes; it must stay within ``LIMIT_BYTES``, what a device call carries):
- ``wheels/``: Python 3.12 wheels, installed with ``pip --no-index``: apache-tvm-ffi (cp312), the apache-tvm wheel
  without ``libtvm_compiler.so`` (259 MB; the kit's TVM runs with ``TVM_USE_RUNTIME_LIB=1``: runtime alone), farm,
  and the small packages farm's measuring and reporting import (onnx, psutil, jinja2, ...). numpy, onnxruntime and
  torch are the host's own (a venv with ``--system-site-packages``).
- ``cache/``: farm's native server's CUDA bundle (its libtvm_runtime_cuda.so and PyPI's libcudart.so.13 beside it),
  under the name ``native.ensure_native_server(cuda=True)`` looks for: the host needs no g++.
- ``home/cache/``: the models compiled here for ``ARCH`` (cubins: ``compile/cuda.py``), under the keys the host
  computes for the kit's device, so ``farm bench`` finds them and compiles nothing.
- ``kit.json`` (first in the tar): the wheels' Python, the bundled runtime's CUDA and each artifact's arch and CUDA,
  which ``tools/gpu_preflight.py`` checks the machine against in the check's first seconds.
- ``devices.toml``: that device (kind ``cuda``, key ``gpu``, host ``{ kind = "llvm" }``: a generic x86-64 host,
  so the key does not depend on this host's CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ARCH = "sm_90"  # H100 and H200
LIMIT_BYTES = 64 * 2**20  # what one call to the lent GPU machine carries
MODELS = ("mlp", "convnet", "onnx:squeezenet", "onnx:resnet50")
PYTHON = "3.12"
# What tools/gpu_check.sh leaves in OUT: a device call brings back at most 8 files, so these, and nothing else
FILES_BACK = ("gpu-check.log", "summary.json", "report.html", "results.db", "extras.tar.gz")
# farm's imports on a measuring host, beyond numpy and onnxruntime (the host's): checked by tests/test_gpu_kit.py,
# which installs the kit into a fresh venv and runs farm from it
PACKAGES = ("onnx", "protobuf", "psutil", "jinja2", "markupsafe", "ml_dtypes", "cloudpickle", "tornado",
            "typing_extensions",
            # the report's figures
            "matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pillow", "pyparsing", "python-dateutil",
            "six", "packaging")
DEVICES = f"""# The GPU check's device: this host's NVIDIA GPU behind farm's native CUDA server (tools/gpu_kit.py).
[tracker]
host = "127.0.0.1"
port = 9190

[devices.gpu]
kind = "cuda"
key = "gpu"
target = {{ kind = "cuda", arch = "{ARCH}" }}
host = {{ kind = "llvm" }}
tags = ["gpu-check"]
"""
COMPILER = "lib/libtvm_compiler.so"


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("apache-tvm", "apache-tvm-ffi", "onnx")}


def _download(folder: Path, requirements: list[str], say) -> None:
    """The wheels for Python ``PYTHON``, kept in farm's cache (``FARM_CACHE``) once downloaded."""
    from farm.devices.cache import cache_root

    cached = cache_root() / f"gpu-kit-wheels-py{PYTHON}"
    cached.mkdir(parents=True, exist_ok=True)
    missing = [r for r in requirements if not any(cached.glob(_wheel_glob(r)))]
    if missing:
        say(f"downloading {len(missing)} wheel(s) for Python {PYTHON}")
        _pip_download(cached, missing)
    folder.mkdir(parents=True, exist_ok=True)
    for requirement in requirements:
        for wheel in cached.glob(_wheel_glob(requirement)):
            shutil.copy2(wheel, folder / wheel.name)


def _wheel_glob(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{name.replace('-', '_')}-{version or '*'}-*.whl"


def _pip_download(folder: Path, requirements: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON,
         "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
         "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_5_x86_64", "-d", str(folder), *requirements],
        capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: pip could not download {' '.join(requirements)}: {done.stderr.strip()[-400:]}")


def runtime_only_wheel(wheel: Path, out_dir: Path) -> Path:
    """``wheel`` (apache-tvm's) without its compiler library: same name and version, so the host's pip and farm's
    cache tags see apache-tvm 0.27; its RECORD without that file's line."""
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as sliced:
        for item in source.infolist():
            if item.filename.endswith(COMPILER):
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if COMPILER.encode() not in line)
            sliced.writestr(item, data)
    return out


def _farm_wheel(folder: Path, say) -> None:
    """farm's wheel, built from a copy of this checkout's files (tracked, and new ones git does not ignore): never
    from a stale ``build/`` of an earlier build."""
    from farm.manifest import COMMIT_FILE, farm_commit

    say("building farm's wheel")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    with tempfile.TemporaryDirectory(prefix="farm-src-") as source:
        for name in filter(None, listed):
            if (REPO / name).is_file():
                (Path(source) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, Path(source) / name)
        # the copy has no .git: the commit goes in as a file, which a run's manifest reads (farm.measure.manifest)
        (Path(source) / COMMIT_FILE).write_text(farm_commit() or "unknown")
        # with build isolation: pyproject's build backend from the index, whatever setuptools this venv has (a plain
        # set-up's venv keeps Python 3.11's bundled setuptools 65.5, which cannot build a wheel without `wheel`)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), source],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: could not build farm's wheel: {done.stderr.strip()[-400:]}")


def _native_bundle(cache: Path, say) -> str:
    """The native CUDA server's bundle copied into ``cache``; returns the CUDA its cudart is ("13.0")."""
    from farm.devices.native import ensure_native_server

    server = ensure_native_server(cuda=True)
    say(f"native CUDA server: {server.parent.name}")
    shutil.copytree(server.parent, cache / server.parent.name)
    (cudart,) = server.parent.glob("libcudart.so.*")
    return f"{cudart.name.rsplit('.', 1)[1]}.0"


def kit_manifest(bundle_cuda: str, home: Path) -> dict:
    """``kit.json``: what tools/gpu_preflight.py checks the machine against, before the kit is unpacked: the Python
    of the wheels, the CUDA of the bundled runtime, and each carried artifact's cubin arch and CUDA (its note)."""
    from farm.compile.artifacts import inspect_artifact

    artifacts = []
    for library in sorted(home.rglob("*.so")):
        cuda = inspect_artifact(library).cuda
        if cuda is None or cuda.format != "cubin":
            raise SystemExit(f"error: {library.name} carries no cubin ({cuda}): the check would compile on the GPU host")
        artifacts.extend({"model": library.stem, "arch": arch, "cuda_version": cuda.cuda_version,
                          "min_driver": cuda.min_driver} for arch in cuda.archs)
    return {"python": PYTHON, "bundle_cuda": bundle_cuda, "arch": ARCH, "artifacts": artifacts}


def _artifacts(home: Path, devices: Path, models: list[str], say) -> None:
    for model in models:
        say(f"compiling {model} for {ARCH}")
        done = subprocess.run([str(REPO / ".venv" / "bin" / "farm"), "--devices", str(devices), "compile", "--device",
                               "gpu", "--model", model, "--untuned"],
                              capture_output=True, text=True, env={**os.environ, "FARM_HOME": str(home)})
        if done.returncode != 0:
            raise SystemExit(f"error: compiling {model}: {done.stderr.strip()[-400:]}")
        say(done.stdout.strip().splitlines()[-1])


def build_kit(out: Path, models: list[str], say=print) -> Path:
    """The kit as one gzip'd tar at ``out``; SystemExit when it would not fit ``LIMIT_BYTES``."""
    versions = _versions()
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as work_dir:
        work = Path(work_dir)
        wheels, downloads = work / "wheels", work / "downloads"
        wheels.mkdir()
        _download(downloads, [f"apache-tvm-ffi=={versions['apache-tvm-ffi']}", f"apache-tvm=={versions['apache-tvm']}",
                              f"onnx=={versions['onnx']}", *PACKAGES[1:]], say)
        for wheel in downloads.glob("*.whl"):
            if wheel.name.startswith("apache_tvm-"):
                runtime_only_wheel(wheel, wheels)
            else:
                shutil.move(str(wheel), wheels / wheel.name)
        _farm_wheel(wheels, say)
        (work / "devices.toml").write_text(DEVICES)
        bundle_cuda = _native_bundle(_mkdir(work / "cache"), say)
        _artifacts(_mkdir(work / "home"), work / "devices.toml", models, say)
        (work / "kit.json").write_text(json.dumps(kit_manifest(bundle_cuda, work / "home"), indent=1))
        shutil.rmtree(downloads)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz") as tar:
            tar.add(work / "kit.json", arcname="kit.json")  # first: the preflight reads it without unpacking the rest
            for path in sorted(work.iterdir()):
                if path.name != "kit.json":
                    tar.add(path, arcname=path.name)
    size = out.stat().st_size
    say(f"{out}: {size / 2**20:.1f} MiB (limit {LIMIT_BYTES / 2**20:.0f} MiB)")
    if size > LIMIT_BYTES:
        raise SystemExit(f"error: the kit is {size / 2**20:.1f} MiB, over the {LIMIT_BYTES / 2**20:.0f} MiB a device "
                         "call carries: leave a model out (--models)")
    return out


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu-kit.tar.gz", help="the kit's file")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help=f"models to carry (default: {' '.join(MODELS)})")
    parser.add_argument("--list", action="store_true", help="list the kit's files with their sizes after building it")
    args = parser.parse_args()
    kit = build_kit(args.out, args.models, say=lambda line: print(line, file=sys.stderr))
    if args.list:
        with tarfile.open(kit) as tar:
            for item in tar.getmembers():
                if item.isfile():
                    print(f"{item.size:>12,}  {item.name}")
    print(kit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
