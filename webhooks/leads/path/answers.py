"""The answer a lead's claim remembers for its publisher's replays, small: a remembered lead_id
costs Redis at most 200 bytes (docs/api.md "Data kept per lead is bounded") for LEAD_REPLAY_TTL_S.

`remember` writes an answer as `~<status>|<buyer>|<price>|<attempts>`: the lead_id is in the
key, outcomes are one letter, ids need no quoting (they match [A-Za-z0-9._-]). A shared lead's
buyers and prices are listed with commas (`b1,b2|12.00,9.50`): its `sales` in order, the first
its `buyer_id` and `price` (at most MAX_SALES: about 75 bytes more a further sale). Attempts that
do not fit MAX_INLINE are left to the ledger (`*<count>`), read again on a replay (`recall`).
Answers remembered as JSON before this form still replay as they are."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

COMPACT = "~"
# The 503 of a lead whose answer only the ledger could give, when it cannot be asked
LEDGER_UNREACHABLE_AFTER_LOSS = "the lead ledger is unreachable and Redis lost its replay memory lately; retry shortly"
MAX_INLINE = 64  # bytes of the remembered form; past it the attempts are the ledger's
_STATUS = {"s": ("sold", False), "u": ("unsold", False), "ts": ("sold", True), "tu": ("unsold", True)}
_STATUS_CODE = {v: k for k, v in _STATUS.items()}
_OUTCOME = {"a": "accepted", "r": "rejected", "t": "timeout", "e": "error", "c": "circuit_open", "u": "unknown"}
_OUTCOME_CODE = {v: k for k, v in _OUTCOME.items()}


class AttemptsPending(Exception):
    """The remembered answer's attempts are the ledger's, and it does not hold the lead yet."""


def _attempt(a: dict[str, Any]) -> str:
    code = f"{a['buyer_id']}:{_OUTCOME_CODE[a['outcome']]}:{a['ms']}"
    return code + f":{a['bid']}" if a.get("bid") is not None else code


def remember(answer: dict[str, Any]) -> str:
    """The form a lead's claim keeps of `answer` (as settlement.answer_of made it)."""
    sales = answer.get("sales") or ()
    buyers = ",".join(s["buyer_id"] for s in sales) if len(sales) > 1 else answer["buyer_id"] or ""
    prices = ",".join(s["price"] for s in sales) if len(sales) > 1 else answer["price"] or ""
    head = f"{COMPACT}{_STATUS_CODE[(answer['status'], bool(answer.get('test')))]}|{buyers}|{prices}|"
    known = all(a["outcome"] in _OUTCOME_CODE for a in answer["attempts"])
    attempts = ";".join(_attempt(a) for a in answer["attempts"]) if known else "*"
    if not answer["attempts"] or (known and len(head) + len(attempts) <= MAX_INLINE):
        return head + attempts
    return f"{head}*{len(answer['attempts'])}"


def recall(held: str, lead_id: str, attempts_of: Callable[[], list[dict[str, Any]] | None]) -> dict[str, Any]:
    """The answer `held` remembers for `lead_id`. `attempts_of` reads the lead's attempts from
    the ledger when they were left to it (None: not settled yet, AttemptsPending)."""
    if not held.startswith(COMPACT):
        remembered: dict[str, Any] = json.loads(held)  # remembered before the compact form
        return remembered
    status_code, buyers, prices, attempts = held[1:].split("|", 3)
    status, test = _STATUS[status_code]
    sold = list(zip(buyers.split(","), prices.split(","))) if buyers else []
    answer: dict[str, Any] = {
        "lead_id": lead_id,
        "status": status,
        "buyer_id": sold[0][0] if sold else None,
        "price": (sold[0][1] or None) if sold else prices or None,
    }
    if attempts.startswith("*"):
        found = attempts_of()
        if found is None:
            raise AttemptsPending(lead_id)
        answer["attempts"] = found
    else:
        answer["attempts"] = [_recalled(a) for a in attempts.split(";")] if attempts else []
    if status == "sold" and not test:
        answer["sales"] = [{"buyer_id": b, "price": p} for b, p in sold]
    if test:
        answer["test"] = True
    return answer


def _recalled(code: str) -> dict[str, Any]:
    buyer_id, outcome, ms, *bid = code.split(":")
    attempt: dict[str, Any] = {"buyer_id": buyer_id, "outcome": _OUTCOME[outcome], "ms": int(ms)}
    if bid:
        attempt["bid"] = bid[0]
    return attempt
