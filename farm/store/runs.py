"""Runs: one bench result with its raw samples, copies, check and summaries, written in one transaction;
the reads of runs by filter; copy curves.

Each sample series' summary (``stats.summarize_rows``) is written with its samples, so that reading
50,000 runs never reads their 1.5 M samples; the summaries are derived data, recomputed from the
samples when farm's rule changes (``_summarize_stored``).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, fields, replace
from typing import Any, Sequence

from farm.manifest import manifest_digest
from farm.records import (OFFLINE_ATTEMPT, Artifact, BenchResult, CopyCurve, Device, KernelProfile, KernelTime, Lease,
                          ModelSource, RunToStore)
from farm.stats import Summary, summarize_groups
from farm.store.backends import Backend, now, retried, write_token

# the columns of ``summaries`` after its key: stats.Summary's fields, by name
SUMMARY_COLUMNS = ", ".join(f.name for f in fields(Summary))


def insert_summaries(db: Backend, keys: list[tuple[int, str, int]], sizes: list[int], values: list[float]) -> None:
    """Summarize each (run id, metric, series) key's ``sizes[i]`` values, taken in order from ``values``."""
    rows = summarize_groups(sizes, values)
    db.executemany(f"INSERT INTO summaries (run_id, metric, series, {SUMMARY_COLUMNS})"
                   f" VALUES ({','.join('?' * (3 + len(fields(Summary))))})",
                   [(*k, *r[:-1], int(r[-1])) for k, r in zip(keys, rows)])


# What ``run_table`` reads of a run, in ``runs.Run``'s field order (``results.run_rows`` adds the series context,
# summaries and copies after ``r.context``; each position it reads is found here by name)
RUN_TABLE = (
    "r.id", "r.started_at", "r.device", "r.key", "r.model", "r.model_digest", "r.status", "r.failed_step", "r.reason",
    "r.upload_s", "r.load_s", "r.first_run_s", "r.load_warm_s", "r.first_run_warm_s", "r.steady_clock",
    "r.steady_number", "r.steady_wall_number", "r.fallback_of", "COALESCE(c.status, 'skipped')", "c.max_abs_err",
    "r.emulated", "r.tuned", "COALESCE(a.tuned_tasks, 0)", "COALESCE(a.total_tasks, 0)", "r.sweep_id", "r.attempt",
    "r.artifact_key", "r.tvm_version", "r.farm_version", "r.runtime", "r.runtime_version", "r.context",
    "r.params_bytes", "r.planned_host_bytes", "r.planned_device_bytes", "r.rss_before_load_bytes",
    "r.rss_after_load_bytes", "r.rss_peak_bytes", "r.threads", "r.manifest",
)


# a stored profile's kernels: one JSON array of rows in this order (no repeated keys), zlib-compressed: pack_kernels
PROFILE_FIELDS = ("name", "op_class", "calls", "time_s", "args", "flops", "schedule")


def pack_kernels(kernels: Sequence[KernelTime]) -> bytes:
    """A profile's kernels as stored: rows of ``PROFILE_FIELDS`` in JSON, zlib-compressed (names and shapes repeat)."""
    return zlib.compress(json.dumps([[k.name, k.op_class, k.calls, k.time_s, list(k.args), k.flops, k.schedule]
                                     for k in kernels], separators=(",", ":")).encode(), 6)


def unpack_kernels(data: bytes) -> tuple[KernelTime, ...]:
    return tuple(KernelTime(name, op_class, float(calls), float(time_s), tuple(args), flops, schedule)
                 for name, op_class, calls, time_s, args, flops, schedule in json.loads(zlib.decompress(bytes(data))))


def run_filter(device: str | None, model: str | None, latest_only: bool, sweep_id: int | None,
               limit: int | None, status: str | None = None) -> tuple[str, list[Any]]:
    """A subquery selecting run ids, and its parameters."""
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        where.append("r.status = ?")
        params.append(status)
    if sweep_id is not None:
        where.append("r.sweep_id = ?")
        params.append(sweep_id)
    if device:
        where.append("r.device = ?")
        params.append(device)
    if model:
        where.append("r.model = ?")
        params.append(model)
    if latest_only:
        where.append("r.id = (SELECT MAX(id) FROM runs r2 WHERE r2.device = r.device AND r2.model = r.model"
                     " AND r2.tuned = r.tuned AND r2.runtime = r.runtime)")
    sql = "SELECT r.id FROM runs r" + (" WHERE " + " AND ".join(where) if where else "")
    if limit is not None:
        sql, params = sql + " ORDER BY r.id DESC LIMIT ?", [*params, int(limit)]
    return sql, params


def cell_key(result: BenchResult, sweep_id: int | None, attempt: int, token: str) -> str:
    """What makes a stored run unique: a sweep's measured attempt by its sweep, device, model, runtime and attempt
    (schema 16); outside a sweep, and a cell stored offline (``OFFLINE_ATTEMPT``: stored again at each resume while
    down), by the write's ``token`` (schema 21: made once per write, so a write run again stores nothing twice)."""
    if sweep_id is None or attempt == OFFLINE_ATTEMPT:
        return f"write/{token}/{result.device}/{result.runtime}"
    return f"{sweep_id}/{result.device}/{result.model}/{result.runtime}/{attempt}"



def _store_manifest(db: Backend, manifest: dict[str, Any] | None, stamp: str) -> str | None:
    """A run's manifest (``farm.manifest``), stored once by its digest; the digest the run names (None: none read)."""
    if not manifest:
        return None
    digest = manifest_digest(manifest)
    db.execute("INSERT INTO manifests (digest, body, first_seen) VALUES (?,?,?) ON CONFLICT DO NOTHING",
               (digest, json.dumps(manifest, sort_keys=True), stamp))
    return digest


def _upsert_artifact(db: Backend, artifact: Artifact, stamp: str) -> None:
    """A run's artifact row, inside its write; planned memory filled in on a row stored before farm read it."""
    db.execute(
        """INSERT INTO artifacts (cache_key, model_digest, target, export, toolchain,
           tvm_version, file_digest, path, build_s, created_at, tuning_digest, tuned_tasks, total_tasks,
           params_bytes, planned_host_bytes, planned_device_bytes, planned_dynamic)
           VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (cache_key) DO UPDATE SET
           params_bytes = COALESCE(artifacts.params_bytes, excluded.params_bytes),
           planned_host_bytes = COALESCE(artifacts.planned_host_bytes, excluded.planned_host_bytes),
           planned_device_bytes = COALESCE(artifacts.planned_device_bytes, excluded.planned_device_bytes),
           planned_dynamic = excluded.planned_dynamic""",
        (artifact.cache_key, artifact.model_digest, json.dumps(artifact.target), artifact.export,
         artifact.toolchain, artifact.tvm_version, artifact.file_digest, artifact.path,
         artifact.build_s, stamp, artifact.tuning_digest, artifact.tuned_tasks, artifact.total_tasks,
         artifact.params_bytes, artifact.planned_host_bytes, artifact.planned_device_bytes,
         artifact.planned_dynamic))


class RunsMixin:
    """The ``Store``'s runs, samples, summaries, copies and copy curves."""

    _db: Backend

    # -- writes -------------------------------------------------------------------------

    def record_result(self, result: BenchResult, device: Device, model: ModelSource, artifact: Artifact | None,
                      sweep_id: int | None = None, attempt: int = 1) -> int:
        """Store one bench result with its samples, copies and check, atomically. Returns the run id: of the run
        already stored when this sweep's cell has this attempt stored (``cell_key``), which then stores nothing."""
        return self.record_cell(RunToStore(result, device, model, artifact, attempt), sweep_id=sweep_id)[0]

    def record_cell(self, run: RunToStore, fallback: RunToStore | None = None, reference: RunToStore | None = None,
                    sweep_id: int | None = None, lease: Lease | None = None) -> tuple[int, int | None, int | None]:
        """``_record_cell`` under one write token, whatever the retries (``write_token``)."""
        return self._record_cell(run, fallback, reference, sweep_id, lease, write_token())

    @retried
    def _record_cell(self, run: RunToStore, fallback: RunToStore | None, reference: RunToStore | None,
                     sweep_id: int | None, lease: Lease | None, token: str) -> tuple[int, int | None, int | None]:
        """Store a cell's attempt whole, in one transaction: TVM's run, the run on the device's CPU that stands in
        for it (``fallback``: its ``fallback_of`` is set to the run's id) and the model in its reference runtime,
        each with its samples, copies and check (#50: a job killed between two commits left a cell without its
        reference run, for good). With a ``lease``, only while it is still the holder's (``LeaseLost`` else: the
        device passed to another holder while this one measured). Returns the three run ids (None where not
        given); a run already stored under its ``cell_key`` is found, not stored again."""
        with self._db.transaction() as db:
            if lease is not None:
                self._check_lease(db, lease)  # type: ignore[attr-defined]  # LeasesMixin's, on the same Store
            run_id = self._insert_run(db, run, sweep_id, None, token)
            fallback_id = None if fallback is None else self._insert_run(db, fallback, sweep_id, run_id, token)
            reference_id = None if reference is None else self._insert_run(db, reference, sweep_id, None, token)
        return run_id, fallback_id, reference_id

    def _insert_run(self, db: Backend, run: RunToStore, sweep_id: int | None, fallback_of: int | None,
                    token: str) -> int:
        """One run with its device, model, artifact, samples, summaries, copies and check, inside a write."""
        result, device, model, artifact, attempt = run.result, run.device, run.model, run.artifact, run.attempt
        if fallback_of is not None:
            result = replace(result, fallback_of=fallback_of)
        stamp = now()
        db.execute(
            """INSERT INTO devices VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET
               key=excluded.key, kind=excluded.kind, target=excluded.target, emulated=excluded.emulated,
               tags=excluded.tags, context=excluded.context, last_seen=excluded.last_seen""",
            (device.name, device.key, device.kind, json.dumps(device.target), int(device.emulated),
             json.dumps(list(device.tags)), json.dumps(result.context.get("host", {})), stamp, stamp))
        db.execute("INSERT INTO models (digest, name, origin, inputs, first_seen, ops) VALUES (?,?,?,?,?,?)"
                   " ON CONFLICT DO NOTHING",
                   (model.digest, model.name, model.origin,
                    json.dumps([asdict(s) for s in model.inputs]), stamp, json.dumps(list(model.ops))))
        if artifact is not None:
            _upsert_artifact(db, artifact, stamp)
        config = result.config
        key = cell_key(result, sweep_id, attempt, token)
        context = dict(result.context)
        manifest = _store_manifest(db, context.pop("manifest", None), stamp)
        inserted = db.execute(
            """INSERT INTO runs (started_at, device, key, model, model_digest, artifact_key, status,
               failed_step, reason, upload_s, load_s, first_run_s, steady_number, steady_repeat,
               min_repeat_ms, emulated, farm_version, tvm_version, context, config, tuned, sweep_id, attempt,
               load_warm_s, first_run_warm_s, steady_clock, steady_wall_number, fallback_of, runtime,
               runtime_version, params_bytes, planned_host_bytes, planned_device_bytes, rss_before_load_bytes,
               rss_after_load_bytes, rss_peak_bytes, threads, cell_key, manifest)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
               ON CONFLICT DO NOTHING RETURNING id""",
            (result.started_at or stamp, result.device, result.key, result.model, result.model_digest,
             result.artifact_key, result.status, result.failed_step, result.reason, result.upload_s,
             result.load_s, result.first_run_s, result.steady_number, config.repeat, config.min_repeat_ms,
             int(device.emulated), result.context.get("farm_version", ""),
             result.context.get("tvm_version", ""), json.dumps(context), json.dumps(asdict(config)),
             int(bool(artifact and artifact.tuned_tasks)), sweep_id, attempt, result.load_warm_s,
             result.first_run_warm_s, result.steady_clock, result.steady_wall_number, result.fallback_of,
             result.runtime, result.runtime_version, result.params_bytes, result.planned_host_bytes,
             result.planned_device_bytes, result.rss_before_load_bytes, result.rss_after_load_bytes,
             result.rss_peak_bytes, result.threads, key, manifest)).fetchall()
        if not inserted:  # this attempt of this cell is stored already (its job was delivered again)
            return int(db.execute("SELECT id FROM runs WHERE cell_key = ?", (key,)).fetchone()[0])
        run_id = int(inserted[0][0])
        db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                       [(run_id, "steady", 0, i, v, result.steady_number or 0)
                        for i, v in enumerate(result.steady_samples_s)]
                       + [(run_id, "steady_wall", 0, i, v, result.steady_wall_number or 0)
                          for i, v in enumerate(result.steady_wall_samples_s)])
        for copy in result.copies:
            db.execute("INSERT INTO copies VALUES (?,?,?,?,?,?)",
                       (run_id, copy.output_index, copy.nbytes, json.dumps(list(copy.shape)), copy.dtype, copy.number))
            db.executemany("INSERT INTO samples VALUES (?,?,?,?,?,?)",
                           [(run_id, "copy", copy.output_index, i, v, copy.number)
                            for i, v in enumerate(copy.samples_s)])
        series: list[tuple[tuple[int, str, int], Sequence[float]]] = [
                  ((run_id, "steady", 0), result.steady_samples_s),
                  ((run_id, "steady_wall", 0), result.steady_wall_samples_s),
                  *(((run_id, "copy", c.output_index), c.samples_s) for c in result.copies)]
        series = [(k, list(v)) for k, v in series if len(v)]
        insert_summaries(db, [k for k, _ in series], [len(v) for _, v in series], [x for _, v in series for x in v])
        check = result.check
        db.execute("INSERT INTO checks VALUES (?,?,?,?,?,?,?)",
                   (run_id, check.status, check.max_abs_err, check.rtol, check.atol, check.reference, check.detail))
        if (profile := result.profile) is not None:
            db.execute("INSERT INTO profiles VALUES (?,?,?,?,?,?,?,?,?)",
                       (run_id, profile.status, profile.reason, profile.clock, profile.runs, profile.main_s,
                        profile.kernel_sum_s, json.dumps(profile.by_class()), pack_kernels(profile.kernels)))
        return run_id

    def record_copy_curve(self, curve: CopyCurve, sweep_id: int | None = None, attempt: int = 1,
                          lease: Lease | None = None) -> int:
        """Store one copy curve with every raw sample, atomically (with a ``lease``: only while it is the holder's).
        Returns its id: in a sweep, of the curve already stored as this device's ``attempt`` (schema 19's
        ``curve_key``: a curve job delivered again), which then stores nothing; outside one, of the curve this
        write stored before a retry (schema 21: its token)."""
        key = f"write/{write_token()}/{curve.device}" if sweep_id is None else f"{sweep_id}/{curve.device}/{attempt}"
        return self._record_copy_curve(curve, sweep_id, lease, key)

    @retried
    def _record_copy_curve(self, curve: CopyCurve, sweep_id: int | None, lease: Lease | None, key: str) -> int:
        with self._db.transaction() as db:
            if lease is not None:
                self._check_lease(db, lease)  # type: ignore[attr-defined]
            inserted = db.execute(
                """INSERT INTO copy_curves (started_at, device, key, device_type, status, reason, sweep_id, context,
                   curve_key) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING RETURNING id""",
                (curve.started_at, curve.device, curve.key, curve.device_type, curve.status, curve.reason,
                 sweep_id, json.dumps(curve.context), key)).fetchall()
            if not inserted:
                return int(db.execute("SELECT id FROM copy_curves WHERE curve_key = ?", (key,)).fetchone()[0])
            curve_id = int(inserted[0][0])
            db.executemany("INSERT INTO copy_curve_samples VALUES (?,?,?,?,?,?)",
                           [(curve_id, p.direction, p.nbytes, i, v, p.number)
                            for p in curve.points for i, v in enumerate(p.samples_s)])
        return curve_id

    def _summarize_stored(self, db: Backend, runs_per_chunk: int = 20_000) -> None:
        """(Re)compute every stored run's summaries from its samples, a chunk of runs at a time (memory stays
        flat whatever the database's size): schema 8's migration, and any change of ``stats.SUMMARY_RULE``."""
        db.execute("DELETE FROM summaries")
        key = "run_id, metric, series"
        last = -1
        while True:
            row = db.execute("SELECT MAX(id) FROM (SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?) chunk",
                             (last, runs_per_chunk)).fetchone()
            if row is None or row[0] is None:
                return
            first, last = last, int(row[0])
            span = (first, last)
            groups = [tuple(g) for g in db.execute(f"SELECT {key}, COUNT(*) FROM samples WHERE run_id > ? AND run_id <= ?"
                                                   f" GROUP BY {key} ORDER BY {key}", span)]
            values = [v[0] for v in db.execute(f"SELECT value_s FROM samples WHERE run_id > ? AND run_id <= ?"
                                               f" ORDER BY {key}, idx", span)]
            insert_summaries(db, [g[:3] for g in groups], [g[3] for g in groups], values)

    # -- reads --------------------------------------------------------------------------

    def runs(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
             sweep_id: int | None = None, limit: int | None = None,
             status: str | None = None) -> list[dict[str, Any]]:
        """Runs joined with their check, newest first (the newest ``limit`` only, when given)."""
        where, params = run_filter(device, model, latest_only, sweep_id, limit, status)
        sql = f"""SELECT r.*, c.status AS check_status, c.max_abs_err, c.rtol, c.atol, c.reference, c.detail AS check_detail,
                        a.tuned_tasks, a.total_tasks
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id LEFT JOIN artifacts a ON a.cache_key = r.artifact_key
                 WHERE r.id IN ({where}) ORDER BY r.id DESC"""
        return self._db.dicts(sql, params)

    def manifests(self, digests: Sequence[str | None]) -> dict[str, dict[str, Any]]:
        """The manifests (``farm.manifest``) of these digests, by digest (runs name theirs: ``Run.manifest``)."""
        wanted = sorted({d for d in digests if d})
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            for row in self._db.dicts(f"SELECT digest, body FROM manifests WHERE digest IN "
                                      f"({','.join('?' * len(chunk))})", tuple(chunk)):
                out[row["digest"]] = json.loads(row["body"])
        return out

    def run(self, run_id: int) -> dict[str, Any] | None:
        """One run as ``runs`` gives it (joined with its check), or None."""
        rows = self._db.dicts("""SELECT r.*, c.status AS check_status, c.max_abs_err, c.rtol, c.atol, c.reference,
                                        c.detail AS check_detail, a.tuned_tasks, a.total_tasks
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id LEFT JOIN artifacts a ON a.cache_key = r.artifact_key
                 WHERE r.id = ?""", (run_id,))
        return rows[0] if rows else None

    def run_table(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                  sweep_id: int | None = None, limit: int | None = None, status: str | None = None) -> list[tuple]:
        """The runs ``runs`` selects, newest first, as plain tuples of ``RUN_TABLE`` (the columns the read model's
        ``Run`` is made of, in its order): no row objects, for reads of 50,000 runs."""
        where, params = run_filter(device, model, latest_only, sweep_id, limit, status)
        return self._db.tuples(f"""SELECT {', '.join(RUN_TABLE)}
                 FROM runs r LEFT JOIN checks c ON c.run_id = r.id LEFT JOIN artifacts a ON a.cache_key = r.artifact_key
                 WHERE r.id IN ({where}) ORDER BY r.id DESC""", params)

    def run_summaries(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                      sweep_id: int | None = None, limit: int | None = None,
                      status: str | None = None) -> dict[tuple[int, str, int], Summary]:
        """(run id, metric, series) -> its stored summary, for the runs ``runs`` selects with the same arguments."""
        where, params = run_filter(device, model, latest_only, sweep_id, limit, status)
        rows = self._db.tuples(f"SELECT run_id, metric, series, {SUMMARY_COLUMNS} FROM summaries WHERE run_id IN ({where})",
                               params)
        return {(r[0], r[1], r[2]): Summary(*r[3:-1] + (bool(r[-1]),)) for r in rows}

    def trajectories(self) -> list[dict[str, Any]]:
        """One row per ok run of a sweep, fallbacks left out, oldest first: its sweep, device, model, runtime, tuned
        flag, TVM version, threads, steady median and its artifact's tuning coverage (0/0 for a reference runtime's run).
        The report's per-night trajectory of TVM untuned, tuned and the reference, so only of the device × model
        pairs that have a tuned run (a lab of 1,000 untuned series reads none of its 50,000 runs); reads no sample."""
        return self._db.dicts(
            "SELECT r.id, r.sweep_id, r.device, r.model, r.runtime, r.tuned, r.tvm_version, r.threads, s.median, "
            "COALESCE(a.tuned_tasks, 0) AS tuned_tasks, COALESCE(a.total_tasks, 0) AS total_tasks FROM runs r "
            "JOIN summaries s ON s.run_id = r.id AND s.metric = 'steady' AND s.series = 0 "
            "LEFT JOIN artifacts a ON a.cache_key = r.artifact_key "
            "WHERE r.status = 'ok' AND r.sweep_id IS NOT NULL AND r.fallback_of IS NULL "
            "AND (r.device, r.model) IN (SELECT device, model FROM runs WHERE tuned <> 0) ORDER BY r.id")

    def run_copies(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                   sweep_id: int | None = None, limit: int | None = None,
                   status: str | None = None) -> dict[int, list[dict[str, Any]]]:
        """run id -> its outputs' copies (index, bytes, shape, dtype, number), for the runs ``runs`` selects."""
        where, params = run_filter(device, model, latest_only, sweep_id, limit, status)
        copies: dict[int, list[dict[str, Any]]] = {}
        for row in self._db.execute(f"SELECT * FROM copies WHERE run_id IN ({where}) ORDER BY run_id, output_index",
                                    params):
            copies.setdefault(row["run_id"], []).append(dict(row))
        return copies

    def profiles(self, run_ids: Sequence[int]) -> dict[int, KernelProfile]:
        """run id -> its stored profile, for the runs given that have one (read only when asked: its own table)."""
        found: dict[int, KernelProfile] = {}
        ids = sorted(set(int(i) for i in run_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows = self._db.tuples(f"SELECT run_id, status, reason, clock, runs, main_s, kernels FROM profiles "
                                   f"WHERE run_id IN ({', '.join('?' * len(chunk))})", tuple(chunk))
            for run_id, status, reason, clock, runs, main_s, kernels in rows:
                found[int(run_id)] = KernelProfile(status, reason, clock, int(runs), float(main_s),
                                                   unpack_kernels(kernels))
        return found

    def profile_sums(self, device: str | None = None, model: str | None = None, latest_only: bool = False,
                     sweep_id: int | None = None, limit: int | None = None,
                     status: str | None = None) -> dict[int, dict[str, Any]]:
        """run id -> its profile's sums ({status, reason, clock, runs, main_s, kernel_sum_s, by_class_s}), for the
        runs ``runs`` selects that have one: no kernel is read (``profiles`` reads them)."""
        where, params = run_filter(device, model, latest_only, sweep_id, limit, status)
        rows = self._db.tuples(f"SELECT run_id, status, reason, clock, runs, main_s, kernel_sum_s, by_class FROM profiles "
                               f"WHERE run_id IN ({where})", params)
        return {int(r[0]): {"status": r[1], "reason": r[2], "clock": r[3], "runs": r[4], "main_s": r[5],
                            "kernel_sum_s": r[6], "by_class_s": json.loads(r[7])} for r in rows}

    def latest_profiled(self, limit: int = 10) -> list[dict[str, Any]]:
        """The newest profiled run of each device × model × runtime (the ``limit`` newest): id, device, model, runtime,
        threads and its profile."""
        rows = self._db.dicts("SELECT r.id, r.device, r.model, r.runtime, r.threads FROM runs r WHERE r.id IN "
                              "(SELECT MAX(p.run_id) FROM profiles p JOIN runs q ON q.id = p.run_id "
                              "GROUP BY q.device, q.model, q.runtime) ORDER BY r.id DESC LIMIT ?", (limit,))
        profiles = self.profiles([row["id"] for row in rows])
        return [{**row, "profile": profiles[row["id"]]} for row in rows]

    def profile(self, run_id: int) -> KernelProfile | None:
        """One run's stored profile, or None (not profiled)."""
        return self.profiles([run_id]).get(run_id)

    def samples(self, run_id: int, metric: str = "steady", series: int = 0) -> list[float]:
        rows = self._db.execute(
            "SELECT value_s FROM samples WHERE run_id=? AND metric=? AND series=? ORDER BY idx", (run_id, metric, series))
        return [row[0] for row in rows]

    def sweep_curves(self, sweep_id: int, device: str) -> list[str]:
        """The statuses of the copy curves stored for ``device`` in the sweep, in attempt order."""
        return [row[0] for row in self._db.execute("SELECT status FROM copy_curves WHERE sweep_id = ? AND device = ? "
                                                   "ORDER BY id", (sweep_id, device))]

    def copy_curves(self, device: str | None = None, latest_only: bool = False) -> list[dict[str, Any]]:
        """Copy curves, newest first, each with ``points``: {direction, nbytes, number, samples_s}."""
        sql, params = "SELECT * FROM copy_curves c", []
        if device:
            sql, params = sql + " WHERE c.device = ?", [device]
        if latest_only:
            sql += (" WHERE" if not device else " AND") + \
                " c.id = (SELECT MAX(id) FROM copy_curves c2 WHERE c2.device = c.device)"
        curves = [dict(row) for row in self._db.execute(sql + " ORDER BY c.id DESC", params)]
        for curve in curves:
            curve["context"] = json.loads(curve["context"])
            points: dict[tuple[str, int], dict[str, Any]] = {}
            for row in self._db.execute("SELECT * FROM copy_curve_samples WHERE curve_id=? ORDER BY direction, nbytes, idx",
                                        (curve["id"],)):
                point = points.setdefault((row["direction"], row["nbytes"]), {
                    "direction": row["direction"], "nbytes": row["nbytes"], "number": row["number"], "samples_s": []})
                point["samples_s"].append(row["value_s"])
            curve["points"] = list(points.values())
        return curves
