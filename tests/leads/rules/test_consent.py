"""Consent certificates (docs/api.md "Consent, suppression and pre-ping"): a buyer requiring
TrustedForm is offered a lead only once Floodgate has claimed its certificate, through the
Certificate API v4.0 (a local stand-in answering in its documented shapes), once per lead,
within the lead's deadline; the outcome is kept with the lead and in its trace; a claim that
is refused, late or not answered at all keeps the lead from that buyer and from nobody else."""

from __future__ import annotations

import base64

import pytest

from testkit.trustedform import API_KEY, TrustedFormStandIn
from webhooks.leads.rules import consent

WEB_ID = "eb9fc4dd9bed9ad451a5648946cf4bf09b5bb947"
LEADID = "0A1B2C3D-4E5F-6789-ABCD-EF0123456789"


def cert(n: int) -> str:
    return f"https://cert.trustedform.com/{n:040x}"


@pytest.fixture
def standin():
    server = TrustedFormStandIn()
    yield server
    server.close()


@pytest.fixture
def consent_buyers(api, buyer_server, reconfigure, standin, worker):
    """`needs` (priority 1) requires TrustedForm, `any` (priority 2) nothing; the publisher's
    spec declares `cert` a certificate and `leadid` a LeadiD token."""
    reconfigure(trustedform_api_base=standin.url, trustedform_api_key=API_KEY, trustedform_timeout_ms=800)
    buyer_server.add("needs")
    buyer_server.add("any")
    key = api.put_publisher(
        "pub",
        fields={"cert": {"type": "trustedform_cert"}, "leadid": {"type": "jornaya_leadid"}, "email": {"type": "email"}},
    )
    api.put_buyer("needs", buyer_server.url("needs"), priority=1, require_consent=["trustedform"])
    api.put_buyer("any", buyer_server.url("any"), priority=2)
    api.settle_config()
    return key


def test_a_claimed_certificate_opens_the_buyer_that_requires_it(api, consent_buyers, standin, buyer_server):
    answer = api.post_lead(
        consent_buyers,
        {"lead_id": "c-1", "cert": cert(1).upper().replace("HTTPS://CERT", "https://CERT"), "email": "Ada@Example.com"},
    ).json()
    assert answer["status"] == "sold" and answer["buyer_id"] == "needs", answer
    (call,) = standin.requests
    assert call["cert"] == f"{1:040x}"  # the id lower-cased, posted to TRUSTEDFORM_API_BASE
    assert call["headers"]["Authorization"] == "Basic " + base64.b64encode(f"API:{API_KEY}".encode()).decode()
    assert call["headers"]["api-version"] == "4.0"
    assert call["body"] == {
        "match_lead": {"email": "ada@example.com"},
        "retain": {"reference": "pub:c-1", "vendor": "Floodgate"},
    }
    lead = api.wait_settled("c-1", "pub")
    (claim,) = lead["consent"]
    assert (
        claim["outcome"] == "claimed"
        and claim["cert_id"] == f"{1:040x}"
        and claim["expires_at"] == "2031-12-02T12:00:00Z"
    )


@pytest.mark.parametrize(
    "mode, outcome",
    [("no", "refused"), ("expired", "refused"), ("broken", "failed"), ("late", "late")],
)
def test_a_claim_not_made_keeps_the_lead_from_that_buyer_only(api, consent_buyers, standin, mode, outcome):
    standin.behaviour[f"{2:040x}"] = mode
    answer = api.post_lead(consent_buyers, {"lead_id": "c-2", "cert": cert(2), "email": "ada@example.com"}).json()
    assert answer["status"] == "sold" and answer["buyer_id"] == "any", answer
    standin.release.set()
    lead = api.wait_settled("c-2", "pub")
    assert {"buyer_id": "needs", "reason": "consent"} in lead["skipped"]
    assert lead["consent"][0]["outcome"] == outcome


def test_a_claim_api_that_is_not_there_at_all(api, consent_buyers, reconfigure):
    reconfigure(trustedform_api_base="http://127.0.0.1:9", trustedform_api_key=API_KEY, trustedform_timeout_ms=800)
    answer = api.post_lead(consent_buyers, {"lead_id": "c-3", "cert": cert(3), "email": "ada@example.com"}).json()
    assert answer["buyer_id"] == "any"
    assert api.wait_settled("c-3", "pub")["consent"][0]["outcome"] == "failed"


def test_no_certificate_or_no_key_means_no_claim(api, consent_buyers, standin, reconfigure):
    assert api.post_lead(consent_buyers, {"lead_id": "c-4", "email": "ada@example.com"}).json()["buyer_id"] == "any"
    assert api.wait_settled("c-4", "pub")["consent"] == [{"kind": "trustedform", "outcome": "missing"}]
    reconfigure(trustedform_api_base=standin.url, trustedform_api_key="", trustedform_timeout_ms=800)
    assert api.post_lead(consent_buyers, {"lead_id": "c-5", "cert": cert(5)}).json()["buyer_id"] == "any"
    assert api.wait_settled("c-5", "pub")["consent"][0]["outcome"] == "not_configured"
    assert standin.requests == []


def test_a_wrong_key_fails_the_claim_without_refusing_the_certificate(api, app, consent_buyers, standin, reconfigure):
    """401 is Floodgate's to fix, not the certificate's: `failed`, not remembered, so the
    lead's retry claims again once the key is right."""
    reconfigure(
        trustedform_api_base=standin.url, trustedform_api_key="tf_wrong_key_0123456789", trustedform_timeout_ms=800
    )
    assert (
        api.post_lead(consent_buyers, {"lead_id": "k-1", "cert": cert(8), "email": "ada@example.com"}).json()[
            "buyer_id"
        ]
        == "any"
    )
    record = api.wait_settled("k-1", "pub")["consent"][0]
    assert (record["outcome"], record["status"]) == ("failed", 401)
    reconfigure(trustedform_api_base=standin.url, trustedform_api_key=API_KEY, trustedform_timeout_ms=800)
    from webhooks import services

    check = consent.start(
        services.of(app).store,
        services.of(app).intake.router.trustedform,
        fields=consent.Fields(cert="cert"),
        required={"trustedform"},
        lead={"cert": cert(8), "email": "ada@example.com"},
        publisher_id="pub",
        lead_id="k-1",
        deadline=10**12,
    )
    assert check.allows(("trustedform",)) and len(standin.requests) == 2


def test_the_lead_is_matched_by_its_ten_digit_phone_or_not_claimed_without_one(api, consent_buyers, standin):
    api.put_publisher(
        "pub",
        api_key=consent_buyers,
        fields={"cert": {"type": "trustedform_cert"}, "phone": {"type": "phone"}},
    )
    api.settle_config()
    assert (
        api.post_lead(consent_buyers, {"lead_id": "p-1", "cert": cert(9), "phone": "(512) 555-0100"}).json()["buyer_id"]
        == "needs"
    )
    assert standin.requests[-1]["body"]["match_lead"] == {"phone": "5125550100"}
    assert api.post_lead(consent_buyers, {"lead_id": "p-2", "cert": cert(10)}).json()["buyer_id"] == "any"
    assert api.wait_settled("p-2", "pub")["consent"][0] == {
        "kind": "trustedform",
        "cert_id": f"{10:040x}",
        "outcome": "missing",
        "reason": "no email or phone to match",
        "ms": 0,
    }
    assert len(standin.requests) == 1


def test_a_buyer_that_requires_nothing_is_not_kept_waiting(api, consent_buyers, standin, buyer_server):
    """`any` first in the waterfall: the lead is sold to it while the claim is still held by
    the stand-in; the claim goes on and is remembered, recorded as not awaited."""
    api.put_buyer("any", buyer_server.url("any"), priority=0)
    api.settle_config()
    standin.behaviour[f"{6:040x}"] = "late"
    answer = api.post_lead(consent_buyers, {"lead_id": "c-6", "cert": cert(6), "email": "ada@example.com"}).json()
    assert answer["buyer_id"] == "any" and not standin.release.is_set()
    standin.release.set()
    assert api.wait_settled("c-6", "pub")["consent"][0]["outcome"] == "not_awaited"


def test_a_certificate_of_another_host_or_shape_is_refused_at_intake(api, consent_buyers, standin):
    for bad in (
        "https://cert.trustedform.com.evil.example/" + WEB_ID,
        "https://evil.example/" + WEB_ID,
        "https://cert.trustedform.com/" + WEB_ID + "?x=1",
        "https://cert.trustedform.com/short",
        42,
    ):
        resp = api.post_lead(consent_buyers, {"cert": bad})
        assert resp.status_code == 400 and "cert" in resp.json()["error"]["fields"], bad
    resp = api.post_lead(consent_buyers, {"leadid": "not-a-token"})
    assert resp.status_code == 400 and "leadid" in resp.json()["error"]["fields"]
    assert standin.requests == []


def test_the_claim_is_made_once_per_lead(api, app, consent_buyers, standin):
    from webhooks import services

    store, router = services.of(app).store, services.of(app).intake.router
    assert router.trustedform is not None
    lead = {"cert": cert(7), "email": "ada@example.com"}
    for _ in range(3):
        check = consent.start(
            store,
            router.trustedform,
            fields=consent.Fields(cert="cert"),
            required={"trustedform"},
            lead=lead,
            publisher_id="pub",
            lead_id="once",
            deadline=10**12,
        )
        assert check.allows(("trustedform",))
    assert len(standin.requests) == 1


def test_jornaya_requires_a_well_formed_leadid(api, consent_buyers, buyer_server):
    api.put_buyer("needs", buyer_server.url("needs"), priority=1, require_consent=["jornaya"])
    api.settle_config()
    assert api.post_lead(consent_buyers, {"lead_id": "j-1"}).json()["buyer_id"] == "any"
    assert api.post_lead(consent_buyers, {"lead_id": "j-2", "leadid": LEADID.lower()}).json()["buyer_id"] == "needs"
