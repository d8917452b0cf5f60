"""iOS devices join through TVM's RPC proxy; a real rpc_server --through-proxy stands in for the app."""

import json
import os
import signal
import subprocess
import sys

from farm.procs.supervise import free_port
from farm.rpc.tracker import query_summary, wait_for_servers
from tests.conftest import run_farm


def test_device_through_rpc_proxy_is_benchmarked(farm_net, farm_env, tmp_path):
    proxy_port = free_port()
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(
        f'\n[devices.iphone]\nkind = "ios"\nkey = "iphone-standin"\ntarget = {{ kind = "llvm" }}\n'
        f'proxy = "127.0.0.1:{proxy_port}"\n'))
    env = {**farm_env, "FARM_DEVICES": str(inventory)}
    app = None
    try:
        serve = run_farm("serve", "--device", "iphone", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        assert "RPC proxy listening on port" in serve.stderr
        # the iOS RPC app's part: connect outward to the proxy under the device's key
        app = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--through-proxy", "--host", "127.0.0.1",
                                "--port", str(proxy_port), "--key", "iphone-standin"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for_servers(farm_net.tracker, {"iphone-standin": 1}, timeout_s=120)
        assert query_summary(farm_net.tracker).keys["iphone-standin"].servers == 1
        bench = run_farm("bench", "--device", "iphone", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        assert bench.returncode == 0, bench.stderr
        assert json.loads(bench.stdout)["check"]["status"] == "passed"
    finally:
        if app is not None:
            os.killpg(app.pid, signal.SIGKILL)
            app.wait()
        run_farm("down", env=env)
