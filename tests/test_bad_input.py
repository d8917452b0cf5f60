"""Every verb with bad values and bad files: a non-zero exit, one `error:` line and a hint, no traceback, and the
results database unchanged. Real `farm` processes against a real SQLite file holding a real run."""

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from farm.models import load_model
from farm.records import BenchConfig, BenchResult, CheckResult, Device
from farm.procs.supervise import free_port
from farm.store import Store
from tests.conftest import run_farm, write_inventory

# value errors argparse refuses (exit 2) before anything runs
ARGUMENT_ERRORS = [
    ("bench", "--device", "cpu", "--model", "mlp", "--repeat", "0"),
    ("bench", "--device", "cpu", "--model", "mlp", "--repeat", "x"),
    ("bench", "--device", "cpu", "--model", "mlp", "--number", "-2"),
    ("bench", "--device", "cpu", "--model", "mlp", "--timeout", "-1"),
    ("bench", "--device", "cpu", "--model", "mlp", "--min-repeat-ms", "-5"),
    ("bench", "--device", "cpu", "--model", "mlp", "--rtol", "nan"),
    ("sweep", "--retries", "-1"),
    ("sweep", "--resume", "abc"),
    ("regressions", "--sweep", "abc"),
    ("report", "--sweep", "0"),
    ("compare", "1", "x"),
    ("tune", "--device", "cpu", "--model", "mlp", "--trials", "-5"),
    ("tune", "--device", "cpu", "--model", "mlp", "--per-task", "0"),
    ("tune", "--device", "cpu", "--model", "mlp", "--population", "0"),
    ("tracker", "start", "--port", "70000"),
    ("serve", "--tracker", "foo"),
    ("serve", "--tracker", "127.0.0.1:port"),
    ("serve", "--wait", "-1"),
    ("phones", "--adb", "foo"),
    ("devices", "--probe", "--timeout", "0"),
    ("dashboard", "--port", "0"),
    ("copies", "--device", "cpu", "--size", "0"),
    ("nosuchverb",),
]

# files and values only farm can judge (exit 1): (name, argv with {tmp}, what the error line says)
FARM_ERRORS = [
    ("no inventory", ("--devices", "{tmp}/missing.toml", "bench", "--device", "cpu", "--model", "mlp"), "missing.toml"),
    ("inventory not TOML", ("--devices", "{tmp}/broken.toml", "devices"), "broken.toml"),
    ("inventory binary", ("--devices", "{tmp}/junk.bin", "devices"), "junk.bin"),
    ("inventory wrong type", ("--devices", "{tmp}/wrongtype.toml", "devices"), "target"),
    ("no sweep file", ("sweep", "--file", "{tmp}/missing-sweep.toml"), "does not exist"),
    ("sweep file typo", ("sweep", "--file", "{tmp}/typo.toml"), "repeats"),
    ("sweep file bad value", ("sweep", "--file", "{tmp}/badvalue.toml"), "repeat"),
    ("sweep file not TOML", ("sweep", "--file", "{tmp}/junk.bin"), "TOML"),
    ("sweep file bad shapes", ("sweep", "--file", "{tmp}/shapes.toml"), "shapes"),
    ("sweep file is a folder", ("sweep", "--file", "{tmp}"), "cannot read"),
    ("db not a database", ("--db", "{tmp}/junk.bin", "results"), "junk.bin"),
    ("db is a folder", ("--db", "{tmp}", "results"), ""),
    ("db newer schema", ("--db", "{tmp}/newer.db", "results"), "newer"),
    ("db absent", ("--db", "{tmp}/absent.db", "results"), "absent.db"),
    ("no model file", ("compile", "--device", "cpu", "--model", "{tmp}/missing.onnx"), "missing.onnx"),
    ("model not ONNX", ("compile", "--device", "cpu", "--model", "{tmp}/junk.onnx"), "not a valid ONNX model"),
    ("bad shape", ("compile", "--device", "cpu", "--model", "mlp", "--shape", "x=abc"), "--shape"),
    ("unknown device", ("bench", "--device", "nosuch", "--model", "mlp"), "nosuch"),
    ("unknown model", ("compile", "--device", "cpu", "--model", "nosuchmodel"), "nosuchmodel"),
    ("no such sweep to resume", ("sweep", "--resume", "999"), "999"),
    ("no such runs", ("compare", "998", "999"), "998"),
    ("report of no sweep", ("report", "--sweep", "999", "--out", "{tmp}/r.html"), "999"),
    ("regressions of no sweep", ("regressions", "--sweep", "999"), "999"),
    ("tune import from nowhere", ("tune", "--device", "cpu", "--model", "mlp", "--trials", "0", "--import",
                                  "{tmp}/nowhere"), "nowhere"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """An inventory (its tracker port unused: nothing here may reach a device), a database with one real run,
    and the bad files."""
    tmp = tmp_path_factory.mktemp("bad-input")
    write_inventory(tmp / "devices.toml", '[devices.cpu]\nkind = "local"\nkey = "cpu"\n'
                    'target = { kind = "llvm", num-cores = 2 }\n', free_port())
    model = load_model("mlp")
    with Store(tmp / "results.db") as store:
        store.record_result(BenchResult(
            device="cpu", key="cpu", model="mlp", model_digest=model.digest, status="ok", load_s=0.5,
            first_run_s=0.01, steady_number=10, steady_samples_s=(0.002, 0.001, 0.003),
            check=CheckResult("passed", 1e-7, 1e-4, 1e-4, "onnxruntime"), config=BenchConfig(),
            context={"farm_version": "0.1.0", "tvm_version": "0.27"}), Device("cpu", "local", "cpu", {"kind": "llvm"}),
            model, None)
    (tmp / "broken.toml").write_text("[devices.cpu\nkind = 'local'\n")
    (tmp / "wrongtype.toml").write_text('[devices.cpu]\nkind = "local"\nkey = "cpu"\ntarget = 5\n')
    (tmp / "typo.toml").write_text("[bench]\nrepeats = 5\n")
    (tmp / "badvalue.toml").write_text('[bench]\nrepeat = "5"\n')
    (tmp / "shapes.toml").write_text('[shapes.mlp]\nx = [1, "a"]\n')
    (tmp / "junk.bin").write_bytes(b"\x00\xff not toml, not sqlite " * 50)
    (tmp / "junk.onnx").write_bytes(b"not a model at all" * 10)
    shutil.copy(tmp / "results.db", tmp / "newer.db")
    with sqlite3.connect(tmp / "newer.db") as db:
        db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    return tmp


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(lab: Path, argv: tuple[str, ...]):
    env = {"FARM_HOME": str(lab / "home"), "FARM_DB": str(lab / "results.db"), "FARM_DEVICES": str(lab / "devices.toml")}
    before = _digest(lab / "results.db")
    proc = run_farm(*(a.replace("{tmp}", str(lab)) for a in argv), env=env, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert any(line.startswith("hint: ") for line in proc.stderr.splitlines()), proc.stderr
    assert _digest(lab / "results.db") == before  # nothing measured is lost or changed
    return proc, errors[0]


@pytest.mark.parametrize("argv", ARGUMENT_ERRORS, ids=[" ".join(a) for a in ARGUMENT_ERRORS])
def test_a_bad_value_is_refused_by_argparse_in_one_line(lab, argv):
    proc, error = _run(lab, argv)
    assert proc.returncode == 2, proc.stderr
    assert error.startswith(f"error: farm {argv[0]}: argument") or argv == ("nosuchverb",)


@pytest.mark.parametrize("name,argv,says", FARM_ERRORS, ids=[c[0] for c in FARM_ERRORS])
def test_a_bad_file_or_name_is_one_error_line_with_a_hint(lab, name, argv, says):
    proc, error = _run(lab, argv)
    assert proc.returncode == 1, proc.stderr
    assert says.replace("{tmp}", str(lab)) in error, error


def test_a_read_only_reader_of_an_older_database_says_how_to_upgrade_it(lab, tmp_path):
    from farm.views.dashboard import collect_state
    from farm.inventory import load_inventory

    old = tmp_path / "old.db"
    shutil.copy(lab / "results.db", old)
    with sqlite3.connect(old) as db:  # what an older farm left: no summaries yet
        db.execute("DROP TABLE summaries")
        db.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    before = _digest(old)
    state = collect_state(load_inventory(lab / "devices.toml"), old)
    assert "older farm" in state["tracker_error"] and state["runs"] == []
    assert _digest(old) == before


def test_a_locked_database_is_a_store_error_not_a_traceback(lab, tmp_path):
    from farm.errors import StoreError

    path = tmp_path / "locked.db"
    shutil.copy(lab / "results.db", path)
    with Store(path) as store:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # another process mid-write
        try:
            store._db.db.execute("PRAGMA busy_timeout = 100")  # do not wait the usual 30 s here
            with pytest.raises(StoreError) as info:
                store.start_sweep({"devices": []})  # a write: WAL lets reads through a writer
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    assert "locked" in info.value.message and "another farm process" in info.value.hint
