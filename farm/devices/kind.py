"""The device-kind interface: everything farm knows about one kind of device, in one class.

A kind is a subclass of ``DeviceKind`` in a module of ``farm/devices/`` whose ``name`` is the
``kind`` that devices.toml names; ``farm.devices.kinds()`` finds it (asv picks environment
plug-ins by ``tool_name`` the same way). farm asks the kind and never branches on its name:

    inventory.py   fields, validate, validate_fleet, always_emulated, example
    farm serve     bring_up (the records it returns say how to stop what it started), unready, prerequisites
    health.py      read_health
    compile/       effective_target, export_toolchain
    measure/       measurement_context, software (a run's manifest)
    cli, demo      summary, serve_help, fields (--help texts), demo_entry

Importing a kind must not import TVM: the inventory reads the kinds' fields on every verb.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import psutil

from farm.errors import InventoryError
from farm.records import (LAYOUT_RULE, LAYOUTS, PREPACK_RULE, THREADS_RULE, Device, HostCPU, TrackerAddress,
                           split_address, target_kind, threads_setting)
from farm.procs.registry import ManagedProcess

Fail = Callable[[str, str, str], InventoryError]  # (field, problem, hint) -> the error naming file, line and device


@dataclass(frozen=True)
class Field:
    """One inventory field of a kind: the type it takes and how to write it (``farm devices --help``, errors)."""

    type: str  # "port" | "count" | "flag" | "text" | "texts" | "address"
    example: str  # a line to write, e.g. 'serial = "R58M123ABC"'
    help: str  # what it means
    choices: tuple[str, ...] = ()  # a "text" field's only values, where it has a few

    def problem(self, value: Any) -> str:
        """Why ``value`` is not one of this field's values ('' when it is)."""
        if self.type == "port":
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536
            return "" if ok else "is not a port"
        if self.type == "count":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            return "" if ok else "must be a whole number >= 1"
        if self.type == "flag":
            return "" if isinstance(value, bool) else "must be true or false"
        if self.type == "texts":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            return "" if ok else "must be a list of strings"
        if not isinstance(value, str) or not value:
            return "must be a string"
        if self.type == "address" and split_address(value) is None:
            return "is not HOST:PORT"
        if self.choices and value not in self.choices:
            return "is not one of " + ", ".join(repr(c) for c in self.choices)
        return ""


class DeviceKind:
    """Subclass, set ``name`` (and the other class attributes), implement ``bring_up``.

    The defaults describe a device that is not this host and that farm cannot read."""

    name: ClassVar[str] = ""  # the kind devices.toml names; "" for a base that is not a kind
    summary: ClassVar[str] = ""  # one line: what such a device is
    serve_help: ClassVar[str] = ""  # one line: what `farm serve` does for it
    fields: ClassVar[dict[str, Field]] = {}  # its own inventory fields, beside the common ones
    example: ClassVar[str] = ""  # a minimal valid inventory entry (the lines under [devices.NAME])
    always_emulated: ClassVar[bool] = False  # runs under an emulator: `emulated` defaults to true and cannot be false
    registers_at_start: ClassVar[bool] = True  # `farm serve` waits for its key (False: it registers later, e.g. an app)
    # its code runs on this host's CPU, so a reference runtime (onnxruntime, LiteRT, torch) timed here is the device's
    # own figure; elsewhere farm says "no reference runtime on this device" (farm/measure/reference.py)
    reference_runs_here: ClassVar[bool] = False
    # it measures on the CPU that builds tuning candidates (this host's): `farm tune` then builds a batch before
    # measuring it, since compiles beside a measurement would slow it; elsewhere builds run ahead (farm/tune/)
    measures_on_this_host: ClassVar[bool] = False
    # farm starts the device's server as TVM's stock rpc_server with TVM_NUM_THREADS in its environment (no
    # farm.ThreadsSet to ask): its runs say farm set the threads (farm/measure/context.py)
    threads_by_env: ClassVar[bool] = False

    def validate(self, raw: dict[str, Any], target: dict[str, Any], fail: Fail) -> None:
        """Check one entry's own fields (``raw`` is the whole table); raise ``fail(...)`` on the first problem.

        The default checks each field's type; kinds add the rules between fields."""
        for field, spec in self.fields.items():
            if field in raw and (problem := spec.problem(raw[field])):
                raise fail(field, f"{raw[field]!r} {problem}", f"write {spec.example}")

    def validate_fleet(self, devices: list[Device], path: str) -> None:
        """Check the kind's devices together (e.g. one port per phone); raise InventoryError."""

    def prerequisites(self) -> str:
        """What this host lacks to bring such devices up, as a hint ('' when nothing is missing)."""
        return ""

    def registers_from(self, device: Device) -> tuple[str, ...]:
        """The addresses (or names) this device's server registers with the tracker from, where it is not the host
        that brings it up (a board reached over ssh); (): that host (``devices.registrations``)."""
        return ()

    def unready(self, device: Device) -> str:
        """Why `farm serve` (without --device) cannot bring ``device`` up, as a hint; '' when it can."""
        return ""

    def bring_up(self, device: Device, tracker: TrackerAddress, state_dir: Path) -> list[ManagedProcess]:
        """Start whatever makes the device's server register with ``tracker`` under its key; return the
        processes farm now owns (their records say how to stop them: pid and marker, or the ssh that reaches them)."""
        raise NotImplementedError(f"device kind {self.name!r} has no bring_up")

    def started_note(self, record: ManagedProcess) -> str:
        """What the user must do next once ``bring_up`` has started ``record`` ('' = nothing)."""
        return ""

    def read_health(self, device: Device) -> dict[str, Any]:
        """{"battery_pct", "battery_temp_c", "charging", "thermal": {zone: °C}}, whatever is known; {} if nothing."""
        return {}

    def effective_target(self, device: Device, target: dict[str, Any], host: HostCPU) -> dict[str, Any]:
        """The target farm compiles for, from the inventory's (tags already resolved): the kind's own rules,
        then the device's ``host``."""
        if device.host is not None:
            target["host"] = dict(device.host)
        return target

    def export_toolchain(self, device: Device, triple: str) -> str | None:
        """The compiler that links ``device``'s shared library (``export = "so"``) for LLVM triple ``triple``, when
        that triple names the platform this kind owns (Android's NDK, Xcode): asked of the device's kind first, then
        of every kind, so a phone's triple gets the phone's toolchain whatever kind of server runs it. None: not this
        kind's platform (farm's cross compilers by triple decide). Raise BuildError when the toolchain is missing here."""
        return None

    def measurement_context(self, device: Device) -> dict[str, Any]:
        """What this kind adds to a measurement's context (merged over the common one)."""
        return {}

    def software(self, device: Device) -> dict[str, Any]:
        """The device's software, cheaply, at session time (a run's manifest, ``farm.manifest``: keys ``os_build``,
        ``kernel``, ``gpu_driver``, ``governor``, ``cpu_model``, ``microcode``); what the kind cannot read is left out
        (unknown, never guessed). The measuring process bounds the call (``measure.manifest.SOFTWARE_BUDGET_S``)."""
        return {}

    def demo_entry(self) -> str:
        """An inventory entry `farm demo` adds when this host can serve such a device ('' = none)."""
        return ""


class ThisHost(DeviceKind):
    """A base for kinds whose code runs on this host: its CPU, sensors and load describe the device."""

    reference_runs_here = True  # this host's CPU (for a GPU kind: the CPU that hosts it)
    measures_on_this_host = True

    def effective_target(self, device: Device, target: dict[str, Any], host: HostCPU) -> dict[str, Any]:
        if target_kind(target) == "llvm":
            if "mtriple" not in target and "mcpu" not in target and host.cpu:
                target["mcpu"] = host.cpu
            target.setdefault("num-cores", host.cores)  # this host's cores run the code (MetaSchedule needs it)
        return super().effective_target(device, target, host)

    def read_health(self, device: Device) -> dict[str, Any]:
        health: dict[str, Any] = {}
        if thermal := _host_thermal():
            health["thermal"] = thermal
        battery = getattr(psutil, "sensors_battery", lambda: None)()
        if battery is not None:
            health["battery_pct"], health["charging"] = round(battery.percent), bool(battery.power_plugged)
        return health

    def measurement_context(self, device: Device) -> dict[str, Any]:
        host = {"platform": platform.platform(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
                "load_avg": list(os.getloadavg()), "mem_available_mb": psutil.virtual_memory().available // 2**20}
        freq = psutil.cpu_freq()
        if freq is not None:
            host["cpu_freq_mhz"] = freq.current
        context: dict[str, Any] = {"host": host}
        if thermal := _host_thermal():
            context["thermal"] = thermal
        return context


    def software(self, device: Device) -> dict[str, Any]:
        return host_software()


def host_software() -> dict[str, Any]:
    """This host's kernel, distribution, CPU model, microcode and CPU governor, where readable."""
    found: dict[str, Any] = {"kernel": platform.release()}
    release = _read("/etc/os-release")
    if match := re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', release, re.M):
        found["os_build"] = match.group(1)
    cpuinfo = _read("/proc/cpuinfo")
    for key, name in (("cpu_model", "model name"), ("microcode", "microcode")):
        if match := re.search(rf"^{name}\s*:\s*(.+)$", cpuinfo, re.M):
            found[key] = match.group(1).strip()
    if governor := _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").strip():
        found["governor"] = governor
    return found


# What a Linux device's own shell prints of its software, one KEY=VALUE a line (``software_lines`` reads it): one
# round trip over ssh or adb. The GPU driver: nvidia-smi's, or a Jetson's L4T release line
BOARD_SOFTWARE = (
    'echo "kernel=$(uname -r)"; (. /etc/os-release 2>/dev/null && echo "os_build=$PRETTY_NAME"); '
    'echo "governor=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null)"; '
    'echo "cpu_model=$(grep -m1 -E "^(model name|Hardware|Model)" /proc/cpuinfo 2>/dev/null | cut -d: -f2-)"; '
    'echo "gpu_driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)"; '
    '[ -r /etc/nv_tegra_release ] && echo "gpu_driver=$(head -n1 /etc/nv_tegra_release)"; true')
PHONE_SOFTWARE = (
    'echo "os_build=$(getprop ro.build.fingerprint)"; echo "kernel=$(uname -r)"; '
    'echo "governor=$(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null)"; '
    'echo "cpu_model=$(getprop ro.soc.model)"')


def software_lines(text: str) -> dict[str, str]:
    """KEY=VALUE lines (``BOARD_SOFTWARE``, ``PHONE_SOFTWARE``) as fields: empty values are unknown (left out), a
    later non-empty line of a key wins."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[a-z_]+", key.strip()) and value.strip():
            found[key.strip()] = value.strip()
    return found


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


class GpuHere(ThisHost):
    """A base for GPU kinds of this host (OpenCL, CUDA): the host code runs on this host's CPU, llvm with its CPU
    unless the device names its ``host``."""

    def effective_target(self, device: Device, target: dict[str, Any], host: HostCPU) -> dict[str, Any]:
        target = super().effective_target(device, target, host)
        if device.host is None and target_kind(target) != "llvm":  # this host runs the host code
            target["host"] = {"kind": "llvm", **({"mcpu": host.cpu} if host.cpu else {})}
        return target


# Fields every kind has, checked by their type here (the rest of the common fields are the inventory's)
THREADS = Field("count", "threads = 4", THREADS_RULE)
WEIGHT_PREPACK = Field("flag", "weight_prepack = false", PREPACK_RULE)
SEARCH_POPULATION = Field("count", "search_population = 128",
                          "farm tune: the schedules MetaSchedule's evolutionary search keeps a batch (default 128); "
                          "fewer generate a batch faster and explore less (tune.config.SEARCH_POPULATION)")
LAYOUT = Field("text", 'layout = "NHWC"', LAYOUT_RULE, choices=LAYOUTS)
CUDA_TOOLKIT = Field("text", 'cuda_toolkit = "/usr/local/cuda-10.2"',
                     "a CUDA target's device code compiled by this toolkit's bin/nvcc (default: NVRTC from PyPI, CUDA "
                     "12.9 for sm_50-sm_72, 13.0 from sm_75; a cubin loads only on a driver of its CUDA or newer, so "
                     "a Jetson names its JetPack's toolkit)")
CUDA_DRIVER = Field("text", 'cuda_driver = "10.2"',
                    "the CUDA version of the device's NVIDIA driver (nvidia-smi's 'CUDA Version'; a Jetson's JetPack: "
                    "4.6 is 10.2, 6.x is 12.x): farm bench refuses, before the upload, a device whose driver cannot run "
                    "TVM 0.27's CUDA runtime (it needs CUDA 13: devices.cuda.RUNTIME_CUDA); compiling still works")
COMMON = {"threads": THREADS, "weight_prepack": WEIGHT_PREPACK, "layout": LAYOUT, "search_population": SEARCH_POPULATION,
          "cuda_toolkit": CUDA_TOOLKIT, "cuda_driver": CUDA_DRIVER}


def thread_options(device: Device) -> tuple[str, ...]:
    """The ``--threads`` option of farm's servers (Python and native) for ``device``; none when the setting is the
    server's own count of its online CPUs (``records.THREADS_RULE``)."""
    threads = threads_setting(device)
    return () if threads is None else ("--threads", str(threads))


def _host_thermal() -> dict[str, float]:
    """This host's hottest reading per sensor ({} where psutil has none)."""
    temps: dict[str, list[Any]] = getattr(psutil, "sensors_temperatures", lambda: {})()
    return {name: max(t.current for t in entries) for name, entries in (temps or {}).items() if entries}

