"""farm dashboard: a live, read-only web view of the farm."""

from __future__ import annotations

import argparse

from farm.cli.common import add_verb, load_inventory_of, log, port


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "dashboard", run,
                 "a live, read-only web view: devices, running sweep, results, alerts",
                 "Serves a small page (tornado) that refreshes every 5 s from the tracker and the results\n"
                 "database, opened read-only. Binds 127.0.0.1 unless --host says otherwise. It answers only\n"
                 "requests addressed to it (their Host header: its address, loopback's names, each --url),\n"
                 "so a page of another site cannot read it through DNS rebinding:\n\n"
                 "  farm dashboard --host 0.0.0.0 --url http://farm.lab.example:8090/")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8090)
    p.add_argument("--url", action="append", default=[],
                   help="a URL the lab serves the dashboard under (repeatable): requests for its name are answered")


def run(args: argparse.Namespace) -> int:
    from farm.views.dashboard_server import serve_dashboard

    inventory = load_inventory_of(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the dashboard binds %s: anyone who reaches it sees the farm's devices and results", args.host)
    url = f"http://{args.host}:{args.port}/"
    try:
        serve_dashboard(inventory, args.db, args.host, args.port,
                        on_ready=lambda: print(f"farm dashboard on {url} (Ctrl-C stops it)", flush=True),
                        urls=tuple(args.url))
    except KeyboardInterrupt:
        pass
    return 0
