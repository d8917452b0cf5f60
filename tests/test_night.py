"""The night as a library (farm/night/pipeline.py): docs/nightly-and-lab.md's Python example runs as written, and farm sweep
is a thin layer over it (its verb module holds no step of the night)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


def test_the_docs_python_example_runs_a_night_and_reads_its_findings(farm_net, tmp_path):
    text = (REPO / "docs" / "nightly-and-lab.md").read_text()
    (example,) = re.findall(r"## A night from Python\n.*?```python\n(.*?)```", text, re.S)
    text = farm_net.inventory_text()  # its two servers (the shared inventory's ghost device is left out: offline)
    (tmp_path / "devices.toml").write_text(text[:text.index("[devices.ghost]")] if "[devices.ghost]" in text else text)
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert re.fullmatch(r"sweep 1: done, report reports/sweep-1\.html", first), done.stdout
    assert (tmp_path / "reports" / "sweep-1.html").exists() and (tmp_path / "results.db").exists()


def test_farm_sweep_s_verb_holds_no_step_of_the_night():
    """cli/sweep.py parses, calls run_night, prints: it calls none of the night's steps itself."""
    steps = {"run_sweep", "review_night", "notify_night", "tune_after_sweep", "tune_queued", "render_report",
             "enqueue_sweep", "follow_sweep", "one_sweep_at_a_time"}
    tree = ast.parse((REPO / "farm" / "cli" / "sweep.py").read_text())
    called = {node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
              for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert called & steps == set() and "run_night" in called
