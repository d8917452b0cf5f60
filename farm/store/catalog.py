"""The catalog of what was measured and with what: devices' probes (online, busy, missing), stored
artifacts and models' input signatures, read back as the records farm measures with."""

from __future__ import annotations

import json
from typing import Any

from farm.records import Artifact, Device, InputSpec, ModelSource
from farm.store.backends import Backend


class CatalogMixin:
    """The ``Store``'s probes, artifacts and models."""

    _db: Backend

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
