"""The read side's frozen ``Record`` base (attributes for code, keys for templates and JSON), an ``Alert``,
and a finding's triage states (``TRIAGE_STATES``)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar



class Record(Mapping):
    """Base of the read side's frozen records (a run, a verdict, an alert): attributes for code, and also
    readable by name (``r["device"]``, ``dict(r)``, JSON) for templates, tables and ``--json`` output. Its keys are
    the dataclass fields, then ``VIEWS``: properties derived from them (``steady_median_s`` of a run)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every record is a frozen dataclass
    VIEWS: ClassVar[tuple[str, ...]] = ()

    def __getitem__(self, key: str) -> Any:
        if key not in _record_keys(type(self))[1]:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_record_keys(type(self))[0])

    def __len__(self) -> int:
        return len(_record_keys(type(self))[0])


@functools.cache
def _record_keys(cls: type[Record]) -> tuple[tuple[str, ...], frozenset[str]]:
    names = tuple(f.name for f in fields(cls)) + tuple(cls.VIEWS)
    return names, frozenset(names)


@dataclass(frozen=True)
class Alert(Record):
    """A stored verdict of one series and metric in one sweep, with its confirmation (``Store.alerts``)."""

    id: int
    created_at: str
    updated_at: str
    sweep_id: int
    device: str
    model: str
    tuned: bool
    runtime: str  # tvm, or the reference runtime whose series it judges (onnxruntime …)
    metric: str
    run_id: int
    baseline_run_id: int | None
    status: str  # candidate | improved | confirmed | rejected | unknown | ok | no-baseline | unstable
    value: float
    z: float | None
    change: float | None
    baseline: dict[str, Any] | None
    method: dict[str, Any]
    confirmation: dict[str, Any]


# a finding's triage state (findings.Finding.state): the store checks it, the CLI parses it, each from here
# new | acknowledged | invalid (a false alert) | duplicate (of another finding) | expected (an accepted change) |
# fixed | wontfix (won't fix); each change is an event with its author, note and bug (Store.triage)
TRIAGE_STATES = ("new", "acknowledged", "invalid", "duplicate", "expected", "fixed", "wontfix")
