"""What suppression lists and consent claims cost (webhooks/leads/rules/suppression.py,
consent.py), on a private redis-server (default configuration, jemalloc), in one process
monkey-patched by gevent as a web worker is:

1. bytes per suppression entry in Redis: lists of md5 digests (and one of sha256) loaded the
   way the product loads them (`suppression._redis_write`, the Redis side of an add and of a
   rebuild, in pages of REBUILD_PAGE), `used_memory`'s growth over the entries, and the
   encoding of every bucket (listpack, or hashtable once a bucket passes
   hash-max-listpack-entries);
2. the cost a lead pays for N lists: `suppression.check` against 1, 2, 4, 8 and 16 lists of
   100,000 entries, beside a plain PING (one round trip) and the check's local work alone
   (normalise, digest), all interleaved call by call, medians of 3 rounds;
3. the TrustedForm claim: `consent.start` and `Check.allows(("trustedform",))` against a
   stand-in answering after 0, 50 and 200 ms, and one that answers past the claim's timeout.

    python -m bench.compliance   ->  bench/out/compliance.json, compliance.md
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import math
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    OUT,
    QUICK,
    machine_info,
    markdown_table,
    percentiles,
    quick,
    redis_version,
    write_json,
    write_md,
)
from testkit.servers import RedisServer
from testkit.trustedform import API_KEY, TrustedFormStandIn
from webhooks import consumer, outbound, targets
from webhooks.leads.rules import consent, suppression
from webhooks.storage import keys
from webhooks.storage.redis import Store, make_redis

BUCKETS = 65_536  # a digest's first two bytes name its bucket
LISTPACK_ENTRIES = 512  # hash-max-listpack-entries: redis.conf's default; main() reads the server's
SIZES = [100_000, 1_000_000, 3_000_000, 10_000_000] if not QUICK else [20_000, 100_000]
SHA256_SIZE = quick(1_000_000, 20_000)
NS = (1, 2, 4, 8, 16)
LIST_SIZE = quick(100_000, 10_000)  # entries of each list a lead is checked against
CALLS = quick(2_000, 200)
ROUNDS = quick(3, 1)
CLAIMS = quick(30, 5)
LEAD = {"email": "ada.lovelace@example.com", "phone": "+14155550123"}  # on no list: a miss


def log(msg: str) -> None:
    print(f"[compliance {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- 1. bytes per entry -------------------------------------------------------------------


def digests(kind: str, n: int, salt: str) -> list[bytes]:
    """n distinct digests of made-up e-mail addresses, as `kind` lists keep them."""
    rule = suppression.ListRule(id="x", field="email", hash=kind)
    return [rule.digest_of(f"{salt}{i}@example.com") for i in range(n)]


def load(store: Store, rule: suppression.ListRule, entries: list[bytes]) -> None:
    """The entries into Redis as suppression.rebuild writes them: a page at a time, then the
    list marked ready."""
    page = suppression.REBUILD_PAGE
    for start in range(0, len(entries), page):
        suppression._redis_write(store, rule, entries[start : start + page], present=True)
    store.redis.set(keys.suppression_ready(rule.id), "1")


def encodings(store: Store, list_id: str) -> dict[str, int]:
    """How many of the list's buckets Redis keeps in each encoding."""
    pipe = store.redis.pipeline(transaction=False)
    for b in range(BUCKETS):
        pipe.object("encoding", keys.suppression_bucket(list_id, f"{b:04x}"))
    seen: dict[str, int] = {}
    for enc in pipe.execute():
        if enc is not None:
            seen[enc] = seen.get(enc, 0) + 1
    return seen


def hashtable_buckets(n: int) -> float:
    """Expected buckets holding more than LISTPACK_ENTRIES entries of a list of n (a bucket's
    count is binomial, n draws at 1/65,536: Poisson at this size)."""
    lam = n / BUCKETS
    if lam <= 0:
        return 0.0
    below = sum(math.exp(k * math.log(lam) - lam - math.lgamma(k + 1)) for k in range(LISTPACK_ENTRIES + 1))
    return BUCKETS * max(0.0, 1.0 - below)


def flip_size(expected: float) -> int:
    """The list size at which `expected` buckets are past LISTPACK_ENTRIES (bisection)."""
    lo, hi = 1_000_000, 100_000_000
    while hi - lo > 10_000:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if hashtable_buckets(mid) < expected else (lo, mid)
    return hi


def memory(store: Store) -> list[dict[str, Any]]:
    rows = []
    for kind, n in [("md5", size) for size in SIZES] + [("sha256", SHA256_SIZE)]:
        store.redis.flushall()
        entries = digests(kind, n, uuid.uuid4().hex[:8])
        rule = suppression.ListRule(id=f"mem-{kind}-{n}", field="email", hash=kind)
        before = int(store.redis.info("memory")["used_memory"])
        started = time.perf_counter()
        load(store, rule, entries)
        seconds = time.perf_counter() - started
        after = int(store.redis.info("memory")["used_memory"])
        seen = encodings(store, rule.id)
        row = {
            "hash": kind,
            "entries": n,
            "field_bytes": len(entries[0]) - 2,
            "used_memory_delta": after - before,
            "bytes_per_entry": round((after - before) / n, 1),
            "buckets": sum(seen.values()),
            "encodings": seen,
            "encoding_text": ", ".join(f"{k} {v:,}" for k, v in sorted(seen.items())),
            "load_s": round(seconds, 1),
            "entries_per_s": round(n / seconds),
        }
        rows.append(row)
        log(f"{kind} x {n:,}: {row['bytes_per_entry']} B/entry, {row['encoding_text']}, loaded in {seconds:.1f} s")
        del entries
    store.redis.flushall()
    previous = None
    for row in rows:  # md5: what each entry past the smaller list's adds (the bucket keys exist)
        row["marginal_bytes_per_entry"] = ""
        if row["hash"] == "md5" and previous is not None:
            row["marginal_bytes_per_entry"] = round(
                (row["used_memory_delta"] - previous["used_memory_delta"]) / (row["entries"] - previous["entries"]), 1
            )
        previous = row if row["hash"] == "md5" else previous
        row["entries_text"] = f"{row['entries']:,}"
        row["delta_text"] = f"{row['used_memory_delta']:,}"
        row["rate_text"] = f"{row['entries_per_s']:,}"
    return rows


# --- 2. N lists per lead ------------------------------------------------------------------


def lists_per_lead(store: Store) -> dict[str, Any]:
    store.redis.flushall()
    rules = []
    for i in range(max(NS)):
        rule = suppression.ListRule(id=f"dnc-{i}", field="email" if i % 2 == 0 else "phone", hash="md5")
        load(store, rule, digests("md5", LIST_SIZE, f"l{i}-"))
        rules.append(rule)
    log(f"{len(rules)} lists of {LIST_SIZE:,} entries loaded")
    assert set(suppression.check(store, rules, consumer.keys_of(LEAD, consumer.FIELDS, {})).values()) == {
        suppression.MISS
    }

    def local(lists: list[suppression.ListRule]) -> Callable[[], object]:
        def run() -> object:
            out = []
            for rule in lists:
                value = consumer.key(rule.field, LEAD.get(rule.field))
                assert value is not None
                out.append(suppression._place(rule.id, rule.digest_of(value)))
            return out

        return run

    arms: dict[str, Callable[[], object]] = {"PING": store.redis.ping}
    for n in NS:
        arms[f"check N={n}"] = lambda lists=rules[:n]: suppression.check(
            store, lists, consumer.keys_of(LEAD, consumer.FIELDS, {})
        )
        arms[f"local N={n}"] = local(rules[:n])
    for fn in arms.values():  # warm: connections, phonenumbers' metadata
        for _ in range(50):
            fn()
    rounds: dict[str, list[dict[str, float | None]]] = {name: [] for name in arms}
    for r in range(ROUNDS):
        samples: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(CALLS):
            for name, fn in arms.items():
                t0 = time.perf_counter_ns()
                fn()
                samples[name].append((time.perf_counter_ns() - t0) / 1000)
        for name, values in samples.items():
            rounds[name].append(percentiles(values))
        log(f"round {r + 1}/{ROUNDS}: PING p50 {rounds['PING'][-1]['p50']} µs, "
            f"check N=16 p50 {rounds[f'check N={max(NS)}'][-1]['p50']} µs")  # fmt: skip

    def med(name: str, q: str) -> float:
        return round(statistics.median(float(x[q] or 0) for x in rounds[name]), 1)

    ping50, ping99 = med("PING", "p50"), med("PING", "p99")
    rows = [
        {
            "what": "PING (one round trip)",
            "lists": "",
            "p50_us": ping50,
            "p99_us": ping99,
            "local_p50_us": "",
            "ratio_p50": 1.0,
        }
    ]
    for n in NS:
        p50 = med(f"check N={n}", "p50")
        emails = (n + 1) // 2
        rows.append(
            {
                "what": f"check, {n} list{'s' if n > 1 else ''}",
                "lists": f"{emails} e-mail, {n - emails} phone",
                "p50_us": p50,
                "p99_us": med(f"check N={n}", "p99"),
                "local_p50_us": med(f"local N={n}", "p50"),
                "ratio_p50": round(p50 / ping50, 2) if ping50 else None,
            }
        )
    store.redis.flushall()
    return {"list_entries": LIST_SIZE, "calls_per_round": CALLS, "rounds": ROUNDS, "rows": rows, "raw": rounds}


# --- 3. the consent claim -----------------------------------------------------------------


def claims(store: Store) -> list[dict[str, Any]]:
    stand_in = TrustedFormStandIn()  # answers 200 success, `delay_s` late
    fields = consent.Fields(cert="trustedform_cert")
    rows = []
    try:
        for label, delay_ms, timeout_ms in (
            ("answers at once", 0, 1500),
            ("answers after 50 ms", 50, 1500),
            ("answers after 200 ms", 200, 1500),
            ("never answers in time", 2000, 300),
        ):
            stand_in.delay_s = delay_ms / 1000
            tf = consent.TrustedForm(api_base=stand_in.url, api_key=API_KEY, timeout_ms=timeout_ms)
            starts, waits, outcomes = [], [], {}
            for i in range(CLAIMS + 2):  # the first two warm the connection pool
                lead = {**LEAD, "trustedform_cert": f"https://cert.trustedform.com/{uuid.uuid4().hex}{i:08x}"}
                t0 = time.perf_counter()
                check = consent.start(
                    store,
                    tf,
                    fields=fields,
                    required={consent.TRUSTEDFORM},
                    lead=lead,
                    publisher_id="pub",
                    lead_id=uuid.uuid4().hex,
                    deadline=time.monotonic() + 10,
                )
                t1 = time.perf_counter()
                check.allows((consent.TRUSTEDFORM,))
                t2 = time.perf_counter()
                if i < 2:
                    continue
                outcome = check.claimed()["outcome"]
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                starts.append((t1 - t0) * 1e6)
                waits.append((t2 - t0) * 1000)
            row = {
                "stand_in": label,
                "delay_ms": delay_ms,
                "timeout_ms": timeout_ms,
                "claims": len(waits),
                "start_us": round(statistics.median(starts), 1),
                "start_max_us": round(max(starts), 1),
                "requiring_buyer_waits_ms": round(statistics.median(waits), 1),
                "wait_max_ms": round(max(waits), 1),
                "outcomes": outcomes,
                "outcome_text": ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
            }
            rows.append(row)
            log(f"{label}: start {row['start_us']} µs, a requiring buyer waits {row['requiring_buyer_waits_ms']} ms")
    finally:
        stand_in.close()
    return rows


# --- the report -----------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    flip = data["flip"]
    lists = data["lists"]
    return "\n".join(
        [
            "# Suppression lists and consent claims",
            "",
            f"`bench/compliance.py`, {m['date']}: {m['nproc']} CPUs ({m['cpu_model']}), load average "
            f"{m['loadavg_1m_5m_15m']}, redis-server {m['redis']} (default configuration, jemalloc), "
            f"Python {m['python']} under gevent, hiredis {m['hiredis']}.",
            "",
            "## Bytes per suppression entry",
            "",
            "Entries loaded by `suppression._redis_write` (the Redis side of an add and of a rebuild), "
            f"{suppression.REBUILD_PAGE:,} a pipeline; `used_memory`'s growth over the entries (the "
            "65,536 bucket keys included); every bucket's `OBJECT ENCODING`.",
            "",
            markdown_table(
                data["memory"],
                (
                    ("hash", "hash"),
                    ("entries", "entries_text"),
                    ("field (bytes)", "field_bytes"),
                    ("used_memory growth (B)", "delta_text"),
                    ("bytes / entry", "bytes_per_entry"),
                    ("bytes / entry past the smaller list", "marginal_bytes_per_entry"),
                    ("buckets by encoding", "encoding_text"),
                    ("load (entries/s)", "rate_text"),
                ),
            ),
            "",
            f"A bucket turns to a hashtable past {flip['listpack_entries']} entries "
            "(hash-max-listpack-entries as this server reports it; redis.conf's default, in Redis's "
            "own redis.conf, is 512) and never turns back. With 65,536 buckets a list of n entries "
            "averages n/65,536 a bucket, but buckets fill unevenly (Poisson): the first bucket is "
            f"expected to turn at about {flip['first'] / 1e6:.1f} million entries, 1 % of them at "
            f"{flip['one_percent'] / 1e6:.1f} million, half at {flip['half'] / 1e6:.1f} million "
            f"(at 10 million: {flip['at_10m']:,} buckets expected past it).",
            "",
            "## Added cost per lead of N lists",
            "",
            f"`suppression.check(store, lists, lead)` against N lists of {lists['list_entries']:,} md5 "
            "entries each (e-mail and phone lists alternating; the lead is on none), beside a plain "
            "PING and the check's local work alone (normalise and digest the lead's fields, name the "
            f"bucket: no Redis); every arm called in turn, {lists['calls_per_round']:,} calls each a "
            f"round, the median of {lists['rounds']} rounds' p50 and p99, client-side µs.",
            "",
            markdown_table(
                lists["rows"],
                (
                    ("call", "what"),
                    ("lists", "lists"),
                    ("p50 (µs)", "p50_us"),
                    ("p99 (µs)", "p99_us"),
                    ("local work alone, p50 (µs)", "local_p50_us"),
                    ("p50 / PING", "ratio_p50"),
                ),
            ),
            "",
            "## The consent claim's effect on a lead",
            "",
            '`consent.start(...)` then `Check.allows(("trustedform",))` (what a buyer requiring '
            "TrustedForm waits), against a local stand-in of the certificate API answering 200 "
            f"success after a set delay; {data['claims_per_row']} claims a row, medians. `start` "
            "alone is what a lead whose buyers do not wait for the claim pays: the claim runs beside "
            "it in a greenlet.",
            "",
            markdown_table(
                data["claims"],
                (
                    ("stand-in", "stand_in"),
                    ("timeout_ms", "timeout_ms"),
                    ("start alone (µs)", "start_us"),
                    ("a requiring buyer waits (ms)", "requiring_buyer_waits_ms"),
                    ("max (ms)", "wait_max_ms"),
                    ("outcomes", "outcome_text"),
                ),
            ),
            "",
        ]
    )


def main() -> int:
    import hiredis

    outbound.configure(targets.DEFAULT_DENY_NETS, allow_loopback=True)  # the stand-in is on 127.0.0.1
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            store = Store(make_redis(server.url))
            info = machine_info(redis=redis_version(store.redis), hiredis=hiredis.__version__)
            global LISTPACK_ENTRIES
            LISTPACK_ENTRIES = int(store.redis.config_get("hash-max-listpack-entries")["hash-max-listpack-entries"])
            info["hash_max_listpack_entries"] = LISTPACK_ENTRIES
            log(f"redis-server on port {server.port}; {'quick run' if QUICK else 'full run'}")
            mem = memory(store)
            flip = {
                "first": flip_size(1.0),
                "one_percent": flip_size(0.01 * BUCKETS),
                "half": flip_size(0.5 * BUCKETS),
                "at_10m": round(hashtable_buckets(10_000_000)),
                "listpack_entries": LISTPACK_ENTRIES,
            }
            log(f"first bucket past {LISTPACK_ENTRIES} expected at {flip['first']:,} entries")
            per_lead = lists_per_lead(store)
            claim_rows = claims(store)
        finally:
            server.kill()
    data = {
        "machine": info,
        "memory": mem,
        "flip": flip,
        "lists": per_lead,
        "claims": claim_rows,
        "claims_per_row": CLAIMS,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json("compliance.json", data)
    write_md("compliance.md", markdown(data))
    log(f"wrote {OUT / 'compliance.json'} and compliance.md in {data['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
