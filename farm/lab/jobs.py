"""The lab queue's vocabulary (no database, no procrastinate: every command's parser reads it): the task names,
the timings a worker keeps (``HEARTBEAT_S``, ``STALLED_S``, ``RETRY_WITHIN_S``), the queues and locks by name
(``queue_of``, ``build_queue``, ``device_lock``, ``cell_lock``, ``build_queueing_lock``), a ``Job`` to defer, a
sweep's jobs as counted (``SweepJobs``), a build's state once settled (``BuildState``). queue.py says how they are
used."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

CELL = "farm.cell"  # (sweep_id, device, model, first): one sweep cell, measured and stored
CURVE = "farm.curve"  # (sweep_id, device): a GPU device's copy curve, after its cells
TUNE = "farm.tune"  # (sweep_id, device, budget): a device key's nightly tuning, after the sweep's review
BUILD = "farm.build"  # (sweep_id, device, model): a cell's compile, on a build worker (sweep_builds holds what it made)
HEARTBEAT_S = 5.0  # a worker's heartbeat (procrastinate's default is 10 s)
STALLED_S = 20.0  # a worker silent this long is gone: its running jobs are stalled
STALL_CHECK_S = 5.0  # how often a worker looks for its host's stalled jobs
POLL_S = 1.0  # a worker's poll for new jobs: it keeps no LISTEN connection (POOL_CONNECTIONS); 40 workers, 40 reads/s
# a worker whose calls to the database had no answer this long (a heartbeat a HEARTBEAT_S, a fetch a POLL_S when
# idle) was cut off from it, whether its calls failed or waited for a connection (#61: in a 25 s outage they waited
# 30 s in procrastinate's pool, failed nothing, and the stall check's first answer after it re-queued live jobs)
SILENT_GAP_S = 2 * HEARTBEAT_S
RETRY_WITHIN_S = STALLED_S + HEARTBEAT_S + STALL_CHECK_S + POLL_S  # a killed worker's job is running again by then
# a worker silent this long is removed from procrastinate's list by whoever looks (``prune_dead_workers``), and by a
# worker as it starts (procrastinate's ``stalled_worker_timeout``, which it uses for that prune alone). Not
# STALLED_S: a worker that only froze for a minute, or lost the database for one (#61: every worker starting during
# an outage pruned the others, whose next fetch then failed on procrastinate_jobs.worker_id's foreign key and ended
# them), would wake to a fetch naming a worker id that no longer exists
PRUNE_S = 300.0
# a job whose worker died under it this many times is poison (a model whose import, compile or runtime kills its process,
# or runs the host out of memory): not put back again, but ended failed, its handler told (``LabQueue.serve``'s
# ``poisoned``: a cell is stored failed for good). procrastinate counts a job's deliveries in its ``attempts`` (one
# more at each retry); 3: a worker killed once by the host (an OOM kill of a neighbour's making, a reboot) still
# gets its cell measured, and a poison job costs at most 3 worker restarts, not one every STALL_CHECK_S forever
MAX_DELIVERIES = 3
HOST_WAIT_S = 600.0  # a lab host that took none of a sweep's waiting jobs this long is gone (farm sweep --host-wait)
INSTALL_LOCK = 0x66726D71  # "frmq": one process installs the queue's tables on a new database
ACTIVE = ("todo", "doing")
# a worker's connections, whatever its slots (#50: one a running job put 4 workers × 24 slots past PostgreSQL's
# default max_connections = 100): procrastinate's pool of one (fetch, heartbeat, stall checks; no LISTEN
# connection: a worker polls every POLL_S), and the results store's one, shared by its jobs
# (``store.shared_store``), on which this module's own statements run too. 40 lab hosts' workers: 80 of 100
QUEUE_POOL = 1
POOL_CONNECTIONS = QUEUE_POOL + 1


class BuildState(enum.StrEnum):
    """Where a cell's build job stands once the cell settled it (``LabQueue.settle_build``)."""

    TAKEN = "taken"  # it still waited: cancelled, the cell builds its artifact itself
    DOING = "doing"  # a live build worker builds it (or the same artifact for a device alike, before it)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # its worker raised, or it was aborted
    NONE = "none"  # no build job was deferred, or it was cancelled before


def stall_check_due(now_s: float, started_s: float, unreachable_s: float) -> bool:
    """Whether a worker may judge other workers' jobs stalled now (#61): only once it has served ``STALLED_S``
    itself, and ``STALLED_S + HEARTBEAT_S`` after it last failed to reach the database. A silent worker is dead
    only if it could have beaten: after an outage every live worker's heartbeat lands within a beat of the
    database's return, and a worker that judged at once re-queued the running jobs of live workers, whose
    second delivery then took their lapsed leases while the first still measured."""
    return now_s - started_s >= STALLED_S and now_s - unreachable_s >= STALLED_S + HEARTBEAT_S


def queue_of(lab_host: str) -> str:
    return f"farm-host-{lab_host}"


def build_queue(device: str) -> str:
    return f"farm-build-{device}"


BUILD_QUEUES = build_queue("")  # the prefix of every build queue
BUILDS = "(builds)"  # the build queues' row among the lab hosts (``LabQueue.hosts``)


def build_queueing_lock(sweep_id: int, device: str, model: str) -> str:
    """The queueing lock of a cell's build job (procrastinate's queueing_lock: one waiting job per key), not a lock
    anything holds while it runs."""
    return f"build:{sweep_id}:{device}:{model}"


def device_lock(device: str) -> str:
    return f"device:{device}"


def cell_lock(sweep_id: int, device: str, model: str) -> str:
    return f"cell:{sweep_id}:{device}:{model}"


@dataclass(frozen=True)
class Job:
    """A job to defer: its task, its lab host's queue, its device's lock, its queueing lock and its arguments. A
    build job goes to its device's build queue (``lab_host`` is not used) and takes its ``build_group``'s lock
    instead of the device's: builds of one artifact run one after another, so the second finds the first's."""

    task: str
    lab_host: str
    device: str
    args: dict[str, Any]
    queueing_lock: str | None = None
    build_group: str | None = None  # a build job: what its artifact key depends on, hashed (devices sharing a target)

    @property
    def queue(self) -> str:
        return build_queue(self.device) if self.task == BUILD else queue_of(self.lab_host)

    @property
    def lock(self) -> str | None:
        return f"build:{self.build_group}" if self.task == BUILD else device_lock(self.device)


@dataclass
class SweepJobs:
    """A sweep's jobs by lab host and status (procrastinate's todo, doing, succeeded, failed, cancelled, aborted),
    and its build jobs by status (a cancelled build is one its cell took over)."""

    by_host: dict[str, dict[str, int]] = field(default_factory=dict)
    builds: dict[str, int] = field(default_factory=dict)

    def count(self, *statuses: str) -> int:
        return sum(n for counts in self.by_host.values() for s, n in counts.items() if s in statuses)

    @property
    def active(self) -> int:
        """The jobs a sweep waits for: its cells, curves and tuning (a build serves a cell, which waits for it)."""
        return self.count(*ACTIVE)
