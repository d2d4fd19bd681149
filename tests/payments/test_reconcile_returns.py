"""Reconciliation of money going back (docs/api.md "Disputes, refunds on every API version"): a Stripe
refund and dispute, and a Paystack dispute, whose webhooks never came are applied from the
providers' lists (local stand-ins in their documented shapes, testkit/provider_apis.py) through
the webhook's own path, exactly once with the webhooks that arrive late afterwards, and with a
second run. Real app, Redis and database."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone

from testkit.payments import SECRET, STRIPE_REFUND, balance, deliver, encode, payload, wallet_invariant_breaches
from testkit.provider_apis import ProviderApis, paystack_dispute
from tests.payments.test_disputes import PAYSTACK_RESOLVE, STRIPE_DISPUTE
from webhooks import services
from webhooks.payments import reconcile
from webhooks.payments.providers import payment_lists
from webhooks.storage.records.db import db

SINCE = datetime.now(timezone.utc) - timedelta(days=1)
EMAIL = "jenny@example.com"


def listers(apis: ProviderApis) -> dict:
    found = payment_lists.listers(apis.config())
    for lister in found.values():
        lister.min_interval_s = 0
    return {p: found[p] for p in ("paystack", "stripe")}


def run(app, apis: ProviderApis) -> dict[str, reconcile.ProviderRun]:
    with db.connection_context():
        done = reconcile.run(services.of(app).payments, listers(apis), SINCE)
    return {r.provider: r for r in done.providers}


def stripe_event(body: dict, event_id: str) -> dict:
    event = copy.deepcopy(body)
    event["id"] = event_id
    event["created"] = int((datetime.now(timezone.utc) - timedelta(minutes=5)).timestamp())
    return event


def test_refunds_and_disputes_whose_webhooks_never_came_are_applied_once(app, api):
    with ProviderApis(paystack_key=SECRET["paystack"], monnify_secret=SECRET["monnify"]) as apis:
        # credited by webhook: a Stripe payment and a Paystack one
        deliver(api, "stripe", encode(payload("stripe", "pi_rec", 10000, "USD", EMAIL)))
        deliver(api, "paystack", encode(payload("paystack", "5qm4pv2mxs9rltp", 5700, "NGN", "john@example.com")))
        # what came back without a webhook: a Stripe refund of 3000 and a dispute of 2000 (undelivered
        # events), and a resolved Paystack dispute (its list item); plus one still open (not moved)
        refund = copy.deepcopy(STRIPE_REFUND)
        refund["data"]["object"].update(id="re_rec", payment_intent="pi_rec", amount=3000)
        dispute = copy.deepcopy(STRIPE_DISPUTE)
        dispute["data"]["object"].update(id="dp_rec", payment_intent="pi_rec", amount=2000)
        apis.stripe += [stripe_event(refund, "evt_rf"), stripe_event(dispute, "evt_dp")]
        apis.paystack_disputes += [
            paystack_dispute(358949, "5qm4pv2mxs9rltp", 5700, "john@example.com", resolution="auto-accepted"),
            paystack_dispute(358950, "5qm4pv2mxs9rltp", None, "john@example.com", status="awaiting-merchant-feedback"),
        ]

        first = run(app, apis)
        assert (first["stripe"].moved, first["stripe"].error) == (2, None)
        assert (first["paystack"].moved, first["paystack"].error) == (1, None)
        assert balance(EMAIL, "USD") == 10000 - 3000 - 2000
        assert balance("john@example.com", "NGN") == 0
        assert apis.requests_to("/dispute") and {s.query["type"] for s in apis.requests_to("/v1/events")} >= {
            "charge.*",
            "refund.*",
        }

        # a second run, and the webhooks arriving late: nothing moves again
        again = run(app, apis)
        assert (again["stripe"].moved, again["paystack"].moved) == (0, 0)
        assert deliver(api, "stripe", encode(refund)).json() == {"status": "duplicate"}
        assert deliver(api, "stripe", encode(dispute)).json() == {"status": "duplicate"}
        assert deliver(api, "paystack", encode(PAYSTACK_RESOLVE)).json() == {"status": "duplicate"}
        assert balance(EMAIL, "USD") == 5000
        shown = api.get("/v1/admin/payments/stripe/pi_rec").json()
        assert (shown["refunded_minor"], shown["disputed_minor"], shown["status"]) == (3000, 2000, "disputed")
        assert wallet_invariant_breaches() == []


def test_a_webhook_first_then_reconciliation_moves_once(app, api):
    with ProviderApis(paystack_key=SECRET["paystack"], monnify_secret=SECRET["monnify"]) as apis:
        deliver(api, "stripe", encode(payload("stripe", "pi_wf", 10000, "USD", EMAIL)))
        refund = copy.deepcopy(STRIPE_REFUND)
        refund["data"]["object"].update(id="re_wf", payment_intent="pi_wf", amount=4000)
        assert deliver(api, "stripe", encode(refund)).json() == {"status": "debited"}
        apis.stripe.append(stripe_event(refund, "evt_wf"))  # Stripe still lists it (its delivery failed)
        result = run(app, apis)
        assert (result["stripe"].moved, result["stripe"].known) == (0, 1)
        assert balance(EMAIL, "USD") == 6000


def test_a_listed_refund_of_a_payment_not_in_the_ledger_waits_for_the_next_run(app, api):
    with ProviderApis(paystack_key=SECRET["paystack"], monnify_secret=SECRET["monnify"]) as apis:
        refund = copy.deepcopy(STRIPE_REFUND)
        refund["data"]["object"].update(id="re_early", payment_intent="pi_early", amount=1000)
        apis.stripe.append(stripe_event(refund, "evt_early"))
        result = run(app, apis)
        assert (result["stripe"].moved, result["stripe"].missing, result["stripe"].error) == (0, 1, None)
        deliver(api, "stripe", encode(payload("stripe", "pi_early", 10000, "USD", EMAIL)))
        assert run(app, apis)["stripe"].moved == 1
        assert balance(EMAIL, "USD") == 9000
        assert json.loads(api.get("/v1/admin/payments/stripe/pi_early").text)["refunded_minor"] == 1000
