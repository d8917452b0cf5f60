"""The dashboard's finding pages (farm/views/pages.py) in a real Chromium: the stored findings in their rank order, each
series' nights drawn as the store holds them with the finding's nights and the context changes marked; night against
night (farm compare --sweep); an old night's report shows that night's runs."""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest

from tests.conftest import dashboard_server, env_in, run_farm
from tests.test_findings import DEVICES, MASS, MODELS, NIGHTS, plant, regressions
from tests.test_report import chromium_page, needs_chromium

UPGRADE = 3  # the night TVM 0.28.0 arrived
TUNING, TUNED = 6, "m7"  # the night m7's tuning records arrived


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A store of NIGHTS nights: TVM upgraded on night UPGRADE, a tuning night (TUNED's records, 20 % faster, from
    night TUNING), half the models 12 % slower everywhere on the last (a mass night), every night reviewed by farm
    regressions; and farm dashboard serving it: (db, base URL, the last night's review)."""
    folder = tmp_path_factory.mktemp("pages")
    db = folder / "results.db"
    plant(db, lambda night, device, model: 1.12 if night == NIGHTS and model in MASS else
          0.8 if night >= TUNING and model == TUNED else 1.0,
          tvm=lambda night: "0.28.0" if night >= UPGRADE else "0.27.0",
          tuned=lambda night, device, model: 8 if night >= TUNING and model == TUNED else 0)
    for night in range(2, NIGHTS):
        regressions(db, "--sweep", str(night))
    review = regressions(db)
    (folder / "devices.toml").write_text('[tracker]\nhost = "127.0.0.1"\nport = 9\n\n[devices.dev0]\nkind = "remote"\n'
                                         'key = "dev0"\ntarget = { kind = "llvm" }\n')
    with dashboard_server(folder / "devices.toml", {**env_in(folder), "FARM_DB": str(db)}) as url:
        yield db, url, review


def _chromium(url: str, then=None):
    """(page text, console errors, scroll width, what ``then(page)`` returned) of ``url`` at 1,400 px."""
    with chromium_page() as (page, errors):
        page.goto(url)
        said = then(page) if then else None
        return page.inner_text("body"), errors, page.evaluate("document.documentElement.scrollWidth"), said


@needs_chromium
def test_the_findings_page_lists_the_stored_findings_in_the_review_s_order(lab):
    _, url, review = lab
    text, errors, width, rows = _chromium(f"{url}/findings", lambda page: page.eval_on_selector_all(
        "tr.finding", "rows => rows.map(r => [r.dataset.id, r.cells[1].innerText])"))
    assert errors == [] and width <= 1400
    assert [(str(f["finding_id"]), f["sentence"]) for f in review["findings"]] == [tuple(r) for r in rows]
    assert len(rows) >= 1 and f"Findings of sweep {NIGHTS}" in text


@needs_chromium
def test_a_finding_page_draws_its_series_as_stored_with_its_night_and_the_upgrade_marked(lab):
    db, url, review = lab
    finding = next(f for f in review["findings"] if f["direction"] == "slower")
    drawn = _chromium(f"{url}/finding/{finding['finding_id']}", lambda page: page.eval_on_selector_all(
        "div.chart", """charts => charts.map(c => ({device: c.dataset.device, model: c.dataset.model,
            points: [...c.querySelectorAll("g.pt")].map(g => [Number(g.dataset.sweep), Number(g.dataset.run),
                                                               Number(g.dataset.value), g.classList.contains("finding")]),
            marks: [...c.querySelectorAll("g.mark")].map(g => [Number(g.dataset.sweep),
                                                               g.querySelector("title").textContent])}))"""))
    text, errors, width, charts = drawn
    assert errors == [] and width <= 1400
    assert finding["sentence"] in text and len(charts) == min(12, finding["k"])
    runs = json.loads(run_farm("results", "--json", env={**env_in(db.parent), "FARM_DB": str(db)}).stdout)
    stored = {(r["device"], r["model"], r["sweep_id"]): (r["run_id"], r["steady_median_s"]) for r in runs}
    for chart in charts:
        assert chart["model"] in MASS and chart["device"] in DEVICES
        assert [(s, r, float(f"{v:.9g}")) for s, r, v, _ in chart["points"]] == [
            (s, run, float(f"{value:.9g}")) for s in range(1, NIGHTS + 1)
            for run, value in [stored[(chart["device"], chart["model"], s)]]]
        assert [s for s, *_, marked in chart["points"] if marked] == [NIGHTS]  # the finding's night
        assert chart["marks"] == [[UPGRADE, f"sweep {UPGRADE}: TVM 0.27.0 → 0.28.0"]]  # the upgrade's line


@needs_chromium
def test_two_points_chosen_compare_their_runs(lab):
    _, url, review = lab
    finding = review["findings"][0]

    def choose(page):
        points = page.locator("svg.series g.pt")
        points.nth(NIGHTS - 2).click()
        points.nth(NIGHTS - 1).click()
        page.wait_for_url("**/compare?**")
        return page.url

    text, errors, _, went = _chromium(f"{url}/finding/{finding['finding_id']}", choose)
    assert errors == [] and "/compare?a=" in went and "Mann-Whitney U" in text and "kernels:" in text


def test_night_against_night_gives_every_series_and_the_mass_models_moved(lab):
    db, url, _ = lab
    env = {**env_in(db.parent), "FARM_DB": str(db)}
    done = run_farm("compare", "--sweep", str(NIGHTS - 1), "--sweep", str(NIGHTS), "--json", env=env)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert len(said["series"]) == len(DEVICES) * len(MODELS) and said["only_a"] == said["only_b"] == 0
    moved = {(s["device"], s["model"]) for s in said["series"] if s["shown"] and s["change"] > 0.05}
    assert moved == {(d, m) for d in DEVICES for m in MASS}
    assert [s["change"] for s in said["series"]] == sorted((s["change"] for s in said["series"]), key=lambda c: -abs(c))
    assert {g["name"] for g in said["by_model"][:len(MASS)]} == MASS
    table = run_farm("compare", "--sweep", str(NIGHTS - 1), "--sweep", str(NIGHTS), env=env)
    assert table.returncode == 0 and f"sweep {NIGHTS - 1} → {NIGHTS}: {len(DEVICES) * len(MODELS)} series" in table.stdout
    usage = run_farm("compare", "--sweep", "3", env=env)
    assert usage.returncode == 2 and usage.stderr.startswith("error: farm compare: give two run ids, or two nights")


def test_an_old_night_s_report_shows_that_night_s_runs(lab):
    db, _, _ = lab
    env = {**env_in(db.parent), "FARM_DB": str(db)}
    runs = json.loads(run_farm("results", "--json", env=env).stdout)
    night = {r["run_id"] for r in runs if r["sweep_id"] == 2}
    html_path = db.parent / "old.html"
    done = run_farm("report", "--sweep", "2", "--out", str(html_path), env=env)
    assert done.returncode == 0, done.stderr
    html = html_path.read_text()
    shown = {int(cell) for cell in re.findall(r"<td>(\d+)</td>\n</tr>", html)}
    assert shown == night


@needs_chromium
def test_a_hostile_model_and_device_name_is_shown_as_text_never_run(tmp_path):
    """A device and a model named <script>…</script> (inventories and model files are people's input): the series
    page and the findings page show the names as text, and no script runs (no dialog, no console error)."""
    from farm.records import BenchConfig, BenchResult, CheckResult, Device, InputSpec, ModelSource
    from farm.store import Store

    hostile = "<script>alert(1)</script>"
    db = tmp_path / "results.db"
    with Store(db) as store:
        for _ in range(2):  # two nights
            sweep = store.start_sweep({"devices": [hostile], "models": [hostile]})
            store.record_result(BenchResult(device=hostile, key="k", model=hostile, model_digest="d", status="ok",
                                            steady_number=1, steady_samples_s=(1e-3, 1.001e-3, 0.999e-3) * 4,
                                            check=CheckResult("passed", 0.0), config=BenchConfig()),
                                Device(hostile, "remote", "k", {"kind": "llvm"}),
                                ModelSource(hostile, "builtin:x", "d", b"", (InputSpec("x", (1,), "float32"),)), None,
                                sweep_id=sweep)
        store.record_findings(2, [{"key": "series|steady|slower|x", "kind": "series", "metric": "steady",
                                   "sentence": f"{hostile} is 10.0 % slower", "direction": "slower"}])
    (tmp_path / "devices.toml").write_text('[devices.dev0]\nkind = "remote"\nkey = "dev0"\ntarget = { kind = "llvm" }\n')
    with dashboard_server(tmp_path / "devices.toml", {**env_in(tmp_path), "FARM_DB": str(db)}) as url:
        query = urlencode({"device": hostile, "model": hostile, "tuned": 0, "runtime": "tvm"})
        with chromium_page() as (page, errors):
            page.goto(f"{url}/series?{query}")
            series = page.inner_text("h1")
            page.goto(f"{url}/findings")
            listed = page.inner_text("table#findings")
    assert errors == []
    assert series == f"{hostile} · {hostile}" and f"{hostile} is 10.0 % slower" in listed
