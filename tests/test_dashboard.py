"""farm dashboard: a real tornado server, a real store, checked in headless Chromium."""

import json
import urllib.request

import pytest

from tests.conftest import dashboard_server, farm_workspace, run_farm
from tests.test_report import needs_chromium, open_in_chromium


@pytest.fixture(scope="module")
def dashboard(farm_net, tmp_path_factory):
    """A swept and probed store, and `farm dashboard` serving it: its base URL."""
    inventory_file, farm_env = farm_workspace(farm_net, tmp_path_factory.mktemp("dashboard"))
    sweep = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", "convnet",
                     "--repeat", "3", "--min-repeat-ms", "5", "--no-report", env=farm_env)
    assert sweep.returncode == 0, sweep.stderr
    run_farm("--devices", str(inventory_file), "devices", "--probe", env=farm_env)
    with dashboard_server(inventory_file, farm_env, "--url", "http://farm.lab.example/") as url:
        yield url


def test_dashboard_shows_devices_sweep_and_results(dashboard):
    state = json.loads(urllib.request.urlopen(f"{dashboard}/api/state", timeout=10).read())
    devices = {d["device"]: d for d in state["devices"]}
    assert devices["cpu-a"]["state"] == "online" and devices["cpu-a"]["probe_state"] == "online"
    assert devices["ghost"]["state"] == "missing"
    assert state["sweep"]["status"] == "done" and state["sweep"]["cells_done"] == state["sweep"]["cells_total"] == 2
    assert {r["model"] for r in state["runs"]} == {"mlp", "convnet"}


@needs_chromium
def test_the_dashboard_answers_only_requests_addressed_to_it(dashboard):
    """#62: DNS rebinding: a page of another site, its name pointed at this host, could read /api/state. Now a
    request whose Host is not the dashboard's (its address, loopback's names, a --url the lab gave) gets 403."""
    import http.client

    port = int(dashboard.rsplit(":", 1)[1])

    def status(host: str, path: str = "/api/state") -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", path, headers={"Host": host})
        response = connection.getresponse()
        return response.status, response.read()

    assert status(f"127.0.0.1:{port}")[0] == 200 and status(f"localhost:{port}")[0] == 200
    assert status("farm.lab.example")[0] == 200 and status("farm.lab.example:80", "/")[0] == 200  # its --url
    refused, body = status(f"attacker.example:{port}")
    assert refused == 403 and b"farm dashboard --url" in body and b"devices" not in body
    assert status(f"attacker.example:{port}", "/")[0] == 403


def test_dashboard_page_shows_them_in_chromium(dashboard):
    text, errors, _ = open_in_chromium(f"{dashboard}/", ready=("#updated", "updated"))
    assert errors == []
    assert "cpu-a" in text and "online" in text and "sweep 1: done, 2/2 cells" in text and "convnet" in text


def _sweep(inventory_file, farm_env, tmp_path, *args):
    return run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--reference", "none",
                    "--min-repeat-ms", "5", "--report-dir", str(tmp_path / "reports"), *args, env=farm_env)


def test_one_median_in_the_sweep_output_results_report_and_dashboard(farm_net, inventory_file, farm_env, tmp_path):
    """An even number of repeats (the median is the mean of the middle two) and an odd one."""
    from farm.views.dashboard import collect_state
    from farm.inventory import load_inventory
    from farm.stats import format_duration

    even = _sweep(inventory_file, farm_env, tmp_path, "--model", "mlp", "--repeat", "4", "--json")
    assert even.returncode == 0, even.stderr
    even_cell = json.loads(even.stdout)["cells"][0]
    odd = _sweep(inventory_file, farm_env, tmp_path, "--model", "convnet", "--repeat", "5")
    assert odd.returncode == 0, odd.stderr
    printed = next(line for line in odd.stdout.splitlines() if " convnet " in line).split()  # device model ok 1.2 ms

    results = {r["run_id"]: r for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)}
    mlp = results[even_cell["run_id"]]
    convnet = next(r for r in results.values() if r["model"] == "convnet" and r["runtime"] == "tvm")
    assert mlp["steady_n"] == 4 and convnet["steady_n"] == 5
    assert even_cell["steady_median_s"] == mlp["steady_median_s"]  # exactly: one rule, numpy's median
    assert even_cell["unstable"] is mlp["unstable"]  # and one "unstable" rule (stats.summarize_rows)
    assert " ".join(printed[3:5]) == format_duration(convnet["steady_median_s"])  # what `farm sweep` printed

    state = collect_state(load_inventory(inventory_file), farm_env["FARM_DB"])
    shown = {r["id"]: r["steady_median_s"] for r in state["runs"]}
    assert shown[mlp["run_id"]] == mlp["steady_median_s"] and shown[convnet["run_id"]] == convnet["steady_median_s"]

    report = tmp_path / "report.html"
    assert run_farm("report", "--out", str(report), env=farm_env).returncode == 0
    html = report.read_text()
    for row in (mlp, convnet):
        cell = html[html.index(f'<td class="text">{row["model"]}</td>'):]
        assert f"<td>{format_duration(row['steady_median_s'])} " in cell.split("</tr>")[0], row["model"]


def test_dashboard_counts_a_variant_sweeps_cells(farm_net, inventory_file, farm_env, tmp_path):
    """mlp and a model file, each in fp32 and fp16: four cells (a variant is a cell of its own; the file's runs carry
    its stem, ``tiny``, the sweep's cells its path)."""
    import onnx
    from onnx import TensorProto, helper

    from farm.views.dashboard import collect_state
    from farm.inventory import load_inventory

    tiny = tmp_path / "models" / "tiny.onnx"
    tiny.parent.mkdir()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tiny)
    sweep = _sweep(inventory_file, farm_env, tmp_path, "--model", "mlp", "--model", str(tiny), "--variant", "fp32",
                   "--variant", "fp16", "--repeat", "3", "--no-report", "--json")
    assert sweep.returncode == 0, sweep.stderr
    models = {r["model"] for r in json.loads(run_farm("results", "--json", env=farm_env).stdout)}
    assert models == {"mlp", "mlp@fp16", "tiny", "tiny@fp16"}, models
    state = collect_state(load_inventory(inventory_file), farm_env["FARM_DB"])["sweep"]
    assert state["status"] == "done"
    assert state["cells_done"] <= state["cells_total"] and (state["cells_done"], state["cells_total"]) == (4, 4)
