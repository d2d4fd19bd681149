"""Erasing one lead's personal data everywhere Floodgate keeps it: the ledger, the dedupe
digests at its buyer, every web process's journal and Redis' files on disk (docs/leads.md
"Erasure")."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from webhooks.leads.accounting.ledger import erase_personal_data, forget_consumer
from webhooks.storage.live import erasures, persistence
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.records.models import Lead

log = logging.getLogger(__name__)


class Processes(enum.StrEnum):
    """Whether every web process has dropped the lead's body from its journal."""

    FORGOTTEN = "forgotten"  # every live journal said so
    PENDING = "pending"  # one had not by the deadline, or the feed's Redis did not answer


@dataclass(frozen=True, kw_only=True)
class Erasure:
    """Where an erasure reaches: what the caller needs, by name."""

    store: Store  # REDIS_URL: the dedupe digests
    queue_redis: Store  # RQ_REDIS_URL: the journals' feed
    forget_here: Callable[[Collection[tuple[str, str]]], None]  # this process's journal
    journal_keep_s: float
    wait_s: float  # how long the answer waits for the journals and Redis' files together


def erase(e: Erasure, lead: Lead) -> tuple[dict[str, Any], bool]:
    """Erase `lead`'s personal data: the ledger first (it stands whatever follows), then its
    dedupe digests, every journal's copy and Redis' files. (The answer, whether all of it is
    done.) Safe to repeat: a retry does again what did not finish."""
    deadline = time.monotonic() + e.wait_s
    key = (lead.publisher_id, lead.lead_id)
    record = erase_personal_data(lead)
    forget_consumer(e.store, lead)
    e.forget_here({key})
    processes = _forget_everywhere(e, key, deadline)
    rewrite = persistence.rewrite((e.store.redis, e.queue_redis.redis), wait_s=max(0.0, deadline - time.monotonic()))
    at = rewrite.finished_at
    answer = {
        **record,
        "web_processes": processes.value,
        "redis_files": rewrite.files.value,
        "redis_rewritten_at": None if at is None else at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }
    done = processes is Processes.FORGOTTEN and rewrite.files in (
        persistence.Files.REWRITTEN,
        persistence.Files.NOT_PERSISTED,
    )
    return answer, done


def _forget_everywhere(e: Erasure, key: tuple[str, str], deadline: float) -> Processes:
    """Announce the erasure to every journal and wait (until `deadline`) for each live one's word."""
    client = e.queue_redis.redis
    try:
        announced = erasures.announce(client, lead=key, keep_s=e.journal_keep_s)
        while not erasures.forgotten_everywhere(client, announced):
            if time.monotonic() >= deadline:
                log.warning("erasure of %s:%s: a web process had not dropped its body in time", *key)
                return Processes.PENDING
            time.sleep(persistence.POLL_S)
    except REDIS_DOWN as exc:
        log.warning("erasure of %s:%s: the journals' feed is unreachable: %s", *key, exc)
        return Processes.PENDING
    return Processes.FORGOTTEN
