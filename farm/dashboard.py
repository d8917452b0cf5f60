"""``farm dashboard``: a small read-only web view of the farm (tornado, 127.0.0.1 by default).

Devices (tracker state, last probe, temperature of the last local run), the running sweep's
progress, the lab's queue on a PostgreSQL database (each lab host's workers, waiting, running and stalled jobs:
``farm.queue``), the last reviewed night's findings (as stored: ``farm.pages`` draws each one's series), recent
results. The page polls ``/api/state`` every 5 s; every request opens the store read-only, so the dashboard never
blocks or changes a sweep.
"""

from __future__ import annotations

import functools
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import tornado.ioloop
import tornado.web
from markupsafe import Markup

from farm.errors import FarmError, StoreError, message_line
from farm.compare import compare_nights, compare_runs
from farm.manifest import known
from farm.pages import finding_page, findings_page, new_nonce, series_view
from farm.queue import HOST_COLUMNS, LabQueue, host_row
from farm.records import Inventory, SweepSpec
from farm.rpc.tracker import key_state, query_summary
from farm.results import run_rows
from farm.stats import format_duration, hottest
from farm.store import Store, exists
from farm.store.backends import is_url

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


class Guarded(tornado.web.RequestHandler):
    """A handler that answers only a request addressed to this dashboard: its Host header must be one of the
    dashboard's own names (``allowed_hosts``). A page of another site that a browser was made to send here by DNS
    rebinding carries that site's name and gets 403 (#62: it could read ``/api/state``)."""

    def initialize(self, allowed_hosts: frozenset[str], **_: Any) -> None:
        self.allowed_hosts = allowed_hosts

    def prepare(self) -> None:
        if self.request.host.lower() not in self.allowed_hosts:
            self.set_status(403)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(f"403: {self.request.host!r} is not this dashboard's address; a lab that serves it under a "
                        "name starts it with farm dashboard --url http://NAME:PORT/\n")


def allowed_hosts(host: str, port: int, urls: tuple[str, ...] = ()) -> frozenset[str]:
    """The Host headers the dashboard answers: its bind address and loopback's names with its port, and each URL a
    lab serves it under (``--url``; a default port may be left out, as browsers do)."""
    from urllib.parse import urlsplit

    own = ["127.0.0.1", "localhost", "[::1]"]
    if host not in ("0.0.0.0", "::", ""):
        own.append(f"[{host}]" if ":" in host else host)
    names = {f"{name}:{port}" for name in own} | ({*own} if port == 80 else set())  # a browser leaves :80 out
    for url in urls:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        default = 443 if parts.scheme == "https" else 80
        names.add(parts.netloc.lower())
        if parts.port in (None, default):
            names.update({(parts.hostname or "").lower(), f"{(parts.hostname or '').lower()}:{default}"})
    return frozenset(names)


class PageHandler(Guarded):
    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy",
                        "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline'; img-src data:")
        self.write(PAGE)


class StateHandler(Guarded):
    def initialize(self, allowed_hosts: frozenset[str], **kwargs: Any) -> None:
        super().initialize(allowed_hosts)
        self.inventory, self.db_path = kwargs["inventory"], kwargs["db_path"]

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(collect_state(self.inventory, self.db_path), default=str))


class StoredPage(Guarded):
    """A page of findings, a series or a comparison (``farm.pages``), rendered from the store read-only, with a
    policy that runs only this page's own script (its nonce) and loads nothing from elsewhere."""

    page = ""

    def initialize(self, allowed_hosts: frozenset[str], **kwargs: Any) -> None:
        super().initialize(allowed_hosts)
        self.db_path, self.token = kwargs["db_path"], kwargs.get("token")

    def render_page(self, title: str, **values: Any) -> None:
        nonce = new_nonce()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", f"default-src 'self'; script-src 'nonce-{nonce}'; "
                        "style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; base-uri 'none'; "
                        "form-action 'self'")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.write(templates().get_template("pages.html").render(page=self.page, title=title, nonce=nonce, **values))

    def missing(self, what: str, status: int = 404) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(f"{status}: {what}\n")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A store this dashboard cannot read (an older schema, a database gone): its reason, not a traceback."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        said = f"{exc.message} ({exc.hint})" if isinstance(exc, FarmError) else self._reason
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code}: {said}\n")

    def store(self) -> Store:
        return Store(self.db_path, readonly=True)

    def number(self, name: str) -> int | None:
        text = self.get_argument(name, "")
        return int(text) if text.isascii() and text.isdecimal() else None


class FindingsPage(StoredPage):
    page = "findings"

    def get(self) -> None:
        if not exists(self.db_path):
            return self.missing("no results database yet")
        with self.store() as store:
            values = findings_page(store, self.number("sweep"))
        self.render_page(f"Findings of sweep {values['sweep_id']}" if values["sweep_id"] else "Findings", **values)


class FindingPage(StoredPage):
    page = "finding"

    def get(self, finding_id: str) -> None:
        if not exists(self.db_path):
            return self.missing("no results database yet")
        with self.store() as store:
            values = finding_page(store, int(finding_id), self.number("sweep"))
        if values is None:
            return self.missing(f"no finding {finding_id}")
        form = Markup(self.xsrf_form_html()) if self.token else None  # read-only without the lab's triage token
        self.render_page(f"Finding {finding_id}", triage_form=form, **values)


class TriageHandler(StoredPage):
    """POST /finding/<id>/triage: a triage event, only with the lab's token and tornado's XSRF check (a form this
    dashboard served); 403 and nothing changed without either. The dashboard is read-only without a token."""

    def post(self, finding_id: str) -> None:
        given = self.get_body_argument("token", "")
        if not self.token or not hmac.compare_digest(given.encode(), self.token.encode()):
            return self.missing("triage needs the lab's token (the dashboard is read-only without one)", 403)
        if not exists(self.db_path):
            return self.missing("no results database yet")
        duplicate = self.get_body_argument("duplicate_of", "").strip()
        try:
            with Store(self.db_path) as store:
                store.triage(int(finding_id), self.get_body_argument("state", ""), self.get_body_argument("by", ""),
                             self.get_body_argument("note", ""), self.get_body_argument("bug", ""),
                             int(duplicate) if duplicate.isascii() and duplicate.isdecimal() else None)
        except FarmError as exc:
            return self.missing(f"{exc.message} ({exc.hint})", 400)
        self.redirect(f"/finding/{finding_id}", status=303)


class SeriesPage(StoredPage):
    page = "series"

    def get(self) -> None:
        device, model = self.get_argument("device", ""), self.get_argument("model", "")
        tuned, runtime = self.get_argument("tuned", "0") == "1", self.get_argument("runtime", "tvm")
        if not device or not model:
            return self.missing("name the series: /series?device=D&model=M&tuned=0&runtime=tvm")
        if not exists(self.db_path):
            return self.missing("no results database yet")
        with self.store() as store:
            view = series_view(store, device, model, tuned, runtime)
        if not view["points"]:
            return self.missing(f"no nights of {device} · {model}")
        self.render_page(f"{device} · {view['label']}", view=view)


class ComparePage(StoredPage):
    """/compare?a=RUN&b=RUN (``compare.compare_runs``); its subclass /nights?a=SWEEP&b=SWEEP (``compare_nights``)."""

    page, what = "compare", "run"

    def compare(self, store: Store, a: int, b: int) -> dict[str, Any]:
        return compare_runs(store, a, b)

    def get(self) -> None:
        a, b = self.number("a"), self.number("b")
        if a is None or b is None or not exists(self.db_path):
            return self.missing(f"give two: /{self.page}?a={self.what.upper()}&b={self.what.upper()}")
        try:
            with self.store() as store:
                data = self.compare(store, a, b)
        except FarmError as exc:
            return self.missing(f"{exc.message} ({exc.hint})")
        self.render_page(f"{self.what.capitalize()} {a} against {self.what} {b}", data=data)


class NightsPage(ComparePage):
    page, what = "nights", "sweep"

    def compare(self, store: Store, a: int, b: int) -> dict[str, Any]:
        return compare_nights(store, a, b)


@functools.cache
def templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("farm", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["ms"] = format_duration
    return env


def triage_token(inventory: Inventory) -> str | None:
    """The lab's triage token: FARM_TRIAGE_TOKEN, else the inventory's [dashboard] token_file's first line; None:
    the dashboard changes nothing."""
    if token := os.environ.get("FARM_TRIAGE_TOKEN", "").strip():
        if len(token) < MIN_TOKEN:
            raise FarmError(f"FARM_TRIAGE_TOKEN is shorter than {MIN_TOKEN} characters",
                            "set a long random one: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
        return token
    if inventory.triage_token_file:
        path = Path(inventory.triage_token_file).expanduser()
        try:
            words = path.read_text().split()
        except OSError as exc:
            raise FarmError(f"cannot read the triage token {path}: {exc.strerror}",
                            "fix [dashboard] token_file in the inventory, or set FARM_TRIAGE_TOKEN") from exc
        token = words[0] if words else ""
        if len(token) < MIN_TOKEN:
            raise FarmError(f"the triage token in {path} is shorter than {MIN_TOKEN} characters",
                            "write a long random one: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
        return token
    return None


MIN_TOKEN = 16


def make_app(inventory: Inventory, db_path: str | Path, hosts: frozenset[str]) -> tornado.web.Application:
    stored = {"allowed_hosts": hosts, "db_path": db_path, "token": triage_token(inventory)}
    return tornado.web.Application([
        (r"/", PageHandler, {"allowed_hosts": hosts}),
        (r"/api/state", StateHandler, {"allowed_hosts": hosts, "inventory": inventory, "db_path": db_path}),
        (r"/findings", FindingsPage, stored),
        (r"/finding/([0-9]+)", FindingPage, stored),
        (r"/finding/([0-9]+)/triage", TriageHandler, stored),
        (r"/series", SeriesPage, stored),
        (r"/compare", ComparePage, stored),
        (r"/nights", NightsPage, stored),
    ], xsrf_cookies=True)


def serve_dashboard(inventory: Inventory, db_path: str | Path, host: str, port: int, on_ready=None,
                    urls: tuple[str, ...] = ()) -> None:
    """Serve until interrupted (blocks), answering requests addressed to ``allowed_hosts`` only."""
    app = make_app(inventory, db_path, allowed_hosts(host, port, urls))
    try:
        app.listen(port, address=host)
    except OSError as exc:
        raise FarmError(f"cannot listen on {host}:{port}: {exc.strerror}", "pick another --port") from exc
    if on_ready:
        on_ready()
    tornado.ioloop.IOLoop.current().start()
