"""The lab's job queue: procrastinate on the results database's PostgreSQL. The one module that imports it (#30).

A lab of several hosts shares one PostgreSQL already (the results). procrastinate keeps its jobs there and gives
what a device farm needs without a scheduler of farm's own (docs/ARCHITECTURE.md says why this engine):

- **a queue per lab host** (``queue_of``): a device's jobs wait for a worker on the host its phone is plugged into;
- **a lock per device** (``device_lock``): no two jobs of one device run at once, on any worker of its host, and one
  device's jobs run in the order they were deferred (procrastinate starts a lock's jobs oldest first), so a device's
  first cell comes first and its copy curve after its cells;
- **a queueing lock per cell** (``cell_lock``): one waiting job per cell, however often a sweep is resumed;
- **a build queue per device** (``build_queue``): a cell's compile is a job of its own (``BUILD``), taken by a build
  worker on any host whose toolchain builds for the device (``farm worker --builds`` listens to those devices'
  queues only); a lock per artifact (``Job.build_group``), not the device's, so builds run beside the
  measurements and an artifact several devices share is built once. A cell whose build still waits when it
  starts takes it over (``settle_build``: cancelled, built by the cell's own worker), so a lab with no build
  worker runs as before;
- **worker heartbeats** (``HEARTBEAT_S``): a job whose worker stopped beating for ``STALLED_S`` is stalled, and every
  worker puts its own host's stalled jobs back in the queue every ``STALL_CHECK_S`` (``_retry_stalled``): a killed
  worker's cell runs again on its host within ``RETRY_WITHIN_S``.

A job's body is farm's (``farm.lab.worker``, ``farm.night.tuning``): the worker passes its handlers in by task name
(``CELL``, ``CURVE``, ``TUNE``, ``BUILD``); it runs no cell's body (it only names a cell's locks). What a job does
must be safe to do twice (at least once: a worker killed after its result committed and before its job was marked done
runs again): a cell is stored whole under its unique cell key (``Store.record_cell``) and a copy curve under its curve
key, so a job run again finds them and measures nothing; a tuning job run again finds its key's night stored
(``Store.night_tuned``) and tunes nothing; a build job run again finds its artifact in the lab's store. Two deliveries
of one job may also run at once (a worker that froze past ``STALLED_S``): the device's lease (``farm.lab.leases``)
lets only its current holder store.

A worker holds ``POOL_CONNECTIONS`` database connections, whatever its slots (#50: 4 workers × 24 slots passed
PostgreSQL's default ``max_connections = 100``): procrastinate's pool of ``QUEUE_POOL`` and the store's one shared
connection (``store.shared_store``), both counted in ``lab.jobs``.

Sync tasks run in threads of the worker's event loop (asgiref's ``sync_to_async``): the loop's executor is sized to
the worker's slots, so a worker holds as many sessions as it has slots (``farm.rpc.session.SESSION_SLOTS``).

The package's modules: jobs.py the vocabulary (task names, timings, queues and locks by name, ``Job``); reach.py
a call run again through an outage (``patient``); monitor.py the reads (``QueueReads``); this module the
``LabQueue``: defer, settle, cancel, serve.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from farm.errors import FarmError, StoreError, message_line
from farm.lab.jobs import (BUILD, CELL, CURVE, HEARTBEAT_S, INSTALL_LOCK, MAX_DELIVERIES, POLL_S, PRUNE_S, QUEUE_POOL,
                           SILENT_GAP_S, STALL_CHECK_S, STALLED_S, TUNE, BuildState, Job, queue_of, stall_check_due)
from farm.lab.monitor import DEAD_WORKER, QueueReads
from farm.lab.reach import ANSWERED, connection_lost, patient, queue_installed, redacted

log = logging.getLogger("farm.queue")  # the name its warnings have always carried


class LabQueue(QueueReads):
    """The queue on one PostgreSQL database: defer jobs, settle and cancel them, run a worker; its reads of a
    sweep's, the hosts' and the workers' state are ``QueueReads``'s (monitor.py)."""

    def __init__(self, url: str) -> None:
        import procrastinate

        self.url = url
        self._procrastinate = procrastinate
        from farm.store.locations import application_name

        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=url, min_size=QUEUE_POOL, max_size=QUEUE_POOL,
            # a new connection after a failover goes to the writable server, never a standby (connection_lost)
            kwargs={"application_name": application_name(), "target_session_attrs": "read-write"}))
        self._handlers: dict[str, Callable[..., Any]] = {}
        # a worker's own view of the database (``stall_check_due``): when it started serving, when it last failed
        # to reach it, when it last had an answer (monotonic seconds)
        self._started_s, self._unreachable_s, self._answered_s = 0.0, float("-inf"), 0.0
        for name in (CELL, CURVE, TUNE, BUILD):
            self.app.task(name=name, pass_context=False)(self._dispatcher(name))

    def _dispatcher(self, name: str) -> Callable[..., Any]:
        def run(**kwargs: Any) -> Any:
            return self._handlers[name](**kwargs)

        run.__name__ = name.replace(".", "_")
        return run

    # -- the database -------------------------------------------------------------------

    def _connect(self):
        """The connection for one call: in a worker, its shared store's (``store.shared_connection``: no connection of
        its own), else one of its own, closed after (``patient`` translates errors and runs the call again)."""
        import psycopg

        from farm.store import shared_connection
        from farm.store.locations import application_name

        return shared_connection(self.url) or psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                                                              application_name=application_name(),
                                                              target_session_attrs="read-write")

    def check(self) -> None:
        """That the queue's database answers now, at once: a ``StoreError`` with a hint where it does not (a worker
        says it started only after this)."""
        import psycopg

        try:
            with self._connect() as db:
                db.execute("SELECT 1")
            ANSWERED.add(self.url)
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the lab's queue at {redacted(self.url)}: {message_line(exc)}",
                             "check that the PostgreSQL server runs (the lab's queue is on the results database)") from exc

    @patient
    def install(self) -> None:
        """procrastinate's tables on this database, once (its own schema file; one installer at a time)."""
        import psycopg

        with self._connect() as db:
            try:
                db.execute("SELECT pg_advisory_lock(%s)", (INSTALL_LOCK,))
                if not queue_installed(db):
                    db.execute(self.app.schema_manager.get_schema())
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                raise StoreError(f"could not install the lab's queue in {redacted(self.url)}: {message_line(exc)}",
                                 "the database user must be able to create tables and types") from exc
            finally:
                if not db.closed:
                    db.execute("SELECT pg_advisory_unlock(%s)", (INSTALL_LOCK,))

    @patient
    def prune_dead_workers(self) -> int:
        """Remove the workers silent for ``PRUNE_S`` from procrastinate's list (a killed worker's row stays until a
        new worker starts, else); their running jobs keep no worker, which ``_retry_stalled`` treats as stalled.
        Whoever looks calls this: the follower, ``farm worker --status``. Returns how many."""
        with self._connect() as db:
            if not queue_installed(db):
                return 0
            return len(db.execute("SELECT * FROM procrastinate_prune_stalled_workers_v1(%s)",
                                  (PRUNE_S,)).fetchall())

    @patient
    def defer(self, jobs: list[Job]) -> int:
        """Defer ``jobs`` in order; a job whose queueing lock has one waiting or running already is not deferred
        again. Returns how many were deferred."""
        self.install()
        deferred = 0
        sweeps = {job.args["sweep_id"] for job in jobs}
        busy = set().union(*(self.waiting_or_running(sweep_id) for sweep_id in sweeps))
        with self.app.open():
            for job in jobs:
                if job.queueing_lock in busy:
                    continue
                deferrer = self.app.configure_task(job.task, queue=job.queue, lock=job.lock,
                                                   queueing_lock=job.queueing_lock)
                try:
                    deferrer.defer(**job.args)
                    deferred += 1
                except self._procrastinate.exceptions.AlreadyEnqueued:
                    pass
        return deferred

    @patient
    def cancel_waiting(self, sweep_id: int, lab_host: str) -> list[tuple[str, dict[str, Any]]]:
        """Cancel the sweep's jobs that wait in ``lab_host``'s queue, after putting back those stuck on a dead
        worker (procrastinate's ``retry_job``, as a live worker of the host would); the (task, arguments) of each
        one cancelled. A job a worker took meanwhile is not cancelled (procrastinate cancels only a waiting job),
        so a cell is either measured on its host or returned here, never both."""
        queue = queue_of(lab_host)
        with self._connect() as db:
            stuck = db.execute(
                f"""SELECT j.id FROM procrastinate_jobs j LEFT JOIN procrastinate_workers k ON k.id = j.worker_id
                    WHERE j.status = 'doing' AND {DEAD_WORKER} AND j.queue_name = %s AND j.args->>'sweep_id' = %s""",
                (STALLED_S, queue, str(sweep_id))).fetchall()
        for (job_id,) in stuck:
            self._put_back(job_id)
        with self.app.open():
            manager = self.app.job_manager
            with self._connect() as db:
                rows = db.execute("SELECT id, task_name, args FROM procrastinate_jobs WHERE status = 'todo' "
                                  "AND queue_name = %s AND args->>'sweep_id' = %s ORDER BY id",
                                  (queue, str(sweep_id))).fetchall()
            return [(task, args) for job_id, task, args in rows if manager.cancel_job_by_id(job_id)]

    @patient
    def settle_build(self, sweep_id: int, device: str, model: str) -> BuildState:
        """Where the cell's build job stands, after cancelling it if it still waits (procrastinate cancels only a
        waiting job, so a build worker either took it first or never will) or if its worker is dead (put back,
        then cancelled); one that waits for its lock while a live build worker builds the same artifact (a device
        alike's) is left to wait (``BuildState``)."""

        for _ in range(3):  # a build worker may take the job between the read and the cancel: read again
            with self._connect() as db:
                if not queue_installed(db):
                    return BuildState.NONE
                row = db.execute(
                    f"""SELECT j.id, j.status::text, j.status = 'doing' AND {DEAD_WORKER},
                               EXISTS (SELECT 1 FROM procrastinate_jobs o JOIN procrastinate_workers w
                                         ON w.id = o.worker_id
                                       WHERE o.lock = j.lock AND o.status = 'doing'
                                         AND w.last_heartbeat >= NOW() - make_interval(secs => %s))
                        FROM procrastinate_jobs j LEFT JOIN procrastinate_workers k ON k.id = j.worker_id
                        WHERE j.task_name = %s AND j.args->>'sweep_id' = %s AND j.args->>'device' = %s
                          AND j.args->>'model' = %s ORDER BY j.id DESC LIMIT 1""",
                    (STALLED_S, STALLED_S, BUILD, str(sweep_id), device, model)).fetchone()
                if row is None:
                    return BuildState.NONE
                job_id, status, dead, lock_busy = row
                if status == "todo" and lock_busy:  # a live build worker builds its artifact for a device alike
                    return BuildState.DOING
                if status == "todo" and self.app.job_manager.cancel_job_by_id(job_id, connection=db):
                    return BuildState.TAKEN
            if dead:  # its build worker died: no build worker of that queue may be left to put it back
                self._put_back(job_id)
                continue
            if status != "todo":
                return {"doing": BuildState.DOING, "succeeded": BuildState.SUCCEEDED,
                        "cancelled": BuildState.NONE}.get(status, BuildState.FAILED)
        return BuildState.DOING

    def _put_back(self, job_id: int) -> None:
        """procrastinate's own retry of a dead worker's job (its ``retry_job`` statement) on this call's connection: a
        worker's shared one, never a pool of procrastinate's opened per call (#61: with the build worker dead, every
        slot's cell opened one, past the worker's ``POOL_CONNECTIONS``); a job put back meanwhile is left."""
        import datetime

        import psycopg
        from procrastinate import sql

        with self._connect() as db:
            try:
                db.execute(sql.queries["retry_job"],
                           {"job_id": job_id, "retry_at": datetime.datetime.now(datetime.timezone.utc),
                            "new_priority": None, "new_queue_name": None, "new_lock": None})
            except psycopg.errors.RaiseException as exc:  # put back meanwhile: no longer "doing"
                log.info("job %s was not put back: %s", job_id, message_line(exc))

    @patient
    def cancel_waiting_builds(self, sweep_id: int) -> int:
        """Cancel the sweep's build jobs that still wait once none of its cells does: they serve no cell (a resume
        deferred them while their cells ran). Returns how many."""
        with self._connect() as db:
            if not queue_installed(db):
                return 0
            rows = db.execute("SELECT id FROM procrastinate_jobs WHERE task_name = %s AND status = 'todo' AND "
                              "args->>'sweep_id' = %s", (BUILD, str(sweep_id))).fetchall()
        if not rows:
            return 0
        with self.app.open():
            return sum(bool(self.app.job_manager.cancel_job_by_id(job_id)) for (job_id,) in rows)

    # -- a worker -----------------------------------------------------------------------

    def serve(self, queues: list[str], handlers: dict[str, Callable[..., Any]], slots: int, name: str,
              wait: bool = True, poisoned: Callable[[str, dict[str, Any], int], bool] | None = None) -> None:
        """Run a worker for ``queues`` (a lab host's ``queue_of``, or devices' ``build_queue``) until SIGINT/SIGTERM
        (or, with ``wait`` False, until they are empty): ``slots`` jobs at once, each in a thread, each through
        ``handlers[task]``; and every ``STALL_CHECK_S`` their stalled jobs put back in the queue, unless their
        worker died under them ``MAX_DELIVERIES`` times: then ended, after ``poisoned(task, args, deliveries)`` (in
        a thread) stored what the job's end means: failed, or succeeded where it says the job's work was done
        before (its result committed, its worker killed before the queue heard)."""
        import asyncio  # here, not at import: every command's parser reads this module's constants
        from concurrent.futures import ThreadPoolExecutor

        self.install()
        self._handlers = handlers
        self._outlast_restarts()

        async def main() -> None:
            asyncio.get_running_loop().set_default_executor(
                ThreadPoolExecutor(max_workers=slots, thread_name_prefix="farm-job"))
            async with self.app.open_async():
                self._started_s = self._answered_s = time.monotonic()
                stalled = asyncio.create_task(self._retry_stalled(set(queues), poisoned))
                try:
                    await self.app.run_worker_async(
                        queues=queues, concurrency=slots, name=name, wait=wait, listen_notify=False,
                        fetch_job_polling_interval=POLL_S, update_heartbeat_interval=HEARTBEAT_S,
                        stalled_worker_timeout=PRUNE_S, delete_jobs="never")
                finally:
                    stalled.cancel()

        try:
            asyncio.run(main())
        except self._procrastinate.exceptions.ConnectorException as exc:
            raise FarmError(f"the lab's queue at {redacted(self.url)} failed: {message_line(exc)}",
                            "check the PostgreSQL server, then start the worker again: its jobs wait") from exc

    # what procrastinate's worker asks of its database: a failure of any ends the worker (a failed heartbeat stops it,
    # a failed fetch ends its loop) or leaves its job "doing" for good (a failed finish, on a live worker)
    WORKER_CALLS = ("fetch_job", "finish_job", "retry_job", "update_heartbeat", "list_jobs_to_abort_async",
                    "register_worker", "unregister_worker", "prune_stalled_workers")

    def _outlast_restarts(self) -> None:
        """Make the worker's own database calls (``WORKER_CALLS``) wait through a restart or failover as farm's do
        (#50: a database restart must cost seconds, not the lab's workers): each runs again while its error is the
        connection's (``OperationalError``: the pool's reconnects, a server starting), for up to ``RECONNECT_S``.
        A finish that committed before its connection went reports the job missing when run again: procrastinate
        logs it, and the job is done. A fetch whose answer was lost returns the job it took (``_taken_meanwhile``)."""
        import asyncio

        from farm.store.backends import Outage

        manager, connector_error = self.app.job_manager, self._procrastinate.exceptions.ConnectorException

        def waited_through(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
            async def run(*args: Any, **kwargs: Any) -> Any:
                outage = Outage()
                fetching, before = name == "fetch_job", None  # a fetch: the jobs running for it before it
                while True:
                    try:
                        if fetching and before is None:
                            before = await self._doing_of(kwargs["worker_id"])
                        elif fetching and (taken := await self._taken_meanwhile(kwargs["worker_id"], before)):
                            log.warning("the lab's queue (fetch_job): job %s was taken before the connection went: "
                                        "running it", taken.id)
                            return taken
                        answer = await call(*args, **kwargs)
                        self._note_answer()
                        return answer
                    except connector_error as exc:
                        if not connection_lost(exc.__cause__):
                            raise
                        self._unreachable_s = time.monotonic()  # the stall check waits (stall_check_due)
                        if (wait := outage.pause()) is None:
                            raise
                        if outage.tries == 1:
                            log.warning("the lab's queue (%s): %s: trying again", name, message_line(exc.__cause__ or exc))
                        await asyncio.sleep(wait)

            return run

        for name in self.WORKER_CALLS:
            setattr(manager, name, waited_through(name, getattr(manager, name)))

    def _note_answer(self) -> None:
        """An answer from the database: one after ``SILENT_GAP_S`` without any (its calls blocked, waiting for a
        connection in an outage, rather than failing) ends an outage as a failure would (``stall_check_due``)."""
        now = time.monotonic()
        if now - self._answered_s > SILENT_GAP_S:
            self._unreachable_s = now
        self._answered_s = now

    async def _doing_of(self, worker_id: int) -> set[int]:
        """The jobs marked running for ``worker_id``: what a fetch finds taken meanwhile is the one it fetched."""
        rows = await self.app.connector.execute_query_all_async(
            "SELECT id FROM procrastinate_jobs WHERE status = 'doing' AND worker_id = %(worker_id)s", worker_id=worker_id)
        return {row["id"] for row in rows}

    async def _taken_meanwhile(self, worker_id: int, before: set[int] | None) -> Any:
        """The job a fetch took for ``worker_id`` whose answer was lost with the connection (it committed, the
        worker never heard): marked running for this worker since the fetch began. A worker fetches one job at a
        time, so it is that fetch's. Fetched again, another job would run and this one stay "doing" on a live
        worker for good, holding its device's lock (#61); None when the fetch took nothing."""
        taken = sorted(await self._doing_of(worker_id) - (before or set()))
        if not taken:
            return None
        row = await self.app.connector.execute_query_one_async("SELECT * FROM procrastinate_jobs WHERE id = %(id)s",
                                                               id=taken[0])
        return self._procrastinate.jobs.Job.from_row(row)

    async def _retry_stalled(self, queues: set[str],
                             poisoned: Callable[[str, dict[str, Any], int], bool] | None = None) -> None:
        """Put back in their queue the jobs of ``queues`` whose worker stopped beating (killed, or host rebooted);
        end failed those whose worker died under them ``MAX_DELIVERIES`` times (``serve``)."""
        import asyncio

        manager = self.app.job_manager
        while True:
            await asyncio.sleep(STALL_CHECK_S)
            if not stall_check_due(time.monotonic(), self._started_s, self._unreachable_s):
                continue
            try:
                one = next(iter(queues)) if len(queues) == 1 else None  # else all queues' stalled jobs, filtered
                asked = time.monotonic()
                stalled_jobs = await manager.get_stalled_jobs(queue=one, seconds_since_heartbeat=STALLED_S)
                self._note_answer()
                if time.monotonic() - asked > HEARTBEAT_S:  # it waited for the database: what it read is stale
                    self._unreachable_s = time.monotonic()
                    continue
                for job in stalled_jobs:
                    if job.queue not in queues:
                        continue
                    deliveries = job.attempts + 1  # procrastinate's attempts: one more at each retry
                    if deliveries < MAX_DELIVERIES:
                        log.warning("job %s (%s %s) stalled on a silent worker: queued again", job.id, job.task_name,
                                    job.task_kwargs)
                        await manager.retry_job(job)
                        continue
                    done = await self._told_poisoned(poisoned, job, deliveries)
                    log.error("job %s (%s %s): its worker died %d times under it: ended %s, not queued again",
                              job.id, job.task_name, job.task_kwargs, deliveries,
                              "succeeded (its work was done before)" if done else "failed")
                    status = self._procrastinate.jobs.Status
                    await manager.finish_job(job, status=status.SUCCEEDED if done else status.FAILED, delete_job=False)
            except self._procrastinate.exceptions.ConnectorException as exc:
                if connection_lost(exc.__cause__):
                    self._unreachable_s = time.monotonic()
                log.warning("could not look for stalled jobs: %s", message_line(exc))

    async def _told_poisoned(self, poisoned: Callable[[str, dict[str, Any], int], bool] | None, job: Any,
                             deliveries: int) -> bool:
        """``poisoned``'s answer for a poison job (in a thread); its failure (the job names a device or a sweep this
        worker does not know) is logged and the job is ended failed all the same, never left "doing" holding its
        device's lock, nor stopping the check of the stalled jobs after it."""
        import asyncio

        if poisoned is None:
            return False
        try:
            return bool(await asyncio.to_thread(poisoned, job.task_name, dict(job.task_kwargs), deliveries))
        except Exception:  # noqa: BLE001  # the job ends failed without what its handler would have stored
            log.exception("job %s (%s): what its end means could not be stored", job.id, job.task_name)
            return False
