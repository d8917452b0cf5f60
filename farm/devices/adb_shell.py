"""``python -m farm.devices.adb_shell HOST PORT SERIAL COMMAND``: run COMMAND on a phone, print its output.

The command prefix farm records for servers it started on phones (``procs/supervise.py`` runs
it to check and stop them). Unlike the ``adb`` client, it never starts an adb server of its
own when none answers: it exits 1 with the reason on stderr.
"""

from __future__ import annotations

import sys

from farm.devices.android import adb_errors, client
from farm.errors import FarmError


def main(argv: list[str]) -> int:
    if len(argv) != 4 or not argv[1].isdigit():
        print("usage: python -m farm.devices.adb_shell HOST PORT SERIAL COMMAND", file=sys.stderr)
        return 2
    host, port, serial, command = argv
    try:
        adb = client((host, int(port)))
        with adb_errors(f"running a command on phone {serial}"):
            sys.stdout.write(adb.device(serial).shell(command, timeout=30))
    except FarmError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
