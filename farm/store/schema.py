"""The results database's schema, written once in SQLite's dialect; ``postgres_ddl`` translates it.

SCHEMA_VERSION history:
  1  devices, models, artifacts, runs, samples (steady + copy), copies, checks
  2  tuning: tune_sessions, tune_workloads, tune_records; artifacts.tuning_digest/tuned_tasks/total_tasks;
     runs.tuned
  3  sweeps; runs.sweep_id, runs.attempt
  4  alerts (regression verdicts with method, baseline and confirmation, reproducible)
  5  probes (device health checks)
  6  GPUs: runs.load_warm_s/first_run_warm_s (cold vs warm first run), runs.steady_clock (what the steady
     samples measure: wall | kernel | device), runs.steady_wall_number + samples metric 'steady_wall',
     runs.fallback_of (the failed GPU run a CPU run stands in for); copy_curves + copy_curve_samples
  7  index runs_series (device, model, tuned, id): a series' latest run without scanning every run
     (the report's latest-per-cell at 50,000 runs)
  8  summaries: each run's (metric, series) summary written with its samples (stats.summarize_rows, the
     one rule), so no read of runs touches the raw samples; the migration computes them for the runs
     already stored (``Store._summarize_stored``). meta 'summary_rule' names the rule that wrote them.
  9  reference runtimes: runs.runtime ('tvm', or onnxruntime | litert | torch timed beside it, with no
     artifact: artifact_key '') and runs.runtime_version; a series' latest run is per runtime too (index
     runs_series); alerts.runtime, and an alert is one per (sweep, device, model, tuned, runtime, metric): the
     table is rebuilt for the new key (ids kept; PostgreSQL's id sequence moved past them: RESEQUENCE)
 10  tune_cost_models: the XGBoost cost model of a tuning key (farm/tune/costmodel.py's .npz, base64: data only),
     saved after each session and loaded by the next one
 11  memory (#21): artifacts.params_bytes/planned_host_bytes/planned_device_bytes/planned_dynamic (planned memory
     read from the built module), the same three on runs (carried from the run's artifact), and runs'
     rss_before_load_bytes/rss_after_load_bytes/rss_peak_bytes (the session process's RSS; NULL: not measured).
     BIGINT: bytes pass PostgreSQL's 32-bit INTEGER
 12  findings (#22): a finding (farm/analysis/findings/) per key with its triage state (new | acknowledged | expected |
     fixed) and its first and last sweep; finding_sweeps, its body as each sweep ranked it; confirmation_budgets,
     what a sweep's confirmation spent and left unconfirmed
 13  reviewed_sweeps: every sweep reviewed (``Store.record_findings``), with findings or none, so a finding that
     vanished for a reviewed night and came back is new again; filled from finding_sweeps and
     confirmation_budgets (the reviews schema 12 can tell)
 14  threads (#33): runs.threads, the CPU threads the run used as its session reported them (runtime.NumThreads) or,
     for a reference runtime, as it was given (TVM's reported count); NULL for runs stored before (not known). A
     series' context holds the count (series.context_of), so a change of threads starts a new series
 15  models.ops (#32): the operator types a model's graph contains (``ModelSource.ops``; '[]': not known), so a
     finding can name the models it concerns by an op they share ("models with depthwise convolution")
 16  runs.cell_key (#30): 'SWEEP/DEVICE/MODEL/RUNTIME/ATTEMPT' for a sweep's measured attempt (NULL for runs outside a
     sweep, for offline cells and for runs stored before), unique: a cell's job delivered twice stores its result once
 17  night_tunings (#30): what a sweep's nightly tuning did for each device key (``night.tuning.NightTuning`` as JSON, in
     order), stored by whoever tuned it: the sweep's process on one host, a lab host's worker over several
 18  compiles as jobs (#30): artifact_files, an artifact's library by its cache key (bytes, their sha256, its
     metadata), the store every lab host reads; sweep_builds, what a queued sweep's build job made for a cell (the
     artifact's key, or the build's error) and which worker built it
 19  the lab under faults (#50): copy_curves.curve_key 'SWEEP/DEVICE/ATTEMPT' (NULL outside a sweep), unique: a
     redelivered curve job stores its curve once; device_leases, who holds each device for a lab's cell (holder,
     epoch, expiry in the database's own clock, released): a result is stored only by the holder of the epoch it
     measured under (``Store.record_cell``), so a frozen worker's late result is refused, not stored twice
 20  profiles (#52): a run's per-kernel profile (``records.KernelProfile``), written with its run in the same
     transaction; a row of its own per run: its sums (kernel_sum_s, by_class: op class -> seconds, JSON) for reads
     of many runs, the kernels as one JSON array of rows (``store.runs.PROFILE_FIELDS``), zlib-compressed (a 60-kernel
     profile in ~2 KB), read only for the runs asked for, so no read of runs, summaries or samples touches it;
     status 'not available' keeps the reason
 21  writes whose acknowledgement was lost (#61): sweeps.start_key, unique, a token made once per ``start_sweep``
     call; and runs.cell_key (schema 16) and copy_curves.curve_key (19) now also for runs and curves outside a sweep
     and for offline cells: 'write/TOKEN/DEVICE/RUNTIME', a token made once per write. A write run again after a
     reconnect (``backends.retried``) whose first commit had landed finds its rows, and stores nothing twice: a
     retried farm bench no longer stored a second run, nor a retried start_sweep an orphan sweep "running"
 22  run manifests (#63): manifests, each distinct manifest (``farm.manifest``: what could move a run besides the code
     under test: farm's commit, TVM's build, the toolchain, the records applied, the device's software) once, by its
     sha256; runs.manifest names it (NULL: stored before farm read one, all unknown)
 23  triage with an audit trail (#65): finding_events, each change of a finding's triage state (at, author, from, to,
     note, bug URL, the finding it duplicates, the sweep it was on); findings.bug and findings.duplicate_of; index
     alerts_series (a series' alerts, for its page). A finding's state now carries to the nights it returns on within
     a few reviewed nights (schema 13 started a returning finding as new; ``findings._carried``); a fixed one that
     returns on a later night is reopened, with an event saying so
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 23

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE devices (
        name TEXT PRIMARY KEY, key TEXT NOT NULL, kind TEXT NOT NULL, target TEXT NOT NULL,
        emulated INTEGER NOT NULL, tags TEXT NOT NULL, context TEXT NOT NULL,
        first_seen TEXT NOT NULL, last_seen TEXT NOT NULL);
    CREATE TABLE models (
        digest TEXT PRIMARY KEY, name TEXT NOT NULL, origin TEXT NOT NULL, inputs TEXT NOT NULL,
        first_seen TEXT NOT NULL);
    CREATE TABLE artifacts (
        cache_key TEXT PRIMARY KEY, model_digest TEXT NOT NULL, target TEXT NOT NULL, export TEXT NOT NULL,
        toolchain TEXT NOT NULL, tvm_version TEXT NOT NULL, file_digest TEXT NOT NULL, path TEXT NOT NULL,
        build_s REAL NOT NULL, created_at TEXT NOT NULL);
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, device TEXT NOT NULL, key TEXT NOT NULL,
        model TEXT NOT NULL, model_digest TEXT NOT NULL, artifact_key TEXT NOT NULL, status TEXT NOT NULL,
        failed_step TEXT NOT NULL, reason TEXT NOT NULL, upload_s REAL, load_s REAL, first_run_s REAL,
        steady_number INTEGER, steady_repeat INTEGER NOT NULL, min_repeat_ms REAL NOT NULL,
        emulated INTEGER NOT NULL, farm_version TEXT NOT NULL, tvm_version TEXT NOT NULL,
        context TEXT NOT NULL, config TEXT NOT NULL);
    CREATE INDEX runs_device_model ON runs (device, model, started_at);
    CREATE TABLE samples (
        run_id INTEGER NOT NULL REFERENCES runs(id), metric TEXT NOT NULL, series INTEGER NOT NULL,
        idx INTEGER NOT NULL, value_s REAL NOT NULL, number INTEGER NOT NULL,
        PRIMARY KEY (run_id, metric, series, idx));
    CREATE TABLE copies (
        run_id INTEGER NOT NULL REFERENCES runs(id), output_index INTEGER NOT NULL, nbytes INTEGER NOT NULL,
        shape TEXT NOT NULL, dtype TEXT NOT NULL, number INTEGER NOT NULL,
        PRIMARY KEY (run_id, output_index));
    CREATE TABLE checks (
        run_id INTEGER PRIMARY KEY REFERENCES runs(id), status TEXT NOT NULL, max_abs_err REAL,
        rtol REAL, atol REAL, reference TEXT NOT NULL, detail TEXT NOT NULL);
    """,
    2: """
    ALTER TABLE artifacts ADD COLUMN tuning_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE artifacts ADD COLUMN tuned_tasks INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE artifacts ADD COLUMN total_tasks INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN tuned INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE tune_sessions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, finished_at TEXT, device TEXT NOT NULL,
        key TEXT NOT NULL, model TEXT NOT NULL, model_digest TEXT NOT NULL, tuning_key TEXT NOT NULL,
        target TEXT NOT NULL, tvm_version TEXT NOT NULL, trials_requested INTEGER NOT NULL,
        trials_done INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '');
    CREATE TABLE tune_workloads (
        tuning_key TEXT NOT NULL, sha TEXT NOT NULL, line TEXT NOT NULL, added_at TEXT NOT NULL,
        PRIMARY KEY (tuning_key, sha));
    CREATE TABLE tune_records (
        tuning_key TEXT NOT NULL, sha TEXT NOT NULL, workload_sha TEXT NOT NULL, body TEXT NOT NULL,
        run_s REAL, session_id INTEGER, added_at TEXT NOT NULL,
        PRIMARY KEY (tuning_key, sha));
    """,
    3: """
    CREATE TABLE sweeps (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, finished_at TEXT, status TEXT NOT NULL,
        spec TEXT NOT NULL);
    ALTER TABLE runs ADD COLUMN sweep_id INTEGER REFERENCES sweeps(id);
    ALTER TABLE runs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX runs_sweep ON runs (sweep_id, device, model);
    """,
    4: """
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        sweep_id INTEGER NOT NULL, device TEXT NOT NULL, model TEXT NOT NULL, tuned INTEGER NOT NULL,
        metric TEXT NOT NULL, run_id INTEGER NOT NULL, baseline_run_id INTEGER, status TEXT NOT NULL,
        value REAL NOT NULL, z REAL, change REAL, baseline TEXT NOT NULL, method TEXT NOT NULL,
        confirmation TEXT NOT NULL DEFAULT '{}',
        UNIQUE (sweep_id, device, model, tuned, metric));
    """,
    5: """
    CREATE TABLE probes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, device TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL,
        state TEXT NOT NULL, reason TEXT NOT NULL, latency_s REAL);
    CREATE INDEX probes_device ON probes (device, at);
    """,
    6: """
    ALTER TABLE runs ADD COLUMN load_warm_s REAL;
    ALTER TABLE runs ADD COLUMN first_run_warm_s REAL;
    ALTER TABLE runs ADD COLUMN steady_clock TEXT NOT NULL DEFAULT 'wall';
    ALTER TABLE runs ADD COLUMN steady_wall_number INTEGER;
    ALTER TABLE runs ADD COLUMN fallback_of INTEGER;
    CREATE TABLE copy_curves (
        id INTEGER PRIMARY KEY AUTOINCREMENT, started_at TEXT NOT NULL, device TEXT NOT NULL, key TEXT NOT NULL,
        device_type TEXT NOT NULL, status TEXT NOT NULL, reason TEXT NOT NULL, sweep_id INTEGER,
        context TEXT NOT NULL);
    CREATE TABLE copy_curve_samples (
        curve_id INTEGER NOT NULL REFERENCES copy_curves(id), direction TEXT NOT NULL, nbytes INTEGER NOT NULL,
        idx INTEGER NOT NULL, value_s REAL NOT NULL, number INTEGER NOT NULL,
        PRIMARY KEY (curve_id, direction, nbytes, idx));
    """,
    7: """
    CREATE INDEX runs_series ON runs (device, model, tuned, id);
    """,
    8: """
    CREATE TABLE summaries (
        run_id INTEGER NOT NULL REFERENCES runs(id), metric TEXT NOT NULL, series INTEGER NOT NULL,
        n INTEGER NOT NULL, median REAL NOT NULL, mean REAL NOT NULL, p10 REAL NOT NULL, p90 REAL NOT NULL,
        min REAL NOT NULL, max REAL NOT NULL, cv REAL NOT NULL, mad REAL NOT NULL, ci_low REAL NOT NULL,
        ci_high REAL NOT NULL, unstable INTEGER NOT NULL,
        PRIMARY KEY (run_id, metric, series));
    """,
    9: """
    ALTER TABLE runs ADD COLUMN runtime TEXT NOT NULL DEFAULT 'tvm';
    ALTER TABLE runs ADD COLUMN runtime_version TEXT NOT NULL DEFAULT '';
    DROP INDEX runs_series;
    CREATE INDEX runs_series ON runs (device, model, tuned, runtime, id);
    CREATE TABLE alerts_v9 (
        id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        sweep_id INTEGER NOT NULL, device TEXT NOT NULL, model TEXT NOT NULL, tuned INTEGER NOT NULL,
        runtime TEXT NOT NULL DEFAULT 'tvm', metric TEXT NOT NULL, run_id INTEGER NOT NULL, baseline_run_id INTEGER,
        status TEXT NOT NULL, value REAL NOT NULL, z REAL, change REAL, baseline TEXT NOT NULL, method TEXT NOT NULL,
        confirmation TEXT NOT NULL DEFAULT '{}',
        UNIQUE (sweep_id, device, model, tuned, runtime, metric));
    INSERT INTO alerts_v9 (id, created_at, updated_at, sweep_id, device, model, tuned, metric, run_id, baseline_run_id,
        status, value, z, change, baseline, method, confirmation)
        SELECT id, created_at, updated_at, sweep_id, device, model, tuned, metric, run_id, baseline_run_id,
        status, value, z, change, baseline, method, confirmation FROM alerts;
    DROP TABLE alerts;
    ALTER TABLE alerts_v9 RENAME TO alerts;
    RESEQUENCE alerts
    """,
    10: """
    CREATE TABLE tune_cost_models (
        tuning_key TEXT PRIMARY KEY, body TEXT NOT NULL, format TEXT NOT NULL, samples INTEGER NOT NULL,
        session_id INTEGER, updated_at TEXT NOT NULL);
    """,
    11: """
    ALTER TABLE artifacts ADD COLUMN params_bytes BIGINT;
    ALTER TABLE artifacts ADD COLUMN planned_host_bytes BIGINT;
    ALTER TABLE artifacts ADD COLUMN planned_device_bytes BIGINT;
    ALTER TABLE artifacts ADD COLUMN planned_dynamic INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE runs ADD COLUMN params_bytes BIGINT;
    ALTER TABLE runs ADD COLUMN planned_host_bytes BIGINT;
    ALTER TABLE runs ADD COLUMN planned_device_bytes BIGINT;
    ALTER TABLE runs ADD COLUMN rss_before_load_bytes BIGINT;
    ALTER TABLE runs ADD COLUMN rss_after_load_bytes BIGINT;
    ALTER TABLE runs ADD COLUMN rss_peak_bytes BIGINT;
    """,
    12: """
    CREATE TABLE findings (
        id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kind TEXT NOT NULL, metric TEXT NOT NULL,
        first_sweep INTEGER NOT NULL, last_sweep INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'new',
        note TEXT NOT NULL DEFAULT '', created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE INDEX findings_key ON findings (key, last_sweep);
    CREATE TABLE finding_sweeps (
        finding_id INTEGER NOT NULL REFERENCES findings(id), sweep_id INTEGER NOT NULL, position INTEGER NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (finding_id, sweep_id));
    CREATE INDEX finding_sweeps_sweep ON finding_sweeps (sweep_id, position);
    CREATE TABLE confirmation_budgets (
        sweep_id INTEGER PRIMARY KEY, budget_s REAL NOT NULL, spent_s REAL NOT NULL, rerun INTEGER NOT NULL,
        left_unconfirmed INTEGER NOT NULL, updated_at TEXT NOT NULL);
    """,
    13: """
    CREATE TABLE reviewed_sweeps (sweep_id INTEGER PRIMARY KEY, reviewed_at TEXT NOT NULL);
    INSERT INTO reviewed_sweeps (sweep_id, reviewed_at) SELECT sweep_id, '' FROM
        (SELECT sweep_id FROM finding_sweeps UNION SELECT sweep_id FROM confirmation_budgets) AS reviewed;
    """,
    14: """
    ALTER TABLE runs ADD COLUMN threads INTEGER;
    """,
    15: """
    ALTER TABLE models ADD COLUMN ops TEXT NOT NULL DEFAULT '[]';
    """,
    16: """
    ALTER TABLE runs ADD COLUMN cell_key TEXT;
    CREATE UNIQUE INDEX runs_cell_key ON runs (cell_key);
    """,
    17: """
    CREATE TABLE night_tunings (
        sweep_id INTEGER NOT NULL, device TEXT NOT NULL, position INTEGER NOT NULL, body TEXT NOT NULL,
        stored_at TEXT NOT NULL, PRIMARY KEY (sweep_id, device, position));
    """,
    18: """
    CREATE TABLE artifact_files (
        cache_key TEXT PRIMARY KEY, file_digest TEXT NOT NULL, bytes BIGINT NOT NULL, meta TEXT NOT NULL,
        data BLOB NOT NULL, stored_at TEXT NOT NULL);
    CREATE TABLE sweep_builds (
        sweep_id INTEGER NOT NULL, device TEXT NOT NULL, model TEXT NOT NULL, cache_key TEXT, error TEXT,
        hint TEXT, builder TEXT NOT NULL, build_s REAL, stored_at TEXT NOT NULL,
        PRIMARY KEY (sweep_id, device, model));
    """,
    19: """
    ALTER TABLE copy_curves ADD COLUMN curve_key TEXT;
    CREATE UNIQUE INDEX copy_curves_curve_key ON copy_curves (curve_key);
    CREATE TABLE device_leases (
        device TEXT PRIMARY KEY, holder TEXT NOT NULL, epoch INTEGER NOT NULL, expires_s REAL NOT NULL,
        released INTEGER NOT NULL, previous TEXT NOT NULL, taken_at TEXT NOT NULL);
    """,
    20: """
    CREATE TABLE profiles (
        run_id INTEGER PRIMARY KEY, status TEXT NOT NULL, reason TEXT NOT NULL, clock TEXT NOT NULL,
        runs INTEGER NOT NULL, main_s REAL NOT NULL, kernel_sum_s REAL NOT NULL, by_class TEXT NOT NULL,
        kernels BLOB NOT NULL);
    """,
    21: """
    ALTER TABLE sweeps ADD COLUMN start_key TEXT;
    CREATE UNIQUE INDEX sweeps_start_key ON sweeps (start_key);
    """,
    22: """
    CREATE TABLE manifests (digest TEXT PRIMARY KEY, body TEXT NOT NULL, first_seen TEXT NOT NULL);
    ALTER TABLE runs ADD COLUMN manifest TEXT;
    """,
    23: """
    CREATE TABLE finding_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, finding_id INTEGER NOT NULL REFERENCES findings(id), at TEXT NOT NULL,
        author TEXT NOT NULL, from_state TEXT NOT NULL, to_state TEXT NOT NULL, note TEXT NOT NULL, bug TEXT NOT NULL,
        duplicate_of INTEGER, sweep_id INTEGER);
    CREATE INDEX finding_events_finding ON finding_events (finding_id, id);
    ALTER TABLE findings ADD COLUMN bug TEXT NOT NULL DEFAULT '';
    ALTER TABLE findings ADD COLUMN duplicate_of INTEGER;
    CREATE INDEX alerts_series ON alerts (device, model, tuned, runtime, metric, sweep_id);
    """,
}


# tables whose reads keep insertion order with SQLite's implicit rowid; PostgreSQL gets a column for it
ORDERED_BY_ROWID = ("tune_workloads", "tune_records")


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


RESEQUENCE = re.compile(r"RESEQUENCE (\w+)$")  # a table rebuilt with its ids kept: its next id follows them


def sqlite_ddl(statement: str) -> str:
    """One migration statement for SQLite: as written (AUTOINCREMENT follows copied ids by itself)."""
    return "SELECT 1" if RESEQUENCE.match(statement) else statement


def postgres_ddl(statement: str) -> str:
    """One migration statement in PostgreSQL's dialect: serial ids, double precision, an explicit rowid."""
    if match := RESEQUENCE.match(statement):
        table = match.group(1)
        return (f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)")
    statement = statement.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "SERIAL PRIMARY KEY")
    statement = re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)
    statement = re.sub(r"\bBLOB\b", "BYTEA", statement)
    match = re.match(r"CREATE TABLE (\w+) \(", statement)
    if match and match.group(1) in ORDERED_BY_ROWID:
        statement = statement[:statement.rindex(")")] + ", rowid BIGSERIAL)"
    return statement
