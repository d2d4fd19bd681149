"""The console's return policy fields and its review queue: a buyer's policy set from its
form (and its optional fields emptied back to the defaults), a return asked from a lead's
trace left for review, then approved or rejected from /ops/returns."""

from __future__ import annotations

from tests.web.ops.conftest import post

DEFAULTS = {"window_days": 7, "max_pct": None, "period_days": 14, "reasons": None, "review": "auto"}
EMPTY = {
    "returns.window_days": "",
    "returns.max_pct": "",
    "returns.period_days": "",
    "returns.reasons": "",
    "returns.review": "auto",
}


def _sold(api, buyer_server, lead_id: str) -> None:
    key = api.put_publisher("pub-r", commission_pct="10")
    api.settle_config()
    assert api.post_lead(key, {"lead_id": lead_id}).json()["status"] == "sold"
    api.wait_settled(lead_id, "pub-r")


def test_a_return_policy_is_set_from_the_buyer_form_and_emptied_back_to_the_defaults(api, browser):
    api.put_buyer("pol", "http://127.0.0.1:9/pol", price="8.00", return_window_days=3)
    policy = {
        "returns.window_days": "2",
        "returns.max_pct": "25",
        "returns.period_days": "30",
        "returns.reasons": "bad_phone, duplicate",
        "returns.review": "manual",
    }
    resp = post(api, browser, "/ops/buyers/pol", policy)
    assert resp.status_code == 303, resp.text[:500]
    assert api.get("/v1/admin/buyers/pol").json()["returns"] == {
        "window_days": 2,
        "max_pct": 25,
        "period_days": 30,
        "reasons": ["bad_phone", "duplicate"],
        "review": "manual",
    }
    page = browser[0].get(api.base + "/ops/buyers/pol").text
    assert 'value="bad_phone, duplicate"' in page and "<option selected>manual</option>" in page
    resp = post(api, browser, "/ops/buyers/pol", EMPTY)
    assert resp.status_code == 303, resp.text[:500]
    got = api.get("/v1/admin/buyers/pol").json()
    assert got["returns"] == DEFAULTS and got["return_window_days"] == 7
    refused = post(api, browser, "/ops/buyers/pol", {**EMPTY, "returns.max_pct": "120"})
    assert refused.status_code == 400 and 'data-error-for="returns.max_pct"' in refused.text


def test_a_reviewed_return_is_approved_from_the_queue_once(api, browser, buyer_server, worker):
    buyer_server.add("rev")
    api.put_buyer("rev", buyer_server.url("rev"), price="8.00", returns={"review": "manual"})
    _sold(api, buyer_server, "q-1")
    resp = post(api, browser, "/ops/leads/q-1/return", {"publisher_id": "pub-r", "reason": "wrong number"})
    assert resp.status_code == 303 and "notice=return_pending" in resp.headers["Location"]
    trace = browser[0].get(api.base + resp.headers["Location"]).text
    assert 'data-sale="rev" data-status="return_pending"' in trace and 'id="return-form"' not in trace
    [sale] = api.get("/v1/admin/leads/q-1").json()["sales"]
    queue = browser[0].get(api.base + "/ops/returns").text
    assert f'data-return="{sale["return_id"]}"' in queue and "wrong number" in queue
    assert "/ops/leads/q-1?publisher_id=pub-r" in queue
    unsigned = browser[0].post(f"{api.base}/ops/returns/{sale['return_id']}/approve", data={})
    assert unsigned.status_code == 403  # no CSRF token: nothing decided
    assert api.get("/v1/admin/leads/q-1").json()["sales"][0]["status"] == "return_pending"

    done = post(api, browser, f"/ops/returns/{sale['return_id']}/approve", {})
    assert done.status_code == 303 and "notice=approved" in done.headers["Location"]
    got = api.get("/v1/admin/leads/q-1").json()
    assert got["status"] == "returned" and got["sales"][0]["status"] == "returned"
    assert got["return_reason"] == "wrong number"
    queue = browser[0].get(api.base + done.headers["Location"]).text
    assert f'data-return="{sale["return_id"]}"' not in queue and "lead.returned" in queue
    again = post(api, browser, f"/ops/returns/{sale['return_id']}/reject", {})
    assert again.status_code == 409 and "decided already" in again.text
    assert post(api, browser, "/ops/returns/ret_none/approve", {}).status_code == 404


def test_a_rejected_return_leaves_the_sale_sold(api, browser, buyer_server, worker):
    buyer_server.add("rej")
    api.put_buyer("rej", buyer_server.url("rej"), price="8.00", returns={"review": "manual"})
    _sold(api, buyer_server, "q-2")
    resp = api.http.post(f"{api.base}/v1/admin/leads/q-2/return", json={"reason": "meh"}, headers=api.admin)
    assert resp.status_code == 202
    done = post(api, browser, f"/ops/returns/{resp.json()['return_id']}/reject", {})
    assert done.status_code == 303 and "notice=rejected" in done.headers["Location"]
    got = api.get("/v1/admin/leads/q-2").json()
    assert got["status"] == "sold" and got["sales"][0]["status"] == "sold"
    assert 'id="return-form"' in browser[0].get(api.base + "/ops/leads/q-2").text  # it may be asked again
