"""Write the parts of the docs that are read from code, so they cannot drift from it.

    .venv/bin/python tools/gen_docs.py           # rewrite them in place
    .venv/bin/python tools/gen_docs.py --check   # exit 1, naming each page that differs

- README.md's verb table, from the parser (``farm.cli.build_parser()``): every verb with its one-line help;
- docs/ARCHITECTURE.md's "may import" table, from ``ALLOWED`` in tests/test_layers.py (the rule the layering test
  enforces), with the comment on each entry's line as its note.

Each part sits between two marker comments, ``<!-- NAME: ... -->`` and ``<!-- /NAME -->``; what lies between is
replaced whole. tests/test_docs.py fails when a page differs from what this script writes.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
LAYERS = REPO / "tests" / "test_layers.py"


def verbs(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """Each verb of ``parser`` with its one-line help, in the parser's order (a verb without help: '')."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    return [(name, helps.get(name, "")) for name in sub.choices]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def verb_table() -> str:
    from farm.cli import build_parser

    rows = [f"| `farm {name}` | {_cell(help_text)} |" for name, help_text in verbs(build_parser())]
    return "\n".join(["| verb | what it does (`farm VERB --help` for the rest) |", "|---|---|", *rows])


def allowed_notes(source: str) -> dict[str, str]:
    """The comment on each ``ALLOWED`` entry's lines in test_layers.py's source, by layer."""
    node = next(n.value for n in ast.parse(source).body
                if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "ALLOWED" for t in n.targets))
    comments = {tok.start[0]: tok.string.lstrip("# ").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    notes = {}
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant):
            lines = range(key.lineno, value.end_lineno + 1)
            notes[key.value] = "; ".join(comments[n] for n in lines if n in comments)
    return notes


def import_table() -> str:
    sys.path.insert(0, str(REPO))
    from tests.test_layers import ALLOWED

    notes = allowed_notes(LAYERS.read_text())
    rows = []
    for layer, allowed in ALLOWED.items():
        may = "anything" if "*" in allowed else ", ".join(f"`{m}`" for m in sorted(allowed)) or "—"
        rows.append(f"| `{layer}` | {may} | {_cell(notes.get(layer, ''))} |")
    return "\n".join(["| layer | may import (farm) | why, where it is not obvious |", "|---|---|---|", *rows])


PARTS = {README: {"verbs": verb_table}, ARCHITECTURE: {"imports": import_table}}


def replace(text: str, name: str, body: str) -> str:
    """``text`` with what lies between the markers of ``name`` replaced by ``body``."""
    pattern = re.compile(rf"(<!-- {name}:[^\n]*-->\n).*?(<!-- /{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"error: no <!-- {name}: ... --> ... <!-- /{name} --> markers found")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def generated(page: Path) -> str:
    """The page as this script writes it."""
    text = page.read_text()
    for name, make in PARTS[page].items():
        text = replace(text, name, make())
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs")
    args = parser.parse_args(argv)
    stale = []
    for page in PARTS:
        text = generated(page)
        if text != page.read_text():
            stale.append(page.relative_to(REPO))
            if not args.check:
                page.write_text(text)
    verb = "differs" if args.check else "rewritten"
    for page in stale:
        print(f"{page}: {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
