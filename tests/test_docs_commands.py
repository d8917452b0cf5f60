"""Every shell command in docs/*.md runs as a newcomer types it: tests/test_readme.py's walk over the docs pages, in a
folder of its own. A file of its own so that pytest-xdist (one file per worker at a time) walks the docs beside the
README, instead of one worker walking both while the other idles at the suite's end."""

import pytest

from tests.test_readme import DOCS, walk_pages


@pytest.mark.slow  # 6 min on a quiet 2-core machine: five sweeps (nightly.sh's included), four short tuning sessions
def test_every_docs_command_runs_as_written(tmp_path):
    assert DOCS, "docs/*.md"
    walk_pages(tmp_path, DOCS)
