"""Debian's POCL for arm64, in a sysroot that qemu-user runs: the GPU driver of the emulated board and of the
stand-in phone.

No phone GPU exists here. POCL (Portable Computing Language) is a real OpenCL implementation: its ``pthread``
device JIT-compiles OpenCL C with LLVM and runs the kernels on the CPU. Debian ships it for arm64, and under
``qemu-aarch64 -L SYSROOT`` it serves TVM's aarch64 OpenCL runtime (built with ``opencl_wrapper``, which opens
``libOpenCL.so`` at run time: ``opencl_runtime.py``) the way a phone's vendor driver would: each kernel is built
slowly on its first run, then comes from the driver's kernel cache (``POCL_CACHE_DIR``, which farm's native
server sets per device and clears for a cold measurement).

The sysroot is built once in ``$FARM_CACHE`` (``python -m farm.devices.pocl_arm64``, run by
``tools/setup.sh --emulation``), about 50 MB of Debian's arm64 packages, downloaded with apt-get into a private
arm64 package list: nothing is installed on this host and its apt configuration is not changed.

- ``lib`` → the cross toolchain's ``/usr/aarch64-linux-gnu/lib`` (the libc and libstdc++ the board links with);
- ``usr/lib/aarch64-linux-gnu``: POCL, the ICD loader (``ocl-icd``) and their libraries, from the packages;
- ``usr/lib/aarch64-linux-gnu/libOpenCL.so`` → ``libOpenCL.so.1``: the name TVM's opencl_wrapper opens (a phone
  ships it as ``/vendor/lib64/libOpenCL.so``; Debian only in the -dev package);
- ``etc/OpenCL/vendors/pocl.icd``, which the loader reads through qemu's prefix, names libpocl by its path
  on this host (``<sysroot>/usr/lib/aarch64-linux-gnu/libpocl.so.2``), not by the package's bare name;
- ``usr/share/pocl``: POCL's kernel library. POCL finds it relative to where libpocl was loaded from
  (``<libdir>/../../share/pocl``) and checks it with ``access()``, which qemu-user 7.2 passes to this host
  without its ``-L`` prefix. Loaded by its host path, libpocl's ``<libdir>`` is the sysroot's folder, so the
  check finds the sysroot's file; loaded as ``/usr/lib/aarch64-linux-gnu/libpocl.so.2`` it would look for
  ``/usr/share/pocl/kernel-aarch64-…bc`` on this host ("Kernel library file … doesn't exist") and abort.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from farm.devices.board import SYSROOT
from farm.devices.cache import building, cache_root, setup_step
from farm.errors import DeviceError

RECIPE = 1  # bump when the sysroot below changes
# pocl-opencl-icd and what it needs at run time that the cross toolchain's sysroot lacks (clang-15, a
# dependency of libpocl2, is not needed: POCL compiles in process with libclang-cpp)
PACKAGES = ("pocl-opencl-icd", "libpocl2", "libpocl2-common", "ocl-icd-libopencl1", "libllvm15", "libclang-cpp15",
            "libhwloc15", "libedit2", "libffi8", "libtinfo6", "libudev1", "libxml2", "zlib1g", "libz3-4", "libicu72",
            "liblzma5", "libbsd0", "libmd0")
MULTIARCH = "usr/lib/aarch64-linux-gnu"
SETUP_HINT = ("farm downloads Debian's arm64 POCL packages once with apt-get: bash tools/setup.sh --emulation "
              "(needs apt-get, dpkg and Debian's package archive)")


def sysroot_folder() -> Path:
    release = Path("/etc/debian_version").read_text().split(".")[0].strip() if Path("/etc/debian_version").exists() \
        else "unknown"
    return cache_root() / f"pocl-aarch64-debian{release}-r{RECIPE}"


def ensure_sysroot(progress=None) -> Path:
    """The sysroot with arm64 POCL (see the module's text), built on first use and cached; DeviceError when it
    cannot be had here."""
    folder = sysroot_folder()
    if (folder / "etc" / "OpenCL" / "vendors" / "pocl.icd").exists():
        return folder
    missing = [tool for tool in ("apt-get", "dpkg") if shutil.which(tool) is None]
    if not (SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists():
        missing.append(f"{SYSROOT} (aarch64 libc: g++-aarch64-linux-gnu)")
    if missing:
        raise DeviceError(f"the arm64 POCL sysroot needs {', '.join(missing)}", SETUP_HINT)
    with building(folder, "pocl-") as work:
        if progress:
            progress(f"downloading Debian's arm64 POCL ({len(PACKAGES)} packages)")
        debs = _download(work / "apt")
        root = work / "root"
        for deb in debs:
            done = subprocess.run(["dpkg", "-x", str(deb), str(root)], capture_output=True, text=True)
            if done.returncode != 0:
                raise DeviceError(f"could not unpack {deb.name}: {done.stderr.strip()[-300:]}", SETUP_HINT)
        _merge(root / "lib", root / "usr" / "lib")  # some packages still ship /lib/aarch64-linux-gnu (no usrmerge)
        (root / "lib").symlink_to(SYSROOT / "lib")
        (root / MULTIARCH / "libOpenCL.so").symlink_to("libOpenCL.so.1")
        icd = root / "etc" / "OpenCL" / "vendors" / "pocl.icd"
        libraries = sorted((root / MULTIARCH).glob("libpocl.so.2*"))
        if not icd.exists() or not libraries:
            raise DeviceError("Debian's arm64 POCL packages had no etc/OpenCL/vendors/pocl.icd or libpocl.so.2",
                              "report this: the packages' layout changed")
        icd.write_text(f"{folder / MULTIARCH / libraries[0].name}\n")  # its path once the build is renamed in place
        for item in root.iterdir():
            item.rename(work / item.name)
        shutil.rmtree(work / "apt")
        root.rmdir()
        work.chmod(0o755)
    return folder


def _merge(source: Path, into: Path) -> None:
    if not source.exists():
        return
    for path in sorted(p for p in source.rglob("*") if not p.is_dir()):
        target = into / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.rename(target)
    shutil.rmtree(source)


def _download(apt_dir: Path) -> list[Path]:
    """Debian's arm64 packages, with a private package list: the host's apt state and architectures are untouched."""
    (apt_dir / "lists" / "partial").mkdir(parents=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True)
    options = ["-q", "-o", f"Dir::State::Lists={apt_dir / 'lists'}", "-o", f"Dir::Cache={apt_dir / 'cache'}",
               "-o", "APT::Architecture=arm64", "-o", "APT::Architectures::=arm64", "-o", "Debug::NoLocking=1",
               "-o", "APT::Sandbox::User=root"]
    for what, command in (("reading Debian's arm64 package list", ["apt-get", *options, "update"]),
                          ("downloading the arm64 POCL packages", ["apt-get", *options, "download", *PACKAGES])):
        done = subprocess.run(command, cwd=apt_dir, capture_output=True, text=True)
        if done.returncode != 0:
            raise DeviceError(f"{what} failed: {(done.stderr.strip() or done.stdout.strip())[-400:]}", SETUP_HINT)
    debs = sorted(apt_dir.glob("*.deb"))
    if len(debs) != len(PACKAGES):
        raise DeviceError(f"apt-get downloaded {len(debs)} of {len(PACKAGES)} arm64 packages", SETUP_HINT)
    return debs


def main() -> int:
    """Build (or find) the sysroot, as tools/setup.sh does."""
    return setup_step("arm64 POCL sysroot", lambda: ensure_sysroot(progress=print))


if __name__ == "__main__":
    sys.exit(main())
