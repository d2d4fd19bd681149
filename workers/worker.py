"""The RQ worker class of the Procfile's `worker` and `events` (`-w workers.worker.Worker`):
RQ's SimpleWorker, kept alive through a Redis outage. RQ records a job's end in Redis and
quits on any error its work loop meets outside the wait for a job ("found an unhandled
exception, quitting..."): a Redis restart while a job ran ended the worker for good. Here a
Redis error in that bookkeeping waits for Redis to answer again and carries on; the job's
work is left for its next run (each job is safe to run twice). docs/operations.md."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from rq import Queue
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import StopRequested
from rq.job import Job
from rq.scheduler import RQScheduler
from rq.worker import SimpleWorker

from webhooks.storage.live.redis import REDIS_DOWN

log = logging.getLogger(__name__)

WAIT_MAX_S = 5.0  # the longest pause between two pings of a Redis that does not answer
REENTER_RESET_S = 60.0  # a work loop that ran this long ended on an error of its own
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # what a deploy or a Ctrl-C sends


class Scheduler(RQScheduler):
    """RQ's scheduler (--with-scheduler), a process its worker forks, that leaves with its
    worker. RQ stops it only by a signal: a worker killed -9 (the OOM killer, a supervisor's
    hard stop) left it running under PID 1, heartbeating in a dead worker's name and holding
    the scheduler locks, one more such process after each death. Each heartbeat (every
    second) it looks at its parent; gone, it releases its locks and stops.

    A stop signal that reaches the new process before it has set its own handlers would be
    taken by the worker's inherited ones and lost, and the worker, which waits for its
    scheduler to exit, would wait until killed: the fork happens with SIGINT and SIGTERM
    blocked, and the child lets them in once its handlers are set."""

    _parent: int | None = None

    def start(self) -> Any:
        self._parent = os.getpid()  # before the fork: the child's parent
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            return super().start()  # type: ignore[no-untyped-call]  # RQ leaves it unannotated
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal held meanwhile arrives now

    def _install_signal_handlers(self) -> None:
        """In the forked process, first thing: its handlers, then the signals held since the fork."""
        super()._install_signal_handlers()  # type: ignore[no-untyped-call]  # RQ leaves it unannotated
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def heartbeat(self) -> None:
        if self._parent is not None and os.getppid() != self._parent:
            log.warning("the worker that started this scheduler is gone: stopping")
            self._stop_requested = True  # the loop's next turn releases the locks and stops
            return
        super().heartbeat()  # type: ignore[no-untyped-call]  # RQ leaves it unannotated


class Worker(SimpleWorker):
    """SimpleWorker that outlives a Redis outage (and revives its scheduler after one)."""

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        """RQ's work loop, entered again when it ends with no stop asked for. RQ ends it on
        any error it does not expect ("found an unhandled exception, quitting...", logged with
        its traceback), and an error its bookkeeping meets while Redis restarts, or a command
        Redis refuses for a while, is not the end of the process's work: every job is safe to
        run twice, and what RQ had not recorded is handed back by the scheduler. A burst run,
        a stop, or a limit the caller set ends as RQ ends it."""
        pause = 0.5
        while True:
            entered = time.monotonic()
            try:
                worked = bool(super().work(burst, *args, **kwargs))
            except REDIS_DOWN as exc:  # RQ's teardown (its death, its scheduler) met Redis away
                log.warning("Redis unavailable as the work loop ended (%s)", exc)
                worked = False
            if burst or self._stopping() or kwargs.get("max_jobs") or kwargs.get("max_idle_time"):
                return worked
            # An error that lasts (a command Redis refuses) ends each turn at once: the turns
            # come further apart, up to WAIT_MAX_S, and close again after a turn that lasted.
            pause = 0.5 if time.monotonic() - entered > REENTER_RESET_S else min(pause * 2, WAIT_MAX_S)
            log.error("RQ's work loop ended with no stop asked for (see above): entering it again in %.1f s", pause)
            try:
                time.sleep(pause)
            except StopRequested:  # RQ's handler of a stop signal, still set
                return worked
            self._await_redis(lambda: self.connection.delete(self.key))  # RQ registers it again

    def _stopping(self) -> bool:
        """Whether a stop was asked for: RQ marks `_stop_requested` only for a stop that comes
        during a job; an idle worker's stop ends its loop by an exception, and only the date RQ
        keeps of every stop request tells it (a worker entered its loop again after Ctrl-C and
        was killed at the end of scripts/run's grace)."""
        return bool(self._stop_requested or getattr(self, "_shutdown_requested_date", None))

    def execute_job(self, job: Job, queue: Queue) -> None:
        try:
            super().execute_job(job, queue)
        except REDIS_DOWN as exc:
            # The job ran (or failed) but RQ could not record it: left in its started registry,
            # it is handed back as abandoned once Redis is up (workers/schedule.py).
            log.warning("Redis unavailable as job %s ended (%s): waiting for it", job.id, exc)
            self._wait_for_redis()
        self._revive_scheduler()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:  # queued on a pipeline: nothing is sent yet
            super().heartbeat(timeout, pipeline)
            return
        try:
            super().heartbeat(timeout)
        except REDIS_DOWN as exc:
            log.warning("Redis unavailable for the heartbeat (%s): waiting for it", exc)
            self._wait_for_redis()

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except REDIS_DOWN as exc:
            log.warning("Redis unavailable (%s): waiting for it", exc)
            self._wait_for_redis()

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()  # type: ignore[no-untyped-call]  # RQ leaves it unannotated
        except REDIS_DOWN as exc:  # tried again at the next loop
            log.warning("Redis unavailable for maintenance (%s)", exc)

    def _wait_for_redis(self) -> None:
        """Wait for Redis to answer, then register this worker again if Redis came back empty,
        so that `rq info` and the dashboards see it."""
        self._await_redis(self._register_again)
        log.info("Redis answers again: carrying on")

    def _register_again(self) -> None:
        if not self.connection.sismember(self.redis_workers_keys, self.key):
            self.connection.delete(self.key)  # a heartbeat's remains, if any
            self.register_birth()  # type: ignore[no-untyped-call]  # RQ leaves it unannotated

    def _await_redis(self, then: Callable[[], object]) -> None:
        """Ping until Redis answers and `then` has run (or a stop is asked for)."""
        pause = 0.5
        while not self._stop_requested:
            try:
                self.connection.ping()
                then()
                return
            except REDIS_DOWN:
                time.sleep(pause)
                pause = min(pause * 2, WAIT_MAX_S)

    def _start_scheduler(
        self,
        burst: bool = False,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """RQ 3.0's own (rq/worker/base.py), with Scheduler for RQScheduler."""
        scheduler: RQScheduler = Scheduler(  # typed as RQ's: its methods are unannotated
            self.queues,
            connection=self.connection,
            logging_level=logging_level if logging_level is not None else self.log.level,
            date_format=date_format,
            log_format=log_format,
            serializer=self.serializer,
        )
        self.scheduler = scheduler
        scheduler.acquire_locks()
        if not scheduler.acquired_locks:
            return
        if not burst:
            scheduler.start()
            return
        try:
            scheduler.register_birth()
            scheduler.enqueue_scheduled_jobs()
        finally:
            scheduler.release_locks()
            scheduler.register_death()

    def _revive_scheduler(self) -> None:
        """RQ's scheduler (--with-scheduler, a child process: retries and delayed jobs) exits on
        a Redis error and RQ starts it again only at its 10-minute maintenance: start it now.
        Not once a stop is asked for: RQ stopped the scheduler then, and waits for it as it quits."""
        scheduler = self.scheduler
        if self._stop_requested or scheduler is None:
            return
        if scheduler._process is not None and scheduler._process.is_alive():
            return
        try:
            scheduler.acquire_locks(auto_start=True)
        except REDIS_DOWN as exc:
            log.warning("RQ's scheduler not restarted yet (%s)", exc)
