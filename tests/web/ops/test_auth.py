"""The /ops session: the login form swaps the admin token (in its body, never an address) for a
random session id kept in Redis with an expiry (never the admin token), HttpOnly,
SameSite=Strict, Secure unless OPS_INSECURE_COOKIE=1; a browser without one is sent to the
form; a change under that cookie must come from the same origin with the session's CSRF token
(the RQ dashboard's own scripts: the origin only); the dashboard's faults are 4xx JSON; the
token never reaches gunicorn's access log."""

from __future__ import annotations

import hashlib
import uuid
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
import requests
from rq import Queue
from rq.registry import FailedJobRegistry

from testkit import ops
from testkit.servers import WebServer, wait_until
from tests.conftest import ADMIN_TOKEN
from webhooks import services
from webhooks.storage.live import keys
from webhooks.web import logins

COOKIE = "floodgate_ops"


def login(http: requests.Session, base: str, next_page: str = "/ops/rq/") -> str:
    """Log in through the form; the session cookie's value (the session keeps it too)."""
    return ops.login(http, base, ADMIN_TOKEN, next_page)


def test_login_form_opens_a_random_expiring_session(api, redis_server):
    form = api.http.get(f"{api.base}/ops/login")
    assert form.status_code == 200 and 'name="token"' in form.text and 'type="password"' in form.text
    resp = api.http.post(
        f"{api.base}/ops/login", data={"token": ADMIN_TOKEN, "next": "/ops/rq/?x=1"}, allow_redirects=False
    )
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/?x=1"
    assert resp.headers["Cache-Control"] == "no-store"
    morsel = SimpleCookie(resp.headers["Set-Cookie"])[COOKIE]
    session_id = morsel.value
    assert ADMIN_TOKEN not in resp.headers["Set-Cookie"] and len(session_id) >= 40
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/ops"
    assert int(morsel["max-age"]) == services.of(api.app).config.ops_session_ttl_s
    ttl = redis_server.client().ttl(keys.ops_session(hashlib.sha256(session_id.encode()).hexdigest()))
    assert 0 < ttl <= int(morsel["max-age"])
    page = api.http.get(api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: session_id})
    assert page.status_code == 200 and "queues" in page.json()
    # the cookie is no key to the admin API
    assert (
        api.http.get(api.base + "/v1/admin/buyers/x", headers={"Authorization": f"Bearer {session_id}"}).status_code
        == 401
    )


def test_a_browser_without_a_session_is_sent_to_the_login_form(api):
    for path in ("/ops", "/ops/buyers?cursor=abc", "/ops/rq/"):
        resp = api.http.get(api.base + path, allow_redirects=False)
        assert resp.status_code == 303, path
        location = urlsplit(resp.headers["Location"])
        assert location.path == "/ops/login" and parse_qs(location.query)["next"] == [path]
    # a wrong token in the address is not carried on to the form
    resp = api.http.get(f"{api.base}/ops?token=a-guess&x=1", allow_redirects=False)
    assert resp.status_code == 303 and "Set-Cookie" not in resp.headers
    assert "a-guess" not in resp.headers["Location"]
    assert parse_qs(urlsplit(resp.headers["Location"]).query)["next"] == ["/ops?x=1"]


def test_a_token_in_the_address_is_swapped_for_a_session_and_leaves_the_address(api):
    resp = api.http.get(f"{api.base}/ops/rq/?token={ADMIN_TOKEN}&x=1", allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/?x=1"
    assert resp.headers["Referrer-Policy"] == "no-referrer" and resp.headers["Cache-Control"] == "no-store"
    session_id = SimpleCookie(resp.headers["Set-Cookie"])[COOKIE].value
    assert ADMIN_TOKEN not in resp.headers["Set-Cookie"]
    page = api.http.get(api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: session_id})
    assert page.status_code == 200 and "queues" in page.json()
    # a wrong bearer token is the admin API's JSON 401, as is a change without a session
    wrong = api.http.get(api.base + "/ops", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert api.http.post(api.base + "/ops/buyers", data={"id": "x"}).status_code == 401


def test_a_wrong_token_is_refused_and_guessing_is_slowed(api, redis_server):
    for _ in range(logins.LOGIN_FAILURES):
        resp = api.http.post(f"{api.base}/ops/login", data={"token": "a-guess"}, allow_redirects=False)
        assert resp.status_code == 401 and "That is not the admin token." in resp.text
        assert "Set-Cookie" not in resp.headers
    resp = api.http.post(f"{api.base}/ops/login", data={"token": ADMIN_TOKEN}, allow_redirects=False)
    assert resp.status_code == 429 and "Set-Cookie" not in resp.headers  # even the right one, for a while
    redis_server.client().delete(*redis_server.client().keys("*ops:login-failures:*"))
    assert api.http.post(f"{api.base}/ops/login", data={"token": ADMIN_TOKEN}, allow_redirects=False).status_code == 303


@pytest.mark.parametrize("next_page", ["https://evil.example/", "//evil.example/ops", "/v1/admin/buyers", "/ops\\x"])
def test_the_login_goes_nowhere_but_a_console_page(api, next_page):
    resp = api.http.post(f"{api.base}/ops/login", data={"token": ADMIN_TOKEN, "next": next_page}, allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops"


def test_a_form_post_needs_the_session_csrf_token(api):
    http = api.session()
    login(http, api.base, "/ops")
    csrf = ops.form_token(http, api.base, "/ops/buyers/new")
    fields = {"id": "b1", "name": "B", "endpoint_url": "https://b.example/", "price": "1.00"}
    same = {"Origin": api.base, "Sec-Fetch-Site": "same-origin"}
    for data in (fields, {**fields, "csrf_token": ""}, {**fields, "csrf_token": "0" * 64}):
        resp = http.post(api.base + "/ops/buyers", data=data, headers=same, allow_redirects=False)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "csrf_token_invalid"
    other = api.session()
    login(other, api.base, "/ops")
    theirs = ops.form_token(other, api.base)
    resp = http.post(
        api.base + "/ops/buyers", data={**fields, "csrf_token": theirs}, headers=same, allow_redirects=False
    )
    assert resp.status_code == 403  # another session's token is no token of this one
    resp = http.post(
        api.base + "/ops/buyers",
        data={**fields, "csrf_token": csrf},
        headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        allow_redirects=False,
    )
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "cross_site_request"
    assert api.get("/v1/admin/buyers/b1").status_code == 404
    assert ops.post_form(http, api.base, "/ops/buyers", fields, csrf).status_code == 303
    assert api.get("/v1/admin/buyers/b1").status_code == 200


def test_the_admin_token_itself_is_no_session_cookie(api):
    resp = api.http.get(api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: ADMIN_TOKEN}, allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"].startswith("/ops/login")


def test_cookie_is_secure_unless_ops_insecure_cookie(api, reconfigure):
    reconfigure(ops_insecure_cookie=False)  # the default: OPS_INSECURE_COOKIE unset
    resp = api.http.post(f"{api.base}/ops/login", data={"token": ADMIN_TOKEN}, allow_redirects=False)
    assert SimpleCookie(resp.headers["Set-Cookie"])[COOKIE]["secure"]
    reconfigure(ops_insecure_cookie=True)
    resp = api.http.post(f"{api.base}/ops/login", data={"token": ADMIN_TOKEN}, allow_redirects=False)
    assert not SimpleCookie(resp.headers["Set-Cookie"])[COOKIE]["secure"]


def test_an_expired_session_or_a_new_admin_token_ends_the_session(api, redis_server, reconfigure):
    session_id = login(api.session(), api.base)

    def status() -> int:
        return api.http.get(
            api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: session_id}, allow_redirects=False
        ).status_code

    assert status() == 200
    reconfigure(admin_token="a-rotated-admin-token-0123456789")
    assert status() == 303  # to the login form
    reconfigure(admin_token=ADMIN_TOKEN)
    assert status() == 200
    key = keys.ops_session(hashlib.sha256(session_id.encode()).hexdigest())
    client = redis_server.client()
    client.pexpire(key, 1)
    wait_until(lambda: not client.exists(key), what="the session to expire")
    assert status() == 303


@pytest.mark.parametrize(
    "path, status",
    [
        ("/ops/rq/0/data/job/no-such-job.json", 404),
        ("/ops/rq/9/data/queues.json", 404),
        ("/ops/rq/0/data/jobs/floodgate/queued/many/asc/1.json", 400),
        ("/ops/rq/0/view/job/no-such-job", 404),
    ],
)
def test_dashboard_faults_are_4xx_json(api, path, status):
    resp = api.http.get(api.base + path, headers=api.admin)
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["Content-Type"] == "application/json" and resp.json()["error"]["code"]


def test_requeue_of_an_unknown_job_is_404_json(api):
    resp = api.http.post(f"{api.base}/ops/rq/job/no-such-job/requeue", headers=api.admin)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.text[:300]
    # delete answers the library's own {"status": "ERROR"}: a 200, but JSON and no traceback
    resp = api.http.post(f"{api.base}/ops/rq/job/no-such-job/delete", headers=api.admin)
    assert resp.json() == {"status": "ERROR"}


# -- against gunicorn, with the headers a browser sends ---------------------------------------


@pytest.fixture
def queue(queue_server):
    """A queue of its own holding one job, and one failed job."""
    q = Queue("ops-test-" + uuid.uuid4().hex[:8], connection=redis.Redis(port=queue_server.port))
    q.enqueue("builtins.print", "waiting")
    failed = q.enqueue("builtins.print", "failed")
    q.remove(failed)
    FailedJobRegistry(queue=q).add(failed, exc_string="boom")
    yield q
    q.empty()
    q.delete(delete_jobs=True)


def test_cross_site_changes_under_the_cookie_are_refused(web, queue):
    browser = requests.Session()
    login(browser, web.url)
    empty = f"{web.url}/ops/rq/queue/{queue.name}/queued/empty"
    for headers in (
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://evil.example"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "null"},
        {},
    ):
        resp = browser.post(empty, headers=headers, timeout=10)
        assert resp.status_code == 403, (headers, resp.text)
        assert resp.json()["error"]["code"] == "cross_site_request"
        assert queue.count == 1, headers
    # the dashboard's own pages: same origin
    own = browser.post(empty, headers={"Origin": web.url, "Sec-Fetch-Site": "same-origin"}, timeout=10)
    assert own.status_code == 200 and queue.count == 0
    queue.enqueue("builtins.print", "again")
    assert browser.post(empty, headers={"Origin": web.url}, timeout=10).status_code == 200 and queue.count == 0
    # the admin header is no cookie: no origin is needed
    queue.enqueue("builtins.print", "again")
    header = requests.post(empty, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert header.status_code == 200 and queue.count == 0


def test_requeue_all_refuses_get(web, queue):
    browser = requests.Session()
    login(browser, web.url)
    url = f"{web.url}/ops/rq/requeue/{queue.name}"
    failed = FailedJobRegistry(queue=queue)
    for resp in (
        browser.get(url, timeout=10),
        requests.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10),
    ):
        assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    assert failed.count == 1
    cross = browser.post(url, headers={"Sec-Fetch-Site": "cross-site"}, timeout=10)
    assert cross.status_code == 403 and failed.count == 1
    done = browser.post(url, headers={"Sec-Fetch-Site": "same-origin"}, timeout=10)
    assert done.status_code == 200 and done.json()["count"] == 1 and failed.count == 0


@pytest.mark.e2e  # a gunicorn of its own, with an access log
def test_token_never_reaches_the_access_log(base_env, tmp_path):
    log = tmp_path / "access.log"
    server = WebServer({**base_env, "ACCESS_LOG": str(log)}, tmp_path / "web.log", workers=1)
    try:
        browser = requests.Session()
        login(browser, server.url, "/ops/rq/0/data/queues.json")
        for path in ("/ops", "/ops/rq/", "/ops/rq/0/data/queues.json"):
            assert browser.get(f"{server.url}{path}", timeout=10).status_code == 200
        # an old bookmark with the token in it: no way in, and scrubbed from the log
        resp = requests.get(f"{server.url}/ops?token={ADMIN_TOKEN}&x=1", allow_redirects=False, timeout=10)
        assert resp.status_code == 303
        wait_until(lambda: log.exists() and log.read_text().count("/ops") >= 5, what="the access log lines")
        text = log.read_text()
        assert '"POST /ops/login HTTP/1.1" 303' in text and '"GET /ops/rq/0/data/queues.json HTTP/1.1" 200' in text
        assert ADMIN_TOKEN not in text and "token=" not in text
    finally:
        server.stop()
