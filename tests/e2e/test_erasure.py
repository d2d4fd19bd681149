"""DELETE .../personal-data under gunicorn with two web workers and a Redis that keeps an AOF:
after the answer, no file in Redis' directory holds the erased leads' e-mail or phone, and no
worker's journal does either (a Redis loss while the ledger cannot be asked makes every
journal push all it holds again: the erased leads come back with empty bodies)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from testkit.servers import BuyerServer, Proc, RedisServer, WebServer, post_lead_until_answered, venv_bin, wait_until
from tests.conftest import Api
from webhooks.storage.live import keys
from webhooks.storage.live.settle_queue import SETTLE
from webhooks.storage.records.db import db

pytestmark = pytest.mark.e2e  # gunicorn, an RQ worker and a redis-server of its own

ROUND = 8  # leads posted at once


def consumer(i: int) -> dict[str, str]:
    return {"email": f"erase.me.{i:02d}@example.com", "phone": f"+1512555{i:04d}"}


@dataclass
class Stack:
    redis: RedisServer
    web: WebServer
    worker: Proc
    api: Api


@pytest.fixture
def stack(base_env: dict, tmp_path: Path, buyer_server: BuyerServer) -> Iterator[Stack]:
    """Two web workers, an RQ worker and a redis-server keeping an AOF (its snapshots
    uncompressed, so that a value they hold can be found in them)."""
    redis_server = RedisServer(tmp_path / "redis", appendonly=True, args=("--rdbcompression", "no"))
    redis_server.start()
    env = {
        **base_env,
        "REDIS_URL": redis_server.url,
        "RQ_REDIS_URL": redis_server.url,
        "JOURNAL_KEEP_S": "600",  # nothing leaves a journal while the test runs
        "ERASURE_WAIT_S": "60",
    }
    worker = Proc(
        [venv_bin("rq"), "worker", "--url", redis_server.url, "-w", "rq.worker.SimpleWorker", SETTLE],
        env,
        tmp_path / "worker.log",
    )
    web = WebServer(env, tmp_path / "web.log", workers=2)
    api = Api(web.url)
    try:
        yield Stack(redis_server, web, worker, api)
    finally:
        api.http.close()
        web.stop()
        worker.stop()
        redis_server.kill()


def redis_files_holding(directory: Path, needle: str) -> list[str]:
    files = (f for f in directory.rglob("*") if f.is_file())
    return sorted(f.name for f in files if needle.encode() in f.read_bytes())


@pytest.fixture
def ledger_unreadable() -> Iterator[Callable[[], None]]:
    """`ledger_unreadable()` renames the `leads` table away for the rest of the test: a journal
    asking what the ledger holds fails, and pushes every entry again."""
    renamed: list[bool] = []

    def away() -> None:
        db.execute_sql("ALTER TABLE leads RENAME TO leads_away")
        renamed.append(True)

    yield away
    if renamed:
        db.execute_sql("ALTER TABLE leads_away RENAME TO leads")


def test_erasure_leaves_no_trace_in_any_web_worker_or_in_redis_files(stack, buyer_server, ledger_unreadable):
    api = stack.api
    buyer_server.add("acme")
    key = api.put_publisher("surge")
    api.put_buyer("acme", buyer_server.url("acme"))
    api.settle_config()

    answers: dict[int, dict] = {}

    def post(i: int) -> None:
        session = api.session()
        answers[i] = post_lead_until_answered(session, api.base, key, {"lead_id": f"E{i:02d}", **consumer(i)})
        session.close()

    def both_workers_journaled() -> bool:
        """Post a round of leads at once, from sessions of their own; whether each worker's
        journal holds some by now (each says so in the erasure feed once its watcher runs)."""
        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(answers), len(answers) + ROUND)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return stack.redis.client().hlen(keys.ERASURES_SEEN) == 2

    wait_until(both_workers_journaled, timeout=120, interval=0, what="leads journaled by both web workers")
    leads = len(answers)
    erased = range(0, leads, 2)  # every other lead
    assert all(answers[i]["status"] == "sold" for i in range(leads)), answers
    for i in range(leads):
        api.wait_settled(f"E{i:02d}", "surge")
    directory = stack.redis.dir
    for i in erased:  # the settlement list's AOF records hold them until the rewrite
        assert redis_files_holding(directory, consumer(i)["email"]), i

    before = datetime.now(timezone.utc)
    for i in erased:
        resp = api.http.delete(f"{api.base}/v1/admin/leads/E{i:02d}/personal-data", headers=api.admin)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert (body["personal_data"], body["web_processes"], body["redis_files"]) == (
            "erased",
            "forgotten",
            "rewritten",
        )
        assert datetime.fromisoformat(body["redis_rewritten_at"]) >= before
    for i in erased:
        for value in consumer(i).values():
            assert redis_files_holding(directory, value) == [], (i, value)

    # Every journal pushes again all it holds: Redis loses its data while the ledger cannot be
    # asked. No worker drains the list meanwhile, so it shows what each journal held.
    stack.worker.stop()
    ledger_unreadable()
    client = stack.redis.client()
    client.flushall()

    def every_lead_pushed_again() -> dict[str, str] | None:
        # by lead: a journal whose push failed part-way pushes all it holds again on its next
        # check, so one busy worker's leads can be in the list twice before the other's once
        items = [json.loads(raw) for raw in client.lrange(keys.SETTLE_PENDING, 0, -1)]
        held = {item["lead_id"]: item["payload"] for item in items}
        return held if len(held) >= leads else None

    bodies = wait_until(every_lead_pushed_again, timeout=30, what="every journal's settlements pushed again")
    assert sorted(bodies) == [f"E{i:02d}" for i in range(leads)]
    for i in range(leads):
        held = bodies[f"E{i:02d}"]
        if i in erased:
            assert held == "", (i, held)
        else:
            assert consumer(i)["email"] in held, (i, held)
