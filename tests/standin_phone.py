"""A stand-in Android phone: the device side of the ADB protocol, running commands on this host.

No phone and no adbd exist here, so tests bring up this process instead: the real `adb`
server connects to it over TCP (`adb connect HOST:PORT`) and speaks the real wire protocol
(CNXN/OPEN/OKAY/WRTE/CLSE). It serves the services farm uses:

- ``shell:CMD`` / ``exec:CMD``: ``sh -c CMD`` on this host (raw shell, stdout+stderr, no exit code:
  the phone does not offer shell_v2), with ``getprop`` and ``dumpsys`` from ``--props`` on PATH;
- ``sync:``: STAT, SEND, RECV, LIST, QUIT;
- ``tcp:PORT``: connections for ``adb forward`` to a port on the phone's 127.0.0.1;
- ``reverse:forward|killforward|killforward-all|list-forward``: the phone listens on its
  127.0.0.1:PORT and opens ``tcp:PORT`` streams back to the host for each connection.

Run it inside its own network namespace (tests do) so that the phone's loopback is not the
host's: then forwarded and reversed ports really travel through adb. An aarch64 RPC server
pushed to it runs under qemu when the device's ``launcher`` says so; nothing here emulates.

    python tests/standin_phone.py --listen 10.0.0.2:5555 --props props.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import struct
import sys
import tempfile
from pathlib import Path

A_CNXN, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_AUTH = (int.from_bytes(c, "little") for c in
                                                 (b"CNXN", b"OPEN", b"OKAY", b"CLSE", b"WRTE", b"AUTH"))
VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
HEADER = struct.Struct("<6I")
SYNC_DATA_MAX = 64 * 1024


def props_banner(props: dict[str, str]) -> bytes:
    names = ("ro.product.name", "ro.product.model", "ro.product.device")
    parts = [f"{n}={props.get(n, '')}" for n in names] + ["features=cmd,fixed_push_mkdir"]
    return ("device::" + ";".join(parts)).encode()


class Stream:
    """One ADB stream: bytes in through ``inbox``, bytes out one WRTE per acknowledgement."""

    def __init__(self, transport: "Transport", local_id: int, remote_id: int = 0):
        self.transport, self.local_id, self.remote_id = transport, local_id, remote_id
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.acked = asyncio.Event()
        self.opened = asyncio.get_running_loop().create_future()  # for streams the phone opens
        self.closed = False
        self.pending = b""

    async def write(self, data: bytes) -> bool:
        for start in range(0, len(data), self.transport.max_payload):
            await self.acked.wait()
            if self.closed:
                return False
            self.acked.clear()
            self.transport.send(A_WRTE, self.local_id, self.remote_id, data[start:start + self.transport.max_payload])
        return not self.closed

    async def read(self) -> bytes | None:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return await self.inbox.get()

    async def read_exactly(self, size: int) -> bytes:
        buf = b""
        while len(buf) < size:
            chunk = await self.read()
            if chunk is None:
                raise EOFError
            buf += chunk
        self.pending, buf = buf[size:], buf[:size]
        return buf

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.send(A_CLSE, self.local_id, self.remote_id)
            self._gone()

    def _gone(self) -> None:
        self.closed = True
        self.acked.set()
        self.inbox.put_nowait(None)
        self.transport.streams.pop(self.local_id, None)


class Transport:
    """One connection from the adb server."""

    def __init__(self, phone: "Phone", reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.phone, self.reader, self.writer = phone, reader, writer
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.max_payload = MAX_PAYLOAD

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        if self.writer.is_closing():
            return
        self.writer.write(HEADER.pack(command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, command ^ 0xFFFFFFFF) + data)

    def new_stream(self, remote_id: int = 0) -> Stream:
        stream = Stream(self, self.next_id, remote_id)
        self.streams[stream.local_id] = stream
        self.next_id += 1
        return stream

    async def run(self) -> None:
        try:
            while True:
                command, arg0, arg1, length, _check, magic = HEADER.unpack(await self.reader.readexactly(HEADER.size))
                if magic != command ^ 0xFFFFFFFF:
                    raise ValueError("bad message magic")
                data = await self.reader.readexactly(length) if length else b""
                self.dispatch(command, arg0, arg1, data)
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            for stream in list(self.streams.values()):
                stream._gone()
            self.writer.close()

    def dispatch(self, command: int, arg0: int, arg1: int, data: bytes) -> None:
        if command == A_CNXN:
            self.max_payload = min(MAX_PAYLOAD, arg1) if arg1 else MAX_PAYLOAD
            self.send(A_CNXN, VERSION, MAX_PAYLOAD, props_banner(self.phone.props))
        elif command == A_OPEN:
            service = data.rstrip(b"\0").decode(errors="replace")
            stream = self.new_stream(arg0)
            self.send(A_OKAY, stream.local_id, arg0)
            stream.acked.set()
            asyncio.get_running_loop().create_task(self.phone.serve(stream, service))
        elif command == A_OKAY:
            stream = self.streams.get(arg1)
            if stream is not None:
                if not stream.opened.done():
                    stream.remote_id = arg0
                    stream.opened.set_result(True)
                stream.acked.set()
        elif command == A_WRTE:
            stream = self.streams.get(arg1)
            if stream is None:
                self.send(A_CLSE, 0, arg0)
            else:
                stream.inbox.put_nowait(data)
                self.send(A_OKAY, arg1, arg0)
        elif command == A_CLSE:
            stream = self.streams.get(arg1)
            if stream is not None:
                if not stream.opened.done():
                    stream.opened.set_result(False)
                stream._gone()


class Phone:
    def __init__(self, props: dict[str, str], bin_dir: Path):
        self.props, self.bin_dir = props, bin_dir
        self.reverses: dict[str, tuple[str, asyncio.base_events.Server]] = {}
        self.transport: Transport | None = None

    async def accept(self, reader, writer) -> None:
        transport = Transport(self, reader, writer)
        self.transport = transport
        await transport.run()

    async def serve(self, stream: Stream, service: str) -> None:
        try:
            if service.startswith(("shell:", "exec:")):
                await self.shell(stream, service.partition(":")[2])
            elif service == "sync:":
                await self.sync(stream)
            elif service.startswith("tcp:"):
                await self.connect_local(stream, service)
            elif service.startswith("reverse:"):
                await self.reverse(stream, service.partition(":")[2])
            else:
                await stream.write(fail(f"unknown service {service}"))
        except (EOFError, ConnectionError, OSError) as exc:
            if not stream.closed:
                await stream.write(fail(str(exc)))
        finally:
            stream.close()

    # -- shell ------------------------------------------------------------------------------
    async def shell(self, stream: Stream, command: str) -> None:
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", command or "sh", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, cwd="/", start_new_session=True)

        async def feed() -> None:
            while (data := await stream.read()) is not None:
                proc.stdin.write(data)
            proc.stdin.close()

        feeder = asyncio.get_running_loop().create_task(feed())
        while chunk := await proc.stdout.read(SYNC_DATA_MAX):
            if not await stream.write(chunk):
                break
        await proc.wait()
        feeder.cancel()

    # -- sync -------------------------------------------------------------------------------
    async def sync(self, stream: Stream) -> None:
        while True:
            ident, length = struct.unpack("<4sI", await stream.read_exactly(8))
            if ident == b"QUIT":
                return
            path = (await stream.read_exactly(length)).decode()
            if ident == b"STAT":
                try:
                    st = os.stat(path)
                    await stream.write(struct.pack("<4sIII", b"STAT", st.st_mode, st.st_size, int(st.st_mtime)))
                except OSError:
                    await stream.write(struct.pack("<4sIII", b"STAT", 0, 0, 0))
            elif ident == b"SEND":
                await self.receive_file(stream, path)
            elif ident == b"RECV":
                await self.send_file(stream, path)
            elif ident == b"LIST":
                for entry in os.scandir(path) if os.path.isdir(path) else []:
                    st = entry.stat(follow_symlinks=False)
                    name = entry.name.encode()
                    dent = struct.pack("<4sIIII", b"DENT", st.st_mode, st.st_size, int(st.st_mtime), len(name))
                    await stream.write(dent + name)
                await stream.write(struct.pack("<4sIIII", b"DONE", 0, 0, 0, 0))
            else:
                await stream.write(fail(f"unknown sync request {ident!r}"))
                return

    async def receive_file(self, stream: Stream, spec: str) -> None:
        path, _, mode = spec.rpartition(",")
        chunks, mtime = [], 0
        while True:
            ident, length = struct.unpack("<4sI", await stream.read_exactly(8))
            if ident == b"DATA":
                chunks.append(await stream.read_exactly(length))
            elif ident == b"DONE":
                mtime = length
                break
            else:
                await stream.write(fail(f"unexpected {ident!r} in SEND"))
                return
        try:
            os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
            tmp = f"{path}.adb-tmp"
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.chmod(tmp, stat.S_IMODE(int(mode or "420")))
            os.replace(tmp, path)
            os.utime(path, (mtime, mtime))
            await stream.write(struct.pack("<4sI", b"OKAY", 0))
        except OSError as exc:
            await stream.write(sync_fail(str(exc)))

    async def send_file(self, stream: Stream, path: str) -> None:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            await stream.write(sync_fail(str(exc)))
            return
        for start in range(0, len(data), SYNC_DATA_MAX):
            chunk = data[start:start + SYNC_DATA_MAX]
            await stream.write(struct.pack("<4sI", b"DATA", len(chunk)) + chunk)
        await stream.write(struct.pack("<4sI", b"DONE", 0))

    # -- forward (host -> phone) and reverse (phone -> host) --------------------------------------
    async def connect_local(self, stream: Stream, service: str) -> None:
        port = int(service.split(":")[1])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return  # closing the stream tells the host the connection was refused
        await relay(stream, reader, writer)

    async def reverse(self, stream: Stream, request: str) -> None:
        if request == "list-forward":
            lines = "".join(f"host-1 {remote} {local}\n" for remote, (local, _) in self.reverses.items())
            await stream.write(block(lines))  # adbd sends no OKAY before the list
            return
        if request == "killforward-all":
            for remote in list(self.reverses):
                self.reverses.pop(remote)[1].close()
            await stream.write(b"OKAY")
            return
        if request.startswith("killforward:"):
            remote = request.partition(":")[2]
            if remote not in self.reverses:
                await stream.write(fail(f"listener '{remote}' not found"))
                return
            self.reverses.pop(remote)[1].close()
            await stream.write(b"OKAY")
            return
        if not request.startswith("forward:"):
            await stream.write(fail(f"unknown reverse request {request}"))
            return
        spec = request.partition(":")[2]
        norebind = spec.startswith("norebind:")
        remote, _, local = spec.removeprefix("norebind:").partition(";")
        if remote in self.reverses:
            if norebind:
                await stream.write(fail(f"cannot rebind {remote}"))
                return
            self.reverses.pop(remote)[1].close()
        transport = stream.transport

        async def on_connect(reader, writer) -> None:
            back = transport.new_stream()
            transport.send(A_OPEN, back.local_id, 0, local.encode() + b"\0")
            if await back.opened:
                await relay(back, reader, writer)
                back.close()
            else:
                writer.close()

        try:
            server = await asyncio.start_server(on_connect, "127.0.0.1", int(remote.split(":")[1]))
        except OSError as exc:
            await stream.write(fail(f"cannot bind {remote}: {exc}"))
            return
        self.reverses[remote] = (local, server)
        await stream.write(b"OKAY")


async def relay(stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    async def to_socket() -> None:
        while (data := await stream.read()) is not None:
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.get_running_loop().create_task(to_socket())
    try:
        while data := await reader.read(MAX_PAYLOAD):
            if not await stream.write(data):
                break
    except ConnectionError:
        pass
    stream.close()
    await asyncio.gather(task, return_exceptions=True)
    writer.close()


def block(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):04x}".encode() + data


def fail(message: str) -> bytes:
    return b"FAIL" + block(message)


def sync_fail(message: str) -> bytes:
    data = message.encode()
    return struct.pack("<4sI", b"FAIL", len(data)) + data


def write_system_tools(bin_dir: Path, props: dict[str, str], battery: dict[str, int]) -> None:
    """``getprop`` and ``dumpsys battery`` for this phone, from its property file."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    data = bin_dir / "props.json"
    data.write_text(json.dumps({"props": props, "battery": battery}))
    py = sys.executable
    (bin_dir / "getprop").write_text(
        f"#!/bin/sh\nexec {py} -c 'import json,sys; p=json.load(open(\"{data}\"))[\"props\"];"
        f" print(p.get(sys.argv[1], \"\") if len(sys.argv) > 1"
        f" else \"\\n\".join(\"[%s]: [%s]\" % kv for kv in sorted(p.items())))' \"$@\"\n")
    (bin_dir / "dumpsys").write_text(
        f"#!/bin/sh\n[ \"$1\" = battery ] || {{ echo \"Can't find service: $1\"; exit 0; }}\n"
        f"exec {py} -c 'import json; b=json.load(open(\"{data}\"))[\"battery\"]; print(\"Current Battery Service state:\");"
        f" [print(\"  %s: %s\" % kv) for kv in b.items()]'\n")
    for tool in ("getprop", "dumpsys"):
        (bin_dir / tool).chmod(0o755)


DEFAULT_PROPS = {
    "ro.product.name": "standin", "ro.product.model": "Stand-in Phone", "ro.product.device": "standin",
    "ro.product.manufacturer": "farm", "ro.product.cpu.abi": "arm64-v8a", "ro.board.platform": "qemu-aarch64",
    "ro.build.version.release": "14", "ro.build.version.sdk": "34",
}
DEFAULT_BATTERY = {"level": 87, "temperature": 312, "status": 2}


async def main_async(args) -> None:
    props = {**DEFAULT_PROPS, **(json.loads(Path(args.props).read_text()) if args.props else {})}
    battery = {**DEFAULT_BATTERY, **({k: int(v) for k, v in json.loads(args.battery).items()} if args.battery else {})}
    bin_dir = Path(args.system or tempfile.mkdtemp(prefix="standin-phone-")) / "bin"
    write_system_tools(bin_dir, props, battery)
    phone = Phone(props, bin_dir)
    host, _, port = args.listen.rpartition(":")
    server = await asyncio.start_server(phone.accept, host, int(port))
    print(f"stand-in phone listening on {args.listen}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:5655", help="HOST:PORT for the adb server to connect to")
    parser.add_argument("--props", help="JSON file of extra getprop properties")
    parser.add_argument("--battery", help='JSON of dumpsys battery fields, e.g. {"level": 40, "temperature": 415}')
    parser.add_argument("--system", help="folder for the phone's getprop/dumpsys (default: a new temp folder)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
