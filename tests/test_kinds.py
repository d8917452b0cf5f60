"""Every registered device kind implements the whole interface (farm/devices/kind.py)."""

import json

import pytest

from farm.cli import build_parser
from farm.devices import kind_of, kinds
from farm.devices.kind import DeviceKind, ThisHost
from farm.errors import InventoryError
from farm.inventory import COMMON_FIELDS, parse_inventory
from farm.records import Device, HostCPU, target_kind
from tests.conftest import run_farm

KINDS = sorted(kinds())
FIELD_TYPES = {"port", "text", "texts", "address"}
NOT_A_VALUE = "{ nested = 1 }"  # a table: no kind's field takes one


def test_the_registry_holds_the_kinds_farm_ships():
    assert {"local", "remote", "qemu", "android", "ios", "linux"} <= set(KINDS)  # opencl: tests/test_opencl.py
    assert all(isinstance(kind, DeviceKind) and kind.name == name for name, kind in kinds().items())


def _entry(name: str, extra: str = "") -> str:
    return f'[devices.d]\nkind = "{name}"\n{kinds()[name].example}\n{extra}'


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_implements_the_whole_interface(name):
    kind = kinds()[name]
    assert type(kind).bring_up is not DeviceKind.bring_up, "bring_up is the one method without a default"
    assert kind.summary and kind.serve_help and kind.example
    assert not set(kind.fields) & COMMON_FIELDS
    for field, spec in kind.fields.items():
        assert spec.type in FIELD_TYPES and spec.help and spec.example.startswith(field), field
    device = parse_inventory(_entry(name)).devices["d"]
    assert kind_of(device) is kind and device.emulated == kind.always_emulated
    assert isinstance(kind.prerequisites(), str) and isinstance(kind.unready(device), str)
    assert isinstance(kind.measurement_context(device), dict)
    if isinstance(kind, ThisHost):  # this host describes the device: its CPU goes into the target and the context
        assert "host" in kind.measurement_context(device)
    assert isinstance(kind.read_health(device), dict)
    target = kind.effective_target(device, dict(device.target), HostCPU("skylake", 8))
    assert target_kind(target) == target_kind(device.target)
    assert kind.export_toolchain(device, "aarch64-linux-gnu") is None, "no kind owns plain Linux: farm's cross g++"
    offered = kind.demo_entry()
    if offered:
        assert parse_inventory(offered).devices, "what `farm demo` adds must be a valid entry"


@pytest.mark.parametrize("name", KINDS)
def test_each_kind_refuses_a_bad_entry_with_a_hint(name):
    kind = kinds()[name]
    with pytest.raises(InventoryError) as caught:
        parse_inventory(_entry(name, "bogus_field = 1"))
    assert "'bogus_field' is not known" in caught.value.message and "allowed fields" in caught.value.hint
    for field, spec in kind.fields.items():
        with pytest.raises(InventoryError) as caught:
            parse_inventory(_entry(name, f"{field} = {NOT_A_VALUE}"))
        assert f"device 'd': {field} " in caught.value.message, field
        assert spec.example in caught.value.hint, field


def test_field_types_take_their_values_and_refuse_others():
    from farm.devices.kind import Field

    cases = {"port": ([5001], [0, 70000, True, "5001"]), "text": (["a"], ["", 3, ["a"]]),
             "texts": ([[], ["-o", "x"]], ["x", [1]]), "address": (["127.0.0.1:5037", "phone.lab:1", "::1:9190"],
                                                 ["127.0.0.1", "h:p", 5037, ":5037", "a b:5037", "h:0", "h:70000", "h:-1"])}
    for type_, (good, bad) in cases.items():
        spec = Field(type_, "x = 1", "x")
        assert [spec.problem(v) for v in good] == [""] * len(good), type_
        assert all(spec.problem(v) for v in bad), type_


def test_one_reader_of_host_port():
    from farm.records import split_address

    assert split_address("127.0.0.1:5037") == ("127.0.0.1", 5037) and split_address("::1:9190") == ("::1", 9190)
    assert [split_address(t) for t in ("127.0.0.1", ":1", "h:", "h:p", "h:0", "h:65536", "a b:1", "h:+1")] == [None] * 8


def test_the_kinds_rules_apply_through_the_inventory():
    with pytest.raises(InventoryError, match="cannot be false for a qemu device"):
        parse_inventory(_entry("qemu", "emulated = false"))
    with pytest.raises(InventoryError, match="proxy 'phone' is not HOST:PORT"):
        parse_inventory(_entry("ios", 'proxy = "phone"'))
    board = parse_inventory(_entry("linux")).devices["d"]
    assert "ssh" in kinds()["linux"].unready(board)
    assert kinds()["linux"].unready(parse_inventory(_entry("linux", 'ssh = "me@tx2"')).devices["d"]) == ""


def test_effective_targets_follow_the_kinds_rules():
    host = HostCPU("skylake", 8)
    local = parse_inventory(_entry("local")).devices["d"]
    assert kind_of(local).effective_target(local, {"kind": "llvm"}, host) == {"kind": "llvm", "mcpu": "skylake", "num-cores": 8}
    cross = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    board = parse_inventory(_entry("qemu")).devices["d"]
    assert kind_of(board).effective_target(board, dict(cross), host) == {**cross, "num-cores": 8}
    remote = parse_inventory(_entry("remote")).devices["d"]
    assert kind_of(remote).effective_target(remote, {"kind": "llvm"}, host) == {"kind": "llvm"}


def test_help_names_every_kind():
    parser = build_parser()
    helps = {name: sub.format_help() for name, sub in parser._subparsers._group_actions[0].choices.items()}
    for name, kind in kinds().items():
        assert f"{name} → {kind.serve_help[:30]}" in " ".join(helps["serve"].split()), name
        assert f"{name}: {kind.summary[:30]}" in " ".join(helps["devices"].split()), name


def test_farm_devices_kinds_lists_each_kind_with_its_fields(tmp_path):
    proc = run_farm("devices", "--kinds", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {row["kind"]: row for row in json.loads(proc.stdout)["kinds"]}
    assert set(listed) == set(KINDS)
    for name, row in listed.items():
        assert set(row["fields"]) == set(kinds()[name].fields)
        assert parse_inventory(row["example"].replace("NAME", "d")).devices["d"].kind == name
    every = json.loads(proc.stdout)["every_kind"]
    assert "num-cores" in every["threads"]["help"] and "online" in every["threads"]["help"]  # its default, stated
    text = run_farm("devices", "--kinds", cwd=tmp_path).stdout
    assert text.startswith("every kind:\n  threads: TVM's CPU threads on a device: devices.toml's threads, else the "
                           "target's num-cores")


def test_export_toolchains_are_the_platform_kinds_whatever_kind_serves_the_device(monkeypatch):
    """compile.toolchain_for asks the kinds (android: the NDK, ios: Xcode) instead of knowing their names; a phone's
    triple gets the phone's toolchain on any kind of device, with the same errors as before the move."""
    import sys

    from farm.compile import toolchain_for
    from farm.errors import BuildError

    android_triple = {"kind": "llvm", "mtriple": "aarch64-linux-android"}
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    for name in ("android", "remote", "linux"):
        device = Device("p", name, "p", android_triple)
        with pytest.raises(BuildError) as caught:
            toolchain_for(device, android_triple)
        assert caught.value.message == "device 'p' targets aarch64-linux-android and no Android NDK compiler is configured"
        assert caught.value.hint == ("install the Android NDK and set TVM_NDK_CC to its clang++ (e.g. "
                                     "aarch64-linux-android28-clang++), or set cc in devices.toml")
    monkeypatch.setenv("TVM_NDK_CC", "/ndk/aarch64-linux-android28-clang++")
    assert toolchain_for(Device("p", "remote", "p", android_triple), android_triple) == "/ndk/aarch64-linux-android28-clang++"
    assert toolchain_for(Device("p", "android", "p", android_triple, options={"cc": "my-cc"}), android_triple) == "my-cc"

    apple = {"kind": "metal", "host": {"kind": "llvm", "mtriple": "arm64-apple-darwin"}}
    for name in ("ios", "remote"):
        device = Device("i", name, "i", apple)
        if sys.platform == "darwin":
            assert toolchain_for(device, apple) == "xcode"
            continue
        with pytest.raises(BuildError) as caught:
            toolchain_for(device, apple)
        assert caught.value.message == "device 'i': a dynamic library for arm64-apple-darwin needs macOS with Xcode"
        assert caught.value.hint == ('iOS cannot load dynamic libraries anyway: use export = "system-lib" '
                                     "(objects to link into the app)")
    assert toolchain_for(Device("i", "ios", "i", apple, export="system-lib"), apple) == ""
