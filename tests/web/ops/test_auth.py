"""The /ops session: `?token=` swapped for a random session id kept in Redis with an expiry
(never the admin token), HttpOnly, SameSite=Strict, Secure unless OPS_INSECURE_COOKIE=1; a
change under that cookie must come from the same origin; the dashboard's faults are 4xx JSON;
the token never reaches gunicorn's access log."""

from __future__ import annotations

import hashlib
import uuid
from http.cookies import SimpleCookie

import pytest
import redis
import requests
from rq import Queue
from rq.registry import FailedJobRegistry

from testkit.servers import WebServer, wait_until
from tests.conftest import ADMIN_TOKEN
from webhooks import services
from webhooks.storage import keys

COOKIE = "floodgate_ops"


def login(http: requests.Session, base: str, path: str = "/ops/rq/") -> str:
    """Open `path?token=`: the session cookie's value (the session keeps it too)."""
    resp = http.get(f"{base}{path}?token={ADMIN_TOKEN}", allow_redirects=False, timeout=10)
    assert resp.status_code == 303, resp.text
    return SimpleCookie(resp.headers["Set-Cookie"])[COOKIE].value


def test_token_is_swapped_for_a_random_expiring_session_id(api, redis_server):
    resp = api.http.get(f"{api.base}/ops/rq/?token={ADMIN_TOKEN}&x=1", allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"] == "/ops/rq/?x=1"
    assert resp.headers["Referrer-Policy"] == "no-referrer" and resp.headers["Cache-Control"] == "no-store"
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


def test_the_admin_token_itself_is_no_session_cookie(api):
    resp = api.http.get(api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: ADMIN_TOKEN})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"


def test_cookie_is_secure_unless_ops_insecure_cookie(api, reconfigure):
    reconfigure(ops_insecure_cookie=False)  # the default: OPS_INSECURE_COOKIE unset
    resp = api.http.get(f"{api.base}/ops?token={ADMIN_TOKEN}", allow_redirects=False)
    assert SimpleCookie(resp.headers["Set-Cookie"])[COOKIE]["secure"]
    reconfigure(ops_insecure_cookie=True)
    resp = api.http.get(f"{api.base}/ops?token={ADMIN_TOKEN}", allow_redirects=False)
    assert not SimpleCookie(resp.headers["Set-Cookie"])[COOKIE]["secure"]


def test_an_expired_session_or_a_new_admin_token_ends_the_session(api, redis_server, reconfigure):
    session_id = login(api.http, api.base)

    def status() -> int:
        return api.http.get(api.base + "/ops/rq/0/data/queues.json", cookies={COOKIE: session_id}).status_code

    assert status() == 200
    reconfigure(admin_token="a-rotated-admin-token-0123456789")
    assert status() == 401
    reconfigure(admin_token=ADMIN_TOKEN)
    assert status() == 200
    key = keys.ops_session(hashlib.sha256(session_id.encode()).hexdigest())
    client = redis_server.client()
    client.pexpire(key, 1)
    wait_until(lambda: not client.exists(key), what="the session to expire")
    assert status() == 401


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
        for path in ("/ops", "/ops/rq/", "/ops/rq/0/data/queues.json"):
            resp = requests.get(f"{server.url}{path}?token={ADMIN_TOKEN}&x=1", allow_redirects=False, timeout=10)
            assert resp.status_code == 303
        wait_until(lambda: log.exists() and log.read_text().count("/ops") >= 3, what="the access log lines")
        text = log.read_text()
        assert '"GET /ops/rq/0/data/queues.json HTTP/1.1" 303' in text, text
        assert ADMIN_TOKEN not in text and "token=" not in text
    finally:
        server.stop()
