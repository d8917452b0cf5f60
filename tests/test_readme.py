"""Every shell command in README.md and docs/*.md runs as a newcomer types it (pyperf's test_examples.py; issue #20
item 7, #31 item 6).

The fenced shell blocks of README.md (here), and of each docs/*.md page in name order (``DOCS``, in
tests/test_docs_commands.py: a file of its own, so pytest-xdist walks both at once), run in their order, each
command as written, through bash, in one fresh folder per walk:
a copy of the repository's devices.toml (its fixed ports made free ones, so the test can run beside a farm someone
started by hand), ``.venv`` and ``tools/`` linked in, FARM_HOME / FARM_DB / FARM_DEVICES unset, so farm's defaults
apply as the README describes them (state in ./.farm, results in ./.farm/results.db, reports in ./reports).

What a command must do is decided by what it names, never by a list of expected failures:

- a device (``--device``): exit 0 when its key has a server on the tracker (``farm serve`` brought it up);
  otherwise (a phone, an iPhone, a Jetson, a stock server nobody started) farm's ``error:`` line and a ``hint:``;
- ``farm serve``: exit 0 when each device it brings up has what its kind needs here (``DeviceKind.prerequisites``);
- ``farm sweep`` (and ``tools/nightly.sh``, a sweep over every device): exit 0 when each device it sweeps has a
  server on the tracker; otherwise its cells are stored offline and the sweep ends incomplete: error + hint;
- ``farm phones``: exit 0 when an adb server answers; a ``postgresql://`` database on another host: error + hint;
  ``farm compare A B``: exit 0 when both runs are stored with samples, else error + hint;
- anything else: exit 0. Never a traceback, never ``error: unexpected``.

Placeholders a reader fills in are filled in the same way (``PLACEHOLDERS``, ``NEWCOMER_FILES``). A few commands are
not run (``NOT_RUN``: they set up the machine, run the whole suite, or benchmark farm itself for minutes); each is
checked to exist and to take the options the README gives it. ``farm demo`` runs in tests/test_demo.py, as
written, in a newcomer's folder of its own (``RUN_BY``): that file checks what it did, and one run serves both. A
block that uses the farm without starting it runs after the README's own bring-up (``farm tracker start``, ``farm
serve``), as a reader coming from "Using it on your own devices" has it. At the end the README's ``farm down`` stops
everything; the process registry is the safety net. Every fence of these pages must name its language; output is
shown in ``text`` fences, which are not run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from farm.cli import build_parser
from farm.devices import can_bring_up, kind_of
from farm.devices.android import adb_address
from farm.errors import TrackerError
from farm.inventory import load_inventory
from farm.procs.registry import load_records
from farm.procs.supervise import free_port, stop_process
from farm.rpc.tracker import query_summary

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = tuple(sorted((REPO / "docs").glob("*.md")))  # in the order they run in
PAGES = (README, *DOCS)
SHELL_FENCES = {"bash", "sh", "shell", "console"}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
COMMAND_TIMEOUT_S = 600
ELSEWHERE = "another machine, not this one"

# Commands not run here, each with the reason; the test checks that they exist and take the README's options.
NOT_RUN = {
    "tools/setup.sh": "sets the machine up (apt-get, pip into .venv): the suite's own setup",
    "tools/test.sh": "runs the whole test suite, this test included",
    "tools/bench_sweep.py": "benchmarks farm's sweep (4 devices × 3 models, twice, with cooldowns): minutes",
    "tools/fault_sweep.py": "kills a server 20 times over 25 sweeps: minutes",
    "createdb": "runs on the database server (dbhost), which this machine is not",
    "adb": "starts a system-wide adb daemon that would outlive the test, and no phone is attached here",
}

# farm commands of the README another test runs, as written, in a newcomer's folder of its own, and checks further
# (by their arguments after .venv/bin/farm): (that test file, why). The walk checks they parse and that the file is
# there. One run each.
RUN_BY = {
    ("demo",): ("tests/test_demo.py", "runs it as written and checks what it did (a 100-s run: once, not twice)"),
}

# Files the README has the reader bring: the test writes a small one of each.
NEWCOMER_FILES = ("my_model.onnx", "nightly.toml")


@dataclass(frozen=True)
class Command:
    line: int  # in its page
    text: str  # one command as written, without its comment (a `&&` chain is split into its commands)
    argv: tuple[str, ...]  # its words, without VAR=value prefixes and redirections
    env: tuple[tuple[str, str], ...]  # its VAR=value prefixes
    page: str = "README.md"  # the page it is in, relative to the repository

    @property
    def farm(self) -> tuple[str, ...] | None:
        """The arguments after ``.venv/bin/farm``, or None for another program."""
        return self.argv[1:] if self.argv and self.argv[0].endswith("bin/farm") else None

    @property
    def program(self) -> str:
        """What NOT_RUN is keyed by: the script a `bash`/python runs, else the program."""
        if len(self.argv) > 1 and (self.argv[0] == "bash" or self.argv[0].endswith("python")) and "/" in self.argv[1]:
            return self.argv[1]
        return self.argv[0]


def page_blocks(pages: tuple[Path, ...] = PAGES) -> list[list[Command]]:
    """The commands of each fenced shell block of ``pages``, in their order."""
    return [block for page in pages for block in readme_blocks(page.read_text(), page.relative_to(REPO).as_posix())]


def readme_blocks(text: str, page: str = "README.md") -> list[list[Command]]:
    """The commands of each fenced shell block of one page, in order. Every fence must name its language."""
    blocks: list[list[Command]] = []
    current: list[Command] | None = None
    language = ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                language = line[3:].strip()
                assert language, f"{page}:{number}: name the fence's language (bash, toml, text, ...)"
                current = []
            else:
                if language in SHELL_FENCES:
                    blocks.append(current)
                current = None
        elif current is not None and language in SHELL_FENCES:
            if language == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            current.extend(parse_line(number, line, page))
    return blocks


def parse_line(number: int, line: str, page: str = "README.md") -> list[Command]:
    text = re.sub(r"(^|\s)#.*$", "", line).strip()
    commands = []
    for part in filter(None, (p.strip() for p in text.split(" && "))):
        words = shlex.split(part)
        env = []
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            env.append(tuple(words.pop(0).split("=", 1)))
        cut = next((i for i, w in enumerate(words) if w in (">", ">>", "<", "|", "2>")), len(words))
        commands.append(Command(number, part, tuple(words[:cut]), tuple(env), page))
    return commands


def test_readme_parses_into_shell_commands():
    blocks = page_blocks()
    commands = [c for block in blocks for c in block]
    assert len(blocks) >= 8 and any(c.farm == ("demo",) for c in commands if c.page == "README.md")
    assert {page.relative_to(REPO).as_posix() for page in PAGES} >= {"README.md", "docs/devices.md", "docs/tuning.md"}
    named = {c.program for c in commands}
    assert set(NOT_RUN) <= named, f"NOT_RUN names commands the pages no longer have: {set(NOT_RUN) - named}"
    in_readme = {c.farm for c in commands if c.page == "README.md"}
    assert set(RUN_BY) <= in_readme, f"RUN_BY names commands the README no longer has: {set(RUN_BY) - in_readme}"
    text = "".join(page.read_text() for page in PAGES)
    assert all(name in text for name in NEWCOMER_FILES)


# -- the newcomer's folder -------------------------------------------------------------------------------------------

def newcomer_inventory(text: str) -> str:
    """The repository's devices.toml with free ports for the tracker and each iPhone's RPC proxy (default 9091)."""
    tracker = re.subn(r"(?m)^(\[tracker\][^\[]*?^port = )\d+$", rf"\g<1>{free_port()}", text)
    assert tracker[1] == 1, "devices.toml's [tracker] has no port line"
    text = tracker[0]
    for name in re.findall(r'(?m)^\[devices\.([\w-]+)\]\nkind = "ios"\n(?:(?!\[)(?!proxy).*\n)*(?=\[|\Z)', text):
        text = text.replace(f"[devices.{name}]\n", f'[devices.{name}]\nproxy = "127.0.0.1:{free_port()}"\n', 1)
    return text


def write_newcomer_files(work: Path) -> None:
    """A model of the reader's own (input `input`, dynamic dims, so --shape is needed) and a small sweep file."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.1).astype(np.float32), "w"),
               numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["relu"]),
         helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
         helper.make_node("Flatten", ["pool"], ["output"])],
        "my_model", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 8])], initializer=weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), work / "my_model.onnx")
    (work / "nightly.toml").write_text('devices = ["x86-local"]\nmodels = ["mlp"]\n')


@dataclass
class Row:
    command: Command
    expected: str  # "ok" | "error" | "not run"
    why: str
    rc: int | None = None
    seconds: float = 0.0
    problem: str = ""
    said: str = ""  # an expected error's `error:` line


def _terminal_signals() -> None:
    """In the child, before exec: SIGINT and SIGQUIT do what they do in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Newcomer:
    """Runs README commands in ``work`` and judges each against what it names."""

    def __init__(self, work: Path):
        self.work = work
        self.inventory = load_inventory(str(work / "devices.toml"))
        self.tracker = self.inventory.tracker
        venv_bin = work / ".venv" / "bin"
        self.env = dict(os.environ)  # without the user's FARM_* settings (conftest.USER_SETTINGS)
        self.env["PATH"] = f"{venv_bin}:{self.env.get('PATH', '')}"  # `python -m tvm.exec.rpc_server`: the venv's
        self.rows: list[Row] = []
        self.background: list[subprocess.Popen] = []

    # what a command names, and so what it must do
    def tracker_up(self) -> bool:
        try:
            query_summary(self.tracker)
        except TrackerError:
            return False
        return True

    def registered(self, key: str) -> bool:
        try:
            status = query_summary(self.tracker).keys.get(key)
        except TrackerError:
            return False
        return status is not None and status.servers > 0

    def expectation(self, command: Command, env: dict[str, str]) -> tuple[str, str]:
        if command.program in NOT_RUN:
            return "not run", NOT_RUN[command.program]
        if command.farm in RUN_BY:
            return "not run", " ".join(RUN_BY[command.farm])
        if command.argv[:3] == ("python", "-m", "tvm.exec.rpc_server"):
            return "ok", "a stock TVM rpc_server; this host plays the remote one"
        if command.program == "tools/nightly.sh":
            return self.sweep_expectation(list(self.inventory.devices), "a sweep over every device")
        if command.farm is None:
            return "ok", "a script of the repository's"
        try:
            args = build_parser().parse_args([a for a in command.farm if a != "..."])  # `...`: see substitute()
        except SystemExit:
            return "ok", "(the README's arguments must parse)"
        db = env.get("FARM_DB", "")
        if db.startswith("postgresql://") and urlsplit(db).hostname not in LOOPBACK:
            return "error", f"its database server {urlsplit(db).hostname} is {ELSEWHERE}"
        if args.command == "serve":
            names = args.device or [n for n, d in self.inventory.devices.items() if can_bring_up(d)]
            lacks = {n: kind_of(d).prerequisites() or (kind_of(d).unready(d) if args.device else "")
                     for n, d in ((n, self.inventory.devices[n]) for n in names)}
            lacking = {n: why for n, why in lacks.items() if why}
            if lacking:
                return "error", "; ".join(f"{n}: {why}" for n, why in lacking.items())
            return "ok", f"this host has what {', '.join(names)} need"
        if args.command in ("bench", "tune", "copies"):
            device = self.inventory.devices[args.device]
            if self.registered(device.key):
                return "ok", f"{device.name}'s server is on the tracker"
            kind = kind_of(device)
            return "error", (f"no server for {device.name} ({device.kind}): "
                             f"{kind.prerequisites() or kind.unready(device) or 'nothing here starts one'}")
        if args.command == "sweep" and args.resume is None and args.status is None and not args.file:
            return self.sweep_expectation(args.device or list(self.inventory.devices), "a sweep")
        if args.command == "phones":
            address = adb_address()
            try:
                socket.create_connection(address, timeout=3).close()
                return "ok", f"an adb server answers at {address[0]}:{address[1]}"
            except OSError:
                return "error", f"no adb server at {address[0]}:{address[1]} (no phone here)"
        if args.command == "compare":
            listed = self.shell(".venv/bin/farm results --json", env)
            runs = {r["run_id"]: r for r in (json.loads(listed.stdout) if listed.returncode == 0 else [])}
            usable = [i for i in (args.run_a, args.run_b) if i in runs and runs[i]["status"] == "ok"
                      and (runs[i]["steady_n"] or 0) >= 3]
            if len(usable) == 2:
                return "ok", "both runs are stored, with samples"
            return "error", f"runs {args.run_a} and {args.run_b} are not both stored with samples here"
        if args.command == "dashboard":
            return ("ok", "serves until Ctrl-C") if port_free(args.host, args.port) else \
                ("error", f"{args.host}:{args.port} is taken")
        return "ok", "needs nothing this host lacks"

    def sweep_expectation(self, names: list[str], what: str) -> tuple[str, str]:
        """A sweep over ``names`` ends done only when each has a server on the tracker: a device with none has its
        cells stored offline, and the sweep is incomplete (exit 1, the cells named)."""
        offline = [n for n in names if not self.registered(self.inventory.devices[n].key)]
        if offline:
            return "error", f"{what}: {', '.join(offline)} have no server here: their cells are stored offline"
        return "ok", f"{what}: every device's server is on the tracker"

    # running
    def shell(self, text: str, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", text], cwd=self.work, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL, **kwargs)

    def run(self, command: Command, env: dict[str, str]) -> Row:
        expected, why = self.expectation(command, env)
        row = Row(command, expected, why)
        self.rows.append(row)
        start = time.monotonic()
        text = substitute(command.text, self.tracker)
        if expected == "not run":
            row.problem = self.check_not_run(command)
        elif command.farm and command.farm[0] == "dashboard" and expected == "ok":
            row.rc, row.problem = self.foreground_dashboard(text, env)
        elif command.argv[:3] == ("python", "-m", "tvm.exec.rpc_server"):
            row.rc, row.problem = self.foreground_rpc_server(text, env)
        else:
            if why.endswith(ELSEWHERE):  # libpq must not ask DNS for a host that stands for another machine
                env = {**env, "PGHOSTADDR": "127.0.0.1"}
            done = self.shell(text, env)
            row.rc, row.problem = done.returncode, judge(expected, done.returncode, done.stdout, done.stderr)
            row.said = next((line for line in done.stderr.splitlines() if line.startswith("error: ")), "")
            if not row.problem and command.farm and command.farm[0] == "down":
                left = load_records(self.work / ".farm")
                row.problem = f"the registry still lists {left}" if left else ""
        row.seconds = time.monotonic() - start
        return row

    def check_not_run(self, command: Command) -> str:
        if command.farm in RUN_BY:
            try:
                build_parser().parse_args(list(command.farm))
            except SystemExit:
                return "its arguments do not parse"
            runner = RUN_BY[command.farm][0]
            return "" if (REPO / runner).exists() else f"{runner} does not exist"
        script = self.work / command.program
        if command.program.startswith("tools/"):
            if not script.exists():
                return f"{command.program} does not exist"
        if command.program.endswith(".py"):
            done = self.shell(f".venv/bin/python {command.program} --help", self.env)
            return "" if done.returncode == 0 else f"--help failed: {done.stderr[-300:]}"
        if command.program.endswith(".sh"):
            done = self.shell(f"bash -n {command.program}", self.env)
            if done.returncode != 0:
                return f"bash -n: {done.stderr[-300:]}"
            if command.program == "tools/setup.sh":  # its only side-effect-free call: an unknown option prints usage
                usage = self.shell("bash tools/setup.sh --help", self.env).stderr
                missing = [a for a in command.argv[2:] if a not in usage]
                return f"setup.sh's usage lacks {missing}: {usage}" if missing else ""
        return ""

    def foreground(self, text: str, env: dict[str, str], ready, timeout_s: float = 120):
        """Start a command that serves until stopped, in its own process group; wait until ``ready()``."""
        out, err = self.work / f"fg-{len(self.background)}.out", self.work / f"fg-{len(self.background)}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            # Ctrl-C as in a terminal: a suite started in the background (`cmd &` in a script) passes SIGINT on
            # ignored, and Python then never raises KeyboardInterrupt
            proc = subprocess.Popen(["bash", "-c", f"exec {text}"], cwd=self.work, env=env, stdout=stdout,
                                    stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_terminal_signals)
        self.background.append(proc)
        deadline = time.monotonic() + timeout_s
        while not ready(out.read_text()):
            if proc.poll() is not None or time.monotonic() > deadline:
                return proc, out, err, f"not serving (exit {proc.poll()}): {err.read_text()[-500:]}"
            time.sleep(0.2)
        return proc, out, err, ""

    def foreground_dashboard(self, text: str, env: dict[str, str]) -> tuple[int | None, str]:
        proc, out, err, problem = self.foreground(text, env, lambda o: "farm dashboard on" in o)
        if not problem:
            url = re.search(r"on (http://\S+/)", out.read_text()).group(1)
            with urllib.request.urlopen(url + "api/state", timeout=30) as response:
                state = json.load(response)
            if not isinstance(state, dict):
                problem = f"/api/state answered {state!r}"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the README says
        rc = proc.wait(timeout=30)
        return rc, problem or judge("ok", rc, out.read_text(), err.read_text())

    def foreground_rpc_server(self, text: str, env: dict[str, str]) -> tuple[int | None, str]:
        key = shlex.split(text)[shlex.split(text).index("--key") + 1]
        proc, _, err, problem = self.foreground(text, env, lambda _: self.registered(key))
        if not problem:  # the README's next sentence: `farm devices` then shows it online
            devices = json.loads(self.shell(".venv/bin/farm devices --json", env).stdout)["devices"]
            state = {d["key"]: d["state"] for d in devices}.get(key)
            problem = "" if state == "online" else f"farm devices shows {key} as {state}"
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        return None, problem

    def stop_everything(self) -> None:
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for record in load_records(self.work / ".farm"):
            stop_process(record)

    def table(self) -> str:
        lines = [f"{'page:line':>26}  {'s':>5}  {'rc':>4}  {'expected':8}  command — why" + " " * 10]
        for r in self.rows:
            where = f"{r.command.page}:{r.command.line}"
            lines.append(f"{where:>26}  {r.seconds:5.1f}  {'' if r.rc is None else r.rc:>4}  {r.expected:8}  "
                         f"{r.command.text} — {r.why}" + (f"\n      PROBLEM: {r.problem}" if r.problem else "")
                         + (f"\n      {r.said}" if r.said and r.expected == "error" else ""))
        return "\n".join(lines)


def substitute(text: str, tracker) -> str:
    """The placeholders a reader fills in: their tracker's address; `...` (more arguments of their own) left out.
    A stock rpc_server started here binds loopback only (TVM's default is every interface)."""
    text = text.replace("TRACKER_HOST:9190", str(tracker))
    text = re.sub(r"\s\.\.\.(?=\s|$)", "", text)
    if text.startswith("python -m tvm.exec.rpc_server") and "--host" not in text:
        text += " --host 127.0.0.1"
    return text


def judge(expected: str, rc: int | None, stdout: str, stderr: str) -> str:
    """'' when the command did what it must, else what went wrong."""
    if "Traceback (most recent call last)" in stdout + stderr:
        return "a traceback: " + stderr[-800:]
    if "error: unexpected" in stderr:
        return "a farm bug: " + stderr[-500:]
    if expected == "ok":
        return "" if rc == 0 else f"exit {rc}: {stderr[-500:]}"
    last = [line for line in stderr.splitlines() if line.strip()][-2:]
    if rc != 1 or len(last) != 2 or not last[0].startswith("error: ") or not last[1].startswith("hint: "):
        return f"expected exit 1 with `error:` and `hint:` last; exit {rc}: {stderr[-500:]}"
    return ""


def port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((host, port)) != 0


def needs_farm(block: list[Command]) -> bool:
    """A block that uses the farm's tracker without starting it."""
    uses = any((c.farm and c.farm[0] in ("devices", "bench", "tune", "copies", "sweep") and "--kinds" not in c.farm)
               or c.argv[:3] == ("python", "-m", "tvm.exec.rpc_server") for c in block)
    return uses and not any(c.farm and c.farm[:2] == ("tracker", "start") for c in block)


@pytest.mark.slow  # 30 s on a quiet 2-core machine: a bring-up, two benches (tests/test_demo.py runs the demo)
def test_every_readme_command_runs_as_written(tmp_path):
    """Every command of README.md's shell blocks, in order."""
    walk_pages(tmp_path, (README,))


def newcomer_folder(tmp_path: Path) -> Path:
    """A fresh folder as a reader of the README has it: ``.venv`` and ``tools/`` linked in, the repository's
    devices.toml (free ports), the files the README has the reader bring."""
    venv = Path(sys.prefix)
    assert (venv / "bin" / "farm").exists(), f"the test runs README's .venv/bin/farm: install farm into {venv}"
    work = tmp_path / "newcomer"
    work.mkdir()
    (work / ".venv").symlink_to(venv)
    (work / "tools").symlink_to(REPO / "tools")
    (work / "devices.toml").write_text(newcomer_inventory((REPO / "devices.toml").read_text()))
    write_newcomer_files(work)
    return work


def readme_command(farm_args: tuple[str, ...]) -> Command:
    """The README's command that runs ``.venv/bin/farm`` with these arguments."""
    return next(c for block in page_blocks((README,)) for c in block if c.farm == farm_args)


def walk_pages(tmp_path: Path, pages: tuple[Path, ...]) -> None:
    """Every command of ``pages``' shell blocks, in order, in one fresh folder; README's bring-up (``farm tracker
    start``, ``farm serve``) before a block that uses the farm without starting it, README's ``farm down`` at the end."""
    work = newcomer_folder(tmp_path)
    blocks = page_blocks(pages)
    bring_up = [readme_command(args) for args in (("tracker", "start"), ("serve",))]
    stop = readme_command(("down",))
    newcomer = Newcomer(work)
    started = time.monotonic()
    try:
        for block in blocks:
            env = dict(newcomer.env)  # each block is a fresh shell
            if needs_farm(block) and not newcomer.tracker_up():
                for command in bring_up:
                    newcomer.run(command, env)
            for command in block:
                if command.argv[:1] == ("export",):
                    env.update(dict(word.split("=", 1) for word in command.argv[1:]))
                    continue
                newcomer.run(command, {**env, **dict(command.env)})
    finally:
        newcomer.run(stop, dict(newcomer.env))
        newcomer.stop_everything()
        print(f"\n{newcomer.table()}\n{time.monotonic() - started:.0f} s in all")
    problems = [r for r in newcomer.rows if r.problem]
    assert not problems, "README and docs commands that did not do what they must:\n" + newcomer.table()
