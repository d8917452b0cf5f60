"""Docs that cannot drift (issue #31 item 6): what they say of the code is generated from it and checked here.

- README.md's verb table is the parser's verbs with their help; docs/ARCHITECTURE.md's "may import" table is
  ``ALLOWED`` of tests/test_layers.py. ``tools/gen_docs.py`` writes both; these tests fail when a page differs.
- Every relative link of README.md and docs/*.md leads to a file (and a heading, when it names one).
- Lines stay readable: none over 200 characters, except a table row (Markdown cannot wrap one), which stays
  within 400; a URL does not count towards a line's length.
- The README stays a front door: at most 150 lines.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINE_LIMIT, TABLE_ROW_LIMIT, README_LINES = 200, 400, 150

_spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
gen_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_docs)


def _part(text: str, name: str) -> str:
    match = re.search(rf"<!-- {name}:[^\n]*-->\n(.*?)<!-- /{name} -->", text, re.S)
    assert match, f"no <!-- {name}: ... --> markers"
    return match.group(1).rstrip("\n")


def test_readme_verb_table_is_the_parsers():
    assert _part(gen_docs.README.read_text(), "verbs") == gen_docs.verb_table(), \
        "README.md's verb table differs from farm's parser: run .venv/bin/python tools/gen_docs.py"


def test_architecture_import_table_is_test_layers_allowed():
    assert _part(gen_docs.ARCHITECTURE.read_text(), "imports") == gen_docs.import_table(), \
        "docs/ARCHITECTURE.md's 'may import' table differs from tests/test_layers.py ALLOWED: run " \
        ".venv/bin/python tools/gen_docs.py"


def test_every_verb_is_in_the_table_with_its_help():
    from farm.cli import build_parser

    table = _part(gen_docs.README.read_text(), "verbs")
    listed = re.findall(r"^\| `farm ([\w-]+)` \| (.+) \|$", table, re.M)
    assert [name for name, _ in listed] == list(next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    assert all(help_text.strip() for _, help_text in listed), "a verb without help: give it help= in farm/cli"


def test_verbs_are_read_from_argparse_as_added():
    """The reading code against argparse itself: a literal parser, its verbs in order, one without help."""
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("start", help="start it")
    sub.add_parser("quiet")
    sub.add_parser("stop", help="stop | it")
    assert gen_docs.verbs(parser) == [("start", "start it"), ("quiet", ""), ("stop", "stop | it")]
    assert gen_docs._cell("stop | it\n  now") == "stop \\| it now"


def test_allowed_notes_are_the_comments_beside_each_entry():
    source = 'X = 1\nALLOWED = {\n    "a": set(),  # why a\n    "b": {"a",\n          "c"},  # why b\n    "c": {"a"},\n}\n'
    assert gen_docs.allowed_notes(source) == {"a": "why a", "b": "why b", "c": ""}


def test_replace_rewrites_only_between_the_markers():
    text = "a\n<!-- t: generated -->\nold\n<!-- /t -->\nb\n"
    assert gen_docs.replace(text, "t", "new") == "a\n<!-- t: generated -->\nnew\n<!-- /t -->\nb\n"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", page.read_text())
    return {_slug(h) for h in re.findall(r"(?m)^#+ (.+)$", text)}


def test_every_relative_link_leads_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme] == []


def test_lines_stay_readable():
    long = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            counted = len(re.sub(r"https?://\S+", "", line))
            limit = TABLE_ROW_LIMIT if line.startswith("|") else LINE_LIMIT
            if counted > limit:
                long.append(f"{page.relative_to(REPO)}:{number}: {counted} characters (limit {limit})")
    assert long == []


def test_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text().splitlines()) <= README_LINES


def test_every_python_file_the_architecture_page_names_exists():
    """The page names modules by file (``cli/worker.py``, ``costmodel.py``): each exists in farm/, tests/ or tools/
    (its opening once named CLI modules that did not). Placeholders are written in capitals (``cli/VERB.py``)."""
    import re

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"(?<![\w/.-])((?:\w+/)*[a-z_0-9]+\.py)\b", text)) - {"model.py"}  # a name not chosen
    have = {str(p.relative_to(REPO / base)) for base in ("farm", "tests", "tools") for p in (REPO / base).rglob("*.py")}
    have |= {p.rsplit("/", 1)[-1] for p in have}
    assert sorted(n for n in named if n not in have and n.rsplit("/", 1)[-1] not in have) == []
