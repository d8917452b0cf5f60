"""The main job on the embedded default: the README's first command, `farm demo`, run here as written (the README
walk, tests/test_readme.py, leaves it to this file: ``RUN_BY``), in a newcomer's folder, and what it did checked from
what it printed, what it stored and the processes left on this host."""

import json
import os
import re
from pathlib import Path

import psutil
import pytest

from farm.devices import kinds
from farm.inventory import parse_inventory
from tests.conftest import run_farm
from tests.test_readme import RUN_BY, Newcomer, judge, newcomer_folder, readme_command
from tests.test_report import needs_chromium, open_in_chromium

CELL = re.compile(r"^(?P<device>\S+)\s+(?P<model>\S+)\s+(?P<status>\S+)\s+steady\s")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The README's `farm demo`, as written: (its folder, its output lines, its stored runs, the devices it measured)."""
    command = readme_command(("demo",))
    assert ("demo",) in RUN_BY  # else the README walk runs it too
    work = newcomer_folder(tmp_path_factory.mktemp("demo"))
    newcomer = Newcomer(work)
    proc = newcomer.shell(command.text, newcomer.env)
    assert judge("ok", proc.returncode, proc.stdout, proc.stderr) == "", proc.stdout + proc.stderr
    runs = json.loads(run_farm("results", "--json", cwd=work).stdout)
    offered = parse_inventory("".join(kind.demo_entry() for kind in kinds().values())).devices  # opencl-gpu on POCL
    return work, proc.stdout.splitlines(), runs, ("host-native", "host-generic", *offered)


def said(lines: list[str], prefix: str) -> str:
    """What the line starting with ``prefix`` says after it."""
    return next(line[len(prefix):] for line in lines if line.startswith(prefix))


def holding(folder: Path) -> list[str]:
    """Live processes of this host but this one with a file under ``folder`` open (a server's or the tracker's log)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["pid"] != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                    Path(f.path).is_relative_to(folder) for f in proc.open_files()):
                found.append(f"{proc.info['pid']}: {' '.join(proc.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_demo_benchmarks_builtin_models_on_its_devices_reports_and_stops_everything(demo):
    """Two local CPU devices, and what the kinds offer here: the OpenCL device where this host has one; the database
    and report where the README says (FARM_HOME unset: ./.farm, ./reports); nothing it started still running."""
    work, lines, runs, devices = demo
    cells = {(m["device"], m["model"]): m["status"] for m in map(CELL.match, lines) if m}
    assert cells == {(d, m): "ok" for d in devices for m in ("mlp", "convnet")}, lines
    assert said(lines, "results database: ") == ".farm/results.db" and (work / ".farm" / "results.db").exists()
    report = work / said(lines, "report: ")
    assert report.parent == work / "reports" and "host-generic" in report.read_text()
    assert lines[-1].endswith("every process the demo started is stopped")
    logs = list((work / ".farm").glob("demo-*/*.log"))
    assert len(logs) >= 1 + len(devices), logs  # the tracker's and a server's per device: they ran from here
    assert holding(work) == []


def test_demo_tunes_its_model_then_measures_it_again_beside_the_reference_threads_stated(demo):
    """The story a newcomer came for: untuned TVM beside onnxruntime on equal threads, a short session, the same
    model measured again with its new records."""
    work, lines, runs, _ = demo
    tvm = [r for r in runs if r["runtime"] == "tvm" and r["device"] == "host-native"]
    for line in (line for line in lines if line.startswith("host-native ")):
        threads = next(r["threads"] for r in tvm if r["model"] == CELL.match(line)["model"] and not r["tuned"])
        assert threads >= 1 and f"{threads} thread" in line and "each)" in line, line  # onnxruntime on TVM's count
    untuned, tuned = ([r for r in tvm if r["model"] == "convnet" and bool(r["tuned"]) is t] for t in (False, True))
    assert len(untuned) == len(tuned) == 1 and tuned[0]["run_id"] > untuned[0]["run_id"], tvm
    assert tuned[0]["status"] == "ok" and tuned[0]["steady_median_s"] > 0 and untuned[0]["steady_median_s"] > 0
    line = said(lines, "tuned convnet on host-native for ")
    trials = int(re.search(r"\((\d+) trials", line).group(1))
    assert trials > 0 and "untuned " in line and " → tuned " in line and "threads each)" in line, line
    report = (work / said(lines, "report: ")).read_text()
    assert report.count("host-native</td>") >= 2 and "tuned " in report and "untuned" in report  # before and after rows


@needs_chromium
def test_demo_report_shows_the_opencl_devices_figures_in_chromium(demo):
    work, lines, _, devices = demo
    if "opencl-gpu" not in devices:
        pytest.skip("this host offers no OpenCL device to the demo (bash tools/setup.sh --opencl)")
    text, errors, images = open_in_chromium(work / said(lines, "report: "), open_details=True)
    assert errors == []
    assert images and all(width > 0 for width in images)
    # the cell's row (its kernel-time steady figure), then its details folded under it: cold and warm first run, the
    # wall-time steady figure, copies and their share
    row, details = text[text.index("opencl-gpu\tconvnet"):].split("load, first runs, intervals", 1)
    assert "\tok\t" in row and " kernel\t" in row
    details = details.split("\nopencl-gpu", 1)[0].split("host-", 1)[0]
    assert re.search(r" wall \(\d+ × ", details) and "#1 32768 B → " in details and "%" in details
    assert "first run cold" in text and "first run warm" in text
    assert "GPU copies: device ↔ host against size" in text and "64 MiB" in text and "GB/s" in text


def test_demo_rejects_unknown_model_before_starting_anything(tmp_path):
    proc = run_farm("demo", "--models", "mlp,resnet9000", cwd=tmp_path, env={"FARM_HOME": str(tmp_path / ".farm")})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "error: model file resnet9000 does not exist"
    assert not (tmp_path / ".farm").exists()
