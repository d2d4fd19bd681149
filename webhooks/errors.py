"""Every error Floodgate raises on purpose, each mapped to the JSON error shape of docs/api.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")


class FloodgateError(Exception):
    """Base class: `status` and `code` are what the HTTP layer answers."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str = "", *, status: int | None = None, code: str | None = None):
        super().__init__(message or self.code)
        self.message = message or self.code.replace("_", " ")
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class ConfigError(FloodgateError):
    code = "config_error"


class BadRequest(FloodgateError):
    status = 400
    code = "bad_request"


class InvalidJSON(BadRequest):
    """A body the strict JSON rules refuse (webhooks/formats/strictjson.py)."""

    code = "invalid_json"


class MalformedJSON(InvalidJSON):
    """A body that is not JSON at all (a syntax error), as opposed to JSON the strict rules
    refuse; the payment webhook answers it as docs/api.md's "body not parseable"."""


class ValidationError(BadRequest):
    """Bad field in a request body; `code` names the resource (invalid_buyer, invalid_lead...)."""

    def __init__(self, code: str, field: str, problem: str):
        super().__init__(f"{field}: {problem}", code=code)
        self.field = field
        self.problem = problem


class ValidationErrors(ValidationError):
    """Every bad field of one body. It answers as its first (the API's error shape names one
    field); `errors` holds them all, for a console form that shows each beside its field."""

    def __init__(self, errors: Sequence[ValidationError]):
        first = errors[0]
        super().__init__(first.code, first.field, first.problem)
        self.errors = tuple(errors)


class Checks:
    """A body's checks run one after another, every refusal kept: `run` answers a check's value,
    or `default` (of the check's type) when it refused; `done` then raises them all at once."""

    def __init__(self) -> None:
        self.errors: list[ValidationError] = []

    def run(self, default: Any, check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return check(*args, **kwargs)
        except ValidationErrors as exc:
            self.errors.extend(exc.errors)
        except ValidationError as exc:
            self.errors.append(exc)
        return cast(T, default)

    def require(self, code: str, body: dict[str, Any], names: Sequence[str]) -> None:
        """Each of `names` missing from `body` refused as required."""
        self.errors.extend(ValidationError(code, name, "is required") for name in names if name not in body)

    def done(self) -> None:
        if self.errors:
            raise ValidationErrors(self.errors)


class InvalidLead(BadRequest):
    """A lead that breaks its publisher's field spec: `fields` names each failing field and why
    (docs/api.md: `error.fields`)."""

    code = "invalid_lead"

    def __init__(self, message: str, *, fields: dict[str, str]):
        super().__init__(message)
        self.fields = fields


class InvalidPayload(BadRequest):
    """A verified payment delivery without a usable event, reference, amount or payer."""

    code = "invalid_payload"


class Unauthorized(FloodgateError):
    status = 401
    code = "unauthorized"


class InvalidSignature(Unauthorized):
    code = "invalid_signature"


class Forbidden(FloodgateError):
    status = 403
    code = "forbidden"


class NotFound(FloodgateError):
    status = 404
    code = "not_found"


class Conflict(FloodgateError):
    status = 409
    code = "conflict"


class AlreadyAssigned(Conflict):
    """An assign of a payment that is not (or no longer) unattributed."""

    code = "already_assigned"


class ReferenceConflict(FloodgateError):
    """A known payment reference delivered with another amount, currency or payer."""

    status = 422
    code = "reference_conflict"


class NotConfirmed(FloodgateError):
    """A verified delivery whose payment the provider's own API does not confirm (status,
    amount, currency, reference or payer differ): nothing credited, flagged for review."""

    status = 422
    code = "verification_failed"


class PaymentNotFound(FloodgateError):
    """A refund of a payment the ledger does not hold yet: nothing debited; the provider retries."""

    status = 409
    code = "payment_not_found"


class RefundExceedsPayment(FloodgateError):
    """A refund that would take the refunds of its payment past the payment's amount: nothing
    debited, flagged for review."""

    status = 422
    code = "refund_exceeds_payment"


class Unavailable(FloodgateError):
    """A backing service (Redis, the database) cannot be reached, or is not ready yet: nothing
    was done. `retry_after_s`, when known, becomes the answer's Retry-After header."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str = "", *, retry_after_s: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class PublisherCapReached(FloodgateError):
    """A lead over one of its publisher's `caps` (docs/api.md): 429 publisher_cap_reached, with
    Retry-After the seconds to the cap's next window."""

    status = 429
    code = "publisher_cap_reached"

    def __init__(self, message: str = "", *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class RateLimited(FloodgateError):
    """A lead over its publisher's `rate_limit` (docs/api.md): refused before anything else is done
    for it. `retry_after_s` (at least 1) becomes the answer's Retry-After header."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str = "", *, retry_after_s: int, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = max(1, retry_after_s)


class TooManyAttempts(FloodgateError):
    """429: this client address used up its tries of the admin token or of buyer API keys
    (webhooks/web/logins.py); `retry_after_s` is when its window ends."""

    status = 429
    code = "too_many_attempts"

    def __init__(self, retry_after_s: int, what: str = "admin tokens") -> None:
        super().__init__(f"too many wrong {what} from this address: wait and retry")
        self.retry_after_s = max(1, retry_after_s)
