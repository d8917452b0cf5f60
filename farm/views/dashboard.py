"""``farm dashboard``: a small read-only web view of the farm (tornado, 127.0.0.1 by default).

Devices (tracker state, last probe, temperature of the last local run), the running sweep's
progress, the lab's queue on a PostgreSQL database (each lab host's workers, waiting, running and stalled jobs:
``farm.lab.queue``), the last reviewed night's findings (as stored: ``farm.views.pages`` draws each one's series), recent
results. The page polls ``/api/state`` every 5 s; every request opens the store read-only, so the dashboard never
blocks or changes a sweep. ``farm.views.dashboard_server`` serves it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


from farm.errors import FarmError, StoreError, message_line
from farm.manifest import known
from farm.views.pages import findings_page
from farm.lab.monitor import HOST_COLUMNS, host_row
from farm.lab.queue import LabQueue
from farm.records import Inventory, SweepSpec
from farm.rpc.tracker import key_state, query_summary
from farm.analysis.results import run_rows
from farm.stats import format_duration, hottest
from farm.store import Store, exists
from farm.store.locations import is_url

RUN_FIELDS = ("started_at", "device", "model", "tuned", "runtime", "threads", "status", "failed_step", "reason",
              "sweep_id", "steady_median_s", "context")

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>farm dashboard</title><link rel="icon" href="data:,">
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
.online, .ok, .done { color: #1a7f37; } .missing, .failed, .unreachable, .confirmed { color: #cf222e; font-weight: bold; }
.busy, .candidate, .running { color: #9a6700; }
#updated { color: #666; font-size: 0.85em; }
</style></head>
<body>
<h1>farm dashboard</h1>
<p id="updated">loading…</p>
<h2>Devices</h2><table id="devices"></table>
<h2>Sweep</h2><div id="sweep"></div>
<section id="lab" hidden><h2>Lab hosts</h2><table id="hosts"></table><p id="workers"></p></section>
<h2>Findings</h2><p id="findings-of"></p><table id="findings"></table>
<h2>Recent results</h2><table id="runs"></table>
<h2>Where the time goes: latest profiles</h2><table id="profiles"></table>
<script>
function cell(value, cls, href) {
  const td = document.createElement("td");
  const text = value === null || value === undefined ? "" : String(value);
  if (href) { const a = document.createElement("a"); a.href = href; a.textContent = text; td.appendChild(a); }
  else td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function fill(id, columns, rows, classOf, links) {
  const table = document.getElementById(id);
  table.replaceChildren();
  const head = document.createElement("tr");
  columns.forEach(c => { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); });
  table.appendChild(head);
  if (!rows.length) { const tr = document.createElement("tr"); tr.appendChild(cell("none")); table.appendChild(tr); return; }
  rows.forEach(r => {
    const tr = document.createElement("tr");
    columns.forEach(c => tr.appendChild(cell(r[c], classOf && classOf[c] ? r[c] : "", links && links[c] ? links[c](r) : "")));
    table.appendChild(tr);
  });
}
function ms(s) { return s === null || s === undefined ? "" : (s * 1000).toPrecision(3) + " ms"; }
async function refresh() {
  try {
    const state = await (await fetch("api/state")).json();
    fill("devices", ["device", "kind", "key", "state", "servers", "free", "last_probe", "probe_state", "temperature_c"],
         state.devices, {state: 1, probe_state: 1});
    const sweep = document.getElementById("sweep");
    const s = state.sweep;
    sweep.textContent = s ? `sweep ${s.id}: ${s.status}, ${s.cells_done}/${s.cells_total} cells, started ${s.started_at}`
                          : "no sweep yet";
    sweep.className = state.sweep ? state.sweep.status : "";
    const lab = document.getElementById("lab");
    lab.hidden = !state.lab;
    if (state.lab) {
      fill("hosts", state.lab.columns, state.lab.hosts);
      document.getElementById("workers").textContent = state.lab.error ? "the lab's queue: " + state.lab.error
        : `${state.lab.live_workers} live worker(s) in the lab`;
    }
    document.getElementById("findings-of").textContent = state.findings_sweep === null ? "no night reviewed yet"
      : `sweep ${state.findings_sweep}, as its review stored them: all findings and their series on /findings`;
    fill("findings", ["sentence", "state", "age", "kernels"], state.findings, {state: 1},
         {sentence: r => "finding/" + r.id + "?sweep=" + state.findings_sweep});
    fill("profiles", ["run", "device", "model", "runtime", "threads", "main", "kernels", "by op class", "top kernels"],
         state.profiles);
    fill("runs", ["id", "started_at", "device", "model", "runtime", "threads", "status", "steady", "manifest", "reason"],
         state.runs.map(r => Object.assign({}, r, {steady: ms(r.steady_median_s),
                                                  manifest: (r.manifest_digest || "not read").slice(0, 10)})), {status: 1},
         {model: r => "series?" + new URLSearchParams({device: r.device, model: r.model, tuned: r.tuned ? 1 : 0,
                                                      runtime: r.runtime})});
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString() +
      (state.tracker_error ? " · tracker: " + state.tracker_error : "");
  } catch (e) {
    document.getElementById("updated").textContent = "cannot reach farm dashboard: " + e;
  }
}
refresh();
setInterval(refresh, 5000);
</script>
</body></html>
"""


def profile_row(row: dict[str, Any]) -> dict[str, Any]:
    """A profiled run as the page's table shows it: its main and kernels' time, by op class, its top 3 kernels."""
    profile = row["profile"]
    shown = {"run": row["id"], "device": row["device"], "model": row["model"], "runtime": row["runtime"],
             "threads": row["threads"]}
    if profile.status != "ok":
        return {**shown, "main": "not available", "kernels": profile.reason}
    return {**shown, "main": format_duration(profile.main_s), "kernels": format_duration(profile.kernel_sum_s),
            "by op class": " · ".join(f"{c} {format_duration(t)}" for c, t in profile.by_class().items() if c != "vm"),
            "top kernels": " · ".join(f"{k.name} {format_duration(k.time_s)}"
                                      for k in [k for k in profile.top() if k.op_class != "vm"][:3])}


def collect_state(inventory: Inventory, db_path: str | Path) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data."""
    state: dict[str, Any] = {"devices": [], "sweep": None, "findings": [], "findings_sweep": None, "runs": [],
                             "tracker_error": None,
                             "lab": None, "profiles": []}
    try:
        summary = query_summary(inventory.tracker, timeout_s=2.0)
    except FarmError as exc:
        summary, state["tracker_error"] = None, exc.message
    probes: dict[str, dict] = {}
    runs: list[dict] = []
    if exists(db_path):
        try:
            with Store(db_path, readonly=True) as store:
                probes = store.latest_probes()
                latest = run_rows(store, limit=20)
                manifests = store.manifests([row.manifest for row in latest])
                runs = [{"id": row.run_id, **{k: row[k] for k in RUN_FIELDS}, "manifest_digest": row.manifest,
                         "manifest": known(manifests.get(row.manifest or "", {}))} for row in latest]
                sweep = store.sweep()
                if sweep is not None:
                    spec = SweepSpec.from_json(sweep["spec"])
                    cells = spec.by_cell(store.sweep_attempts(sweep["id"]))
                    total, done = len(cells), sum(1 for attempts in cells.values() if spec.cell_done(attempts))
                    state["sweep"] = {"id": sweep["id"], "status": sweep["status"], "started_at": sweep["started_at"],
                                      "cells_done": done, "cells_total": total}
                reviewed = findings_page(store)
                state["findings_sweep"] = reviewed["sweep_id"]
                state["findings"] = [{**f, "age": "new tonight" if f["age"] == 0 else f"since sweep {f['first_sweep']}"}
                                     for f in reviewed["findings"]]
                state["profiles"] = [profile_row(row) for row in store.latest_profiled()]
        except StoreError as exc:
            state["tracker_error"] = exc.message
    if is_url(str(db_path)):  # a lab's PostgreSQL: its queue beside the results (none on a file)
        state["lab"] = {"columns": list(HOST_COLUMNS), "hosts": [], "live_workers": 0, "error": None}
        try:
            lab = LabQueue(str(db_path))
            state["lab"].update(hosts=[host_row(h) for h in lab.hosts()], live_workers=lab.live_workers())
        except Exception as exc:  # any database error of the queue's: shown, and the page keeps serving
            state["lab"]["error"] = message_line(exc)
    temperatures: dict[str, float] = {}
    for run in reversed(runs):  # newest last, so it wins
        context = run.pop("context") or {}
        # this host's sensors (local devices) and the device's own (a phone's zones, its battery)
        readings = [t for t in (hottest({"thermal": context.get("thermal")}), hottest(context.get("device_health") or {}),
                                hottest(context.get("device_health_after") or {})) if t is not None]
        if readings:
            temperatures[run["device"]] = max(readings)
    for run in runs:
        run.pop("context", None)
    for name, device in inventory.devices.items():
        status = summary.keys.get(device.key) if summary else None
        servers, free = (status.servers, status.free) if status else (0, 0)
        probe = probes.get(name)
        state["devices"].append({
            "device": name, "kind": device.kind, "key": device.key,
            "state": "unknown" if summary is None else key_state(status),
            "servers": servers, "free": free,
            "last_probe": time.strftime("%H:%M:%S", time.localtime(probe["at"])) if probe else None,
            "probe_state": probe["state"] if probe else None, "temperature_c": temperatures.get(name),
        })
    state["runs"] = runs
    return state
