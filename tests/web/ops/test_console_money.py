"""The console's money pages: every payment searched (filters, cursor, CSV), a wallet looked
up as the ledger holds it, event endpoints made, edited, paused and given a new secret, and
suppression lists made and filled from forms and uploaded files, each through the admin API's
own functions (the same audit rows); an analyst changes none of it."""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timedelta, timezone

from testkit.payments import deliver, encode, payload, refund_payload
from tests.web.ops.conftest import post
from webhooks.events.outbox import EventType
from webhooks.storage.records.db import db
from webhooks.storage.records.models import Payment

EVENT_TYPES = tuple(t.value for t in EventType)


def page(api, browser, path, status=200):
    resp = browser[0].get(api.base + path)
    assert resp.status_code == status, resp.text[:500]
    return resp.text


def credit(api, provider, reference, amount_minor, currency="NGN", email="ada@example.com"):
    raw = encode(payload(provider, reference, amount_minor, currency=currency, email=email))
    assert deliver(api, provider, raw).json()["status"] == "credited"


def listed(text):
    return re.findall(r'data-listed="([^"]+)"', text)


def test_every_payment_is_listed_newest_first_and_filtered(api, browser):
    credit(api, "standard", "s-1", 1000, "USD", "ada@example.com")
    credit(api, "paystack", "p-1", 2000, "NGN", "bob@example.com")
    credit(api, "standard", "s-2", 3000, "NGN", "Ada@Example.com")
    text = page(api, browser, "/ops/payments")
    assert listed(text) == ["standard:s-2", "paystack:p-1", "standard:s-1"]
    assert listed(page(api, browser, "/ops/payments?provider=standard")) == ["standard:s-2", "standard:s-1"]
    assert listed(page(api, browser, "/ops/payments?currency=ngn")) == ["standard:s-2", "paystack:p-1"]
    assert listed(page(api, browser, "/ops/payments?account=ADA@example.com")) == ["standard:s-2", "standard:s-1"]
    assert listed(page(api, browser, "/ops/payments?account=ada@example.com&currency=USD")) == ["standard:s-1"]
    today = datetime.now(timezone.utc).date()
    day = today.isoformat()
    assert len(listed(page(api, browser, f"/ops/payments?from={day}&to={day}"))) == 3
    tomorrow = (today + timedelta(days=1)).isoformat()
    assert listed(page(api, browser, f"/ops/payments?from={tomorrow}")) == []
    yesterday = (today - timedelta(days=1)).isoformat()
    assert listed(page(api, browser, f"/ops/payments?to={yesterday}")) == []
    assert listed(page(api, browser, "/ops/payments?to=9999-12-31&from=0001-01-01")) != []


def test_refused_filters_are_all_shown_at_once(api, browser):
    text = page(api, browser, "/ops/payments?provider=evil&currency=XYZ&from=2026-13-01&to=yesterday&status=x", 400)
    errors = re.findall(r'data-error-for="([^"]+)"', text)
    assert sorted(errors) == ["currency", "from", "provider", "status", "to"]
    assert 'value="XYZ"' in text  # what was typed stays in its field
    text = page(api, browser, "/ops/payments?from=2026-12-02&to=2026-12-01", 400)
    assert re.findall(r'data-error-for="([^"]+)"', text) == ["to"]
    assert page(api, browser, "/ops/payments?cursor=bm90IG91cnM", 400)
    hostile = page(api, browser, "/ops/payments?account=%3Cscript%3E", 200)
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile


def test_the_list_pages_by_cursor_and_the_csv_holds_every_match(api, browser, monkeypatch):
    from webhooks.payments import search
    from webhooks.web.ops import payments

    for i in range(7):
        credit(api, "standard", f"pg-{i}", 100 + i, "USD")
    monkeypatch.setattr(payments, "PAGE", 3)
    seen, path = [], "/ops/payments?currency=USD"
    while path:
        text = page(api, browser, path)
        seen += listed(text)
        found = re.search(r'<a rel="next" href="([^"]+)"', text)
        path = found.group(1).replace("&amp;", "&") if found else None
    assert seen == [f"standard:pg-{i}" for i in reversed(range(7))]

    monkeypatch.setattr(search, "CSV_PAGE", 2)  # several reads, one header
    resp = browser[0].get(api.base + "/ops/payments.csv?currency=USD")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/csv")
    assert resp.headers["Cache-Control"] == "no-store" and "attachment" in resp.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert [r["reference"] for r in rows] == [f"pg-{i}" for i in reversed(range(7))]
    assert rows[0]["amount"] == "1.06" and rows[0]["wallet"] == "ada@example.com"
    assert browser[0].get(api.base + "/ops/payments.csv?currency=XX").status_code == 400


def test_a_csv_cell_that_reads_as_a_formula_is_neutralised(api, browser):
    credit(api, "standard", "=HYPERLINK(1)", 500, "USD", "-cmd@example.com")
    text = browser[0].get(api.base + "/ops/payments.csv").text
    row = next(csv.DictReader(io.StringIO(text)))
    assert row["reference"] == "'=HYPERLINK(1)" and row["wallet"] == "'-cmd@example.com"


def test_a_wallet_shows_its_balance_payments_and_debits(api, browser):
    credit(api, "standard", "w-1", 5000, "USD", "ada@example.com")
    credit(api, "standard", "w-2", 700, "NGN", "ada@example.com")
    refund = encode(refund_payload("standard", "rf-1", "w-1", 1200, currency="USD"))
    assert deliver(api, "standard", refund).json()["status"] == "debited"
    text = page(api, browser, "/ops/payments/wallet?account=Ada@Example.com&currency=usd")
    assert 'data-wallet="ada@example.com"' in text
    assert re.findall(r'data-balance="([^"]+)" data-amount="([^"]+)"', text) == [("USD", "38.00")]
    assert listed(text) == ["standard:w-1"]
    moves = re.findall(r'data-kind="([^"]+)" data-debit="([^"]+)"', text)
    assert moves == [("refund", "true"), ("top_up", "false")]
    every = page(api, browser, "/ops/payments/wallet?account=ada@example.com")
    assert re.findall(r'data-balance="([^"]+)"', every) == ["NGN", "USD"]
    assert api.get("/v1/admin/wallets/ada@example.com").json()["balances_minor"] == {"NGN": 700, "USD": 3800}
    none = page(api, browser, "/ops/payments/wallet?account=nobody@example.com")
    assert 'id="no-wallet"' in none
    bad = page(api, browser, "/ops/payments/wallet?account=has+space&currency=QQQ", 400)
    assert sorted(re.findall(r'data-error-for="([^"]+)"', bad)) == ["account", "currency"]
    assert page(api, browser, "/ops/payments/wallet?account=&currency=USD", 400)
    assert 'id="wallet"' not in page(api, browser, "/ops/payments/wallet")
    with db.connection_context():
        assert Payment.select().count() == 2


def errors_of(text):
    return re.findall(r'data-error-for="([^"]+)"', text)


def test_an_endpoint_made_from_the_form_shows_its_secret_once(api, browser):
    resp = post(
        api, browser, "/ops/events/endpoints", {"id": "app", "url": "https://app.example/hooks?token=s3cr3tvalue1234"}
    )
    assert resp.status_code == 201
    secret = re.search(r'<code class="secret" id="endpoint-secret">([^<]+)</code>', resp.text).group(1)
    got = api.get("/v1/admin/event-endpoints/app").json()
    assert secret.startswith("whsec_") and got["secret"] != secret and got["secret"].endswith(secret[-4:])
    assert got["types"] == list(EVENT_TYPES) and got["publisher_id"] is None and got["enabled"] is True
    again = page(api, browser, "/ops/events/endpoints/app")
    assert secret not in again and "s3cr3tvalue1234" not in again
    assert 'data-action="event_endpoint.put"' in again  # the API's own audit row
    taken = post(api, browser, "/ops/events/endpoints", {"id": "app", "url": "https://other.example/"})
    assert taken.status_code == 400 and errors_of(taken.text) == ["id"]
    assert api.get("/v1/admin/event-endpoints/app").json()["url"].startswith("https://app.example/")


def test_a_refused_endpoint_form_shows_every_error_and_keeps_what_was_typed(api, browser):
    fields = [
        ("id", "bad id"),
        ("url", "ftp://files.example/"),
        ("types", "lead.sold"),
        ("publisher_id", "no spaces please"),
        ("secret", "not-a-secret"),
        ("enabled", ""),
        ("enabled", "on"),
    ]
    resp = post(api, browser, "/ops/events/endpoints", fields)
    assert resp.status_code == 400
    assert sorted(errors_of(resp.text)) == ["id", "publisher_id", "secret", "url"]
    assert 'value="ftp://files.example/"' in resp.text and "not-a-secret" not in resp.text
    assert 'value="lead.sold" checked' in resp.text
    assert api.get("/v1/admin/event-endpoints").json()["endpoints"] == []
    # a publisher's endpoint takes lead events only: the API's rule, beside the events
    resp = post(
        api,
        browser,
        "/ops/events/endpoints",
        {"id": "pb", "url": "https://pub.example/", "publisher_id": "surge", "types": "wallet.credited"},
    )
    assert resp.status_code == 400 and errors_of(resp.text) == ["types"]
    # then right, with optional fields left empty
    ok = post(
        api,
        browser,
        "/ops/events/endpoints",
        {"id": "pb", "url": "https://pub.example/", "publisher_id": "", "secret": ""},
    )
    assert ok.status_code == 201


def test_an_endpoint_is_edited_paused_resumed_and_given_a_new_secret(api, browser):
    made = post(
        api, browser, "/ops/events/endpoints", {"id": "app", "url": "https://app.example/hooks?token=abcdefghijklmnop"}
    )
    first = re.search(r'id="endpoint-secret">([^<]+)<', made.text).group(1)
    text = page(api, browser, "/ops/events/endpoints/app")
    url = html_value(text, "url")
    assert "abcdefghijklmnop" not in url
    fields = [
        ("url", url),
        ("types", "lead.sold"),
        ("types", "lead.returned"),
        ("publisher_id", "surge"),
        ("enabled", ""),
        ("enabled", "on"),
    ]
    resp = post(api, browser, "/ops/events/endpoints/app", fields)
    assert resp.status_code == 303 and "notice=saved" in resp.headers["Location"]
    got = api.get("/v1/admin/event-endpoints/app").json()
    assert got["types"] == ["lead.sold", "lead.returned"] and got["publisher_id"] == "surge"
    from webhooks.storage.records.models import EventEndpoint

    with db.connection_context():
        row = EventEndpoint.get_by_id("app")
        assert row.url == "https://app.example/hooks?token=abcdefghijklmnop" and row.secret == first  # both kept
    bad = post(api, browser, "/ops/events/endpoints/app", [("url", "not a url"), ("publisher_id", "a b")])
    assert bad.status_code == 400 and sorted(errors_of(bad.text)) == ["publisher_id", "url"]

    assert post(api, browser, "/ops/events/endpoints/app/pause", {}).status_code == 303
    assert api.get("/v1/admin/event-endpoints/app").json()["enabled"] is False
    assert post(api, browser, "/ops/events/endpoints/app/resume", {}).status_code == 303
    assert api.get("/v1/admin/event-endpoints/app").json()["enabled"] is True

    rotated = post(api, browser, "/ops/events/endpoints/app/rotate", {})
    assert rotated.status_code == 200
    second = re.search(r'id="endpoint-secret">([^<]+)<', rotated.text).group(1)
    with db.connection_context():
        row = EventEndpoint.get_by_id("app")
        assert second != first and row.secret == second and row.publisher_id == "surge"
        assert row.url == "https://app.example/hooks?token=abcdefghijklmnop"
    actions = re.findall(r'data-action="([^"]+)"', page(api, browser, "/ops/events/endpoints/app"))
    assert actions == [
        "event_endpoint.put",
        "event_endpoint.enabled",
        "event_endpoint.paused",
        "event_endpoint.put",
        "event_endpoint.put",
    ]
    assert post(api, browser, "/ops/events/endpoints/nope/pause", {}).status_code == 404


def html_value(text, name):
    import html

    return html.unescape(re.search(rf'name="{name}" value="([^"]*)"', text).group(1))


def upload(api, browser, list_id, content: bytes, name="list.csv"):
    http, csrf = browser
    return http.post(
        f"{api.base}/ops/suppression/{list_id}/upload",
        data={"csrf_token": csrf},
        files={"file": (name, content, "text/csv")},
        headers={"Origin": api.base, "Sec-Fetch-Site": "same-origin"},
        allow_redirects=False,
        timeout=30,
    )


def digests(list_id):
    from webhooks.storage.records.models import SuppressionEntry

    with db.connection_context():
        return sorted(e.digest for e in SuppressionEntry.select().where(SuppressionEntry.list_id == list_id))


def result_of(text):
    found = re.search(r'data-read="(\d+)" data-added="(\d+)"\s+data-removed="(\d+)" data-invalid="(\d+)"', text)
    assert found, text[:2000]
    return tuple(int(n) for n in found.groups())


def test_a_list_is_made_and_filled_from_the_forms_as_the_api_would(api, browser):
    bad = post(api, browser, "/ops/suppression", {"id": "no good", "field": "fax", "hash": "crc"})
    assert bad.status_code == 400 and sorted(errors_of(bad.text)) == ["field", "hash", "id"]
    made = post(api, browser, "/ops/suppression", {"id": "dnc", "field": "email", "hash": "none"})
    assert made.status_code == 303 and made.headers["Location"].startswith("/ops/suppression/dnc?notice=created")
    assert api.get("/v1/admin/suppression-lists/dnc").json()["field"] == "email"
    taken = post(api, browser, "/ops/suppression", {"id": "dnc", "field": "phone", "hash": "none"})
    assert taken.status_code == 400 and errors_of(taken.text) == ["id"]

    resp = post(
        api, browser, "/ops/suppression/dnc/entries", {"add": " Ada@Example.COM \n\nnot-an-email\nbob@example.com"}
    )
    assert resp.status_code == 200 and result_of(resp.text) == (3, 2, 0, 1)
    assert 'data-line="3"' in resp.text and "not-an-email" not in resp.text  # named by its line, never echoed
    assert "add line 3: is not an e-mail address" in resp.text
    resp = post(api, browser, "/ops/suppression/dnc/entries", {"remove": "BOB@example.com"})
    assert result_of(resp.text) == (1, 0, 1, 0) and api.get("/v1/admin/suppression-lists/dnc").json()["size"] == 1

    # the same value through the API's own call, on a list of the same shape: the same digest
    api.http.put(
        f"{api.base}/v1/admin/suppression-lists/api", json={"field": "email", "hash": "none"}, headers=api.admin
    )
    sent = api.http.post(
        f"{api.base}/v1/admin/suppression-lists/api/entries", json={"add": ["ada@example.com"]}, headers=api.admin
    )
    assert sent.status_code == 200 and digests("api") == digests("dnc")
    actions = re.findall(r'data-action="([^"]+)"', page(api, browser, "/ops/suppression/dnc"))
    assert actions == ["suppression_list.entries", "suppression_list.entries", "suppression_list.create"]


def test_a_file_upload_adds_its_good_lines_and_counts_the_bad(api, browser, monkeypatch):
    from webhooks.leads.rules import suppression

    post(api, browser, "/ops/suppression", {"id": "phones", "field": "phone", "hash": "sha256"})
    post(api, browser, "/ops/suppression", {"id": "mails", "field": "email", "hash": "none"})
    content = (
        '\ufeffemail,name\nada@example.com,Ada\n"bob@example.com","Bob, B."\n\n=cmd|\' /C calc\'!A0\ncy@example.com\n'
    )
    resp = upload(api, browser, "mails", content.encode())
    assert resp.status_code == 200 and result_of(resp.text) == (5, 3, 0, 2)
    assert re.findall(r'data-line="(\d+)"', resp.text) == ["1", "5"]
    assert api.get("/v1/admin/suppression-lists/mails").json()["size"] == 3
    # a hashed list takes the hex digests of normalised values
    import hashlib

    digest = hashlib.sha256(b"+14155550100").hexdigest()
    resp = upload(api, browser, "phones", f"{digest}\n+1 415 555 0100\n".encode(), name="p.txt")
    assert result_of(resp.text) == (2, 1, 0, 1)

    # more lines than one API call takes: written in several calls, every one counted
    monkeypatch.setattr(suppression, "MAX_ENTRIES", 2)
    resp = upload(
        api, browser, "mails", b"d@example.com\ne@example.com\nf@example.com\ng@example.com\nada@example.com\n"
    )
    assert result_of(resp.text) == (5, 4, 0, 0) and api.get("/v1/admin/suppression-lists/mails").json()["size"] == 7

    # a line past the csv module's field limit (131,072 characters) is refused by its number,
    # the good line after it added
    long_line = b'"' + b"x" * 200_000 + b'@example.com"\n'
    resp = upload(api, browser, "mails", long_line + b"h@example.com\n")
    assert resp.status_code == 200 and result_of(resp.text) == (2, 1, 0, 1)
    assert re.findall(r'data-line="(\d+)"', resp.text) == ["1"]


def test_an_upload_too_big_or_not_text_is_refused_with_a_message(api, browser, monkeypatch):
    from webhooks.web.ops import reports

    post(api, browser, "/ops/suppression", {"id": "mails", "field": "email", "hash": "none"})
    over = upload(api, browser, "mails", b"a@example.com\n" * (2 * 1024 * 1024 // 14 + 1))
    assert over.status_code == 413 and "over 2,048 KiB" in over.text
    monkeypatch.setattr(reports, "UPLOAD_MAX_LINES", 3)
    many = upload(api, browser, "mails", b"a@example.com\nb@example.com\nc@example.com\nd@example.com\n")
    assert many.status_code == 413 and "over 3 lines" in many.text
    binary = upload(api, browser, "mails", b"\xff\xfe\x00bin")
    assert binary.status_code == 400 and "not UTF-8" in binary.text
    http, csrf = browser
    none = http.post(
        f"{api.base}/ops/suppression/mails/upload",
        data={"csrf_token": csrf},
        headers={"Origin": api.base, "Sec-Fetch-Site": "same-origin"},
        timeout=10,
    )
    assert none.status_code == 400 and "choose a file" in none.text
    huge = upload(api, browser, "mails", b"x" * (5 * 1024 * 1024))
    assert huge.status_code == 413  # past the body's cap: refused before it is read
    assert api.get("/v1/admin/suppression-lists/mails").json()["size"] == 0
    too_many = post(api, browser, "/ops/suppression/mails/entries", {"add": "a@example.com\n" * 10_001})
    assert too_many.status_code == 400 and "upload a file" in too_many.text
    assert post(api, browser, "/ops/suppression/nope/entries", {"add": "a@example.com"}).status_code == 404


def test_an_analyst_reads_the_money_pages_and_changes_nothing(app, api, browser):
    from tests.web.people.test_users import SAME_SITE, csrf, user_client

    post(api, browser, "/ops/events/endpoints", {"id": "app", "url": "https://app.example/hooks"})
    post(api, browser, "/ops/suppression", {"id": "dnc", "field": "email", "hash": "none"})
    analyst = user_client(app, api, "ana@example.com", "analyst")
    for path in (
        "/ops/payments",
        "/ops/payments?currency=USD",
        "/ops/payments.csv",
        "/ops/payments/wallet?account=ada@example.com",
        "/ops/events",
        "/ops/events/endpoints/app",
        "/ops/suppression",
        "/ops/suppression/dnc",
    ):
        assert analyst.get(path).status_code == 200, path
    token = csrf(analyst, "/ops/events")
    for path, fields in (
        ("/ops/events/endpoints", {"id": "other", "url": "https://other.example/"}),
        ("/ops/events/endpoints/app", {"url": "https://changed.example/"}),
        ("/ops/events/endpoints/app/pause", {}),
        ("/ops/events/endpoints/app/resume", {}),
        ("/ops/events/endpoints/app/rotate", {}),
        ("/ops/suppression", {"id": "other", "field": "email", "hash": "none"}),
        ("/ops/suppression/dnc/entries", {"add": "ada@example.com"}),
        ("/ops/suppression/dnc/upload", {"file": (io.BytesIO(b"ada@example.com\n"), "l.csv")}),
    ):
        resp = analyst.post(path, data={**fields, "csrf_token": token}, headers=SAME_SITE)
        assert resp.status_code == 403, (path, resp.status_code)
    got = api.get("/v1/admin/event-endpoints/app").json()
    assert got["url"] == "https://app.example/hooks" and got["enabled"] is True
    assert [e["id"] for e in api.get("/v1/admin/event-endpoints").json()["endpoints"]] == ["app"]
    assert [x["id"] for x in api.get("/v1/admin/suppression-lists").json()["lists"]] == ["dnc"]
    assert api.get("/v1/admin/suppression-lists/dnc").json()["size"] == 0


def test_the_report_by_buyer_names_its_unsold_row_and_circuits_say_healthy(api, browser, buyer_server, worker):
    buyer_server.add("picky", mode="reject")
    key = api.put_publisher("pub-uns")
    api.put_buyer("picky", buyer_server.url("picky"), price="5.00")
    api.settle_config()
    api.post_lead(key, {"lead_id": "uns-1"})
    api.wait_settled("uns-1", "pub-uns")
    text = page(api, browser, "/ops/reports?group_by=buyer")
    assert "None" not in text
    unsold = re.search(
        r'<tr data-key="" class="unsold-row"><td[^>]*>unsold \(no buyer\)</td>\s*<td class="num">1</td>', text
    )
    assert unsold, text[text.find('id="report"') :][:1500]
    assert re.search(r'<tr data-key="picky">', text)  # its offer, in its own row
    overview = page(api, browser, "/ops")
    assert re.search(r'data-breaker="closed"[^>]*>circuit: healthy</span>', overview)
    assert ">closed<" not in overview


def test_the_payment_events_url_endpoint_is_paused_here_but_changed_only_by_configuration(api, browser):
    from webhooks.events import endpoints

    with db.connection_context():
        endpoints.sync_managed("https://pay.example/events", ())
    path = f"/ops/events/endpoints/{endpoints.MANAGED_ID}"
    text = page(api, browser, path)
    assert "PAYMENT_EVENTS_URL" in text and 'id="endpoint-edit"' not in text and "New secret" not in text
    refused = post(api, browser, path, {"url": "https://elsewhere.example/"})
    assert refused.status_code == 409 and 'id="refusal"' in refused.text
    assert "this endpoint is PAYMENT_EVENTS_URL&#39;s: change it in the configuration" in refused.text  # whole
    assert post(api, browser, f"{path}/rotate", {}).status_code == 409
    assert post(api, browser, f"{path}/pause", {}).status_code == 303
    got = api.get(f"/v1/admin/event-endpoints/{endpoints.MANAGED_ID}").json()
    assert got["enabled"] is False and got["url"] == "https://pay.example/events"
