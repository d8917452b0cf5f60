import pytest

from farm.errors import InventoryError
from farm.inventory import find_device, load_inventory, parse_inventory

GOOD = """
[tracker]
host = "127.0.0.1"
port = 9190

[devices.x86-local]
kind = "local"
key = "x86-local"
target = { kind = "llvm" }
export = "so"

[devices.mate10]
kind = "android"
key = "mate10"
target = { kind = "opencl", device = "mali" }
host = { kind = "llvm", mtriple = "aarch64-linux-android", mattr = ["+neon"] }
export = "so"
cooldown_s = 30
"""


def test_parse_inventory_reads_issue_example():
    inv = parse_inventory(GOOD)
    assert inv.tracker.port == 9190
    mate = inv.devices["mate10"]
    assert mate.kind == "android" and mate.key == "mate10" and mate.cooldown_s == 30.0
    assert mate.target == {"kind": "opencl", "device": "mali"}
    assert mate.host["mattr"] == ["+neon"]


def test_repo_devices_toml_is_valid():
    from pathlib import Path

    inv = load_inventory(Path(__file__).parent.parent / "devices.toml")
    assert "x86-local" in inv.devices


@pytest.mark.parametrize(
    "text, message, hint",
    [
        ("[devices.a\nkind = 'local'", "devices.toml: not valid TOML", "fix the syntax"),
        ('[devices.a]\nkind = "phone"\nkey = "a"\ntarget = { kind = "llvm" }', "devices.toml:1: device 'a': kind 'phone' is unknown", "write kind = one of"),
        ('[devices.a]\nkind = "local"\ntarget = { kind = "llvm" }', "devices.toml:1: device 'a': key is missing", 'add key = "a"'),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = "llvm -mcpu=x"', "device 'a': target 'llvm -mcpu=x' is a string", "TVM 0.27 refuses string targets"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "gpu" }', "device 'a': target.kind 'gpu' is not a TVM target kind", "use one of llvm"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm", mcpu = "native" }', "target.mcpu 'native' is refused", "farm detects the host CPU"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\nexport = "dll"', "export 'dll' is unknown", "so, tar, system-lib"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\ncolldown_s = 3', "field 'colldown_s' is not known for kind 'local'", "allowed fields"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\ncooldown_s = -1', "cooldown_s -1 must be a number of seconds >= 0", "cooldown_s = 30"),
        ('[tracker]\nport = "x"', "[tracker] port must be an integer", "port = 9190"),
    ],
)
def test_parse_inventory_rejects_with_hint(text, message, hint):
    with pytest.raises(InventoryError) as info:
        parse_inventory(text)
    assert message in info.value.message
    assert hint in info.value.hint


def test_parse_inventory_names_line_of_device():
    text = GOOD + '\n[devices.bad]\nkind = "local"\ntarget = { kind = "llvm" }\n'
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "lab.toml")
    line = text.splitlines().index("[devices.bad]") + 1
    assert info.value.message.startswith(f"lab.toml:{line}: device 'bad'")


def test_parse_inventory_rejects_key_reused_for_other_target():
    text = GOOD + '\n[devices.x2]\nkind = "local"\nkey = "x86-local"\ntarget = { kind = "cuda" }\n'
    with pytest.raises(InventoryError, match="reuses key 'x86-local'"):
        parse_inventory(text)


def test_load_inventory_missing_file(tmp_path):
    with pytest.raises(InventoryError) as info:
        load_inventory(tmp_path / "nope.toml")
    assert "no such inventory file" in info.value.message
    assert "--devices" in info.value.hint


def test_find_device_unknown_lists_known():
    with pytest.raises(InventoryError) as info:
        find_device(parse_inventory(GOOD), "pixel")
    assert info.value.message == "unknown device 'pixel' in devices.toml"
    assert "mate10, x86-local" in info.value.hint


PHONE = '''
[devices.{name}]
kind = "android"
key = "{name}"
target = {{ kind = "llvm", mtriple = "aarch64-linux-android" }}
serial = "{serial}"
server_port = {port}
'''


def test_android_phones_need_a_server_port_each():
    text = PHONE.format(name="p1", serial="A1", port=5001) + PHONE.format(name="p2", serial="A2", port=5001)
    with pytest.raises(InventoryError) as err:
        parse_inventory(text)
    assert "share server_port 5001" in err.value.message and "of its own" in err.value.hint
    ok = parse_inventory(text.replace("server_port = 5001\n", "server_port = 5002\n", 1))
    assert {d.options["server_port"] for d in ok.devices.values()} == {5001, 5002}


def test_android_serial_without_server_port_and_bad_gate_are_refused():
    with pytest.raises(InventoryError, match="server_port is missing"):
        parse_inventory(PHONE.format(name="p1", serial="A1", port=5001).replace("server_port = 5001\n", ""))
    with pytest.raises(InventoryError, match="max_temp_c 'hot' must be a number") as err:
        parse_inventory(PHONE.format(name="p1", serial="A1", port=5001) + 'max_temp_c = "hot"\n')
    assert "max_temp_c = 40" in err.value.hint


def test_store_table_names_the_shared_database():
    inv = parse_inventory('[store]\ndb = "postgresql://farm@db:5432/farm"\n')
    assert inv.db == "postgresql://farm@db:5432/farm" and inv.devices == {}
    with pytest.raises(InventoryError, match=r"\[store\] takes one field") as err:
        parse_inventory('[store]\nurl = "x"\n')
    assert "FARM_DB override" in err.value.hint
