"""``farm dashboard``'s web server (tornado): the live page and its state (``farm.views.dashboard``), the pages of stored
findings, series and comparisons (``farm.views.pages``), and triage behind the lab's token and tornado's XSRF check. Every
handler answers only requests addressed to the dashboard (``Guarded``)."""

from __future__ import annotations

import functools
import hmac
import json
import os
from pathlib import Path
from typing import Any, Callable

import tornado.ioloop
import tornado.web
from markupsafe import Markup

from farm.analysis.compare import compare_nights, compare_runs
from farm.views.dashboard import PAGE, collect_state
from farm.errors import FarmError
from farm.views.pages import finding_page, findings_page, new_nonce, series_view
from farm.records import Inventory
from farm.stats import format_duration
from farm.store import Store, exists


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
    """A page of findings, a series or a comparison (``farm.views.pages``), rendered from the store read-only, with a
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
    compare: Callable[[Store, int, int], dict[str, Any]] = staticmethod(compare_runs)

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
    compare = staticmethod(compare_nights)


@functools.cache
def templates():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("farm.views", "templates"), autoescape=True,
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
