"""farm's RPC tracker: TVM's own tracker, on a socket whose backlog holds a fleet's burst of requests.

    python -m farm.rpc.tracker_server --host 127.0.0.1 --port 9190

TVM's tracker (``python -m tvm.exec.rpc_tracker``) listens with ``listen(1)``: the kernel keeps at most two
connections the tracker has not accepted yet and drops every further SYN, which the client sends again after
1, 3, 7, 15 and 31 s. A probe or a sweep opens one tracker connection per device at once (up to
``farm.rpc.session.SESSION_SLOTS``), so on a loaded host some of those waited seconds, now and then past their
whole timeout, only to reach the tracker: the device was reported busy or unreachable while it stood free.
This runs the same tracker (``TrackerServerHandler``: same protocol, same scheduler) on exactly the port
given, listening with ``socket.SOMAXCONN``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to exactly ``host:port``, listening with the system's largest backlog."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    if sys.platform != "win32":  # as TVM's tracker: reuse a port left in TIME_WAIT (on Windows it means sharing)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.rpc.tracker_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9190, help="exactly this port (no sliding to the next)")
    parser.add_argument("--allow", help="a JSON file: each key's allowed source addresses (farm.rpc.registrations)")
    args = parser.parse_args(argv)
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    from farm.tvm_private import import_tvm_without_torch, runtime_only_env

    for name, value in runtime_only_env().items():  # the tracker is Python alone: TVM's runtime, never its compiler
        os.environ.setdefault(name, value)
    import_tvm_without_torch()
    from tvm.rpc.base import random_key
    from tvm.rpc.tracker import TrackerServerHandler

    if args.allow:
        from farm.rpc.registrations import refusal
        from farm.tvm_private import guard_tracker_registrations

        with open(args.allow, encoding="utf-8") as listed:
            allowed = json.load(listed)

        def refused(key: str, peer: str, claimed: str | None) -> str:
            if why := refusal(allowed, key, peer, claimed):
                print(f"farm tracker: refused a server registering from {peer}: {why}", file=sys.stderr, flush=True)
            return why

        guard_tracker_registrations(refused)
        print(f"farm tracker: registrations taken only from the inventory's sources ({len(allowed)} keys)",
              file=sys.stderr, flush=True)

    print(f"farm tracker: listening on {args.host}:{args.port} (backlog {socket.SOMAXCONN})", file=sys.stderr,
          flush=True)
    asyncio.set_event_loop(asyncio.new_event_loop())  # tornado's IOLoop.current() needs one, as in TVM's tracker
    TrackerServerHandler(sock, random_key("tracker")).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
