"""Queue names and how jobs are enqueued (with retries on database errors)."""
from __future__ import annotations

from rq import Queue, Retry

SETTLE = "floodgate"  # the one queue the `worker` process listens on
# The first retry is immediate (a blip, or a job abandoned by a killed worker), then back-off.
RETRY = Retry(max=9, interval=[0, 1, 2, 5, 10, 30, 60, 120, 300])
JOB_TIMEOUT = 120


def queue(connection, name: str = SETTLE) -> Queue:
    return Queue(name, connection=connection)


def enqueue_drain(q: Queue, **meta) -> None:
    """Ask a worker to drain the pending settlements."""
    q.enqueue("workers.settle.drain", job_timeout=JOB_TIMEOUT, retry=RETRY, meta=meta,
              description="drain pending settlements")
