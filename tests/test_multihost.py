"""A farm over two hosts: one tracker, a second lab host made as a network namespace.

The second host runs `farm serve --tracker HOST:PORT` for its own device, inside its own
network namespace joined to this one by a veth pair; `farm bench` here measures that device
through the one tracker. Needs root and iproute2; everything created is removed."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from farm.procs.supervise import free_port
from tests.conftest import REPO, network_namespace, run_farm, write_inventory

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="needs root and iproute2 to create a network namespace")


@pytest.fixture
def second_host():
    """(namespace, host address, lab address): a namespace joined to this host by a veth pair."""
    with network_namespace("farm", 213) as addresses:
        yield addresses


def test_device_on_second_host_is_benchmarked_through_one_tracker(second_host, tmp_path):
    ns, host_addr, lab_addr = second_host
    port = free_port(host_addr)
    inventory = write_inventory(tmp_path / "devices.toml", """
[devices.lab2-cpu]
kind = "local"
key = "lab2-cpu"
target = { kind = "llvm" }
""", port, host_addr)
    here = {"FARM_HOME": str(tmp_path / "home-1"), "FARM_DB": str(tmp_path / "results.db"), "FARM_DEVICES": str(inventory)}
    lab = {**here, "FARM_HOME": str(tmp_path / "home-2")}
    try:
        started = run_farm("tracker", "start", "--host", host_addr, env=here)
        assert started.returncode == 0, started.stderr
        assert "no authentication" in started.stderr  # bound beyond loopback: farm warns
        serve = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "farm.cli", "serve",
                                "--tracker", f"{host_addr}:{port}", "--json"],
                               capture_output=True, text=True, env={**os.environ, **lab}, cwd=REPO, timeout=120)
        assert serve.returncode == 0, serve.stderr
        devices = json.loads(run_farm("devices", "--json", env=here).stdout)
        assert devices["devices"][0]["state"] == "online"
        bench = run_farm("bench", "--device", "lab2-cpu", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=here)
        assert bench.returncode == 0, bench.stderr
        assert json.loads(bench.stdout)["check"]["status"] == "passed"
        summary = subprocess.run([sys.executable, "-m", "tvm.exec.query_rpc_tracker", "--host", host_addr,
                                  "--port", str(port)], capture_output=True, text=True, timeout=60)
        assert lab_addr in summary.stdout  # the server registered from the second host's address
        # #62: it listens on that one address, not on every one of the host's (the namespace's loopback included)
        (server_port,) = [s["port"] for s in json.loads(serve.stdout)["servers"] if s["device"] == "lab2-cpu"]
        listening = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{server_port}"],
                                   capture_output=True, text=True, timeout=30).stdout.split()
        assert f"{lab_addr}:{server_port}" in listening and f"0.0.0.0:{server_port}" not in listening, listening
    finally:
        subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "farm.cli", "down"],
                       env={**os.environ, **lab}, cwd=REPO, capture_output=True, timeout=60)
        run_farm("down", env=here)


def test_a_queued_sweep_measures_each_host_s_device_on_that_host(second_host, tmp_path):
    """Two lab hosts, one tracker, one PostgreSQL: `farm worker --serve` on each brings its own device up and
    measures its cells; a `farm sweep` on this host queues a cell for each and follows them. Each cell is measured
    by the worker of the device's host (its log says so, and the other's does not)."""
    import psycopg

    from tests.conftest import running_postgres

    ns, host_addr, lab_addr = second_host
    port = free_port(host_addr)
    inventory = write_inventory(tmp_path / "devices.toml", """
[devices.lab1-cpu]
kind = "local"
key = "lab1-cpu"
lab_host = "lab1"
target = { kind = "llvm", num-cores = 1 }

[devices.lab2-cpu]
kind = "local"
key = "lab2-cpu"
lab_host = "lab2"
target = { kind = "llvm", num-cores = 1 }
""", port, host_addr)
    with running_postgres(f"127.0.0.1,{host_addr}", f"{lab_addr}/32") as server:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as db:
            db.execute("CREATE DATABASE lab")
        here = {"FARM_HOME": str(tmp_path / "home-1"), "FARM_DB": f"{server}/lab", "FARM_DEVICES": str(inventory)}
        lab = {**here, "FARM_HOME": str(tmp_path / "home-2"),
               "FARM_DB": f"postgresql://farm@{host_addr}:{server.rsplit(':', 1)[1]}/lab"}
        workers: list[subprocess.Popen] = []
        try:
            started = run_farm("tracker", "start", "--host", host_addr, env=here)
            assert started.returncode == 0, started.stderr
            for host, env, prefix in (("lab1", here, []), ("lab2", lab, ["ip", "netns", "exec", ns])):
                with open(tmp_path / f"worker-{host}.log", "wb") as log:
                    workers.append(subprocess.Popen(
                        [*prefix, sys.executable, "-m", "farm.cli", "worker", "--lab-host", host, "--serve",
                         "--progress"], env={**os.environ, **env}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True))
            sweep = run_farm("sweep", "--model", "mlp", "--reference", "none", "--repeat", "3", "--min-repeat-ms",
                             "5", "--no-report", "--json", env=here, timeout=600)
            assert sweep.returncode == 0, sweep.stderr[-3000:]
            out = json.loads(sweep.stdout)
            assert out["status"] == "done"
            assert sorted((c["device"], c["status"]) for c in out["cells"]) == [("lab1-cpu", "ok"), ("lab2-cpu", "ok")]
            logs = {host: (tmp_path / f"worker-{host}.log").read_text() for host in ("lab1", "lab2")}
            assert "lab1-cpu · mlp · check: passed" in logs["lab1"] and "lab2-cpu" not in logs["lab1"], logs["lab1"]
            assert "lab2-cpu · mlp · check: passed" in logs["lab2"] and "lab1-cpu" not in logs["lab2"], logs["lab2"]
            summary = subprocess.run([sys.executable, "-m", "tvm.exec.query_rpc_tracker", "--host", host_addr,
                                      "--port", str(port)], capture_output=True, text=True, timeout=60)
            assert lab_addr in summary.stdout  # host B's device registered from host B
        finally:
            for proc in workers:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "farm.cli", "down"],
                           env={**os.environ, **lab}, cwd=REPO, capture_output=True, timeout=60)
            run_farm("down", env=here)
