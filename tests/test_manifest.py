"""A run's manifest (farm/manifest.py, farm/measure/manifest.py): what could move a run, read at session time,
unknown where it cannot be read, stored once by its digest."""

from __future__ import annotations

import json
import socket
import subprocess
import threading

from farm.manifest import Change, changes, farm_commit, known, manifest_digest, unchanged_words
from farm.records import Device
from tests.conftest import run_farm


def test_changes_name_only_fields_known_on_both_sides_in_the_reader_s_order():
    old = {"farm.commit": "a" * 40, "tvm.version": "0.27.0", "device.os_build": "QP1A", "device.kernel": None}
    new = {"farm.commit": "b" * 40, "tvm.version": "0.27.0", "device.os_build": "RQ3A", "device.kernel": "5.4"}
    assert changes(old, new) == [Change("farm.commit", "a" * 40, "b" * 40), Change("device.os_build", "QP1A", "RQ3A")]
    assert [c.words for c in changes(old, new)] == ["farm commit aaaaaaaaaa → bbbbbbbbbb", "OS build QP1A → RQ3A"]
    assert known(new) == {"farm.commit": "b" * 40, "tvm.version": "0.27.0", "device.os_build": "RQ3A",
                          "device.kernel": "5.4"}
    assert manifest_digest(old) == manifest_digest(dict(reversed(list(old.items())))) != manifest_digest(new)
    server = Change("device.server", "python-server-" + "0" * 64, "python-server-" + "1" * 64)
    assert server.words == "server binary python-server-0000000000 → python-server-1111111111"
    assert Change("farm.commit", "c" * 40, "c" * 40 + "+modified").words.endswith("cccccccccc+modified")
    same = {"tvm.version": "0.27", "model.digest": "m", "records.digest": "r"}
    assert unchanged_words([(same, same)]) == "TVM, model and records unchanged"
    assert unchanged_words([(same, {**same, "model.digest": "m2"})]) == "TVM and records unchanged"
    assert unchanged_words([({}, {})]) == ""  # nothing known: nothing said unchanged


def test_farm_s_commit_is_the_checkout_s_head():
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert farm_commit().split("+")[0] == head


def test_a_phone_whose_adb_does_not_answer_leaves_its_software_unknown_within_the_budget():
    """An adb server that accepts and never answers: the kind's read is abandoned at the budget, nothing is
    guessed, and the run would go on."""
    from farm.measure.manifest import SOFTWARE_BUDGET_S, read_software

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held = []
    threading.Thread(target=lambda: held.append(silent.accept()), daemon=True).start()
    device = Device("mute", "android", "mute", {"kind": "llvm", "mtriple": "aarch64-linux-android"},
                    options={"serial": "emulator-5554", "adb": f"127.0.0.1:{silent.getsockname()[1]}"})
    reads = []
    reader = threading.Thread(target=lambda: reads.append(read_software(device, budget_s=SOFTWARE_BUDGET_S)))
    reader.start()
    reader.join(30)  # adb's own socket timeout is 30 s: a read that waited for it would still be running
    assert reads == [{}]
    silent.close()


def test_a_bench_stores_its_manifest_and_the_host_s_software(inventory_file, farm_env):
    """A real bench on this host's server: farm, TVM and the artifact's build, the host's software, the server's
    build; a second run of the same artifact on the same host names the same manifest (stored once)."""
    for _ in range(2):
        done = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", "mlp", "--tvm-only",
                        "--json", env=farm_env)
        assert done.returncode == 0, done.stderr
    rows = json.loads(run_farm("results", "--json", env=farm_env).stdout)
    manifest = rows[0]["manifest"]
    assert manifest["farm.commit"] == farm_commit() and manifest["tvm.version"].startswith("0.27")
    assert len(manifest["tvm.build"]) == 64 and isinstance(manifest["llvm.version"], int)
    assert manifest["toolchain.compiler"].startswith("g++") and manifest["records.count"] == 0
    assert manifest["device.kernel"] and manifest["device.cpu_model"]
    assert manifest["device.server"].startswith("python-server-")
    assert rows[0]["manifest_digest"] == rows[1]["manifest_digest"]
    assert "manifest" not in rows[0]["context"] and rows[0]["context"]["manifest_s"] > 0  # stored apart, its cost kept
