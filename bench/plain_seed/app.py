"""The plain seed's web app, under the same gunicorn settings as Floodgate:

    gunicorn -c gunicorn.conf.py bench.plain_seed.app:app

POST /v1/leads (lead-caps-redis-lua): a publisher key checked against a dict, buyers filtered by
their static rules, then a waterfall in priority order: the article's Lua script leases a slot
of the buyer's daily cap, the lead is posted with a 1.5 s timeout, a refusal or failure gives
the slot back (DECR) and the next buyer is tried; a sale is settled by an RQ job (worker.py).

POST /v1/webhooks/paystack (payment-webhook-idempotency): the HMAC-SHA512 signature, a Redis
`SET NX EX 30` lease on the reference (a delivery that finds it taken is answered 200
"deduped"), one transaction that inserts the payment unless recorded and credits the wallet,
the `processed:` mark, and the lease released in `finally`.

Settings come from the environment: PLAIN_REDIS_URL, PLAIN_DATABASE_URL, PLAIN_BUYER_URL and
PAYSTACK_SECRET_KEY.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time

import redis
import requests
from flask import Flask, jsonify, request
from rq import Queue

from bench.plain_seed.db import Pool, create_schema

CAP_LEASE = """
local cap_key = KEYS[1]
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])

local current = redis.call('GET', cap_key)
if current and tonumber(current) >= limit then
    return 0 -- Cap reached, reject lease
else
    local new_val = redis.call('INCR', cap_key)
    if new_val == 1 and ttl > 0 then
        redis.call('EXPIRE', cap_key, ttl)
    end
    return 1 -- Lease granted atomically
end
"""

PUBLISHERS = {"pk_bench_0123456789abcdef": "bench"}
# Priority order: the waterfall tries them top down.
BUYERS = [
    {
        "id": "acme",
        "url": os.environ.get("PLAIN_BUYER_URL", "http://127.0.0.1:9/acme"),
        "price": "12.50",
        "daily_cap": 10**9,
        "states": {"TX", "CA", "FL", "NY"},
    },
]
PAYSTACK_SECRET = os.environ.get("PAYSTACK_SECRET_KEY", "").encode()

app = Flask(__name__)
r = redis.Redis.from_url(os.environ.get("PLAIN_REDIS_URL", "redis://127.0.0.1:6379/0"))
lease = r.register_script(CAP_LEASE)
settlements = Queue("plain", connection=r)
http = requests.Session()
create_schema(os.environ["PLAIN_DATABASE_URL"])
pool = Pool(os.environ["PLAIN_DATABASE_URL"])


@app.post("/v1/leads")
def post_lead():
    key = request.headers.get("Authorization", "").removeprefix("Bearer ")
    publisher = PUBLISHERS.get(key)
    if publisher is None:
        return jsonify(error="unauthorized"), 401
    lead = request.get_json()
    # Phase 1: static rules, in memory.
    candidates = [b for b in BUYERS if lead.get("state") in b["states"]]
    attempts = []
    for buyer in candidates:
        # Phase 2: an atomic cap lease.
        cap_key = f"cap:{buyer['id']}:{time.strftime('%Y%m%d')}"
        if not lease(keys=[cap_key], args=[buyer["daily_cap"], 86400]):
            attempts.append({"buyer_id": buyer["id"], "outcome": "capped"})
            continue
        # Phase 3: deliver; refund the lease and cascade on a no, an error or a timeout.
        try:
            resp = http.post(buyer["url"], json=lead, timeout=1.5)
            accepted = resp.status_code == 200 and resp.json().get("accepted") is True
        except (requests.RequestException, ValueError):
            accepted = False
        if not accepted:
            r.decr(cap_key)
            attempts.append({"buyer_id": buyer["id"], "outcome": "rejected"})
            continue
        attempts.append({"buyer_id": buyer["id"], "outcome": "accepted"})
        # Phase 4: the ledger row is written by a background worker.
        settlements.enqueue(
            "bench.plain_seed.worker.settle", lead.get("lead_id"), publisher, buyer["id"], buyer["price"], lead
        )
        return jsonify(
            lead_id=lead.get("lead_id"), status="sold", buyer_id=buyer["id"], price=buyer["price"], attempts=attempts
        )
    return jsonify(lead_id=lead.get("lead_id"), status="unsold", attempts=attempts)


@app.post("/v1/webhooks/paystack")
def paystack():
    raw = request.get_data()
    expected = hmac.new(PAYSTACK_SECRET, raw, hashlib.sha512).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("x-paystack-signature", "")):
        return jsonify(error="invalid signature"), 401
    event = json.loads(raw)
    data = event["data"]
    ref = data["reference"]
    lock_key = f"lock:webhook:{ref}"
    if not r.set(lock_key, "PROCESSING", nx=True, ex=30):
        # 200 at once, so that the provider stops retrying.
        return jsonify(status="deduped", message="Event in flight")
    try:
        with pool.transaction() as cur:
            cur.execute("SELECT 1 FROM payments WHERE reference = %s", (ref,))
            if cur.fetchone() is None:
                customer = data["customer"]["email"]  # the bench's payloads share one customer id
                cur.execute(
                    "INSERT INTO payments (reference, amount, customer, status) VALUES (%s, %s, %s, 'SUCCESSFUL')",
                    (ref, data["amount"], customer),
                )
                cur.execute(
                    "INSERT INTO wallets (customer, balance) VALUES (%s, %s)"
                    " ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)",
                    (customer, data["amount"]),
                )
        r.set(f"processed:{ref}", "TRUE", ex=60 * 60 * 24 * 7)
        return jsonify(status="acknowledged")
    finally:
        r.delete(lock_key)
