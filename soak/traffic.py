"""The soak's traffic (soak/run.py), from a process of its own: leads and payment deliveries
at fixed offered rates (open loop: a slow answer never slows the sending down), each retried
as publishers and providers do, until it has an answer.

    python -m soak.traffic CONFIG_JSON

- Leads: `lead_rate` per second, states weighted TX/CA/NY/FL/OK. A 409 (in_flight), a 503, a
  5xx, a connection error or a time-out is retried with the same `lead_id`, with back-off
  (1, 2, 4 ... 60 s, each pause drawn from its upper half) as docs/leads.md asks of publishers.
- Payments: `payment_rate` deliveries per second across the six providers, with repeats: a
  quarter of the payments get a concurrent second delivery, a third a later one (1-30 s), as
  providers retrying a timed-out socket do; 2% are failed charges (answered `ignored`). Each
  delivery is retried on 409/5xx/connection errors with the same back-off, signed again each
  time, as providers do.
- Refunds (`refunds`: only when the running code has them): 15% of the `standard` payments
  get a partial refund once credited, some delivered twice.

Writes to `out_dir`: requests.jsonl (one line per HTTP request: kind, send time, latency in
ms, result; a first try's latency counts from the moment it was due) and outcomes.jsonl (one
line per lead, delivery or refund: its final answer). Stops sending after `seconds`, keeps
retrying until `seconds + drain_s`, prints a summary line and exits.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json
import random
import sys
import time
from pathlib import Path

import gevent
import gevent.pool
import urllib3

ROOT = Path(__file__).resolve().parent.parent

from testkit.payments import PROVIDERS, encode, payload, signed_headers

STATES = (("TX", 30), ("CA", 25), ("NY", 20), ("FL", 15), ("OK", 10))
CURRENCIES = ("NGN", "USD", "GHS", "KES")
# docs/leads.md asks publishers for "1 s, 2 s, 4 s ... up to a minute"; providers back off at
# least as much. Each pause is drawn from [b/2, b] so that the retries of a fault spread out.
LEAD_BACKOFF = (1, 2, 4, 8, 16, 32, 60)
PAY_BACKOFF = (1, 2, 4, 8, 16, 32, 60)
P_CONCURRENT, P_LATER, P_FAILED, P_REFUND = 0.25, 0.35, 0.02, 0.15
MEAN_DELIVERIES = 1 + P_CONCURRENT + P_LATER


class Traffic:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.url = cfg["url"]
        self.rng = random.Random(cfg.get("seed", 1))
        out = Path(cfg["out_dir"])
        self.requests = open(out / "requests.jsonl", "a", buffering=1 << 16)  # noqa: SIM115
        self.outcomes = open(out / "outcomes.jsonl", "a", buffering=1 << 16)  # noqa: SIM115
        self.pool = urllib3.PoolManager(maxsize=1000, block=False, retries=False)
        self.lead_headers = {"Authorization": f"Bearer {cfg['api_key']}", "Content-Type": "application/json"}
        self.t0 = time.time() + 0.5
        self.stop_sending = self.t0 + cfg["seconds"]
        self.deadline = self.stop_sending + cfg["drain_s"]
        self.counts: dict[str, int] = {}
        # every lead and payment being sent or retried; a finished one leaves the group (a list
        # of them all held 2 GB after 35 minutes, and the garbage collector's passes with it)
        self.jobs = gevent.pool.Group()
        self.conn_errors: dict[str, int] = {}  # connection errors by type and message
        self.states = [s for s, w in STATES for _ in range(w)]

    # -- bookkeeping ---------------------------------------------------------------------
    def request_line(self, kind: str, sent: float, ms: float, result: str, n: int) -> None:
        self.requests.write(f'{{"k":"{kind}","t":{sent:.3f},"ms":{ms:.1f},"r":"{result}","n":{n}}}\n')

    def outcome(self, record: dict) -> None:
        self.outcomes.write(json.dumps(record, separators=(",", ":")) + "\n")
        key = f"{record['k']}:{record['final']}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def flusher(self) -> None:
        while True:
            gevent.sleep(1)
            self.requests.flush()
            self.outcomes.flush()

    # -- one HTTP request ------------------------------------------------------------------
    def post(self, path: str, body: bytes, headers: dict) -> tuple[str, dict | None]:
        """(result kind, JSON body of a 200 or 409/422) of one POST."""
        try:
            resp = self.pool.request(
                "POST", self.url + path, body=body, headers=headers, timeout=urllib3.Timeout(connect=5, read=15)
            )
        except urllib3.exceptions.TimeoutError:
            return "timeout", None
        except Exception as exc:  # refused / reset while a process died, or a full backlog: retried
            reason = getattr(exc, "reason", None) or exc  # urllib3 wraps the socket's error
            detail = f"{type(reason).__name__}: {str(reason)[:100]}"
            self.conn_errors[detail] = self.conn_errors.get(detail, 0) + 1
            return f"conn:{type(reason).__name__}", None
        try:
            data = json.loads(resp.data)
        except ValueError:
            data = None
        if resp.status == 200:
            return "200", data
        if resp.status in (409, 422):
            code = (data or {}).get("status") or ((data or {}).get("error") or {}).get("code") or "conflict"
            return f"{resp.status}:{code}", data
        return str(resp.status), data

    def retrying(self, kind: str, due: float, send, backoff: tuple) -> tuple[str, dict | None, int]:
        """Send until an answer that is final (200, or a 4xx that a retry cannot change);
        return (last result kind, its body, number of tries)."""
        n = 0
        while True:
            sent = time.time()
            result, data = send()
            ms = (time.time() - (due if n == 0 else sent)) * 1000
            self.request_line(kind, sent, ms, result, n)
            n += 1
            retry = result in ("timeout", "409:in_flight", "409:payment_not_found") or result.startswith(("5", "conn"))
            if not retry:
                return result, data, n
            top = backoff[min(n - 1, len(backoff) - 1)]
            pause = self.rng.uniform(top / 2, top)
            if time.time() + pause > self.deadline:
                return "gave_up:" + result, data, n
            gevent.sleep(pause)

    # -- leads -----------------------------------------------------------------------------
    def lead(self, i: int, due: float) -> None:
        lead_id = f"{self.cfg['tag']}-{i}"
        state = self.states[i % len(self.states)]
        body = json.dumps(
            {"lead_id": lead_id, "state": state, "email": f"p{i}@example.com", "first_name": "Ada"}
        ).encode()
        result, data, tries = self.retrying(
            "L", due, lambda: self.post("/v1/leads", body, self.lead_headers), LEAD_BACKOFF
        )
        record = {"k": "L", "id": lead_id, "st": state, "due": round(due, 3), "tries": tries}
        if result == "200" and data:
            record.update(
                final=data["status"],
                buyer=data.get("buyer_id"),
                outcomes=[a["outcome"] for a in data.get("attempts", [])],
                replayed=bool(data.get("replayed")),
            )
        else:
            record.update(final=result)
        self.outcome(record)

    def open_loop(self, rate: float, job) -> None:
        """job(i, due) spawned at `rate` per second until the sending stops, however slow the
        answers (open loop)."""
        i = 0
        while (due := self.t0 + i / rate) < self.stop_sending:
            if (wait := due - time.time()) > 0:
                gevent.sleep(wait)
            self.jobs.spawn(job, i, due)
            i += 1

    # -- payments --------------------------------------------------------------------------
    def deliveries(self, provider: str, raw: bytes, record: dict, dues: list[float]) -> None:
        """Each of `dues` a delivery of `raw` (a repeat after the first), each retried until final."""
        gevent.joinall(
            [gevent.spawn(self.delivery, provider, raw, {**record, "nth": n}, d) for n, d in enumerate(dues)]
        )

    def delivery(self, provider: str, raw: bytes, record: dict, due: float) -> None:
        if (wait := due - time.time()) > 0:
            gevent.sleep(wait)
        path = f"/v1/webhooks/{provider}"

        def send():
            headers = {"Content-Type": "application/json", **signed_headers(provider, raw)}
            return self.post(path, raw, headers)

        result, data, tries = self.retrying(record["k"], due, send, PAY_BACKOFF)
        final = (data or {}).get("status") if result == "200" else result
        self.outcome({**record, "final": final or result, "tries": tries, "due": round(due, 3)})

    def payment(self, i: int, due: float) -> None:
        rng = self.rng
        provider = PROVIDERS[i % len(PROVIDERS)]
        ref = f"{self.cfg['tag']}-pay-{i}"
        currency = rng.choice(CURRENCIES)
        customer = f"{self.cfg['tag']}-c{rng.randrange(500)}@example.com"
        amount = rng.randint(100, 5_000_000)
        success = rng.random() >= P_FAILED
        raw = encode(payload(provider, ref, amount, currency, customer, success=success))
        record = {
            "k": "P",
            "ref": ref,
            "prov": provider,
            "amt": amount,
            "cur": currency,
            "cust": customer,
            "ok": success,
        }
        dues = [due]
        if success and rng.random() < P_CONCURRENT:
            dues.append(due + rng.uniform(0, 0.05))
        if success and rng.random() < P_LATER:
            dues.append(due + rng.uniform(1, 30))
        refund = success and provider == "standard" and self.cfg.get("refunds") and rng.random() < P_REFUND
        self.deliveries(provider, raw, record, dues)
        if refund:
            self.refund(ref, amount, currency, customer)

    def refund(self, ref: str, amount: int, currency: str, customer: str) -> None:
        rng = self.rng
        refund_ref = "rf-" + ref
        part = rng.randint(1, amount)
        body = {
            "type": "payment.refunded",
            "data": {
                "reference": refund_ref,
                "payment_reference": ref,
                "amount_minor": part,
                "currency": currency,
                "customer": {"email": customer},
            },
        }
        raw = encode(body)
        record = {
            "k": "R",
            "ref": refund_ref,
            "pref": ref,
            "prov": "standard",
            "amt": part,
            "cur": currency,
            "cust": customer,
        }
        due = time.time() + rng.uniform(2, 20)
        dues = [due] + ([due + rng.uniform(0, 5)] if rng.random() < 0.3 else [])
        self.deliveries("standard", raw, record, dues)

    def run(self) -> dict:
        gevent.spawn(self.flusher)
        senders = [
            gevent.spawn(self.open_loop, self.cfg["lead_rate"], self.lead),
            gevent.spawn(self.open_loop, self.cfg["payment_rate"] / MEAN_DELIVERIES, self.payment),
        ]
        gevent.joinall(senders)
        self.jobs.join(timeout=max(1.0, self.deadline - time.time() + 30))
        self.requests.flush()
        self.outcomes.flush()
        return {
            "t0": self.t0,
            "stop_sending": self.stop_sending,
            "counts": self.counts,
            "unfinished": len(self.jobs),
            "conn_errors": dict(sorted(self.conn_errors.items(), key=lambda kv: -kv[1])[:10]),
        }


if __name__ == "__main__":
    config = json.loads(Path(sys.argv[1]).read_text())
    print(json.dumps(Traffic(config).run()), flush=True)
