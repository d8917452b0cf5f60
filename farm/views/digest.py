"""A night's findings for the team (#65): a digest in a few lines each (Markdown for a CI job summary or a mail, JSON
for scripts), and a webhook that POSTs the JSON digest when a night has new findings.

The digest reads the stored findings of a reviewed night (``Store.findings``): what `farm regressions` and the report
say, with each finding's triage state and, where the lab's dashboard address is known (``[dashboard] url`` in the
inventory, ``--dashboard-url``, ``FARM_DASHBOARD_URL``), a link to its page. The webhook (``[notify] url``) is tried
``WEBHOOK_ATTEMPTS`` times with ``WEBHOOK_TIMEOUT_S`` for each socket operation and a growing pause between; its
failure is said and logged, never a failed night. A finding is new on a night when it started that night or was
reopened on it (a fixed finding that came back). The POST carries the digest and, as ``text``, its Markdown: what
chat hooks (Slack, Mattermost) show.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from farm.store import Store

log = logging.getLogger("farm.digest")  # the name its warnings have always carried

WEBHOOK_ATTEMPTS = 3
WEBHOOK_TIMEOUT_S = 10.0
WEBHOOK_PAUSE_S = 1.0  # before the second attempt; doubled before each next one


def night_digest(store: Store, sweep_id: int | None = None, dashboard_url: str | None = None) -> dict[str, Any]:
    """The reviewed night's findings (default: the last reviewed), each with its state, whether it is new tonight, its
    sentence and kernels, and its page's URL where the dashboard's address is given."""
    sweep_id = sweep_id if sweep_id is not None else store.last_reviewed()
    rows = store.findings(sweep_id) if sweep_id is not None else []
    base = dashboard_url.rstrip("/") if dashboard_url else None
    events = store.finding_events([f["finding_id"] for f in rows])
    reopened = {i for i, said in events.items() if any(e["to_state"] == "new" and e["sweep_id"] == sweep_id
                                                      for e in said)}
    findings = [{"id": f["finding_id"], "state": f["state"],
                 "new": f["first_sweep"] == sweep_id or f["finding_id"] in reopened,
                 "reopened": f["finding_id"] in reopened,
                 "direction": f["direction"], "kind": f["kind"], "sentence": f["sentence"],
                 "kernels": f.get("kernels", ""), "bug": f.get("bug", ""),
                 "url": f"{base}/finding/{f['finding_id']}?sweep={sweep_id}" if base else None} for f in rows]
    return {"sweep_id": sweep_id, "reviewed": sweep_id is not None and store.reviewed(sweep_id),
            "findings": findings, "new": sum(f["new"] for f in findings),
            "untriaged": sum(f["state"] == "new" for f in findings),
            "url": f"{base}/findings?sweep={sweep_id}" if base and sweep_id is not None else None}


def digest_markdown(digest: dict[str, Any]) -> str:
    """The digest as Markdown: a heading line, then a bullet per finding (new ones first), linked where it can be."""
    sweep = digest["sweep_id"]
    if sweep is None:
        return "**farm**: no night reviewed yet\n"
    if not digest["reviewed"]:
        return f"**farm, sweep {sweep}**: not reviewed yet (farm regressions --sweep {sweep} reviews it)\n"
    head = (f"**farm, sweep {sweep}**: {len(digest['findings'])} finding(s), {digest['new']} new, "
            f"{digest['untriaged']} untriaged" + (f" ([all]({digest['url']}))" if digest["url"] else ""))
    lines = [head, ""]
    for f in sorted(digest["findings"], key=lambda f: not f["new"]):
        title = f"finding {f['id']}"
        named = f"[{title}]({f['url']})" if f["url"] else title
        tags = ", ".join(t for t in ("reopened" if f["reopened"] else "new tonight" if f["new"] else "", f["state"]) if t)
        lines.append(f"- {named} ({tags}): {_markdown_text(f['sentence'])}" + _bug(f["bug"]))
    if not digest["findings"]:
        lines.append("- no findings")
    return "\n".join(lines) + "\n"


def _markdown_text(text: str) -> str:
    """A sentence as Markdown text on one line: characters that would start markup escaped (names come from
    inventories, notes from people)."""
    return "".join("\\" + c if c in "\\`*_[]<>#|~!" else c for c in " ".join(text.split()))


def _bug(bug: str) -> str:
    """' · bug: <URL>' for an http(s) URL (a link); any other text escaped; '' for none."""
    if not bug:
        return ""
    if bug.startswith(("https://", "http://")) and not any(c in bug for c in " <>()[]"):
        return f" · bug: <{bug}>"
    return f" · bug: {_markdown_text(bug)}"


def post_webhook(url: str, digest: dict[str, Any], attempts: int = WEBHOOK_ATTEMPTS,
                 timeout_s: float = WEBHOOK_TIMEOUT_S, pause_s: float = WEBHOOK_PAUSE_S) -> str:
    """POST the JSON digest to ``url``; returns what happened, in words. Never raises: a chat that is down costs the
    night nothing but a line in its log."""
    if not url.startswith(("https://", "http://")):
        return f"the webhook {url!r} is not an http(s) URL: nothing posted"
    body = json.dumps(digest).encode()
    said = ""
    for attempt in range(1, attempts + 1):
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "farm"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return f"posted to the webhook (HTTP {answer.status}, attempt {attempt})"
        except urllib.error.HTTPError as exc:
            said = f"HTTP {exc.code}"
            if exc.code < 500 and exc.code != 429:  # the hook refused it: trying again will not help
                break
        except Exception as exc:  # refused, unreachable, timed out, a bad URL, a broken answer: said, never raised
            said = str(getattr(exc, "reason", exc)) or type(exc).__name__
        if attempt < attempts:
            time.sleep(pause_s * 2 ** (attempt - 1))
    log.warning("the webhook %s did not take the digest: %s", url, said)
    return f"the webhook did not take the digest after {attempt} attempt(s): {said}"


def notify_night(store: Store, sweep_id: int, url: str | None, dashboard_url: str | None = None) -> str:
    """POST the night's digest to the webhook when it has new findings; '' when there is no webhook or nothing new."""
    if not url:
        return ""
    try:
        digest = night_digest(store, sweep_id, dashboard_url)
    except Exception as exc:  # the store went away meanwhile: the night stands, the webhook waits for tomorrow
        log.warning("no digest for the webhook: %s", exc)
        return f"no digest for the webhook: {exc}"
    if not digest["new"]:
        return ""
    return post_webhook(url, {**digest, "text": digest_markdown(digest)})  # "text": what chat hooks show
