"""Showing what was judged: the HTML report (report.py, review.py, figures.py, templates/), the live
dashboard (dashboard.py, dashboard_server.py, pages.py) and the night's digest (digest.py)."""
