"""Consent evidence at intake (docs/api.md "Consent, suppression and pre-ping"; docs/leads.md
"Consent certificates"; the provider's API: docs/leads.md "TrustedForm's certificate API").

A publisher's field spec may declare a field of type `trustedform_cert` (a TrustedForm
certificate URL) or `jornaya_leadid` (a Jornaya LeadiD token); a buyer's `require_consent`
names what it must have before it is offered a lead:
- `trustedform`: the certificate claimed by Floodgate through TrustedForm's Certificate API
  v4.0 ("retain" with "match_lead"): POST TRUSTEDFORM_API_BASE/<cert id>, HTTP Basic with the
  user `API` and TRUSTEDFORM_API_KEY, `api-version: 4.0`; claimed means 200 with outcome
  `success`. Once per lead (the outcome is remembered with the lead's id), under its own
  deadline (TRUSTEDFORM_TIMEOUT_MS) and the lead's, started as soon as the lead is routed and
  waited for only by a buyer that requires it.
- `jornaya`: a well-formed LeadiD token (Floodgate has no Jornaya API to ask).

The certificate's URL is the publisher's; the key is only ever sent to TRUSTEDFORM_API_BASE,
with the certificate id taken from a URL whose host is exactly cert.trustedform.com."""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import gevent
from gevent import monkey

from webhooks import outbound
from webhooks.errors import ValidationError
from webhooks.storage.live import keys
from webhooks.storage.live.redis import REDIS_DOWN, Store

log = logging.getLogger(__name__)

TRUSTEDFORM, JORNAYA = "trustedform", "jornaya"
KINDS = (TRUSTEDFORM, JORNAYA)
CERT_FIELD, LEADID_FIELD = "trustedform_cert", "jornaya_leadid"  # the field spec's types
CERT_HOST = "cert.trustedform.com"
_WEB_ID = re.compile(r"[0-9a-fA-F]{40}")  # fullmatch everywhere: `$` would pass a trailing newline
_MOBILE_ID = re.compile(r"[A-Za-z0-9_-]{80}")
_META_ID = re.compile(r"0\.[A-Za-z0-9_.-]{1,253}")
_LEADID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
MAX_URL = 300

# A claim's outcome, as the lead keeps it (`consent`) and its trace shows it
CLAIMED = "claimed"  # 200, outcome success
REFUSED = "refused"  # TrustedForm said no: outcome failure, or a 4xx of the certificate (unknown, expired)
FAILED = "failed"  # no usable answer: a 5xx, a broken reply, no connection, our key or account refused
LATE = "late"  # no answer within the deadline
MISSING = "missing"  # the lead has no certificate (or the field spec declares none)
NOT_AWAITED = "not_awaited"  # the lead was sold before a buyer needed the claim (it runs on, remembered)
NOT_CONFIGURED = "not_configured"  # no TRUSTEDFORM_API_KEY
ANSWERED = (CLAIMED, REFUSED)  # remembered for the lead: a retry of it does not claim again
REMEMBER_S = 86_400


def parse_required(code: str, raw: Any) -> list[str]:
    """A buyer's `require_consent`: a list of "trustedform" and "jornaya"."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(x, str) and x in KINDS for x in raw):
        raise ValidationError(code, "require_consent", 'must be a list of "trustedform" and "jornaya"')
    return sorted(set(raw))


def cert_url(value: Any) -> str:
    """A TrustedForm certificate URL as the lead keeps it (https, the host lower-cased, a web
    certificate's id lower-cased); ValueError for anything else (another host included)."""
    if not isinstance(value, str) or len(value) > MAX_URL:
        raise ValueError("must be a TrustedForm certificate URL")
    parts = urlsplit(value.strip())
    host = (parts.hostname or "").lower()
    cert = parts.path[1:].rstrip("/")
    if (
        parts.scheme.lower() not in ("https", "http")
        or host != CERT_HOST
        or parts.port is not None
        or parts.username is not None
        or parts.query
        or parts.fragment
        or not (_WEB_ID.fullmatch(cert) or _MOBILE_ID.fullmatch(cert) or _META_ID.fullmatch(cert))
    ):
        raise ValueError(f"must be a TrustedForm certificate URL (https://{CERT_HOST}/<certificate id>)")
    return f"https://{CERT_HOST}/" + (cert.lower() if _WEB_ID.fullmatch(cert) else cert)


def leadid(value: Any) -> str:
    """A Jornaya LeadiD token (36 hex characters with hyphens, 8-4-4-4-12), upper-cased."""
    if not isinstance(value, str) or not _LEADID.fullmatch(value.strip()):
        raise ValueError("must be a LeadiD token (XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX)")
    return value.strip().upper()


def cert_id(url: str) -> str:
    """The certificate id of a URL `cert_url` made."""
    return url.rsplit("/", 1)[1]


@dataclass(frozen=True, kw_only=True)
class Fields:
    """Which fields of a publisher's leads carry consent evidence (from its field spec)."""

    cert: str | None = None
    leadid: str | None = None

    def cert_of(self, lead: dict[str, Any]) -> str | None:
        """The lead's certificate URL (normalised by the field spec), if it carries one."""
        value = lead.get(self.cert) if self.cert else None
        return value if isinstance(value, str) else None

    def has_leadid(self, lead: dict[str, Any]) -> bool:
        return bool(self.leadid and isinstance(lead.get(self.leadid), str))


@dataclass(frozen=True, kw_only=True)
class TrustedForm:
    """The claim client of one process (TRUSTEDFORM_API_BASE, _API_KEY, _TIMEOUT_MS)."""

    api_base: str
    api_key: str
    timeout_ms: int
    client: outbound.Client = field(default_factory=outbound.Client)

    def claim(self, url: str, lead: dict[str, Any], reference: str, deadline_s: float) -> dict[str, Any]:
        """Claim (retain) the certificate at `url` for `lead`: the outcome as the lead keeps it."""
        started = time.perf_counter()
        record: dict[str, Any] = {"kind": TRUSTEDFORM, "cert_id": cert_id(url)}
        if not self.api_key:
            return {**record, "outcome": NOT_CONFIGURED, "ms": 0}
        match = match_fields(lead)
        if not match:  # retain needs match_lead, with an e-mail or a phone: nothing to claim with
            return {**record, "outcome": MISSING, "reason": "no email or phone to match", "ms": 0}
        body = json.dumps({"match_lead": match, "retain": {"reference": reference, "vendor": "Floodgate"}})
        token = base64.b64encode(f"API:{self.api_key}".encode()).decode()
        reply = self.client.request(
            "POST",
            f"{self.api_base.rstrip('/')}/{record['cert_id']}",
            body=body.encode(),
            headers={
                "Authorization": f"Basic {token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
                "api-version": "4.0",
            },
            deadline_s=max(0.001, min(self.timeout_ms / 1000, deadline_s)),
        )
        record["ms"] = int((time.perf_counter() - started) * 1000)
        return {**record, **_judged(reply)}


def match_fields(lead: dict[str, Any]) -> dict[str, str]:
    """The lead's e-mail and phone as match_lead takes them: a US number in E.164 as its ten
    digits (the API's examples; it strips only spaces, hyphens and brackets itself)."""
    out = {k: lead[k] for k in ("email", "phone") if isinstance(lead.get(k), str) and lead[k]}
    phone = out.get("phone", "")
    if phone.startswith("+1") and len(phone) == 12 and phone[1:].isdigit():
        out["phone"] = phone[2:]
    return out


# 4xx that speak of the certificate (404 expired or not found, 405 a sandboxed certificate,
# 422): the claim is refused for good. The others (400 our request, 401 a wrong key, 402 an
# account inactive or out of funds, 403 an operation not contracted, 429) are ours to fix:
# failed, and not remembered, so the lead's retry claims again.
_CERT_REFUSALS = (404, 405, 422)


def _judged(reply: outbound.Reply) -> dict[str, Any]:
    """What a reply of the certificate API says of the claim."""
    if reply.failure is outbound.Failure.TIMEOUT:
        return {"outcome": LATE}
    if reply.failure is not None or reply.status >= 500 or reply.truncated:
        return {"outcome": FAILED, "status": reply.status or None}
    try:
        answer = json.loads(reply.body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return {"outcome": FAILED, "status": reply.status}
    reason = answer.get("reason") if isinstance(answer.get("reason"), str) else None
    if reply.status == 200 and answer.get("outcome") == "success":
        results = (answer.get("retain") or {}).get("results") or {}
        kept = {k: results[k] for k in ("expires_at", "previously_retained") if k in results}
        return {"outcome": CLAIMED, "status": 200, **kept}
    outcome = REFUSED if reply.status == 200 or reply.status in _CERT_REFUSALS else FAILED
    return {"outcome": outcome, "status": reply.status, "reason": (reason or "")[:200] or None}


class Pending:
    """A claim running beside the lead's routing: `result` waits for it at most until its
    deadline (a buyer requiring it waits; nothing else does)."""

    def __init__(self, run: Callable[[], dict[str, Any]], deadline: float) -> None:
        self.deadline = deadline
        self._value: dict[str, Any] | None = None
        if monkey.is_module_patched("socket"):
            self._job: Any = gevent.spawn(self._run, run)
        else:  # in-process tests and the CLI: a thread
            self._job = threading.Thread(target=self._run, args=(run,), daemon=True)
            self._job.start()

    def _run(self, run: Callable[[], dict[str, Any]]) -> None:
        try:
            self._value = run()
        except Exception:  # a bug, not the provider: the lead goes on without the claim
            log.exception("consent claim failed")
            self._value = {"kind": TRUSTEDFORM, "outcome": FAILED}

    def result(self) -> dict[str, Any]:
        self._job.join(max(0.0, self.deadline - time.monotonic()))
        return self._value if self._value is not None else {"kind": TRUSTEDFORM, "outcome": LATE}

    def peek(self) -> dict[str, Any] | None:
        """The outcome if the claim has ended, without waiting."""
        return self._value


@dataclass
class Check:
    """A lead's consent as its routing sees it: the claim (started when a buyer that may be
    offered the lead requires it) and what the lead carries."""

    claim: Pending | dict[str, Any] | None = None
    has_leadid: bool = False
    _claim_seen: dict[str, Any] | None = None

    def allows(self, required: tuple[str, ...]) -> bool:
        """Whether a buyer requiring `required` may be offered the lead."""
        if JORNAYA in required and not self.has_leadid:
            return False
        if TRUSTEDFORM in required:
            return self.claimed().get("outcome") == CLAIMED
        return True

    def claimed(self) -> dict[str, Any]:
        if self._claim_seen is None:
            claim = self.claim
            if claim is None:
                self._claim_seen = {"kind": TRUSTEDFORM, "outcome": MISSING}
            elif isinstance(claim, Pending):
                self._claim_seen = claim.result()
            else:
                self._claim_seen = claim
        return self._claim_seen

    def records(self) -> list[dict[str, Any]]:
        """What the lead keeps of its consent: the claim, when one was made or looked for. Never
        waits: a claim no buyer waited for and still running is recorded as not awaited."""
        if self._claim_seen is not None:
            return [self._claim_seen]
        claim = self.claim
        if claim is None:
            return []
        if isinstance(claim, Pending):
            ended = claim.peek()
            return [ended if ended is not None else {"kind": TRUSTEDFORM, "outcome": NOT_AWAITED}]
        return [claim]


def possible(required: tuple[str, ...], fields: Fields, lead: dict[str, Any], claims_made: bool) -> bool:
    """Whether a lead could meet `required` without a claim being made (a test lead, a
    pre-ping): it carries a LeadiD token for `jornaya`, and for `trustedform` a certificate and
    an e-mail or phone to match it with, while claims can be made (`claims_made`)."""
    if JORNAYA in required and not fields.has_leadid(lead):
        return False
    if TRUSTEDFORM in required:
        return claims_made and fields.cert_of(lead) is not None and bool(match_fields(lead))
    return True


def start(
    store: Store,
    trustedform: TrustedForm,
    *,
    fields: Fields,
    required: set[str],
    lead: dict[str, Any],
    publisher_id: str,
    lead_id: str,
    deadline: float,
) -> Check:
    """The consent check of a lead some of whose buyers require `required`: the claim started
    (or its remembered outcome, one Redis read) when a buyer requires TrustedForm."""
    check = Check(has_leadid=fields.has_leadid(lead))
    if TRUSTEDFORM not in required:
        return check
    url = fields.cert_of(lead)
    if url is None:
        check.claim = {"kind": TRUSTEDFORM, "outcome": MISSING}
        return check
    key = keys.consent_claim(publisher_id, lead_id)
    try:
        known = store.redis.get(key)
    except REDIS_DOWN:
        known = None
    if known:
        check.claim = json.loads(known)
        return check
    own_deadline = min(deadline, time.monotonic() + trustedform.timeout_ms / 1000)

    def run() -> dict[str, Any]:
        record = trustedform.claim(url, lead, f"{publisher_id}:{lead_id}", own_deadline - time.monotonic())
        if record["outcome"] in ANSWERED:
            try:
                store.redis.set(key, json.dumps(record), ex=REMEMBER_S)
            except REDIS_DOWN:
                pass  # a retry of the lead claims again: TrustedForm answers previously_retained
        return record

    check.claim = Pending(run, own_deadline + 0.05)
    return check
