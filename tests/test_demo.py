"""The main job on the embedded default, as the README's first command runs it."""

import json

import psutil

from farm.devices import kinds
from farm.inventory import parse_inventory
from tests.conftest import run_farm
from tests.test_report import CHROMIUM, open_in_chromium


def test_demo_benchmarks_builtin_models_on_its_devices_reports_and_stops_everything(tmp_path):
    """Two local CPU devices, and what the kinds offer here: the OpenCL device where this host has one (its report
    checked in Chromium)."""
    proc = run_farm("demo", "--repeat", "5", "--min-repeat-ms", "5", "--json", cwd=tmp_path,
                    env={"FARM_HOME": str(tmp_path / ".farm")}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    cells = {(c["device"], c["model"]): c["status"] for c in out["cells"]}
    offered = parse_inventory("".join(kind.demo_entry() for kind in kinds().values())).devices  # opencl-gpu on POCL
    devices = ("host-native", "host-generic", *offered)
    assert cells == {(d, m): "ok" for d in devices for m in ("mlp", "convnet")}
    assert (tmp_path / out["db"]).exists()
    report = tmp_path / out["report"]
    assert report.parent == tmp_path / "reports" and "host-generic" in report.read_text()
    assert len(out["stopped_pids"]) == 1 + len(devices)  # tracker + one server per device
    for pid in out["stopped_pids"]:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        command = " ".join(psutil.Process(pid).cmdline()) if alive else ""
        assert "tvm.exec" not in command and "farm.rpc.server" not in command
    if "opencl-gpu" in devices and CHROMIUM is not None:
        text, errors, images = open_in_chromium(report)
        assert errors == []
        assert images and all(width > 0 for width in images)
        row = text[text.index("opencl-gpu\tconvnet"):].split("\tpassed")[0]  # the copies cell breaks the line
        # cold and warm first run, the kernel-time steady figure and the wall-time one, copies and their share
        assert "\tok\t" in row and " kernel\t" in row and " wall (5 × " in row and "#1 32768 B → " in row and "%" in row
        assert "first run cold" in text and "first run warm" in text
        assert "GPU copies: device ↔ host against size" in text and "64 MiB" in text and "GB/s" in text


def test_demo_rejects_unknown_model_before_starting_anything(tmp_path):
    proc = run_farm("demo", "--models", "mlp,resnet9000", cwd=tmp_path, env={"FARM_HOME": str(tmp_path / ".farm")})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "error: model file resnet9000 does not exist"
    assert not (tmp_path / ".farm").exists()
