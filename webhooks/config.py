"""Configuration from environment variables, validated in `load()`, never at import."""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from .errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SQLITE = f"sqlite:///{ROOT / 'var' / 'floodgate.sqlite3'}"

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
    port: int = 8000
    buyer_timeout_ms: int = 1500
    breaker_failures: int = 5
    breaker_cooldown_ms: int = 30_000
    db_pool_size: int = 10
    redis_max_connections: int = 64
    lead_replay_ttl_s: int = 7 * 24 * 3600
    payment_claim_ttl_ms: int = 30_000
    config_check_interval_ms: int = 500
    journal_keep_s: int = 600
    max_body_bytes: int = 256 * 1024
    secrets: Mapping[str, str] = field(default_factory=dict)

    @property
    def queue_redis_url(self) -> str:
        return self.rq_redis_url or self.redis_url


_INTS = {
    "PORT": "port",
    "BUYER_TIMEOUT_MS": "buyer_timeout_ms",
    "BREAKER_FAILURES": "breaker_failures",
    "BREAKER_COOLDOWN_MS": "breaker_cooldown_ms",
    "DB_POOL_SIZE": "db_pool_size",
    "REDIS_MAX_CONNECTIONS": "redis_max_connections",
    "LEAD_REPLAY_TTL_S": "lead_replay_ttl_s",
    "PAYMENT_CLAIM_TTL_MS": "payment_claim_ttl_ms",
    "CONFIG_CHECK_INTERVAL_MS": "config_check_interval_ms",
    "JOURNAL_KEEP_S": "journal_keep_s",
}
_STRS = {
    "REDIS_URL": "redis_url",
    "RQ_REDIS_URL": "rq_redis_url",
    "DATABASE_URL": "database_url",
    "ADMIN_TOKEN": "admin_token",
}


def load(environ: Mapping[str, str] | None = None, **overrides) -> Config:
    """Build a Config from `environ` (default: os.environ); raise ConfigError on bad values."""
    env = os.environ if environ is None else environ
    values: dict = {}
    for var, name in _STRS.items():
        if env.get(var):
            values[name] = env[var]
    for var, name in _INTS.items():
        raw = env.get(var)
        if raw in (None, ""):
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise ConfigError(f"{var} must be an integer, got {raw!r}") from None
        if values[name] <= 0:
            raise ConfigError(f"{var} must be positive, got {raw!r}")
    values["secrets"] = {p: env[v] for p, v in PROVIDER_SECRETS.items() if env.get(v)}
    known = {f.name for f in fields(Config)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown config keys: {sorted(unknown)}")
    values.update(overrides)
    url = values.get("database_url", DEFAULT_SQLITE)
    if not url.startswith(("mysql://", "sqlite:///")):
        raise ConfigError("DATABASE_URL must start with mysql:// or sqlite:///")
    return Config(**values)
