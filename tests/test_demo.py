"""The main job on the embedded default, as the README's first command runs it."""

import json

import psutil
import pytest

from farm.devices import kinds
from farm.inventory import parse_inventory
from tests.conftest import run_farm
from tests.test_report import needs_chromium, open_in_chromium


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One `farm demo --json` run: (its folder, its output, the devices it measured)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    proc = run_farm("demo", "--repeat", "5", "--min-repeat-ms", "5", "--json", cwd=tmp_path,
                    env={"FARM_HOME": str(tmp_path / ".farm")}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    offered = parse_inventory("".join(kind.demo_entry() for kind in kinds().values())).devices  # opencl-gpu on POCL
    return tmp_path, json.loads(proc.stdout), ("host-native", "host-generic", *offered)


def test_demo_benchmarks_builtin_models_on_its_devices_reports_and_stops_everything(demo):
    """Two local CPU devices, and what the kinds offer here: the OpenCL device where this host has one."""
    tmp_path, out, devices = demo
    cells = {(c["device"], c["model"]): c["status"] for c in out["cells"]}
    assert cells == {(d, m): "ok" for d in devices for m in ("mlp", "convnet")}
    assert (tmp_path / out["db"]).exists()
    report = tmp_path / out["report"]
    assert report.parent == tmp_path / "reports" and "host-generic" in report.read_text()
    assert len(out["stopped_pids"]) == 1 + len(devices)  # tracker + one server per device
    for pid in out["stopped_pids"]:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        command = " ".join(psutil.Process(pid).cmdline()) if alive else ""
        assert "tvm.exec" not in command and "farm.rpc.server" not in command


def test_demo_tunes_its_model_then_measures_it_again_beside_the_reference_threads_stated(demo):
    """The story a newcomer came for: untuned TVM beside onnxruntime on equal threads, a short session, the same
    model measured again with its new records."""
    tmp_path, out, _ = demo
    host = [c for c in out["cells"] if c["device"] == "host-native"]
    assert all(c["threads"] >= 1 and f"{c['threads']} thread" in c["versus_reference"] and "each)" in c["versus_reference"]
               for c in host)  # TVM's reported threads, and onnxruntime on the same count
    tuning = out["tuning"]
    assert (tuning["device"], tuning["model"]) == ("host-native", "convnet") and tuning["trials"] > 0
    assert tuning["tuned_run"] > tuning["untuned_run"] and tuning["tuned_s"] > 0 and tuning["untuned_s"] > 0
    assert "threads each)" in tuning["versus_reference"]
    report = (tmp_path / out["report"]).read_text()
    assert report.count("host-native</td>") >= 2 and "tuned " in report and "untuned" in report  # before and after rows


@needs_chromium
def test_demo_report_shows_the_opencl_devices_figures_in_chromium(demo):
    tmp_path, out, devices = demo
    if "opencl-gpu" not in devices:
        pytest.skip("this host offers no OpenCL device to the demo (bash tools/setup.sh --opencl)")
    text, errors, images = open_in_chromium(tmp_path / out["report"])
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
