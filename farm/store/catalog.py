"""The catalog of what was measured and with what: devices' probes (online, busy, missing), stored
artifacts and models' input signatures, read back as the records farm measures with; and the lab's artifact store
(artifact files by cache key, a queued sweep's builds) that carries a build to the host that measures it."""

from __future__ import annotations

import json
from typing import Any

from farm.records import Artifact, Device, InputSpec, ModelSource, SweepBuild
from farm.store.backends import Backend, now, retried


class CatalogMixin:
    """The ``Store``'s probes, artifacts and models."""

    _db: Backend

    @retried
    def record_probes(self, probes: list[Any]) -> None:
        with self._db.transaction() as db:
            db.executemany("INSERT INTO probes (device, key, at, state, reason, latency_s) VALUES (?,?,?,?,?,?)",
                           [(p.device, p.key, p.at, p.state, p.reason, p.latency_s) for p in probes])

    def last_online(self) -> dict[str, float]:
        """device -> time.time() of its last probe that found it online."""
        return {row[0]: row[1] for row in self._db.execute(
            "SELECT device, MAX(at) FROM probes WHERE state='online' GROUP BY device")}

    def latest_probes(self) -> dict[str, dict[str, Any]]:
        rows = self._db.execute("""SELECT p.* FROM probes p JOIN (SELECT device, MAX(at) AS at FROM probes GROUP BY device) l
                                   ON p.device = l.device AND p.at = l.at""").fetchall()
        return {r["device"]: dict(r) for r in rows}

    def model_inputs(self, digest: str) -> list[dict[str, Any]] | None:
        """The stored input signature of a model (name, shape, dtype per input)."""
        row = self._db.execute("SELECT inputs FROM models WHERE digest=?", (digest,)).fetchone()
        return None if row is None else json.loads(row[0])

    def model_signature(self, digest: str, name: str) -> ModelSource | None:
        """A stored model as a source without its bytes: its name, digest and input signature."""
        inputs = self.model_inputs(digest)
        if inputs is None:
            return None
        return ModelSource(name=name, origin="", digest=digest, data=b"",
                           inputs=tuple(InputSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in inputs))

    def devices(self) -> dict[str, Device]:
        """Every device that has a stored run, as it was last stored: its kind, target and tags (what a finding
        names a set of devices by)."""
        rows = self._db.dicts("SELECT name, key, kind, target, emulated, tags FROM devices")
        return {r["name"]: Device(r["name"], r["kind"], r["key"], json.loads(r["target"]),
                                  emulated=bool(r["emulated"]), tags=tuple(json.loads(r["tags"]))) for r in rows}

    def model_ops(self) -> dict[str, tuple[str, ...]]:
        """model name -> the operator types of its stored graphs (every digest stored under the name; schema 15:
        empty for a model stored before farm read them)."""
        ops: dict[str, set[str]] = {}
        for name, stored in self._db.tuples("SELECT name, ops FROM models"):
            ops.setdefault(name, set()).update(json.loads(stored))
        return {name: tuple(sorted(found)) for name, found in ops.items()}

    def artifact(self, cache_key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM artifacts WHERE cache_key=?", (cache_key,)).fetchone()
        return None if row is None else {**dict(row), "target": json.loads(row["target"])}

    def artifact_record(self, cache_key: str, model_name: str) -> Artifact | None:
        """The stored artifact as the record farm measures (every stored field; the pipeline version is part of
        its cache key, not a column)."""
        row = self.artifact(cache_key)
        if row is None:
            return None
        return Artifact(cache_key=row["cache_key"], path=row["path"], model_name=model_name,
                        model_digest=row["model_digest"], target=row["target"], export=row["export"],
                        toolchain=row["toolchain"], tvm_version=row["tvm_version"], file_digest=row["file_digest"],
                        build_s=row["build_s"], cached=True, tuning_digest=row["tuning_digest"] or "",
                        tuned_tasks=row["tuned_tasks"] or 0, total_tasks=row["total_tasks"] or 0,
                        params_bytes=row["params_bytes"], planned_host_bytes=row["planned_host_bytes"],
                        planned_device_bytes=row["planned_device_bytes"], planned_dynamic=row["planned_dynamic"] or 0)

    # -- the lab's artifact store and its build jobs (#30) ---------------------------------------------------

    @retried
    def put_artifact_file(self, cache_key: str, file_digest: str, meta: dict[str, Any], data: bytes) -> None:
        """An artifact's library, for every lab host to read by its cache key (``artifact_file``); a key stored
        already keeps its bytes (one key, one build's output)."""
        with self._db.transaction() as db:
            db.execute("INSERT INTO artifact_files (cache_key, file_digest, bytes, meta, data, stored_at) "
                       "VALUES (?,?,?,?,?,?) ON CONFLICT (cache_key) DO NOTHING",
                       (cache_key, file_digest, len(data), json.dumps(meta), data, now()))

    def artifact_file(self, cache_key: str) -> tuple[str, dict[str, Any], bytes] | None:
        """(sha256 as the builder recorded it, metadata, bytes) of the artifact ``cache_key``, or None. The caller
        checks the digest before the bytes go anywhere (``compile.install_artifact``)."""
        row = self._db.execute("SELECT file_digest, meta, data FROM artifact_files WHERE cache_key=?",
                               (cache_key,)).fetchone()
        return None if row is None else (row[0], json.loads(row[1]), bytes(row[2]))

    @retried
    def drop_artifact_file(self, cache_key: str) -> None:
        """Forget an artifact file whose bytes failed their check: the next build of its key stores it again."""
        with self._db.transaction() as db:
            db.execute("DELETE FROM artifact_files WHERE cache_key=?", (cache_key,))

    def artifact_file_head(self, cache_key: str) -> tuple[str, dict[str, Any]] | None:
        """(sha256, metadata) of the artifact file stored under ``cache_key``, without its bytes; None: none is."""
        row = self._db.execute("SELECT file_digest, meta FROM artifact_files WHERE cache_key=?", (cache_key,)).fetchone()
        return None if row is None else (str(row[0]), json.loads(row[1]))

    @retried
    def record_sweep_build(self, sweep_id: int, device: str, model: str, builder: str, cache_key: str | None = None,
                           error: str | None = None, hint: str | None = None, build_s: float | None = None) -> None:
        """What the build job of a queued sweep's cell made: the artifact's ``cache_key`` (its file stored with
        ``put_artifact_file`` first), or the build's ``error`` and ``hint``. A job run again writes it again."""
        with self._db.transaction() as db:
            db.execute("INSERT INTO sweep_builds (sweep_id, device, model, cache_key, error, hint, builder, build_s, "
                       "stored_at) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (sweep_id, device, model) DO UPDATE SET "
                       "cache_key=excluded.cache_key, error=excluded.error, hint=excluded.hint, "
                       "builder=excluded.builder, build_s=excluded.build_s, stored_at=excluded.stored_at",
                       (sweep_id, device, model, cache_key, error, hint, builder, build_s, now()))

    def sweep_builds(self, sweep_id: int) -> dict[tuple[str, str], SweepBuild]:
        """The sweep's builds by (device, model)."""
        return {(device, model): SweepBuild(key, error, builder, build_s, hint) for device, model, key, error, builder,
                build_s, hint in self._db.tuples("SELECT device, model, cache_key, error, builder, build_s, hint "
                                                 "FROM sweep_builds WHERE sweep_id=?", (sweep_id,))}
