"""Periodic jobs, declared as data and scheduled idempotently: a job's id is a hash of its
definition, so starting the scheduler twice (or restarting it) never schedules a job twice,
and a changed definition replaces the old one. `python -m workers.schedule` runs the
scheduler (the Procfile's `scheduler`)."""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import time
from datetime import datetime, timezone
from types import FrameType
from typing import Any

from redis import Redis
from rq.registry import StartedJobRegistry
from rq_scheduler import Scheduler

from webhooks import config, logs
from webhooks.storage.live import keys
from webhooks.storage.live.outbox_queue import EVENTS
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.live.settle_queue import JOB_TIMEOUT, SETTLE

log = logging.getLogger(__name__)

ID_PREFIX = "fg-periodic-"
PERIODIC = [
    {"func": "workers.reconcile.reconcile_all", "interval": 3600, "description": "reconcile caps"},
    {"func": "workers.settle.sweep", "interval": 60, "description": "drain settlements (safety net)"},
    {"func": "workers.outbox.sweep", "interval": 10, "description": "send due events (safety net)"},
    {
        "func": "workers.leads.sweep_abandoned",
        "interval": config.SWEEP_INTERVAL_MS // 1000,
        "description": "finish leads no retry came for",
    },
    {"func": "workers.retention.purge_bodies", "interval": 3600, "description": "empty lead bodies past retention"},
    {"func": "workers.payouts.release_payouts", "interval": 60, "description": "release payouts whose hold is over"},
]


def periodic(cfg: config.Config) -> list[dict[str, Any]]:
    """The periodic jobs under `cfg`: PERIODIC, and the provider reconciliation every
    PROVIDER_RECONCILE_INTERVAL_S (a changed interval is a changed definition: rescheduled)."""
    return PERIODIC + [
        {
            "func": "workers.payments.reconcile_providers",
            "interval": cfg.provider_reconcile_interval_s,
            "description": "credit provider payments whose webhook never came",
        }
    ]


def job_id(definition: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]
    return ID_PREFIX + digest


def register(scheduler: Scheduler, definitions: list[dict[str, Any]] = PERIODIC) -> list[str]:
    """Make the scheduled periodic jobs exactly `definitions`; return their ids."""
    wanted = {job_id(d): d for d in definitions}
    existing = {job.id: job for job in scheduler.get_jobs() if job.id.startswith(ID_PREFIX)}
    for jid, job in existing.items():
        if jid not in wanted:
            log.info("cancelling old periodic job %s", jid)
            scheduler.cancel(job)
            _give_back_held(scheduler.connection, jid)
    for jid, d in wanted.items():
        if jid not in existing:
            log.info("scheduling %s every %ss", d["func"], d["interval"])
            scheduler.schedule(
                scheduled_time=datetime.now(timezone.utc),
                func=d["func"],
                interval=d["interval"],
                repeat=None,
                id=jid,
                queue_name=SETTLE,
                timeout=JOB_TIMEOUT,
                description=d["description"],
            )
    return list(wanted)


def _give_back_held(connection: Redis, jid: str) -> int:
    """Put the batches a cancelled periodic job still held (its run failed or was killed, and
    only a run under its id would have taken them back) on their queues again; how many."""
    moved = 0
    for held, pending in (
        (keys.settle_processing(jid), keys.SETTLE_PENDING),
        (keys.webhook_calls_processing(jid), keys.WEBHOOK_CALLS_PENDING),
    ):
        while connection.lmove(held, pending, "RIGHT", "RIGHT") is not None:
            moved += 1
    if moved:
        log.warning("periodic job %s was replaced: %d item(s) it held are queued again", jid, moved)
    return moved


def requeue_abandoned(connection: Redis, queues: tuple[str, ...] = (SETTLE, EVENTS)) -> list[str]:
    """Run again (as its retries allow) every job of the settlement and events queues whose
    worker stopped its heartbeat: killed -9, its machine gone, or Redis away as the job ended
    (workers/worker.py). RQ does this too, but only in a worker's maintenance pass (every 10
    minutes), and a killed worker's batch of settlements waited for it. The heartbeat lasts a
    minute and a half (RQ's job monitoring interval + 60 s; a SimpleWorker does not renew it
    while a job runs, so every job here hands over to a fresh one after 30 s), so a batch
    comes back that long after its worker died. Returns the ids found abandoned."""
    expired: list[str] = []
    for name in queues:
        registry = StartedJobRegistry(name, connection=connection)
        found = registry.get_expired_job_ids()
        if found:
            registry.cleanup()
            expired += found
    if expired:
        log.warning(
            "%d job(s) of a dead worker handed to RQ's abandoned-job handling (retried if they have retries left): %s",
            len(expired),
            ", ".join(expired),
        )
    return expired


# rq_scheduler ships no types (pyproject's [tool.mypy]): its Scheduler is Any, the one class
# subclassed across that boundary.
class _Scheduler(Scheduler):  # type: ignore[misc]
    """Declares the periodic jobs again before each poll: a Redis restarted empty loses them with
    everything else, and the sweeps among them are what recovers from that (a no-op otherwise).
    Each poll also hands the jobs of dead workers back to the queue."""

    definitions: list[dict[str, Any]] = PERIODIC

    def enqueue_jobs(self) -> Any:
        register(self, self.definitions)
        try:
            requeue_abandoned(self.connection)
        except Exception:  # never stop the scheduler's own work for it
            log.exception("requeueing abandoned jobs failed")
        return super().enqueue_jobs()

    def run(self, burst: bool = False) -> None:
        """rq-scheduler's loop, through Redis outages: a poll that meets one is skipped and the
        next comes an interval later (rq-scheduler's own loop exits on the first error, and the
        periodic jobs stopped with it). Only a signal ends it."""
        self._install_signal_handlers()
        try:
            while True:
                started = time.monotonic()
                try:
                    self.poll(burst)
                except REDIS_DOWN as exc:
                    log.warning("Redis unavailable (%s): polling again in %s s", exc, self._interval)
                if burst:
                    return
                time.sleep(max(0.0, self._interval - (time.monotonic() - started)))
        finally:
            try:
                self.remove_lock()
                self.register_death()
            except REDIS_DOWN:
                pass  # both keys expire by themselves

    def poll(self, burst: bool = False) -> None:
        """One round: enqueue the jobs that are due, unless another scheduler holds the lock."""
        if not self.connection.exists(self.key):  # first poll, or Redis came back empty
            self.register_birth()
        self.heartbeat()
        if not self.acquire_lock():
            log.info("another scheduler holds the lock: skipping this poll")
            return
        try:
            self.enqueue_jobs()
            self.heartbeat()
        finally:
            self.remove_lock()

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("shutting down the scheduler")
            raise SystemExit()  # run() gives back the lock, if Redis answers

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)


def main() -> None:
    cfg = config.load()
    logs.configure(cfg.log_level)
    scheduler = _Scheduler(queue_name=SETTLE, connection=Redis.from_url(cfg.queue_redis_url), interval=5)
    scheduler.definitions = periodic(cfg)
    scheduler.run()  # its first poll schedules the periodic jobs


if __name__ == "__main__":
    main()
