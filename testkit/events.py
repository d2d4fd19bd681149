"""The applications' side of events, for the tests: a real local HTTP server that verifies every
delivery with the standardwebhooks library (as an application would), and a way to run the
worker's delivery engine in this process (the fast tier; e2e tests run the real RQ worker)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from testkit.servers import wait_until
from webhooks.events import endpoints, sender
from webhooks.events import log as events_log
from webhooks.events.outbox import WALLET_TYPES
from webhooks.leads.accounting.item import SettlementItem
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Event, EventDispatch, utcnow

EVENTS_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"  # the application's Standard Webhooks secret
FAST = sender.RetryPolicy(base_ms=20, max_ms=200, retry_for_s=3600)  # back-off in ms, not s


@dataclass
class Arrival:
    """One POST the receiver got: its webhook-id, body, whether its signature verified, and the
    status it was answered with (None while held, or when never answered)."""

    event_id: str
    body: dict | None
    verified: bool
    status: int | None = None
    at: float = field(default_factory=time.time)


class EventReceiver:
    """The application: answers 2xx to each verified event, unless told to fail (`fail`: a
    predicate of the body, or `fail_next` requests), to hold requests open (`hold()`), or is
    stopped (connections refused) and started again on the same port."""

    def __init__(self, secret: str = EVENTS_SECRET):
        self.webhook = Webhook(secret)
        self.lock = threading.Lock()
        self.arrivals: list[Arrival] = []
        self.fail_next = 0
        self.fail = None  # body -> bool: answer 500 to matching events
        self.released = threading.Event()
        self.released.set()
        self.httpd: ThreadingHTTPServer | None = None
        self.port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/floodgate-events"

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = outer.webhook.verify(raw, dict(self.headers.items()))
                    verified = True
                except WebhookVerificationError:
                    body, verified = None, False
                arrival = Arrival(self.headers.get("webhook-id", ""), body, verified)
                with outer.lock:
                    outer.arrivals.append(arrival)
                    failing = outer.fail_next > 0
                    outer.fail_next -= failing
                outer.released.wait(60)
                if not verified:
                    status = 401
                elif failing or (outer.fail is not None and outer.fail(body)):
                    status = 500
                else:
                    status = 204
                self.close_connection = True  # no kept-alive connection outlives stop()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    arrival.status = status
                except OSError:
                    pass  # the sender is gone (killed mid-delivery)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Down: the port refuses connections until start()."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def hold(self) -> None:
        """Keep every request from now on open, unanswered, until release()."""
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def accepted(self) -> list[Arrival]:
        """Verified events answered 2xx, in the order they arrived."""
        with self.lock:
            return [a for a in self.arrivals if a.verified and a.status is not None and a.status < 300]

    def accepted_ids(self) -> set[str]:
        return {a.event_id for a in self.accepted()}

    def close(self) -> None:
        self.release()
        self.stop()


def all_sent() -> bool:
    """Nothing waits for fan-out and no delivery to an enabled endpoint is pending."""
    enabled = [ep.id for ep in endpoints.active(()) if ep.enabled]
    backlog = events_log.backlog()
    return events_log.not_fanned_out() == 0 and all(backlog.get(e, {}).get("pending", 0) == 0 for e in enabled)


def deliver_inline(
    url: str | None = None,
    policy: sender.RetryPolicy = FAST,
    secret: str = EVENTS_SECRET,
    until=None,
    timeout: float = 30,
    disable_after_s: int = 432_000,
) -> None:
    """Run the worker's engine in this process until `until()` (default: all_sent), as
    workers/outbox.py's drain does; `url`: PAYMENT_EVENTS_URL, signed with `secret`."""
    done = until or all_sent
    with ThreadPoolExecutor(8) as pool, db.connection_context():
        if url:
            endpoints.sync_managed(url, (secret,))
        engine = sender.Engine(pool, policy, 5, disable_after_s, managed_secrets=(secret,))

        def step():
            engine.refresh()
            sender.fan_out(engine.endpoints, utcnow())
            engine.submit_due()
            engine.collect(0.05)
            return not engine.in_flight and done()

        try:
            wait_until(step, timeout=timeout, interval=0.01, what="events delivered")
        finally:
            engine.finish()


def event_rows() -> list[dict]:
    """Every wallet event as PAYMENT_EVENTS_URL sees it, oldest first, with its body parsed: its
    webhook-id, and its delivery's state (pending while not fanned out)."""
    with db.connection_context():
        events = list(Event.select().where(Event.type.in_(list(WALLET_TYPES))).order_by(Event.id))
        managed = {d.event: d for d in EventDispatch.select().where(EventDispatch.endpoint_id == endpoints.MANAGED_ID)}
        rows = []
        for e in events:
            d = managed.get(e.id)
            rows.append(
                {
                    "row": e.id,
                    "id": d.webhook_id if d else e.event_id,
                    "type": e.type,
                    "status": d.status if d else "pending",
                    "customer": e.entity,
                    "attempts": d.attempts if d else 0,
                    "body": json.loads(e.body),
                }
            )
        return rows


def sale_item(publisher_id: str, lead_id: str, payout: str = "4.00", price: str = "40.00") -> SettlementItem:
    """A sale's settlement item, as the settlement worker hands it to leads.ledger.settle (which
    writes its lead.sold event with it): for tests and benches that need sales in numbers."""
    now = datetime.now(timezone.utc).isoformat()
    return SettlementItem.from_dict(
        {
            "publisher_id": publisher_id,
            "lead_id": lead_id,
            "status": "sold",
            "buyer_id": "acme",
            "price": price,
            "commission": payout,
            "attempts": [{"buyer_id": "acme", "outcome": "accepted", "ms": 12}],
            "skipped": [],
            "payload": "{}",
            "received_at": now,
            "sold_at": now,
            "lease": ["acme", f"l-{publisher_id}-{lead_id}"],
            "reserved_us": None,
            "request_id": None,
        }
    )
