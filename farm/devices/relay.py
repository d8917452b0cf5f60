"""TCP relays between this host's loopback and the lab's tracker on another host (#30).

A phone reaches the tracker only through ``adb reverse``, which connects the phone's 127.0.0.1:T to T on its own
host's loopback, and clients reach the phone only through ``adb forward``, which listens on that loopback. When the
tracker runs on another lab host, ``farm serve`` (and ``farm worker --serve``) on the phone's host starts one relay
process with two legs:

- 127.0.0.1:R → the tracker (R reversed to the phone instead of T), so the phone's server registers with the lab's
  one tracker. The tracker then hands clients the address it saw that registration come from: this host's address
  on its route to the tracker, and the phone's ``server_port`` P;
- that address:P → 127.0.0.1:P (``--expose P``: the ``adb forward``), so a client on any lab host reaches the phone,
  and this host's own worker too.

    python -m farm.devices.relay --listen R --to HOST:PORT [--expose P]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path

from farm.errors import DeviceError
from farm.records import TrackerAddress

MODULE = "farm.devices.relay"
START_S = 30.0  # a relay listens within this or is reported with its log (a Python start on a loaded machine)


READY = "ready"  # the line a relay logs once both its legs listen


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this host's loopback, where ``adb reverse`` lands (no relay needed)."""
    with contextlib.suppress(OSError, ValueError):
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    return False


def relay_marker(port: int, tracker: TrackerAddress, expose: int) -> str:
    """What a relay's command line holds (its record's marker): a relay is reused only if it relays the same way."""
    return f"{MODULE} --listen {port} --to {tracker} --expose {expose}"


def start_relay(tracker: TrackerAddress, port: int, expose: int, log_path: Path) -> subprocess.Popen:
    """A relay process (its own process group, its log in ``log_path``) from 127.0.0.1:``port`` to ``tracker``, and
    from this host's route address to it, ``expose``, to 127.0.0.1:``expose``, once it listens; a DeviceError with
    its log when it does not."""
    log_path.write_bytes(b"")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", *relay_marker(port, tracker, expose).split()],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_S
    while proc.poll() is None and time.monotonic() < deadline:
        if READY in log_path.read_text(errors="replace").splitlines():
            return proc
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    raise DeviceError(f"the relay to the tracker at {tracker} did not listen on 127.0.0.1:{port}: "
                      f"{log_path.read_text(errors='replace').strip()[-300:]}",
                      "check that this host reaches the tracker (farm tracker status) and that the port is free")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction until its end: then that end passed on (a half-close), the other direction left to finish."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


def route_address(host: str, port: int) -> str:
    """This host's address on its route to ``host``: the address a connection from here to it comes from."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))  # no packet is sent: the kernel picks the route and its source address
        return probe.getsockname()[0]


async def _relay(listen_host: str, listen_port: int, host: str, port: int) -> asyncio.Server:
    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            print(f"cannot reach {host}:{port}: {exc}", file=sys.stderr, flush=True)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        writer.close()
        upstream_writer.close()

    server = await asyncio.start_server(connect, listen_host, listen_port)
    print(f"relaying {listen_host}:{listen_port} to {host}:{port}", file=sys.stderr, flush=True)
    return server


async def _serve(port: int, host: str, target_port: int, expose: int | None) -> None:
    servers = [] if expose is None else [await _relay(route_address(host, target_port), expose, "127.0.0.1", expose)]
    servers.append(await _relay("127.0.0.1", port, host, target_port))
    print(READY, file=sys.stderr, flush=True)  # start_relay waits for this line: both legs listen
    await asyncio.gather(*(server.serve_forever() for server in servers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=int, required=True, help="the loopback port to listen on")
    parser.add_argument("--to", required=True, help="HOST:PORT of the tracker")
    parser.add_argument("--expose", type=int, help="a loopback port (adb forward's) to offer on the route's address")
    args = parser.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, host, int(port), args.expose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
