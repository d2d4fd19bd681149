"""Structured logs: JSON lines carrying the request id, in the web process and in the RQ job
the request enqueued."""

from __future__ import annotations

import json
import logging
import sys

from testkit.servers import free_port, wait_until
from webhooks.logs import REQUEST_ID, JsonFormatter, RequestIdFilter


def _json_lines(path) -> list[dict]:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def test_a_record_in_a_request_is_one_json_line_with_the_request_id():
    record = logging.LogRecord("webhooks.test", logging.WARNING, __file__, 1, "sold %s to %s", ("l1", "acme"), None)
    record.buyer_id = "acme"  # as passed with extra=
    token = REQUEST_ID.set("req-123")  # what web/http.py does for each request
    try:
        RequestIdFilter().filter(record)
    finally:
        REQUEST_ID.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "sold l1 to acme" and line["level"] == "WARNING"
    assert line["request_id"] == "req-123" and line["buyer_id"] == "acme"
    assert line["logger"] == "webhooks.test" and line["ts"].endswith("+00:00")


def test_a_record_outside_requests_and_jobs_has_no_request_id():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "boom", (), None)
    RequestIdFilter().filter(record)
    try:
        raise ValueError("bad")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] is None and "ValueError: bad" in line["exc"]


def test_request_id_reaches_the_web_log_and_the_settlement_job_log(web_api, web, worker):
    api = web_api
    key = api.put_publisher("pub")
    api.put_buyer("gone", f"http://127.0.0.1:{free_port()}/gone")  # refused: logged by the outbound client
    api.settle_config()
    resp = api.http.post(
        f"{api.base}/v1/leads",
        json={"lead_id": "traced"},
        headers={"Authorization": f"Bearer {key}", "X-Request-Id": "trace-7f3a"},
    )
    assert resp.headers["X-Request-Id"] == "trace-7f3a"
    assert resp.json()["attempts"][0]["outcome"] == "error"

    def logged(path, logger):
        return [
            line for line in _json_lines(path) if line.get("request_id") == "trace-7f3a" and line["logger"] == logger
        ]

    web_lines = wait_until(lambda: logged(web.log, "webhooks.outbound"), what="the web log line")
    assert "call to http://127.0.0.1" in web_lines[0]["message"]
    job_lines = wait_until(lambda: logged(worker.log, "workers.settle"), what="the job's log line")
    assert job_lines[0]["message"] == "draining settlements" and job_lines[0]["job_id"]
