"""farm dashboard: a real tornado server, a real store, checked in headless Chromium."""

import json
import os
import signal
import subprocess
import sys
import urllib.request


from farm.rpc.processes import free_port
from tests.conftest import REPO, run_farm
from tests.test_report import CHROMIUM


def test_dashboard_shows_devices_sweep_and_results(farm_net, inventory_file, farm_env, tmp_path):
    sweep = run_farm("--devices", str(inventory_file), "sweep", "--device", "cpu-a", "--model", "convnet",
                     "--repeat", "3", "--min-repeat-ms", "5", "--no-report", env=farm_env)
    assert sweep.returncode == 0, sweep.stderr
    run_farm("--devices", str(inventory_file), "devices", "--probe", env=farm_env)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "farm.cli", "--devices", str(inventory_file), "dashboard",
                               "--port", str(port)], cwd=REPO, env={**os.environ, **farm_env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "farm dashboard on http://127.0.0.1:" in server.stdout.readline()
        state = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=10).read())
        devices = {d["device"]: d for d in state["devices"]}
        assert devices["cpu-a"]["state"] == "online" and devices["cpu-a"]["probe_state"] == "online"
        assert devices["ghost"]["state"] == "missing"
        assert state["sweep"]["status"] == "done" and state["sweep"]["cells_done"] == state["sweep"]["cells_total"] == 2
        assert {r["model"] for r in state["runs"]} == {"mlp", "convnet"}
        if CHROMIUM:
            from playwright.sync_api import sync_playwright

            errors = []
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                            "--disable-background-networking", "--no-first-run"])
                try:
                    page = browser.new_page()
                    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    page.goto(f"http://127.0.0.1:{port}/")
                    page.locator("#updated", has_text="updated").wait_for(timeout=15000)
                    text = page.inner_text("body")
                finally:
                    browser.close()
            assert errors == []
            assert "cpu-a" in text and "online" in text and "sweep 1: done, 2/2 cells" in text and "convnet" in text
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)
