"""Triage with an audit trail, only for those allowed, and a digest for the team (#65): the store's events in both
backends, `farm regressions --triage/--events/--digest`, the dashboard's triage form in a real Chromium behind the
lab's token and tornado's XSRF check, and the webhook on a local HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from farm.views.digest import digest_markdown, night_digest, notify_night, post_webhook
from farm.procs.supervise import free_port
from farm.store import Store, StoreError
from tests.conftest import dashboard_server, env_in, run_farm
from tests.test_findings import NIGHTS, SINGLE, plant, regressions
from tests.test_report import chromium_page, needs_chromium

TOKEN = "lab-token-0123456789abcdef"


def test_triage_events_and_their_rules_in_both_backends(db_location):
    finding = {"key": "series|steady|slower|cpu|mlp", "kind": "series", "metric": "steady"}
    other = {"key": "series|steady|slower|cpu|convnet", "kind": "series", "metric": "steady"}
    with Store(db_location) as store:
        ids = store.record_findings(3, [finding, other])
        first, second = ids[finding["key"]]["id"], ids[other["key"]]["id"]
        store.triage(first, "invalid", "ana", note="the phone was <b>charging</b>", bug="https://bugs.example/1")
        with pytest.raises(StoreError, match="needs its author"):
            store.triage(first, "acknowledged", " ")
        with pytest.raises(StoreError, match="names the finding it duplicates"):
            store.triage(second, "duplicate", "ana")
        with pytest.raises(StoreError, match="no such other finding"):
            store.triage(second, "duplicate", "ana", duplicate_of=second)
        store.triage(second, "duplicate", "bo", duplicate_of=first)
        store.record_findings(4, [])  # a quiet night, reviewed
        again = store.record_findings(5, [finding, other])
        events = store.finding_events()
        invalid = store.invalid_by_month()
        listed = {f["finding_id"]: f for f in store.findings(5)}
    # the states survive a night without the findings (schema 23)
    assert (again[finding["key"]]["id"], again[finding["key"]]["state"]) == (first, "invalid")
    assert (again[other["key"]]["id"], again[other["key"]]["state"]) == (second, "duplicate")
    assert listed[second]["duplicate_of"] == first and listed[first]["bug"] == "https://bugs.example/1"
    assert [(e["author"], e["from_state"], e["to_state"], e["note"]) for e in events[first]] == [
        ("ana", "new", "invalid", "the phone was <b>charging</b>")]
    assert [(e["to_state"], e["duplicate_of"]) for e in events[second]] == [("duplicate", first)]
    assert len(invalid) == 1 and invalid[0][1] == 1 and len(invalid[0][0]) == 7  # one invalid finding, its YYYY-MM


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A store where one series slowed on the last two nights; the night before last reviewed: (db, env, finding)."""
    folder = tmp_path_factory.mktemp("triage")
    db = folder / "results.db"
    plant(db, lambda n, device, model: 1.3 if n >= NIGHTS - 1 and (device, model) == SINGLE else 1.0)
    env = {**env_in(folder), "FARM_DB": str(db)}
    (finding,) = regressions(db, "--sweep", str(NIGHTS - 1))["findings"]
    return db, env, finding


def test_the_digest_says_the_night_in_a_few_lines_with_links_and_escaped_names(night):
    db, env, finding = night
    md = run_farm("regressions", "--sweep", str(NIGHTS - 1), "--digest", "md", "--dashboard-url", "http://farm.lab:8080/",
                  env=env)
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith(f"**farm, sweep {NIGHTS - 1}**: 1 finding(s), 1 new, 1 untriaged "
                                f"([all](http://farm.lab:8080/findings?sweep={NIGHTS - 1}))")
    assert f"- [finding {finding['finding_id']}](http://farm.lab:8080/finding/{finding['finding_id']}?sweep={NIGHTS - 1})" \
           f" (new tonight, new): " in md.stdout
    said = json.loads(run_farm("regressions", "--sweep", str(NIGHTS - 1), "--digest", "json", env=env).stdout)
    assert [(f["id"], f["new"], f["url"]) for f in said["findings"]] == [(finding["finding_id"], True, None)]
    hostile = {"sweep_id": 3, "reviewed": True, "new": 1, "untriaged": 1, "url": None, "findings": [
        {"id": 1, "new": True, "reopened": False, "state": "new", "sentence": "<script>alert(1)</script> is [slower](x)",
         "url": None, "bug": "javascript:alert(1)", "kernels": "", "direction": "slower", "kind": "series"}]}
    said = digest_markdown(hostile)
    assert "\\<script\\>alert(1)\\</script\\> is \\[slower\\](x) · bug: javascript:alert(1)" in said  # no link
    unreviewed = run_farm("regressions", "--sweep", str(NIGHTS), "--digest", "md", env=env)
    assert unreviewed.stdout == f"**farm, sweep {NIGHTS}**: not reviewed yet (farm regressions --sweep {NIGHTS} reviews it)\n"


class Hook(http.server.BaseHTTPRequestHandler):
    """A chat's webhook: records each POST's JSON; answers the status its server is told to."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append(json.loads(body))
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.posts, server.status = [], 204
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_webhook_gets_the_night_s_digest_once_it_has_new_findings_and_a_failing_one_costs_nothing(night, hook):
    db, _, finding = night
    url = f"http://127.0.0.1:{hook.server_address[1]}/hooks/farm"
    with Store(db) as store:
        said = notify_night(store, NIGHTS - 1, url, "http://farm.lab")
        assert said.startswith("posted to the webhook (HTTP 204, attempt 1)")
        (posted,) = hook.posts
        digest = night_digest(store, NIGHTS - 1, "http://farm.lab")
        assert posted == json.loads(json.dumps({**digest, "text": digest_markdown(digest)}))
        assert posted["findings"][0]["id"] == finding["finding_id"] and posted["new"] == 1
        assert notify_night(store, NIGHTS - 1, None) == ""  # no webhook configured
        hook.status = 503  # the chat is down: bounded retries, then a line, never an exception
        down = post_webhook(url, {"x": 1}, attempts=3, pause_s=0.01)
        assert down == "the webhook did not take the digest after 3 attempt(s): HTTP 503" and len(hook.posts) == 4
        refused = post_webhook(f"http://127.0.0.1:{free_port()}/", {"x": 1}, attempts=2, pause_s=0.01)
        assert refused.startswith("the webhook did not take the digest after 2 attempt(s): ")


@pytest.fixture
def dashboard(night, tmp_path):
    """farm dashboard with the lab's triage token on the night's store: its base URL."""
    db, env, _ = night
    inventory = tmp_path / "devices.toml"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    inventory.write_text(f'[dashboard]\ntoken_file = "{token_file}"\n\n[devices.dev0]\nkind = "remote"\nkey = "dev0"\n'
                         'target = { kind = "llvm" }\n')
    with dashboard_server(inventory, env) as url:
        yield url


def _post(url: str, fields: dict, cookie: str = "") -> int:
    request = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode(), method="POST",
                                     headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


@needs_chromium
def test_a_finding_triaged_invalid_in_the_browser_persists_the_cli_agrees_and_the_next_night_keeps_it(night, dashboard):
    db, env, finding = night
    page_url = f"{dashboard}/finding/{finding['finding_id']}"
    # a POST without the token, or without the XSRF cookie and field, is refused and changes nothing
    assert _post(page_url + "/triage", {"state": "fixed", "by": "eve", "token": TOKEN}) == 403  # no XSRF
    with chromium_page() as (page, errors):
        page.goto(page_url)
        xsrf = next(c["value"] for c in page.context.cookies() if c["name"] == "_xsrf")
        form = page.input_value("form#triage input[name=_xsrf]")
        assert _post(page_url + "/triage", {"state": "fixed", "by": "eve", "token": "wrong", "_xsrf": form},
                     cookie=f"_xsrf={xsrf}") == 403  # the XSRF check passes, the token does not
        page.select_option("form#triage select[name=state]", "invalid")
        page.fill("form#triage input[name=by]", "ana")
        page.fill("form#triage input[name=note]", "<script>alert('note')</script> thermal throttling")
        page.fill("form#triage input[name=bug]", "javascript:alert(1)")
        page.fill("form#triage input[name=token]", TOKEN)
        page.click("form#triage button[type=submit]")
        page.wait_for_url(page_url)
        page.reload()
        events = page.eval_on_selector_all("tr.event", "rows => rows.map(r => r.innerText)")
        links = page.eval_on_selector_all("table#events a", "links => links.map(a => a.href)")
        page.goto(f"{dashboard}/findings?sweep={NIGHTS - 1}")
        state = page.get_attribute("tr.finding", "data-state")
        invalid = page.inner_text("#invalid")
    assert errors == []
    assert len(events) == 1 and "ana" in events[0] and "new → invalid" in events[0]
    assert "<script>alert('note')</script> thermal throttling" in events[0]  # shown as text, never run
    assert links == []  # a bug that is not an http(s) URL is text, not a link
    assert state == "invalid" and "1" in invalid
    cli = regressions(db, "--sweep", str(NIGHTS - 1))["findings"]
    assert [(f["finding_id"], f["state"]) for f in cli] == [(finding["finding_id"], "invalid")]
    later = regressions(db, "--sweep", str(NIGHTS))["findings"]  # the next night: the same finding, still invalid
    assert [(f["finding_id"], f["state"]) for f in later] == [(finding["finding_id"], "invalid")]


def test_a_dashboard_without_a_token_is_read_only(night, tmp_path):
    db, env, finding = night
    inventory = tmp_path / "devices.toml"
    inventory.write_text('[devices.dev0]\nkind = "remote"\nkey = "dev0"\ntarget = { kind = "llvm" }\n')
    with dashboard_server(inventory, env) as url:
        base = f"{url}/finding/{finding['finding_id']}"
        with urllib.request.urlopen(base, timeout=30) as answer:
            cookie = answer.headers["Set-Cookie"] or ""
            page = answer.read().decode()
        assert 'id="triage"' not in page and "Triage here needs the lab's token" in page
        xsrf = cookie.split(";")[0].split("=", 1)[1] if "_xsrf=" in cookie else "x"
        assert _post(base + "/triage", {"state": "fixed", "by": "eve", "token": "", "_xsrf": xsrf},
                     cookie=f"_xsrf={xsrf}") == 403
    with Store(db) as store:
        assert all(e["author"] != "eve" for events in store.finding_events().values() for e in events)


def test_a_state_carries_within_a_few_reviewed_nights_and_an_older_night_extends_its_finding(tmp_path):
    """A finding's key back after more than CARRY_GAP quiet reviewed nights is another finding (a scatter's key is
    the same every night); an older night reviewed after a finding began joins that finding, which keeps its state."""
    from farm.store.findings import CARRY_GAP

    finding = {"key": "scatter|steady|slower|scatter", "kind": "scatter", "metric": "steady"}
    with Store(tmp_path / "r.db") as store:
        first = store.record_findings(10, [finding])[finding["key"]]
        store.triage(first["id"], "acknowledged", "ana")
        older = store.record_findings(8, [finding])[finding["key"]]  # sweep 8 reviewed late
        for quiet in range(11, 12 + CARRY_GAP):
            store.record_findings(quiet, [])
        later = store.record_findings(12 + CARRY_GAP, [finding])[finding["key"]]
    assert (older["id"], older["state"], older["first_sweep"]) == (first["id"], "acknowledged", 8)
    assert later["id"] != first["id"] and later["state"] == "new"
