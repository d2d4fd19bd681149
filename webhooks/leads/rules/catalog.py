"""Per-process cache of buyer and publisher config, so the lead path never reads the database.

Every admin change writes a new random value to one Redis key; each process compares it at
most every CHECK_INTERVAL seconds and reloads from the database when it differs, so a change
is live everywhere within a second. A full reload every MAX_AGE seconds covers a version write
that was lost (Redis briefly down right after an admin change).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import cast

from webhooks.formats.consumer import DEFAULT_SUPPRESSION_KEY
from webhooks.leads.rules import suppression
from webhooks.leads.rules.buyers import BuyerRule
from webhooks.leads.rules.publishers import PublisherRule
from webhooks.leads.rules.suppression import ListRule
from webhooks.storage.live import keys
from webhooks.storage.live.batch import Client
from webhooks.storage.live.redis import REDIS_DOWN
from webhooks.storage.records.db import UNAVAILABLE_ERRORS, db
from webhooks.storage.records.models import Buyer, Publisher

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.5  # seconds; CONFIG_CHECK_INTERVAL_MS overrides (tests use less)
MAX_AGE = 30.0


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    version: str | None = None
    buyers: tuple[BuyerRule, ...] = ()  # active, in waterfall order
    publishers_by_key: dict[str, PublisherRule] = field(default_factory=dict)
    inactive: tuple[str, ...] = ()  # ids of the buyers switched off (not deleted), for the trace
    suppression: dict[str, ListRule] = field(default_factory=dict)  # every suppression list, by id
    # the wallets ("<account>|<currency>") any buyer not deleted is billed from, switched off or not
    billed_wallets: frozenset[str] = frozenset()


def bump_version(r: Client) -> None:
    """Tell every process that config changed (call after the database commit)."""
    r.set(keys.CONFIG_VERSION, uuid.uuid4().hex)


def load_snapshot(version: str | None, suppression_key: str = DEFAULT_SUPPRESSION_KEY) -> Snapshot:
    with db.connection_context():
        rows = list(Buyer.select().where(Buyer.deleted_at.is_null()))
        buyers = [BuyerRule.from_row(b) for b in rows if b.active]
        inactive = tuple(sorted(b.id for b in rows if not b.active))
        billed = frozenset(b.billing_account for b in rows if b.billing_account)
        publishers = {p.api_key_hash: PublisherRule.from_row(p) for p in Publisher.select()}
        lists = suppression.load_rules(suppression_key.encode())
    buyers.sort(key=lambda b: (b.priority, -b.price, b.id))
    return Snapshot(
        version=version,
        buyers=tuple(buyers),
        publishers_by_key=publishers,
        inactive=inactive,
        suppression=lists,
        billed_wallets=billed,
    )


class Catalog:
    def __init__(
        self, redis: Client, check_interval: float = CHECK_INTERVAL, suppression_key: str = DEFAULT_SUPPRESSION_KEY
    ):
        self.redis = redis
        self.suppression_key = suppression_key
        self.check_interval = check_interval
        self._snapshot: Snapshot | None = None
        self._checked = 0.0
        self._loaded = 0.0
        self._lock = threading.Lock()  # gevent-patched in the web process

    def invalidate(self) -> None:
        """Read the version again on the next snapshot (the admin API of this process has
        just changed the config)."""
        self._checked = 0.0

    def invalidate_all(self) -> None:
        """Load the config again on the next snapshot, whatever the version says."""
        self._snapshot = None
        self._checked = 0.0

    def snapshot(self) -> Snapshot:
        """The current config; raises a redis error when the version cannot be read."""
        current = self._snapshot
        if current is not None and time.monotonic() - self._checked < self.check_interval:
            return current
        with self._lock:  # one greenlet refreshes; the others wait for its result
            now = time.monotonic()
            if self._snapshot is not None and now - self._checked < self.check_interval:
                return self._snapshot
            version = self.redis.get(keys.CONFIG_VERSION)
            if version is None:
                # Redis lost the key (restart, flush): make one so processes agree again.
                self.redis.set(keys.CONFIG_VERSION, uuid.uuid4().hex, nx=True)
                version = self.redis.get(keys.CONFIG_VERSION)
            current = self._snapshot
            if current is None or version != current.version or now - self._loaded > MAX_AGE:
                current = self._snapshot = load_snapshot(
                    cast("str | None", version), self.suppression_key
                )  # decoded replies
                self._loaded = now
                log.info("config loaded: %d buyers, %d publishers", len(current.buyers), len(current.publishers_by_key))
            self._checked = now
            return current

    def billed_wallets(self) -> frozenset[str] | None:
        """The wallets buyers are billed from, as of the snapshot (at most a check interval old);
        None when the config cannot be read now."""
        try:
            return self.snapshot().billed_wallets
        except (*REDIS_DOWN, *UNAVAILABLE_ERRORS) as exc:
            log.warning("config unreadable, billed wallets unknown: %s", exc)
            return None
