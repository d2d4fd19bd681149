"""Every Redis key name, from one prefix. Keys of one entity share a hash tag so that each
Lua script touches a single Redis Cluster slot: `{b:<buyer>}`, `{p:<publisher>}`,
`{pay:<provider>:<reference>}`. A wallet's balance, `{w:<account>|<currency>}`, is shared by its
buyers on one Redis only (balance_of; docs/cluster.md "Wallets")."""

from __future__ import annotations

PREFIX = "fg:"


def buyer(buyer_id: str, *parts: str) -> str:
    return PREFIX + "{b:" + buyer_id + "}:" + ":".join(parts)


def cap_counter(buyer_id: str, cap: str, window: str) -> str:
    return buyer(buyer_id, "cap", cap, window)


def lease(buyer_id: str, lease_id: str) -> str:
    return buyer(buyer_id, "lease", lease_id)


def leases(buyer_id: str) -> str:
    """Sorted set of the buyer's live leases (score: reserved at, Redis time in µs)."""
    return buyer(buyer_id, "leases")


def ready(buyer_id: str) -> str:
    """Present while the buyer's counters can be trusted (absent after Redis lost data)."""
    return buyer(buyer_id, "ready")


def balance(buyer_id: str) -> str:
    """The balance hash of a billed buyer on a Redis Cluster, where a wallet is one buyer's
    alone (docs/cluster.md "Wallets"); on one Redis, the key a lease of a buyer not billed
    names in its place. Fields as wallet_balance's."""
    return buyer(buyer_id, "balance")


def wallet_balance(wallet: str) -> str:
    """Hash of one wallet's balance ("<account>|<currency>"), shared by every buyer billed from
    it (minor units): `account`, `wallet` and `version` (the ledger's, lua/sync_balance.lua),
    `held` (prices of every such buyer's live leases and of its sales the ledger does not have
    yet), `cycle` (the version that last raised it: lua/sync_balance.lua), `rebuilt` (set by
    the rebuild after a data loss: lua/rebuild_counters.lua). Absent or without
    `wallet`: not known, and its buyers are sold nothing until it is (fail closed)."""
    return PREFIX + "{w:" + wallet + "}:balance"


def wallet_lock(wallet: str) -> str:
    """Held while a buyer billed from the wallet is checked and written (billing/balance.py
    wallet_lock): its value is the holder's token."""
    return PREFIX + "{w:" + wallet + "}:lock"


def balance_of(buyer_id: str, wallet: str, *, shared: bool) -> str:
    """The balance a buyer billed from `wallet` draws on: the wallet's own on one Redis
    (`shared`), the buyer's on a Redis Cluster (every key of a reservation in one slot)."""
    return wallet_balance(wallet) if shared and wallet else balance(buyer_id)


def dedupe(buyer_id: str, field: str, digest: str) -> str:
    """Present while the buyer has bought the consumer whose normalised `field` hashes to
    `digest` (value: the lease that reserved it, or "ledger" when restored from it)."""
    return buyer(buyer_id, "dedupe", field, digest)


def reconciling(buyer_id: str) -> str:
    """Present while a reconciliation of the buyer runs (a return then leaves the slot to it)."""
    return buyer(buyer_id, "reconciling")


def rebuild_lock(buyer_id: str) -> str:
    return buyer(buyer_id, "rebuild")


def breaker(buyer_id: str) -> str:
    """The buyer's own circuit, for every publisher: transport failures in a row, open-until,
    probe-until (docs/leads.md "Circuit breakers")."""
    return buyer(buyer_id, "breaker")


def publisher_breaker(buyer_id: str, publisher_id: str) -> str:
    """The buyer's circuit for one publisher's leads: failed replies to them in a row,
    open-until, probe-until."""
    return buyer(buyer_id, "breaker", "p", publisher_id)


def breaker_publishers(buyer_id: str) -> str:
    """Sorted set of the publishers whose circuit at the buyer opened (score: open-until, ms)
    and has not closed since."""
    return buyer(buyer_id, "breaker", "publishers")


def round_robin(priority: int) -> str:
    """Round-robin routing's counter of one priority group, shared by every web process."""
    return PREFIX + "rr:" + str(priority)


def lead_claim(publisher_id: str, lead_id: str) -> str:
    return PREFIX + "{p:" + publisher_id + "}:lead:" + lead_id


def lead_attempt(publisher_id: str, lead_id: str) -> str:
    """The buyer (and lease) a lead is being offered to right now, written before the offer,
    so that the retry of a request whose process died offers it to that buyer only."""
    return lead_claim(publisher_id, lead_id) + ":attempt"


def lead_memory(publisher_id: str) -> str:
    """Since when (ms, "0": always) Redis remembers every answer given to the publisher; see
    lua/claim_lead.lua."""
    return PREFIX + "{p:" + publisher_id + "}:memory"


def earnings(publisher_id: str, day: str) -> str:
    """A publisher's buyers' offers, accepted and returned sales and net earnings (cents) of one
    UTC day (YYYYMMDD), a hash of `<buyer>:<o|a|r|e>` fields: what `epl` routing ranks by."""
    return PREFIX + "{p:" + publisher_id + "}:epl:" + day


def earnings_ready(publisher_id: str) -> str:
    """Present while the publisher's earnings can be trusted (absent after Redis lost data:
    its epl leads wait for the rebuild from the ledger)."""
    return PREFIX + "{p:" + publisher_id + "}:epl:ready"


def earnings_rebuild_lock(publisher_id: str) -> str:
    return PREFIX + "{p:" + publisher_id + "}:epl:rebuild"


def publisher_cap(publisher_id: str, cap: str, window: str) -> str:
    """A publisher's count of leads accepted in one UTC window (`caps`: hourly, daily), under
    its own hash tag: lua/claim_lead.lua counts it with the lead's claim."""
    return f"{PREFIX}{{p:{publisher_id}}}:cap:{cap}:{window}"


def publisher_prechecks(publisher_id: str, hour: str) -> str:
    """A publisher's count of pre-pings in one UTC hour (lua/take_precheck.lua), beside its
    hourly lead counter (`publisher_cap(..., "hourly", hour)`) under the same hash tag."""
    return f"{PREFIX}{{p:{publisher_id}}}:precheck:{hour}"


def rate_bucket(publisher_id: str) -> str:
    """The publisher's token bucket (lua/take_token.lua); gone while the bucket is full."""
    return PREFIX + "{p:" + publisher_id + "}:bucket"


def payment(provider: str, reference: str, what: str) -> str:
    return PREFIX + "{pay:" + provider + ":" + reference + "}:" + what


CONFIG_VERSION = PREFIX + "config:version"
EPOCH = PREFIX + "epoch"  # random, made anew when the settlement Redis starts empty
SETTLE_PENDING = PREFIX + "settle:pending"
SETTLE_SCHEDULED = PREFIX + "settle:scheduled"
# The erasure feed (storage/live/erasures.py), on the settlement Redis beside EPOCH: a stream of the
# leads whose personal data was erased, and each web process's journal's word on how far it read.
ERASURES = PREFIX + "erasures"
ERASURES_SEEN = PREFIX + "erasures:seen"


def settle_processing(job_id: str) -> str:
    return PREFIX + "settle:processing:" + job_id


# Queued audit rows of payment webhook calls (webhook_calls). The key strings keep their older
# word ("deliveries"): a rename would strand the rows the running release queued under them.
WEBHOOK_CALLS_PENDING = PREFIX + "deliveries:pending"  # audit rows of webhook calls that changed nothing
WEBHOOK_CALLS_FAILED = PREFIX + "deliveries:failed"  # audit rows the database refused (workers/settle.py)
# The last 1,000 payment webhooks that failed their signature check, newest first: JSON of
# provider, body length and SHA-256, time, request id; never a body or header (payments/rejected.py).
# One key, so one slot on a Redis Cluster.
REJECTED_WEBHOOKS = PREFIX + "webhooks:rejected"


def webhook_calls_processing(job_id: str) -> str:
    """A drain job's audit rows in flight; the older word kept, as for WEBHOOK_CALLS_PENDING."""
    return PREFIX + "deliveries:processing:" + job_id


def ops_session(session_digest: str) -> str:
    """An /ops browser session, by the SHA-256 of its cookie (a copy of Redis holds no live
    cookie); its value binds it to the admin token it was opened with, or names the operator
    user it belongs to and its CSRF token (webhooks/web/sessions.py); its TTL ends it."""
    return PREFIX + "ops:session:" + session_digest


def ops_login_failures(address_digest: str) -> str:
    """Tries of the admin token from one client address (by its SHA-256) on any path that
    takes it (webhooks/web/logins.py), counted for a few minutes."""
    return PREFIX + "ops:login-failures:" + address_digest


def user_login_failures(account_digest: str, address_digest: str) -> str:
    """Wrong passwords or TOTP codes for one operator user's account (by the SHA-256 of its
    e-mail) from one client address (by its SHA-256), counted for a few minutes: an account is
    locked for that address only (webhooks/web/people/signin.py)."""
    return PREFIX + "ops:user-login-failures:" + account_digest + ":" + address_digest


def user_totp_used(user_id: int, step: int) -> str:
    """A TOTP code's time step once an operator user logged in with it: the same code is not
    taken twice."""
    return PREFIX + f"ops:totp-used:{user_id}:{step}"


def buyer_key_failures(address_digest: str) -> str:
    """Wrong buyer API keys presented from one client address (by its SHA-256), counted for a
    few minutes as the admin token's tries are (webhooks/web/logins.py)."""
    return PREFIX + "buyer:key-failures:" + address_digest


def refund(provider: str, reference: str, what: str) -> str:
    """A refund's claim and processed marker: a key space of their own, so that a refund
    reference can never collide with a payment reference of the same provider."""
    return PREFIX + "{ref:" + provider + ":" + reference + "}:" + what


# The payment events outbox (webhooks/payments/outbox.py), on the queue's Redis: a drain job is
# scheduled or running while OUTBOX_SCHEDULED lives; OUTBOX_WAKE wakes a lingering one; only the
# holder of OUTBOX_LOCK sends, so one customer's events go out one after the other.
OUTBOX_SCHEDULED = PREFIX + "outbox:scheduled"
OUTBOX_WAKE = PREFIX + "outbox:wake"
OUTBOX_LOCK = PREFIX + "outbox:lock"


# The provider reconciliation's lock (payments/reconcile.py): one run at a time across every
# scheduler and worker; its value is the holder's token (released by compare-and-delete).
PROVIDER_RECONCILE_LOCK = PREFIX + "payments:reconcile:lock"


def retention_mark(group: str) -> str:
    """Where the lead-body purge of one retention group got to in the ledger (leads/accounting/ledger.py
    purge_bodies): "<received_at>|<id>". Lost, the next walk starts over from the oldest lead."""
    return PREFIX + "retention:" + group


# Suppression lists (leads/rules/suppression.py). Every key of every list shares one hash tag,
# so that a lead is checked against all of its lists in one round trip on a cluster too.
SUPPRESSION_TAG = "{sup}"


def suppression_bucket(list_id: str, bucket: str) -> str:
    """One bucket of a list: a hash whose fields are its entries' digests past their first two
    bytes (the bucket's name, hex): small hashes Redis keeps as listpacks."""
    return PREFIX + SUPPRESSION_TAG + ":" + list_id + ":" + bucket


def suppression_ready(list_id: str) -> str:
    """Set once Redis holds every entry of the list (the database's); missing after a loss, so
    that no lead is checked against a list Redis has only part of."""
    return PREFIX + SUPPRESSION_TAG + ":ready:" + list_id


def suppression_rebuild_lock(list_id: str) -> str:
    return PREFIX + SUPPRESSION_TAG + ":rebuilding:" + list_id


def consent_claim(publisher_id: str, lead_id: str) -> str:
    """A lead's TrustedForm claim outcome (claimed or refused), so a retry of it does not claim
    again (leads/rules/consent.py)."""
    return PREFIX + "consent:" + publisher_id + ":" + lead_id
