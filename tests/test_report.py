"""The HTML report, rendered from a real store and opened in real headless Chromium."""

import contextlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from farm.inventory import parse_inventory
from farm.models import load_model, make_inputs, reference_outputs
from farm.records import BenchConfig, BenchResult, CheckResult, Device
from farm.views.report import render_report
from farm.store import Store
from farm.sweep import bench_cell

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# a test of what a browser shows: skipped, with this reason, where there is no Chromium
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (tools/setup.sh installs it)")
FAST = BenchConfig(repeat=5, min_repeat_ms=5, timeout_s=20)


@contextlib.contextmanager
def chromium_page(width: int = 1400):
    """(a page of a headless Chromium ``width`` px wide, the errors its console, scripts and dialogs report)."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
            yield page, errors
        finally:
            browser.close()


def open_in_chromium(where, ready: tuple[str, str] | None = None, open_details: bool = False, width: int | None = None):
    """Return (page text, console errors, image widths) of ``where`` (a file, or an http:// URL) as headless
    Chromium shows it; ``ready``: (a CSS selector, a text) to wait for first, on a page that fills itself in;
    ``open_details``: every folded part opened first, as a reader clicking each; ``width``: the window's width in px
    (then the widest table's width comes back as a fourth value)."""
    from playwright.sync_api import sync_playwright

    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(**({"viewport": {"width": width, "height": 900}} if width else {}))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(where if isinstance(where, str) else where.resolve().as_uri())
            if ready:
                page.locator(ready[0], has_text=ready[1]).wait_for(timeout=15000)
            if open_details:
                page.eval_on_selector_all("details", "els => els.forEach(e => e.open = true)")
            text = page.inner_text("body")
            images = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
            widest = page.eval_on_selector_all("table", "els => Math.max(0, ...els.map(e => e.scrollWidth))")
        finally:
            browser.close()
    return (text, errors, images, widest) if width else (text, errors, images)


@needs_chromium
def test_report_opens_in_chromium_and_shows_failed_check(farm_net, tmp_path):
    inv = parse_inventory(farm_net.inventory_text())
    model = load_model("mlp")
    wrong = [o + np.float32(1.0) for o in reference_outputs(model, make_inputs(model))]
    np.savez(tmp_path / "wrong.npz", *wrong)
    hostile = Device("<script>alert(1)</script>", "local", "x", {"kind": "llvm"})
    with Store(tmp_path / "r.db") as store:
        bench_cell(inv.tracker, inv.devices["cpu-a"], load_model("convnet"), store, tmp_path / "cache", FAST)
        bench_cell(inv.tracker, inv.devices["cpu-b"], model, store, tmp_path / "cache", FAST,
                   reference_file=str(tmp_path / "wrong.npz"))
        store.record_result(BenchResult(device=hostile.name, key="x", model="mlp", model_digest=model.digest,
                                        status="failed", reason="<b>GPU missing</b>", failed_step="load",
                                        check=CheckResult("skipped")), hostile, model, None)
        report = render_report(store, tmp_path / "report.html", title="test <report>")
    html = report.read_text()
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert "src=\"http" not in html and "<link" not in html  # self-contained
    text, errors, images = open_in_chromium(report)
    assert errors == []
    assert "test <report>" in text
    assert "cpu-a" in text and "convnet" in text and "passed" in text
    assert "failed at check" in text and "max err 1" in text  # the wrong reference is off by exactly 1.0
    assert "<b>GPU missing</b>" in text  # shown as text, not markup
    assert images and all(width > 0 for width in images)
    # the main table fits a 1,400-px window: a cell's details fold under it
    *_, widest = open_in_chromium(report, width=1400)
    assert 0 < widest <= 1400 - 2 * 16, widest  # the body's margins (2em)


def test_figures_drawn_in_worker_processes_are_the_ones_drawn_here(tmp_path):
    """A sweep report's figures go to forked workers in a process without TVM or other threads (``farm report``),
    and are drawn here otherwise (``farm sweep``, pytest): the same bytes either way."""
    script = tmp_path / "figures.py"
    script.write_text(
        "import sys\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from farm.views.figures import InlineExecutor, figure_pool\n"
        "from farm.views.review import drift_png\n"
        "shifted = [{'device': f'd{i}', 'model': 'm', 'tuned': False, 'sweeps': list(range(1, 11)),\n"
        "            'values': [0.001 * (1 + (n > 5) * 0.1 * i) for n in range(1, 11)],\n"
        "            'segments': [{'median': 0.001, 'first_sweep': 1, 'last_sweep': 5}]} for i in range(8)]\n"
        "jobs = [shifted[:n] for n in range(1, 9)]\n"
        "with figure_pool(len(jobs)) as pool:\n"
        "    kind = type(pool).__name__\n"
        "    forked = [f.result() for f in [pool.submit(drift_png, job) for job in jobs]]\n"
        "here = [InlineExecutor().submit(drift_png, job).result() for job in jobs]\n"
        "if sys.argv[1:] == ['tvm']:\n"
        "    import tvm  # noqa: F401\n"
        "    with figure_pool(len(jobs)) as pool:\n"
        "        kind = type(pool).__name__\n"
        "print(kind, forked == here, len(set(here)))\n")
    forks = "ProcessPoolExecutor" if (os.cpu_count() or 1) > 1 else "InlineExecutor"  # one CPU: nothing to gain
    for args, expected in (([], f"{forks} True 8"), (["tvm"], "InlineExecutor True 8")):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
        assert done.stdout.strip() == expected, (args, done.stdout, done.stderr[-2000:])
