"""Delivery of a lead to a buyer, and the outcome of docs/api.md. The call itself goes through
the one outbound path (webhooks/outbound.py): a hard total deadline, a capped reply, no
denied address."""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

from webhooks.leads.posting.integration import DEFAULT_POST, PostTemplate
from webhooks.outbound import MAX_HEAD_BYTES, MAX_REPLY_BYTES, Client, Failure
from webhooks.storage.states import AttemptOutcome
from webhooks.targets import DenyList

log = logging.getLogger(__name__)

__all__ = ["MAX_HEAD_BYTES", "MAX_REPLY_BYTES", "Deliverer", "classify", "judge"]

USER_AGENT = "Floodgate/1"
ACCEPTED, REJECTED, ERROR, TIMEOUT = (
    AttemptOutcome.ACCEPTED,
    AttemptOutcome.REJECTED,
    AttemptOutcome.ERROR,
    AttemptOutcome.TIMEOUT,
)
CIRCUIT_OPEN = AttemptOutcome.CIRCUIT_OPEN
# An attempt whose answer was lost with a dead process and that the buyer did not confirm
# when offered the lead again (docs/api.md): the lead is unsold and flagged for review.
UNKNOWN = AttemptOutcome.UNKNOWN
# Floodgate could not build or send the request (a header http.client refuses, a template over
# its budget): the lead's problem, never the buyer's. Not an attempt: the buyer is skipped
# with this reason and its breaker is left alone.
NOT_SENT = AttemptOutcome.NOT_SENT
TEST_HEADER = "X-Floodgate-Test"  # on the pings of a test lead (never posted), and on a test post from /ops
_OUTCOME = {Failure.TIMEOUT: TIMEOUT, Failure.ERROR: ERROR, Failure.NOT_SENT: NOT_SENT}


def classify(status: int, content: bytes) -> AttemptOutcome:
    if 200 <= status < 300:
        try:
            body = json.loads(content)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return ERROR  # a non-JSON 2xx (or one nested past Python's stack) is an unreadable reply
        return ACCEPTED if isinstance(body, dict) and body.get("accepted") is True else REJECTED
    if 400 <= status < 500:
        return REJECTED
    return ERROR


class Posted(NamedTuple):
    """How a post ended: its outcome, its duration, and whether the buyer replied at all."""

    outcome: AttemptOutcome
    ms: int
    replied: bool


class Deliverer:
    """Buyer posts and pings over the outbound client (keep-alive connections per buyer host,
    shared by every greenlet of a process). It follows no redirect and does not retry a POST
    whose request may have been sent."""

    def __init__(self, timeout_ms: int, pool_size: int = 100, deny: DenyList | None = None):
        self.timeout_s = timeout_ms / 1000
        self.client = Client(deny, pool_size)

    def request(
        self, method: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes, AttemptOutcome | None, int]:
        """Send one request under a hard total deadline: (status, reply, failure, elapsed ms),
        failure being ERROR or TIMEOUT when no full reply came (status 0 then), or NOT_SENT
        when the request could not be built. A reply longer than MAX_REPLY_BYTES is cut there
        and judged by its status (an accept rule sees its start). Never raises for the other
        side's faults."""
        reply = self.client.request(method, url, body=body, headers=headers, deadline_s=timeout_s)
        if reply.failure is not None:
            return 0, b"", _OUTCOME[reply.failure], reply.ms
        return reply.status, reply.body, None, reply.ms

    def deliver(
        self, url: str, body: bytes, idempotency_key: str, template: PostTemplate = DEFAULT_POST
    ) -> tuple[AttemptOutcome, int]:
        """Post `body` to `url` as `template` says; return (outcome, elapsed ms)."""
        posted = self.post(url, body, idempotency_key, template)
        return posted.outcome, posted.ms

    def post(self, url: str, body: bytes, idempotency_key: str, template: PostTemplate = DEFAULT_POST) -> Posted:
        """`deliver`, saying too whether the buyer sent a whole reply (its breaker tells a
        failed reply, which may be about the lead, from a failed connection, which is not)."""
        status, content, failure, ms = self._post(url, body, idempotency_key, template, extra={})
        if failure is not None:
            return Posted(failure, ms, replied=False)
        return Posted(verdict(status, content, template), ms, replied=True)

    def test_post(
        self, url: str, body: bytes, idempotency_key: str, template: PostTemplate
    ) -> tuple[int, bytes, AttemptOutcome, int]:
        """The post of a test lead (`X-Floodgate-Test: 1`), sent by an operator to check a
        buyer's endpoint: (status, reply, outcome, ms), status 0 when no whole reply came."""
        status, content, failure, ms = self._post(url, body, idempotency_key, template, extra={TEST_HEADER: "1"})
        return status, content, failure or verdict(status, content, template), ms

    def _post(
        self, url: str, body: bytes, idempotency_key: str, template: PostTemplate, *, extra: dict[str, str]
    ) -> tuple[int, bytes, AttemptOutcome | None, int]:
        headers = {
            "Content-Type": template.content_type,
            "Content-Length": str(len(body)),
            "Idempotency-Key": idempotency_key,
            "User-Agent": USER_AGENT,
            **dict(template.headers),
            **extra,
        }
        return self.request(template.method, url, body, headers, self.timeout_s)

    def ping(
        self, url: str, body: bytes, timeout_s: float, test: bool = False
    ) -> tuple[int, bytes, AttemptOutcome | None, int]:
        """POST a ping's JSON `body`; (status, reply, failure, ms) as `request`. The ping of a
        test lead carries `X-Floodgate-Test: 1`: the buyer may bid, and will not be posted to."""
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "User-Agent": USER_AGENT}
        if test:
            headers[TEST_HEADER] = "1"
        return self.request("POST", url, body, headers, timeout_s)


def verdict(status: int, content: bytes, template: PostTemplate) -> AttemptOutcome:
    """The outcome of a whole reply: the default contract's, or the buyer's own accept rule's."""
    return classify(status, content) if template is DEFAULT_POST else judge(status, content, template)


def judge(status: int, content: bytes, template: PostTemplate) -> AttemptOutcome:
    """The outcome of a reply under a buyer's own accept rule."""
    if 200 <= status < 300:
        verdict = template.accepted(content)
        return ERROR if verdict is None else ACCEPTED if verdict else REJECTED
    return REJECTED if 400 <= status < 500 else ERROR
