"""linux devices (Jetson, boards) brought up over SSH: a real OpenSSH server on 127.0.0.1."""

import getpass
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.procs.supervise import free_port
from farm.rpc.tracker import query_summary
from tests.conftest import run_farm

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
pytestmark = pytest.mark.skipif(SSHD is None or shutil.which("ssh-keygen") is None,
                                reason="needs openssh-server (bash tools/setup.sh --test installs it)")


@pytest.fixture
def sshd(tmp_path):
    """A throwaway sshd on a free loopback port that accepts one throwaway key."""
    home = tmp_path / "ssh"
    home.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / name)], check=True)
    (home / "authorized_keys").write_text((home / "client_key.pub").read_text())
    os.chmod(home / "authorized_keys", 0o600)
    port = free_port()
    (home / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {home / 'host_key'}
AuthorizedKeysFile {home / 'authorized_keys'}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {home / 'sshd.pid'}
""")
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(home / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(home / "sshd.log", "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + 60  # returns as soon as sshd answers; generous for a loaded machine
        while time.monotonic() < deadline:
            probe = subprocess.run(["ssh", "-p", str(port), "-i", str(home / "client_key"), "-o", "BatchMode=yes",
                                    "-o", f"UserKnownHostsFile={home / 'known_hosts'}", "-o", "StrictHostKeyChecking=accept-new",
                                    f"{getpass.getuser()}@127.0.0.1", "true"], capture_output=True)
            if probe.returncode == 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"sshd did not accept the key: {(home / 'sshd.log').read_text()[-500:]}")
        yield port, home
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_board_brought_up_over_ssh_is_benchmarked_and_stopped(farm_net, farm_env, tmp_path, sshd):
    port, home = sshd
    server_port = free_port()
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(f"""
[devices.jetson]
kind = "linux"
key = "ssh-board"
target = {{ kind = "llvm" }}
ssh = "{getpass.getuser()}@127.0.0.1:{port}"
ssh_key = "{home / 'client_key'}"
ssh_options = ["-o", "UserKnownHostsFile={home / 'known_hosts'}"]
remote_python = "{sys.executable}"
server_port = {server_port}
"""))
    env = {**farm_env, "FARM_DEVICES": str(inventory)}
    try:
        serve = run_farm("serve", "--device", "jetson", "--json", env=env)
        assert serve.returncode == 0, serve.stderr
        remote_pid = json.loads(serve.stdout)["servers"][0]["pid"]
        assert query_summary(farm_net.tracker).keys["ssh-board"].servers == 1
        bench = run_farm("bench", "--device", "jetson", "--model", "mlp", "--repeat", "3", "--min-repeat-ms", "5",
                         "--json", env=env)
        assert bench.returncode == 0, bench.stderr
        assert json.loads(bench.stdout)["check"]["status"] == "passed"
    finally:
        down = run_farm("down", "--json", env=env)
    assert [p["name"] for p in json.loads(down.stdout)["stopped"]] == ["jetson"]
    deadline = time.monotonic() + 60  # polls until gone; the bound only ends a failing test
    while time.monotonic() < deadline and Path(f"/proc/{remote_pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{remote_pid}").exists()  # the remote server (this host) is gone


def test_unreachable_board_is_one_error_line(farm_net, farm_env, tmp_path):
    inventory = tmp_path / "devices.toml"
    inventory.write_text(farm_net.inventory_text(f"""
[devices.jetson]
kind = "linux"
key = "ssh-nowhere"
target = {{ kind = "llvm" }}
ssh = "nobody@127.0.0.1:{free_port()}"
"""))
    proc = run_farm("--devices", str(inventory), "serve", "--device", "jetson", env=farm_env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-2].startswith("error: could not bring up 'jetson': could not start the rpc_server on 'jetson' over ssh")
    assert lines[-1].startswith("hint: check: ssh works without a password")
