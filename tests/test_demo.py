"""The main job on the embedded default, as the README's first command runs it."""

import json

import psutil

from tests.conftest import run_farm


def test_demo_benchmarks_builtin_models_on_two_devices_and_stops_everything(tmp_path):
    proc = run_farm("demo", "--repeat", "5", "--min-repeat-ms", "5", "--json", cwd=tmp_path,
                    env={"FARM_HOME": str(tmp_path / ".farm")}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    cells = {(c["device"], c["model"]): c["status"] for c in out["cells"]}
    assert cells == {(d, m): "ok" for d in ("host-native", "host-generic") for m in ("mlp", "convnet")}
    assert (tmp_path / out["db"]).exists()
    report = tmp_path / out["report"]
    assert report.parent == tmp_path / "reports" and "host-generic" in report.read_text()
    assert len(out["stopped_pids"]) == 3  # tracker + two servers
    for pid in out["stopped_pids"]:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive or "tvm.exec" not in " ".join(psutil.Process(pid).cmdline())


def test_demo_rejects_unknown_model_before_starting_anything(tmp_path):
    proc = run_farm("demo", "--models", "mlp,resnet9000", cwd=tmp_path, env={"FARM_HOME": str(tmp_path / ".farm")})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "error: model file resnet9000 does not exist"
    assert not (tmp_path / ".farm").exists()
