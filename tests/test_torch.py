"""PyTorch models through TVM's Relax torch frontend (from_exported_program), checked against torch."""

import json

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the optional extra farm[torch]")

from tests.conftest import REPO, run_farm  # noqa: E402
from tests.torch_models import make_net  # noqa: E402


def test_exported_program_file_benchmarked_and_checked_against_torch(farm_net, inventory_file, farm_env, tmp_path):
    program = torch.export.export(make_net().eval(), (torch.randn(1, 3, 16, 16),))
    path = tmp_path / "smallnet.pt2"
    torch.export.save(program, path)
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-a", "--model", str(path),
                    "--repeat", "3", "--min-repeat-ms", "5", "--json", env=farm_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"] == "smallnet" and data["check"]["status"] == "passed" and data["check"]["max_abs_err"] < 1e-4
    assert data["check"]["reference"] == "torch"  # checked against the framework's own output
    ref = data["reference"]  # torch (eager, CPU) timed beside TVM
    assert (ref["runtime"], ref["status"], ref["check"]["status"]) == ("torch", "ok", "passed")
    assert ref["runtime_version"] == torch.__version__ and data["versus_reference"].startswith("TVM ")


def test_module_factory_with_input_shape(farm_net, inventory_file, farm_env):
    proc = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-b", "--model",
                    "tests.torch_models:make_net", "--shape", "image=1,3,16,16", "--repeat", "3", "--min-repeat-ms", "5",
                    "--json", env={**farm_env, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["check"]["status"] == "passed"
    missing = run_farm("--devices", str(inventory_file), "bench", "--device", "cpu-b", "--model",
                       "tests.torch_models:make_net", env={**farm_env, "PYTHONPATH": str(REPO)})
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == ["error: tests.torch_models:make_net: input 'image' needs a shape",
                                           "hint: pass --shape image=1,3,224,224 for each forward() argument"]
