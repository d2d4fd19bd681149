"""Configuration from environment variables, validated in `load()`, never at import."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from webhooks.errors import ConfigError
from webhooks.formats.consumer import DEFAULT_SUPPRESSION_KEY
from webhooks.formats.validate import DECIMAL_STRING
from webhooks.standard_keys import standard_key, standard_public_key
from webhooks.storage.live.redis import is_cluster_url
from webhooks.targets import DEFAULT_DENY_NETS, DenyList

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SQLITE = f"sqlite:///{ROOT / 'var' / 'floodgate.sqlite3'}"
DEFAULT_METRICS_DIR = str(ROOT / "var" / "prometheus")
SWEEP_INTERVAL_MS = 60_000  # the abandoned-lead sweep's (workers/schedule.py)
MAX_WATERFALL = 8  # buyers a graceful shutdown waits for, each at its full deadline
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
MIN_SUPPRESSION_KEY = 32

PROVIDER_SECRETS = {
    "paystack": "PAYSTACK_SECRET_KEY",
    "flutterwave": "FLUTTERWAVE_SECRET_HASH",
    "monnify": "MONNIFY_CLIENT_SECRET",
    "interswitch": "INTERSWITCH_SECRET",
    "stripe": "STRIPE_WEBHOOK_SECRET",
    "standard": "STANDARD_WEBHOOK_SECRET",
}


@dataclass(frozen=True)
class Config:
    redis_url: str = "redis://127.0.0.1:6379/0"
    rq_redis_url: str = ""  # empty: same as redis_url
    database_url: str = DEFAULT_SQLITE
    admin_token: str = ""
    host: str = "0.0.0.0"  # web: gunicorn binds HOST:PORT (scripts/run sets 127.0.0.1)
    port: int = 8000
    web_concurrency: int = 2  # gunicorn worker processes
    worker_connections: int = 5000  # connections (greenlets) per gunicorn worker: docs/operations.md
    access_log: str = ""  # gunicorn access log file ('-': stdout); empty: none
    log_level: str = "info"
    metrics_dir: str = DEFAULT_METRICS_DIR  # PROMETHEUS_MULTIPROC_DIR, shared by every process
    buyer_timeout_ms: int = 1500
    ping_timeout_ms: int = 300  # one shared deadline for the pings of a lead's ping/post buyers
    ping_max_bid: Decimal = Decimal("1000.00")  # a ping/post bid above it is ignored (no bid)
    epl_prior_offers: int = 2  # offers' worth of doubt a buyer new to `epl` routing starts with
    epl_half_life_hours: int = 12  # `epl` routing: a day's figures count half this much later (0: all alike)
    breaker_failures: int = 5
    breaker_cooldown_ms: int = 30_000
    db_pool_size: int = 10
    redis_max_connections: int = 64
    lead_replay_ttl_s: int = 7 * 24 * 3600
    payment_claim_ttl_ms: int = 30_000
    lead_claim_margin_ms: int = 10_000  # a lead claim outlives its longest routing by this much
    lead_recovery_window_ms: int = 900_000  # a dead routing's lease waits this long for a retry
    lead_abandoned_after_ms: int = 120_000  # then the abandoned-lead sweep finishes it (leads/path/recovery.py)
    config_check_interval_ms: int = 500
    journal_keep_s: int = 600
    journal_max_bytes: int = 64 * 1024 * 1024  # what a web process's journal may hold (leads/path/settlement.py)
    erasure_wait_s: int = 20  # an erasure's answer waits this long for the journals and Redis' files
    cap_wait_replicas: int = 0  # replicas that must hold a cap reservation before delivery
    cap_wait_timeout_ms: int = 100
    max_body_bytes: int = 256 * 1024
    # (per_second, burst) of the token bucket of a publisher without a rate_limit of its own
    # (PUBLISHER_RATE_LIMIT); None: no limit
    publisher_rate_limit: tuple[int, int] | None = (100, 200)
    # provider -> its secrets: one, or two (the old and the new) while it is being rotated
    secrets: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ops_session_ttl_s: int = 8 * 3600  # lifetime of an /ops session cookie
    ops_insecure_cookie: bool = False  # the /ops cookie without Secure (plain-HTTP development only)
    flutterwave_verify: bool = False  # re-check each Flutterwave payment with its verify endpoint
    flutterwave_api_base: str = "https://api.flutterwave.com"
    flutterwave_secret_key: str = ""  # the API secret key that verify endpoint needs
    # Payment events to the application (the endpoint PAYMENT_EVENTS_URL, webhooks/events/): where, signed with which
    # whsec_ secrets (two while rotating: both sign), and how deliveries are retried.
    payment_events_url: str = ""  # empty: wallet changes are not announced
    payment_events_secrets: tuple[str, ...] = ()
    # the hard total deadline of one event delivery: connect, send and the whole reply
    # (EVENT_DELIVERY_TIMEOUT_MS; PAYMENT_EVENTS_TIMEOUT_MS is its older name)
    event_delivery_timeout_ms: int = 10_000
    payment_events_retry_base_ms: int = 1_000  # first back-off; doubles per failed attempt
    payment_events_retry_max_ms: int = 3_600_000  # back-off never grows past this (1 h)
    payment_events_retry_for_s: int = 86_400  # failing for this long (24 h): `failed`
    # Event endpoints (webhooks/events/): one failing for this long is disabled, keeping its
    # events (docs/api.md "Event endpoints"); the retries above apply to every endpoint.
    event_endpoint_disable_after_s: int = 432_000  # 5 days
    # Attribution (docs/payments.md "Which wallet"): the merchant's metadata key naming the
    # wallet; empty: the payer's e-mail, as before.
    payment_account_field: str = ""
    # Provider reconciliation (webhooks/payments/reconcile.py): each provider's API, and how often
    # and how far back its successful payments are compared with the ledger.
    provider_reconcile_interval_s: int = 600
    provider_reconcile_lookback_s: int = 259_200  # 72 h: Paystack retries a webhook that long
    paystack_api_base: str = "https://api.paystack.co"
    monnify_api_base: str = "https://api.monnify.com"
    monnify_api_key: str = ""
    stripe_api_base: str = "https://api.stripe.com"
    stripe_api_key: str = ""
    # TrustedForm's certificate API (leads/rules/consent.py): a certificate is claimed at
    # TRUSTEDFORM_API_BASE/<cert id>; no key, no claim (buyers requiring it get no lead).
    trustedform_api_base: str = "https://cert.trustedform.com"
    trustedform_api_key: str = ""
    suppression_key: str = DEFAULT_SUPPRESSION_KEY  # keys a plain suppression list's hashes
    trustedform_timeout_ms: int = 1500  # the claim's total deadline, within the lead's own
    # Nothing outside can stall or exhaust Floodgate (docs/api.md): a request's headers and body
    # must arrive within this (web), and no outbound call connects to an address in these nets.
    request_read_timeout_ms: int = 10_000
    outbound_deny_nets: tuple[str, ...] = DEFAULT_DENY_NETS
    # Loopback (127.0.0.0/8, ::1) as itself may be called: development and tests, whose partners
    # run on this machine. Never this host's other spellings (docs/security.md).
    outbound_allow_loopback: bool = False
    # How long a lead's raw body is kept: unsold and test leads, sold leads (the figures stay).
    lead_body_retention_days: int = 30
    sold_lead_body_retention_days: int = 365

    @property
    def queue_redis_url(self) -> str:
        return self.rq_redis_url or self.redis_url

    @property
    def graceful_timeout_s(self) -> int:
        """How long a web worker told to stop (SIGTERM) may finish the leads in flight: the
        routing of a lead offered to MAX_WATERFALL buyers that each take the full deadline."""
        return 10 + MAX_WATERFALL * (self.buyer_timeout_ms + 999) // 1000

    @property
    def bind(self) -> str:
        """gunicorn's `bind`: HOST:PORT, an IPv6 address in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_INTS = {
    "PORT": "port",
    "BUYER_TIMEOUT_MS": "buyer_timeout_ms",
    "PING_TIMEOUT_MS": "ping_timeout_ms",
    "EPL_PRIOR_OFFERS": "epl_prior_offers",
    "EPL_HALF_LIFE_HOURS": "epl_half_life_hours",
    "BREAKER_FAILURES": "breaker_failures",
    "BREAKER_COOLDOWN_MS": "breaker_cooldown_ms",
    "DB_POOL_SIZE": "db_pool_size",
    "REDIS_MAX_CONNECTIONS": "redis_max_connections",
    "LEAD_REPLAY_TTL_S": "lead_replay_ttl_s",
    "PAYMENT_CLAIM_TTL_MS": "payment_claim_ttl_ms",
    "LEAD_CLAIM_MARGIN_MS": "lead_claim_margin_ms",
    "LEAD_RECOVERY_WINDOW_MS": "lead_recovery_window_ms",
    "LEAD_ABANDONED_AFTER_MS": "lead_abandoned_after_ms",
    "CONFIG_CHECK_INTERVAL_MS": "config_check_interval_ms",
    "JOURNAL_KEEP_S": "journal_keep_s",
    "JOURNAL_MAX_BYTES": "journal_max_bytes",
    "ERASURE_WAIT_S": "erasure_wait_s",
    "CAP_WAIT_REPLICAS": "cap_wait_replicas",
    "CAP_WAIT_TIMEOUT_MS": "cap_wait_timeout_ms",
    "OPS_SESSION_TTL_S": "ops_session_ttl_s",
    "WEB_CONCURRENCY": "web_concurrency",
    "WORKER_CONNECTIONS": "worker_connections",
    "PAYMENT_EVENTS_TIMEOUT_MS": "event_delivery_timeout_ms",
    "EVENT_DELIVERY_TIMEOUT_MS": "event_delivery_timeout_ms",  # after its older name: it wins
    "REQUEST_READ_TIMEOUT_MS": "request_read_timeout_ms",
    "LEAD_BODY_RETENTION_DAYS": "lead_body_retention_days",
    "SOLD_LEAD_BODY_RETENTION_DAYS": "sold_lead_body_retention_days",
    "PAYMENT_EVENTS_RETRY_BASE_MS": "payment_events_retry_base_ms",
    "PAYMENT_EVENTS_RETRY_MAX_MS": "payment_events_retry_max_ms",
    "PAYMENT_EVENTS_RETRY_FOR_S": "payment_events_retry_for_s",
    "EVENT_ENDPOINT_DISABLE_AFTER_S": "event_endpoint_disable_after_s",
    "PROVIDER_RECONCILE_INTERVAL_S": "provider_reconcile_interval_s",
    "PROVIDER_RECONCILE_LOOKBACK_S": "provider_reconcile_lookback_s",
    "TRUSTEDFORM_TIMEOUT_MS": "trustedform_timeout_ms",
}
_ZERO_OK = {"CAP_WAIT_REPLICAS", "EPL_HALF_LIFE_HOURS"}  # 0: do not wait for replicas; weigh days alike
_STRS = {
    "REDIS_URL": "redis_url",
    "RQ_REDIS_URL": "rq_redis_url",
    "DATABASE_URL": "database_url",
    "ADMIN_TOKEN": "admin_token",
    "HOST": "host",
    "ACCESS_LOG": "access_log",
    "LOG_LEVEL": "log_level",
    "PROMETHEUS_MULTIPROC_DIR": "metrics_dir",
    "FLUTTERWAVE_API_BASE": "flutterwave_api_base",
    "FLUTTERWAVE_SECRET_KEY": "flutterwave_secret_key",
    "PAYMENT_EVENTS_URL": "payment_events_url",
    "PAYMENT_ACCOUNT_FIELD": "payment_account_field",
    "PAYSTACK_API_BASE": "paystack_api_base",
    "MONNIFY_API_BASE": "monnify_api_base",
    "MONNIFY_API_KEY": "monnify_api_key",
    "STRIPE_API_BASE": "stripe_api_base",
    "STRIPE_API_KEY": "stripe_api_key",
    "TRUSTEDFORM_API_BASE": "trustedform_api_base",
    "TRUSTEDFORM_API_KEY": "trustedform_api_key",
    "SUPPRESSION_KEY": "suppression_key",
}
MIN_ADMIN_TOKEN = 24
RATE_LIMIT_MAX = 100_000  # the bound of the API's rate_limit (webhooks/leads/rules/publishers.py RATE_MAX)
# verif-hash is compared as is and signs nothing: it must at least not be guessable
MIN_FLUTTERWAVE_HASH = 16
API_BASES = {
    "FLUTTERWAVE_API_BASE": "flutterwave_api_base",
    "PAYSTACK_API_BASE": "paystack_api_base",
    "MONNIFY_API_BASE": "monnify_api_base",
    "STRIPE_API_BASE": "stripe_api_base",
    "TRUSTEDFORM_API_BASE": "trustedform_api_base",
}
ACCOUNT_FIELD = re.compile(r"[A-Za-z0-9._-]{1,64}")


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
    """Build a Config from `environ` (default: os.environ); raise ConfigError on bad values."""
    env = os.environ if environ is None else environ
    values = _from_env(env)
    known = {f.name for f in fields(Config)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown config keys: {sorted(unknown)}")
    values.update(overrides)
    _check(values)
    if "ping_max_bid" not in values:
        values["ping_max_bid"] = _max_bid(env)
    return Config(**values)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The Config fields `env` sets, each parsed; the other fields keep their defaults."""
    values: dict[str, Any] = {name: env[var] for var, name in _STRS.items() if env.get(var)}
    for var, name in _INTS.items():
        raw = env.get(var)
        if raw not in (None, ""):
            values[name] = _int(var, raw)
    if _switch(env, "REDIS_CLUSTER"):
        values["redis_url"] = _as_cluster_url(values.get("redis_url", Config.redis_url))
    values["secrets"] = _provider_secrets(env)
    if public_keys := _standard_public_keys(env):  # v1a keys verify beside the whsec_ secrets
        values["secrets"]["standard"] = values["secrets"].get("standard", ()) + public_keys
    values["ops_insecure_cookie"] = _switch(env, "OPS_INSECURE_COOKIE")
    values["outbound_allow_loopback"] = _switch(env, "OUTBOUND_ALLOW_LOOPBACK")
    values["flutterwave_verify"] = _switch(env, "FLUTTERWAVE_VERIFY")
    values["payment_events_secrets"] = _events_secrets(env)
    if "OUTBOUND_DENY_NETS" in env:
        values["outbound_deny_nets"] = _deny_nets(env["OUTBOUND_DENY_NETS"])
    if env.get("PUBLISHER_RATE_LIMIT", "").strip():
        values["publisher_rate_limit"] = _rate_limit(env["PUBLISHER_RATE_LIMIT"])
    return values


def _int(var: str, raw: str) -> int:
    """An integer setting: positive, or 0 or more for those in _ZERO_OK."""
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{var} must be an integer, got {raw!r}") from None
    if value < (0 if var in _ZERO_OK else 1):
        raise ConfigError(f"{var} must be {'0 or more' if var in _ZERO_OK else 'positive'}, got {raw!r}")
    return value


def _check(values: dict[str, Any]) -> None:
    """Refuse a combination of values that cannot run; lower-case the log level in place."""
    url = values.get("database_url", DEFAULT_SQLITE)
    if not url.startswith(("mysql://", "sqlite:///")):
        raise ConfigError("DATABASE_URL must start with mysql:// or sqlite:///")
    _check_redis(values.get("redis_url", Config.redis_url), values.get("rq_redis_url", ""))
    level = values.get("log_level", Config.log_level).lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    values["log_level"] = level
    _check_host(values.get("host", Config.host))
    _check_secrets(values)
    _check_payment_events(values)
    _check_targets(values)
    _check_abandoned_after(values)


def _check_targets(values: dict[str, Any]) -> None:
    """The provider, certificate and payment-event URLs name no address an outbound call may
    never reach (docs/security.md); a name is checked again on every address it resolves to."""
    nets, loopback = values.get("outbound_deny_nets", DEFAULT_DENY_NETS), values.get("outbound_allow_loopback")
    targets = DenyList(nets, allow_loopback=bool(loopback))
    for var, name in {**API_BASES, "PAYMENT_EVENTS_URL": "payment_events_url"}.items():
        url = values.get(name, getattr(Config, name))
        refusal = url and targets.refusal(url)
        if refusal:
            raise ConfigError(f"{var} {refusal}")


def _check_host(host: str) -> None:
    """HOST: the address web listens on, an IP address (a name would be resolved: tcsh, for
    one, exports HOST as the machine's name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"HOST must be the IP address web listens on (0.0.0.0: every interface, 127.0.0.1: "
            f"this machine only, :: or ::1 for IPv6), got {host[:64]!r}"
        ) from None


def _max_bid(env: Mapping[str, str]) -> Decimal:
    """PING_MAX_BID: a decimal string such as "1000.00" (a bid above it is no bid)."""
    raw = env.get("PING_MAX_BID", "")
    if not raw:
        return Config.ping_max_bid
    if not DECIMAL_STRING.fullmatch(raw) or Decimal(raw) <= 0:
        raise ConfigError(f'PING_MAX_BID must be a positive decimal such as "1000.00", got {raw[:32]!r}')
    return Decimal(raw)


def _deny_nets(raw: str) -> tuple[str, ...]:
    """OUTBOUND_DENY_NETS: CIDRs separated by commas (or spaces); empty: none refused."""
    nets = []
    for item in raw.replace(",", " ").split():
        try:
            nets.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ConfigError(f"OUTBOUND_DENY_NETS: {item[:64]!r} is not a CIDR such as 169.254.0.0/16") from None
    return tuple(nets)


def _rate_limit(raw: str) -> tuple[int, int] | None:
    """PUBLISHER_RATE_LIMIT: "<per_second>/<burst>", or "<per_second>" (burst: one second's
    worth), each 1..RATE_LIMIT_MAX as in the API's rate_limit; "off" or "0": no default."""
    text = raw.strip().lower()
    if text in ("off", "0"):
        return None
    m = re.fullmatch(r"([0-9]{1,6})(?:/([0-9]{1,6}))?", text)
    limit = (int(m.group(1)), int(m.group(2) or m.group(1))) if m else None
    if limit is None or not all(1 <= n <= RATE_LIMIT_MAX for n in limit):
        raise ConfigError(
            f"PUBLISHER_RATE_LIMIT must be <per_second>/<burst> (each 1 to {RATE_LIMIT_MAX}, "
            f"e.g. 100/200), <per_second>, or off; got {raw!r}"
        )
    return limit


def _check_abandoned_after(values: dict[str, Any]) -> None:
    """The abandoned-lead sweep (every minute) must find a dead routing's lease while it lives:
    LEAD_ABANDONED_AFTER_MS defaults to 2 minutes, or half a shorter recovery window."""
    window = values.get("lead_recovery_window_ms", Config.lead_recovery_window_ms)
    if "lead_abandoned_after_ms" not in values:
        values["lead_abandoned_after_ms"] = min(Config.lead_abandoned_after_ms, window // 2)
    elif values["lead_abandoned_after_ms"] + SWEEP_INTERVAL_MS >= window:
        raise ConfigError(
            f"LEAD_ABANDONED_AFTER_MS must be at least {SWEEP_INTERVAL_MS} ms (the sweep's interval) "
            "shorter than LEAD_RECOVERY_WINDOW_MS: the sweep must find a dead routing's lease "
            "before it expires"
        )


def _events_secrets(env: Mapping[str, str]) -> tuple[str, ...]:
    """PAYMENT_EVENTS_SECRET: one whsec_ secret, or two while the application's receiver moves
    from the old to the new one (each event is then signed with both)."""
    return _rotating_keys(
        env,
        "PAYMENT_EVENTS_SECRET",
        word="secret",
        check=standard_key,
        expected="whsec_ followed by the base64 of the key (Standard Webhooks)",
    )


def _rotating_keys(
    env: Mapping[str, str], var: str, *, word: str, check: Callable[[str], object], expected: str
) -> tuple[str, ...]:
    """`var`'s keys, separated by white space: one, or the old and the new one while rotating,
    each refused (ConfigError naming which and why) unless `check` takes it."""
    keys = tuple(env.get(var, "").split())
    if len(keys) > 2:
        raise ConfigError(
            f"{var} holds {len(keys)} {word}s; at most two (the old and the new one, "
            "separated by a space) while rotating"
        )
    for i, key in enumerate(keys, 1):
        try:
            check(key)
        except ValueError as exc:
            raise ConfigError(f"{var}: {word} {i} of {len(keys)} {exc}; expected {expected}") from None
    return keys


def _check_payment_events(values: dict[str, Any]) -> None:
    url = values.get("payment_events_url", "")
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("PAYMENT_EVENTS_URL must be an http(s) URL with a host")
        if not values.get("payment_events_secrets"):
            raise ConfigError(
                "PAYMENT_EVENTS_URL needs PAYMENT_EVENTS_SECRET, the whsec_ secret that signs "
                "each event (Standard Webhooks)"
            )
    base = values.get("payment_events_retry_base_ms", Config.payment_events_retry_base_ms)
    if base > values.get("payment_events_retry_max_ms", Config.payment_events_retry_max_ms):
        raise ConfigError("PAYMENT_EVENTS_RETRY_BASE_MS must not exceed PAYMENT_EVENTS_RETRY_MAX_MS")


def _provider_secrets(env: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Each provider's secrets: one, or two separated by a space while one replaces the
    other (a delivery verifying with either is accepted). Messages never show a secret."""
    found = {}
    for provider, var in PROVIDER_SECRETS.items():
        secrets = tuple(env.get(var, "").split())
        if not secrets:
            continue
        if len(secrets) > 2:
            raise ConfigError(
                f"{var} holds {len(secrets)} secrets; at most two (the old and the new one, "
                "separated by a space) while rotating"
            )
        if provider == "standard":
            for i, secret in enumerate(secrets, 1):
                try:
                    standard_key(secret)
                except ValueError as exc:
                    raise ConfigError(
                        f"{var}: secret {i} of {len(secrets)} {exc}; expected whsec_ followed by the base64 of the key"
                    ) from None
        if provider == "flutterwave":
            for i, secret in enumerate(secrets, 1):
                if len(secret) < MIN_FLUTTERWAVE_HASH:
                    raise ConfigError(
                        f"{var}: secret {i} of {len(secrets)} is {len(secret)} characters; it must "
                        f"be at least {MIN_FLUTTERWAVE_HASH} (set a long random secret hash in "
                        "Flutterwave's dashboard)"
                    )
        found[provider] = secrets
    return found


def _standard_public_keys(env: Mapping[str, str]) -> tuple[str, ...]:
    """STANDARD_WEBHOOK_PUBLIC_KEY: one whpk_ key (two while the sender rotates) verifying the
    specification's asymmetric v1a signatures, beside or instead of STANDARD_WEBHOOK_SECRET."""
    return _rotating_keys(
        env,
        "STANDARD_WEBHOOK_PUBLIC_KEY",
        word="key",
        check=standard_public_key,
        expected="whpk_ followed by the base64 of the ed25519 key",
    )


def _check_secrets(values: dict[str, Any]) -> None:
    token = values.get("admin_token", "")
    if token and len(token) < MIN_ADMIN_TOKEN:
        raise ConfigError(
            f"ADMIN_TOKEN is {len(token)} characters; it must be at least {MIN_ADMIN_TOKEN} "
            "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    key = values.get("suppression_key", DEFAULT_SUPPRESSION_KEY)
    if key != DEFAULT_SUPPRESSION_KEY and len(key) < MIN_SUPPRESSION_KEY:
        raise ConfigError(
            f"SUPPRESSION_KEY is {len(key)} characters; it must be at least {MIN_SUPPRESSION_KEY} "
            "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if values.get("flutterwave_verify") and not values.get("flutterwave_secret_key"):
        raise ConfigError(
            "FLUTTERWAVE_VERIFY=1 needs FLUTTERWAVE_SECRET_KEY, the API secret key Flutterwave's "
            "verify endpoint is called with"
        )
    for var, name in API_BASES.items():
        if not values.get(name, getattr(Config, name)).startswith(("https://", "http://")):
            raise ConfigError(f"{var} must be an http(s) URL")
    field_name = values.get("payment_account_field", "")
    if field_name and not ACCOUNT_FIELD.fullmatch(field_name):
        raise ConfigError("PAYMENT_ACCOUNT_FIELD must be a metadata key of 1 to 64 letters, digits, '_', '-' or '.'")


def _switch(env: Mapping[str, str], var: str) -> bool:
    """An on/off variable: 1/true/yes or 0/false/no (or unset); anything else is refused."""
    raw = env.get(var, "").strip().lower()
    if raw not in ("", "0", "1", "false", "true", "no", "yes"):
        raise ConfigError(f"{var} must be 1 or 0, got {raw!r}")
    return raw in ("1", "true", "yes")


def _as_cluster_url(url: str) -> str:
    """REDIS_CLUSTER=1 with redis://host:port means redis+cluster://host:port."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}+cluster{sep}{rest}" if scheme in ("redis", "rediss") else url


def _check_redis(redis_url: str, rq_redis_url: str) -> None:
    """RQ cannot run on Redis Cluster: a cluster needs its own single Redis for the queue."""
    if is_cluster_url(rq_redis_url):
        raise ConfigError("RQ_REDIS_URL must name a single Redis: RQ does not support Redis Cluster")
    if is_cluster_url(redis_url) and not rq_redis_url:
        raise ConfigError(
            "REDIS_URL names a Redis Cluster, which RQ cannot use: set RQ_REDIS_URL to a "
            "single Redis (or a Sentinel-managed primary) for the settlement queue"
        )
