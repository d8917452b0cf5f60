"""Imports point down: the layering docs/ARCHITECTURE.md draws, checked with ast."""

import ast
import subprocess
import sys
from pathlib import Path

from farm.devices import kinds

PACKAGE = Path(__file__).resolve().parent.parent / "farm"

# module -> farm modules it may import (prefix match on dotted names)
ALLOWED = {
    "errors": set(),
    "records": {"errors"},  # InventoryError for a target with no kind farm knows
    "stats": set(),
    "inventory": {"errors", "records", "devices"},  # the kinds' field schemas (importing them imports no TVM)
    "store": {"errors", "manifest", "records", "stats"},  # manifest: a run's manifest stored by its digest
    "manifest": {"__init__"},  # what could move a run: its fields, digest and changes (farm's version: __init__)
    "models": {"errors", "op_classes", "records"},  # op_classes: onnxruntime's profile by TVM's op classes
    "op_classes": set(),  # a kernel's op class by its name, a node's by its op type
    "analysis": {"errors", "manifest", "records", "stats", "store"},  # judging the stored: no TVM, no device
    "procs": {"errors", "records"},  # the processes farm starts: pid registry, teardown on signals
    "rpc": {"errors", "procs", "records", "tvm_private"},  # rpc/server.py: TVM's _serving
    "devices": {"errors", "procs", "records", "rpc", "stats"},
    "compile": {"errors", "records", "models", "devices", "tvm_private"},  # MetaSchedule's normalize_mod
    "measure": {"errors", "manifest", "models", "op_classes", "records", "rpc", "devices", "stats", "__init__"},
    "tune": {"compile", "devices", "errors", "measure", "records", "rpc", "store", "tvm_private"},  # measure: the timer
    "sweep": {"errors", "records", "compile", "devices", "measure", "models", "rpc", "store", "tune"},  # tune: its records
    "signing": set(),  # the lab key's HMAC: the standard library only
    "lab": {"compile", "errors", "models", "records",  # procrastinate on the results' PostgreSQL; its worker
            "signing", "store", "sweep", "tune"},  # runs sweep's cells; signing: the lab key's signature on a library
    "views": {"analysis", "errors", "lab", "manifest",  # lab: the queue's state on the dashboard
              "records", "rpc", "stats", "store", "__init__"},  # rpc: the tracker's
    "night": {"analysis", "compile", "errors", "lab", "measure", "models", "records", "stats", "store", "sweep", "tune",
              "views"},  # a night's steps in order: measure, review, notify, tune, report
    "tvm_private": set(),  # TVM's private names farm relies on, each checked by tests/test_tvm_private.py
    "demo": {"devices", "inventory", "models", "procs", "records", "rpc", "store", "sweep", "tune", "views"},
    "cli": {"*"},
    "__init__": set(),
}
TVM_OWNERS = {"rpc", "compile", "measure", "tune", "tvm_private"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_farm_imports_point_down():
    problems = []
    for path in PACKAGE.rglob("*.py"):
        layer = _layer(path)
        if layer not in ALLOWED:
            problems.append(f"{path.relative_to(PACKAGE)} has no row in ALLOWED: add what it may import (then "
                            "tools/gen_docs.py writes docs/ARCHITECTURE.md's table)")
            continue
        allowed = ALLOWED[layer]
        for name in _imports(path):
            if name == "farm":
                target = "__init__"
            elif name.startswith("farm."):
                target = name.split(".")[1]
            else:
                continue
            if "*" not in allowed and target not in allowed and target != layer:
                problems.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert problems == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Each module of farm/ -> the farm modules it imports, anywhere in it (in functions too).

    ``from P import name`` is an import of module ``P.name`` when that is a module, else of ``P``. The package
    ``__init__`` Python runs before a submodule is not an edge (a package's __init__ may import its modules)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from ..y import z
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                imported.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle once, as a path that starts and ends at its least module: [a, b, a]."""
    found: dict[frozenset[str], list[str]] = {}

    def walk(path: list[str]) -> None:
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                cycle = [*path, nxt]
                found.setdefault(frozenset(cycle), cycle)
            elif nxt not in path and nxt > path[0]:  # each circle is walked from its least module only
                walk([*path, nxt])

    for start in sorted(graph):
        walk([start])
    return sorted(found.values())


def test_the_cycle_finder_reports_each_circle_once_with_its_path():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "a"], ["a", "b", "c", "a"], ["e", "e"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_module_imports_another_in_a_circle():
    """Module by module, function-level imports included: a circle hidden in a function (devices/emulated.py ↔
    devices/opencl_runtime.py was one) is a layering the diagram cannot draw."""
    graph = _module_graph()
    assert {"farm.devices.board", "farm.devices.emulated", "farm.compile"} <= set(graph)  # the graph sees farm
    assert "farm.devices.board" in graph["farm.devices.opencl_runtime"]  # function-level and from-imports count
    circles = [" -> ".join(cycle) for cycle in _cycles(graph)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


def test_only_owners_import_tvm():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if any(n == "tvm" or n.startswith("tvm.") for n in _imports(p)) and _layer(p) not in TVM_OWNERS]
    assert offenders == []


def test_only_store_writes_sqlite():
    """The results are the store's; the queue's tables (on the same PostgreSQL) are the queue's."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if {"sqlite3", "psycopg"} & _imports(p) and _layer(p) != "store"
                 and _module_name(p) not in ("farm.lab.queue", "farm.lab.reach")]
    assert offenders == []


def test_only_the_queue_imports_procrastinate():
    """The lab's job queue is behind one module: another engine would change farm/lab/queue.py only."""
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if any(n.split(".")[0] == "procrastinate" for n in _imports(p)) and _module_name(p) != "farm.lab.queue"]
    assert offenders == [] and "procrastinate" in _imports(PACKAGE / "lab" / "queue.py")


READ_SIDE = ("analysis", "views", "stats", "store")


def test_the_read_side_never_imports_a_device_kind():
    """What reads the store renders what was stored: it must work without (and never start) a device."""
    offenders = [f"{p.relative_to(PACKAGE)} imports {name}" for p in PACKAGE.rglob("*.py") if _layer(p) in READ_SIDE
                 for name in _imports(p) if name == "farm.devices" or name.startswith("farm.devices.")]
    assert offenders == []


def test_the_inventory_and_the_kinds_import_no_tvm():
    """Every verb reads the inventory, which reads the kinds' fields: importing TVM there would cost seconds."""
    code = ("import sys, farm.inventory, farm.devices, farm.rpc.tracker; farm.devices.kinds(); "
            "print(sorted(m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')))")  # `farm devices` too
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _compares_a_device_kind(node: ast.Compare, names: set[str]) -> bool:
    sides = [node.left, *node.comparators]
    about_kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" or isinstance(s, ast.Name) and s.id == "kind"
                     for s in sides)
    constants = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    tables = [s for s in sides if isinstance(s, ast.Name) and s.id.isupper()]  # e.g. `device.kind in HOST_KINDS`
    return about_kind and bool(constants & names or tables)


def test_no_module_branches_on_a_device_kind_outside_the_kinds():
    """farm asks the kind (farm/devices/kind.py) instead of comparing ``device.kind`` with a name."""
    names = set(kinds())
    kind_modules = {Path(type(k).__module__.replace(".", "/") + ".py").name for k in kinds().values()}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "devices" and path.name in kind_modules:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and _compares_a_device_kind(node, names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


# Outside farm/cli (which ends a command on a FarmError: error:, hint:, exit 1), the modules that catch one, and
# why: each turns it into a result or waits and retries (docs/ARCHITECTURE.md, "Where a FarmError is caught").
# A handler that only re-raises (`except BuildError: raise`, so the `except Exception` below it translates only
# third-party errors) catches nothing and is not listed.
CATCHERS = {
    "farm.compile.child": "a compile's FarmError in its own process crosses back as (message, hint): a BuildError here",
    "farm.night.confirmation": "a rerun that fails leaves the alert 'unknown' with the reason",
    "farm.views.dashboard": "a tracker or database that fails is shown on the page; the server keeps serving",
    "farm.views.dashboard_server": "a refused comparison or triage: a 404 or 400 with the reason",
    "farm.devices": "the watchdog reports a restart that failed and keeps watching; a server it cannot stop stays recorded",
    "farm.devices.adb_shell": "a program of its own (python -m): error: and exit 1, as the CLI",
    "farm.devices.cache": "setup_step: a cached build run as a program (setup.sh): error: and exit 1, as the CLI",
    "farm.devices.emulated": "prerequisites(): what this host lacks, as text (farm devices --kinds); no arm64 POCL: "
                             "the board without a GPU driver (a warning)",
    "farm.devices.health": "a device whose health cannot be read: the gate's outcome 'unreadable', and measure on",
    "farm.devices.opencl_runtime": "missing(): what this host lacks; a bundle without OpenCL; main(): missing sources "
                                   "are a warning",
    "farm.night.tuning": "a tuning session or validation that fails is a line of the night's outcome; the sweep stands",
    "farm.measure.copies": "a failed session is a failed copy curve, with its reason",
    "farm.measure.steps": "a failed session is a stored failed run at step 'session'",
    "farm.measure.profile": "a profile that fails is 'not available' with the reason; the run stands",
    "farm.measure.reference": "a reference runtime that fails is its stored failed result; the TVM figure stands",
    "farm.rpc.probe": "a probe's state: busy or unreachable, with the reason",
    "farm.rpc.launch": "start_tracker waits for the tracker it started, then raises its own TrackerError",
    "farm.rpc.tracker": "wait_for_tracker polls until its deadline, then re-raises",
    "farm.store.backends": "a write or read whose connection the server dropped runs again on a new one until "
                           "RECONNECT_S, then raises ConnectionLost",
    "farm.lab.follow": "a host given up: its cells stored offline, a model that no longer loads stored under its name",
    "farm.lab.leases": "a lease renewal that fails is logged and tried at the next beat (the lease outlives five)",
    "farm.sweep.cell": "a cell's failure is a stored failed cell (its compile's error, a CPU fallback refused, with why)",
    "farm.sweep.inputs": "a reference that cannot be read or computed: the output check skipped",
    "farm.lab.worker": "a build job's failure is recorded for its cell, which compiles on its own host; so is an "
                       "artifact from the lab's store whose sha256 fails its check, or a host without the toolchain; a "
                       "result refused for a lost lease is a log line and the job's outcome",
    "farm.sweep.run": "a write that fails loses one cell (or copy curve), not the sweep; a tracker that does not answer "
                      "says nothing offline",
    "farm.tune.metaschedule": "a candidate whose key's servers are all busy asks again (BUSY_RETRIES), then raises",
    "farm.tune.database": "seeds by anchor block whose timing fails: the search starts without them",
    "farm.tune.session": "a tracker that stops answering ends the session as 'device-lost'",
    "farm.tune.steps": "a task profile that fails: MetaSchedule's scheduler shares the trials",
}


def _farm_errors() -> set[str]:
    import farm.errors

    return {name for name, value in vars(farm.errors).items()
            if isinstance(value, type) and issubclass(value, farm.errors.FarmError)}


def _catches(handler: ast.ExceptHandler, errors: set[str]) -> bool:
    """Whether ``handler`` names a FarmError class and does more than re-raise it."""
    named = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(handler.type)
             if isinstance(n, (ast.Name, ast.Attribute))} if handler.type is not None else set()
    only_reraises = len(handler.body) == 1 and isinstance(handler.body[0], ast.Raise) and handler.body[0].exc is None
    return bool(named & errors) and not only_reraises


def test_farm_errors_are_caught_where_the_architecture_page_says():
    errors = _farm_errors()
    assert {"FarmError", "StoreError", "DeviceUnavailable"} <= errors
    catchers = set()
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if name == "farm.cli" or name.startswith("farm.cli."):
            continue
        if any(isinstance(node, ast.ExceptHandler) and _catches(node, errors) for node in ast.walk(ast.parse(path.read_text()))):
            catchers.add(name)
    assert sorted(catchers) == sorted(CATCHERS), "update CATCHERS and docs/ARCHITECTURE.md (Where a FarmError is caught)"


def test_the_cli_keeps_no_rule_of_its_own():
    """cli/ parses, calls the library, prints and exits (#66): no verb module keeps a number at module level (a
    threshold, a count, a budget: those are the library's, named where they are used), and none runs SQL."""
    offenders = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is not None and not any(isinstance(c, ast.Call) for c in ast.walk(value)) and any(
                    isinstance(c, ast.Constant) and type(c.value) in (int, float) for c in ast.walk(value)):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: a number at module level")
        offenders += [f"{path.relative_to(PACKAGE)}:{n.lineno}: SQL" for n in ast.walk(tree)
                      if isinstance(n, ast.Call) and getattr(n.func, "attr", "") in ("execute", "executemany", "dicts")]
    assert offenders == []
