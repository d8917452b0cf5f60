"""farm phones: the Android phones an adb server sees."""

from __future__ import annotations

import argparse

from dataclasses import asdict

from farm.cli.common import add_verb, address, emit_json, print_table


def add_parser(subparsers, common: argparse.ArgumentParser) -> None:
    p = add_verb(subparsers, common, "phones", run,
                 "Android phones the adb server sees: serial, model, ABI, SoC, OpenCL, battery",
                 "Asks the adb server (--adb, default 127.0.0.1:$ANDROID_ADB_SERVER_PORT or 5037) for its devices and\n"
                 "reads each one's properties over adb. Put a phone's serial into devices.toml (kind = \"android\").")
    p.add_argument("--adb", type=address, help="HOST:PORT of the adb server")


def run(args: argparse.Namespace) -> int:
    from farm.devices.android import adb_address, list_phones

    adb = adb_address(given=args.adb)
    rows = [asdict(p) for p in list_phones(adb)]
    if args.json:
        emit_json({"adb": f"{adb[0]}:{adb[1]}", "phones": rows})
    else:
        print(f"adb server {adb[0]}:{adb[1]}: {len(rows)} phone(s)")
        print_table(rows, ["serial", "state", "model", "abi", "soc", "android", "opencl", "battery_pct", "battery_temp_c"])
    return 0
