"""What the lab queue says of a sweep, its hosts and its workers: ``QueueReads`` (``LabQueue``'s reads, for
`farm sweep --status`, `farm worker --status` and the dashboard) and a host's row as farm shows it (``HOST_COLUMNS``)."""

from __future__ import annotations

from typing import Any

from farm.lab.jobs import BUILD_QUEUES, BUILDS, RETRY_WITHIN_S, STALLED_S, SweepJobs, queue_of
from farm.lab.reach import patient, queue_installed


HOST_COLUMNS = ("lab host", "workers", "waiting", "running", "stalled", "done", "failed", "cancelled")


def host_row(host: dict[str, Any]) -> dict[str, Any]:
    """One lab host of ``LabQueue.hosts`` in the words farm shows (``HOST_COLUMNS``): ``farm worker --status``, the
    dashboard."""
    return {"lab host": host["lab_host"], "workers": host["workers"], "waiting": host.get("todo", 0),
            "running": host.get("doing", 0), "stalled": host["stalled"], "done": host.get("succeeded", 0),
            "failed": host.get("failed", 0) + host.get("aborted", 0), "cancelled": host.get("cancelled", 0)}


# a running job's worker is gone: none recorded, or silent for STALLED_S (the query's next parameter); k: its worker
DEAD_WORKER = "(k.id IS NULL OR k.last_heartbeat < NOW() - make_interval(secs => %s))"


class QueueReads:
    """What the queue says of a sweep, its hosts and workers: ``LabQueue``'s reads (its ``_connect`` and ``url``)."""

    url: str

    def _connect(self) -> Any:  # LabQueue's: a connection for one call
        raise NotImplementedError

    @patient
    def waiting_or_running(self, sweep_id: int) -> set[str]:
        """The queueing locks of the sweep's jobs that wait or run: a resume defers none of them again (a stalled
        one is put back by its host's workers)."""
        with self._connect() as db:
            if not queue_installed(db):
                return set()
            rows = db.execute("SELECT queueing_lock FROM procrastinate_jobs WHERE args->>'sweep_id' = %s "
                              "AND status IN ('todo', 'doing')", (str(sweep_id),)).fetchall()
        return {lock for (lock,) in rows if lock}

    @patient
    def sweep_jobs(self, sweep_id: int) -> SweepJobs:
        """The sweep's jobs, counted by lab host and status."""
        jobs = SweepJobs()
        with self._connect() as db:
            if not queue_installed(db):
                return jobs
            rows = db.execute("SELECT queue_name, status::text, COUNT(*) FROM procrastinate_jobs "
                              "WHERE args->>'sweep_id' = %s GROUP BY 1, 2", (str(sweep_id),)).fetchall()
        prefix = queue_of("")
        for queue, status, n in rows:
            if queue.startswith(BUILD_QUEUES):
                jobs.builds[status] = jobs.builds.get(status, 0) + n
            else:
                jobs.by_host.setdefault(queue.removeprefix(prefix), {})[status] = n
        return jobs

    @patient
    def hosts(self) -> list[dict[str, Any]]:
        """Each lab host's jobs by status (procrastinate's: todo, doing, succeeded, failed, cancelled, aborted), the
        stalled ones (running on a worker silent for ``STALLED_S``), and ``workers``: the live workers running one of
        its jobs (procrastinate keeps no worker's queue, so an idle worker is counted by ``live_workers`` alone).
        For the dashboard and ``farm worker --status`` (``host_row``)."""
        with self._connect() as db:
            if not queue_installed(db):
                return []
            rows = db.execute(
                """SELECT j.queue_name, j.status::text, COUNT(*),
                          COUNT(*) FILTER (WHERE j.status = 'doing' AND (w.id IS NULL
                                           OR w.last_heartbeat < NOW() - make_interval(secs => %s))),
                          ARRAY_AGG(DISTINCT w.id) FILTER (WHERE j.status = 'doing'
                                           AND w.last_heartbeat >= NOW() - make_interval(secs => %s))
                   FROM procrastinate_jobs j LEFT JOIN procrastinate_workers w ON w.id = j.worker_id
                   WHERE j.queue_name LIKE %s OR j.queue_name LIKE %s GROUP BY 1, 2 ORDER BY 1, 2""",
                (STALLED_S, STALLED_S, queue_of("") + "%", BUILD_QUEUES + "%")).fetchall()
        hosts: dict[str, dict[str, Any]] = {}
        for queue, status, n, stalled, workers in rows:
            name = BUILDS if queue.startswith(BUILD_QUEUES) else queue.removeprefix(queue_of(""))
            host = hosts.setdefault(name, {"lab_host": name, "stalled": 0, "workers": 0, "worker_ids": set()})
            host[status] = host.get(status, 0) + n
            host["stalled"] += stalled
            host["worker_ids"].update(workers or [])
        for host in hosts.values():
            host["workers"] = len(host.pop("worker_ids"))
        return list(hosts.values())

    @patient
    def live_workers(self) -> int:
        """The lab's workers that beat within ``STALLED_S``, on any host."""
        with self._connect() as db:
            if not queue_installed(db):
                return 0
            return int(db.execute("SELECT COUNT(*) FROM procrastinate_workers "
                                  "WHERE last_heartbeat >= NOW() - make_interval(secs => %s)", (STALLED_S,)).fetchone()[0])

    @patient
    def silent_hosts(self, sweep_id: int, silence_s: float) -> list[str]:
        """The lab hosts where the sweep's jobs wait, or are stuck on a dead worker, and nothing has happened for
        ``silence_s`` seconds: no job of the host's queue runs on a live worker, and no job of it was deferred,
        started or ended since (a host with no ``farm worker``, or whose workers all died). A live worker starts a
        waiting job within ``POLL_S``, or is running one (a device lock holds the rest back), and puts a dead
        worker's jobs back within ``RETRY_WITHIN_S`` (so a stuck job counts only once its worker has been silent
        that long), so a host with one is never silent."""
        with self._connect() as db:
            if not queue_installed(db):
                return []
            rows = db.execute(
                f"""SELECT DISTINCT j.queue_name FROM procrastinate_jobs j LEFT JOIN procrastinate_workers k
                      ON k.id = j.worker_id
                   WHERE j.args->>'sweep_id' = %s AND (j.status = 'todo' OR (j.status = 'doing' AND {DEAD_WORKER}))
                     AND j.queue_name LIKE %s
                     AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs d JOIN procrastinate_workers w ON w.id = d.worker_id
                                     WHERE d.queue_name = j.queue_name AND d.status = 'doing'
                                       AND w.last_heartbeat > NOW() - make_interval(secs => %s))
                     AND NOT EXISTS (SELECT 1 FROM procrastinate_events e JOIN procrastinate_jobs q ON q.id = e.job_id
                                     WHERE q.queue_name = j.queue_name AND e.at > NOW() - make_interval(secs => %s))""",
                (str(sweep_id), RETRY_WITHIN_S, queue_of("") + "%", STALLED_S, silence_s)).fetchall()
        return sorted(queue.removeprefix(queue_of("")) for (queue,) in rows)

    @patient
    def task_statuses(self, sweep_id: int, task: str) -> dict[str, str]:
        """The sweep's jobs of ``task`` by device: each one's status (the latest job of a device)."""
        with self._connect() as db:
            if not queue_installed(db):
                return {}
            rows = db.execute("SELECT args->>'device', status::text FROM procrastinate_jobs WHERE task_name = %s "
                              "AND args->>'sweep_id' = %s ORDER BY id", (task, str(sweep_id))).fetchall()
        return dict(rows)
