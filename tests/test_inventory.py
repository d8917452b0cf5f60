import re
import shutil
from pathlib import Path

import pytest

from farm.errors import BuildError, InventoryError
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
    inv = load_inventory(Path(__file__).parent.parent / "devices.toml")
    assert "x86-local" in inv.devices


@pytest.mark.parametrize(
    "text, message, hint",
    [
        ("[devices.a\nkind = 'local'", "devices.toml: not valid TOML", "fix the syntax"),
        ('[devices.a]\nkind = "phone"\nkey = "a"\ntarget = { kind = "llvm" }',
         "devices.toml:1: device 'a': kind 'phone' is unknown", "write kind = one of"),
        ('[devices.a]\nkind = "local"\ntarget = { kind = "llvm" }',
         "devices.toml:1: device 'a': key is missing", 'add key = "a"'),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = "llvm -mcpu=x"',
         "device 'a': target 'llvm -mcpu=x' is a string", "TVM 0.27 refuses string targets"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "gpu" }',
         "device 'a': target.kind 'gpu' is not a TVM target kind", "use one of llvm"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm", mcpu = "native" }',
         "target.mcpu 'native' is refused", "farm detects the host CPU"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\nexport = "dll"',
         "export 'dll' is unknown", "so, tar, system-lib"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\ncolldown_s = 3',
         "field 'colldown_s' is not known for kind 'local'", "allowed fields"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\ncooldown_s = -1',
         "cooldown_s -1 must be a number of seconds >= 0", "cooldown_s = 30"),
        ('[devices.a]\nkind = "local"\nkey = "a"\ntarget = { kind = "llvm" }\nsearch_population = 0',
         "search_population 0 must be a whole number >= 1", "search_population = 128"),
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


# -- targets given by TVM tag: one reader of a target's kind (records.target_kind) ---------------------------

REPO_DEVICES = Path(__file__).parent.parent / "devices.toml"
TAGGED = '[devices.t]\nkind = "linux"\nkey = "t"\ntarget = {{ tag = "{tag}" }}\n{extra}'


def test_repo_devices_toml_loads_and_each_tag_target_resolves_to_its_kind():
    from farm.records import describe_target, target_kind

    inv = load_inventory(REPO_DEVICES)
    tagged = {name: d.target["tag"] for name, d in inv.devices.items() if "tag" in d.target}
    assert tagged == {"tx2": "nvidia/jetson-tx2"}
    assert target_kind(inv.devices["tx2"].target) == "cuda"
    assert describe_target(inv.devices["tx2"].target) == "cuda (nvidia/jetson-tx2)"
    assert {name: describe_target(d.target) for name, d in inv.devices.items() if name != "tx2"} == {
        "x86-local": "llvm", "x86-remote": "llvm", "arm64-qemu": "llvm", "pocl-gpu": "opencl", "mate10": "opencl",
        "iphone": "metal"}


def test_the_tag_table_gives_each_tvm_tag_the_kind_tvm_gives_it():
    """records.TAG_KINDS (no TVM) against TVM 0.27's own tags: every tag farm reads has TVM's kind, and every TVM
    tag of a kind farm measures is read."""
    import json

    import tvm

    from farm.records import TARGET_KINDS, tag_kind

    tags = {tag: json.loads(str(exported))["kind"] for tag, exported in tvm.target.list_tags().items()}
    assert len(tags) > 250
    assert {tag: tag_kind(tag) for tag in tags if tag_kind(tag) is not None and tag_kind(tag) != tags[tag]} == {}
    assert sorted(tag for tag, kind in tags.items() if kind in TARGET_KINDS and tag_kind(tag) is None) == []
    assert {kind for tag, kind in tags.items() if tag_kind(tag) is None} == {"hexagon", "trn"}  # not measured


def test_a_target_without_a_kind_farm_knows_is_an_inventory_error():
    from farm.records import target_kind

    assert target_kind({"tag": "qcom/adreno-vulkan-texture"}) == "vulkan" and target_kind({"kind": "c"}) == "c"
    with pytest.raises(InventoryError, match="has no kind farm knows") as caught:
        target_kind({"tag": "qcom/hexagon-v68"})
    assert "nvidia/*" in caught.value.hint
    with pytest.raises(InventoryError) as caught:
        parse_inventory(TAGGED.format(tag="qcom/hexagon-v68", extra=""), "lab.toml")
    assert caught.value.message == ("lab.toml:1: device 't': target.tag 'qcom/hexagon-v68' is not a tag of a target kind "
                                    "farm measures")
    assert "nvidia/*" in caught.value.hint and 'target = { kind = "llvm", ... }' in caught.value.hint


def test_the_fallback_check_applies_to_a_tag_target():
    """inventory.py's fallback rule reads the tag's kind: a CPU tag has nothing to fall back to."""
    with pytest.raises(InventoryError, match="fallback needs a GPU target"):
        parse_inventory(TAGGED.format(tag="arm/rasp4b", extra='fallback = "cpu"'))
    gpu = parse_inventory(TAGGED.format(tag="nvidia/jetson-orin-nano", extra='fallback = "cpu"')).devices["t"]
    assert gpu.options["fallback"] == "cpu"


def test_a_host_given_by_tag_must_be_a_cpu_and_compiles_for_its_triple():
    """inventory.py's host rule reads the tag's kind (a tag host was a KeyError); farm.compile resolves it."""
    with pytest.raises(InventoryError, match="host kind 'cuda' cannot be a host"):
        parse_inventory(TAGGED.format(tag="nvidia/jetson-tx2", extra='host = { tag = "nvidia/jetson-nano" }'))
    text = '[devices.t]\nkind = "linux"\nkey = "t"\ntarget = { kind = "opencl" }\nhost = { tag = "arm/rasp4b" }\n'
    device = parse_inventory(text).devices["t"]
    from farm.compile import effective_target, toolchain_for

    target = effective_target(device)
    assert target["host"] == {"kind": "llvm", "mtriple": "armv8l-linux-gnueabihf", "mcpu": "cortex-a72", "mattr": ["+neon"]}
    if shutil.which("arm-linux-gnueabihf-g++"):
        assert toolchain_for(device, target) == "arm-linux-gnueabihf-g++"
    else:  # the host's triple chose the cross compiler, which this machine lacks
        with pytest.raises(BuildError, match="cross compiler arm-linux-gnueabihf-g\\+\\+ for armv8l-linux-gnueabihf"):
            toolchain_for(device, target)


def test_the_kinds_read_a_tag_targets_kind():
    """kind.py (ThisHost), emulated.py and opencl.py read the kind of a target given by tag."""
    from farm.devices import kinds
    from farm.records import HostCPU

    host = HostCPU("skylake", 8)
    board = parse_inventory('[devices.b]\nkind = "qemu"\nkey = "b"\ntarget = { tag = "arm/rasp4b" }').devices["b"]
    assert kinds()["qemu"].effective_target(board, dict(board.target), host)["num-cores"] == 8
    local = parse_inventory('[devices.l]\nkind = "local"\nkey = "l"\ntarget = { tag = "aws/cpu/c5.large" }').devices["l"]
    assert kinds()["local"].effective_target(local, dict(local.target), host)["num-cores"] == 8
    adreno = parse_inventory('[devices.g]\nkind = "opencl"\nkey = "g"\ntarget = { tag = "qcom/adreno-opencl" }').devices["g"]
    assert kinds()["opencl"].effective_target(adreno, dict(adreno.target), host)["host"] == {"kind": "llvm", "mcpu": "skylake"}
    with pytest.raises(InventoryError, match="target kind 'cuda' is not OpenCL"):
        parse_inventory('[devices.g]\nkind = "opencl"\nkey = "g"\ntarget = { tag = "nvidia/jetson-tx2" }')


def test_compile_reads_a_tag_targets_kind_for_its_triple():
    """compile._triple: a GPU tag's host decides the toolchain (the tx2 of the repo's devices.toml)."""
    from farm.compile import effective_target, toolchain_for

    tx2 = load_inventory(REPO_DEVICES).devices["tx2"]
    target = effective_target(tx2)
    assert (target["tag"], target["kind"], target["host"]["mtriple"]) == ("nvidia/jetson-tx2", "cuda", "aarch64-linux-gnu")
    if shutil.which("aarch64-linux-gnu-g++"):
        assert toolchain_for(tx2, target) == "aarch64-linux-gnu-g++"


@pytest.mark.parametrize("table, error", [
    ('[devices."lab:1"]', "device name 'lab:1' is not allowed"),
    ('[devices."x@cpu"]', "device name 'x@cpu' is not allowed"),
    ('[devices."a b"]', "device name 'a b' is not allowed"),
])
def test_a_device_name_that_breaks_job_keys_is_refused_with_a_hint(table, error):
    """#62: a ':' in a name collided with a model's in a lab job's key, and the second job was silently not
    queued."""
    with pytest.raises(InventoryError, match=re.escape(error)) as refused:
        parse_inventory(f'{table}\nkind = "local"\nkey = "k"\ntarget = {{ kind = "llvm" }}\n')
    assert "letters, digits" in refused.value.hint


@pytest.mark.parametrize("value", ["0", "inf", "nan", "-1"])
def test_a_session_timeout_of_zero_infinity_or_nan_is_refused(value):
    """#62: 0 ends every session at once; inf holds a frozen holder's device for ever in the lease design."""
    with pytest.raises(InventoryError, match="session_timeout_s") as refused:
        parse_inventory(f'[devices.d]\nkind = "local"\nkey = "k"\ntarget = {{ kind = "llvm" }}\nsession_timeout_s = {value}\n')
    assert "session_timeout_s = 600" in refused.value.hint or "session_timeout_s = 30" in refused.value.hint
