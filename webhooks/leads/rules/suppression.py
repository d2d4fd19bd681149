"""Suppression lists (docs/api.md "Consent, suppression and pre-ping"; the mechanism in
docs/leads.md "Suppression lists"): consumers, by e-mail or phone, that a buyer is never
offered and a publisher's leads are refused for, kept as digests of their consumer keys (a
plain list's keyed under SUPPRESSION_KEY). The database is the source; Redis holds each list
as small hashes under the hash tag {sup}, checked for every list of a lead in one round trip,
and answers "unknown" for a list it does not hold all of until it is loaded again."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhooks.errors import Conflict, NotFound, ValidationError
from webhooks.formats import consumer
from webhooks.formats.validate import is_id
from webhooks.storage.live import keys
from webhooks.storage.live.redis import REDIS_DOWN, Store
from webhooks.storage.records import audit
from webhooks.storage.records.db import db, is_mysql
from webhooks.storage.records.models import SuppressionEntry, SuppressionList, utcnow

log = logging.getLogger(__name__)

CODE = "invalid_suppression"
FIELDS = ("email", "phone")
HASHES = ("md5", "sha256", "none")
HEX_LENGTH = {"md5": 32, "sha256": 64}
MAX_ENTRIES = 10_000  # values per call, added and removed together
MAX_VALUE = consumer.MAX_VALUE  # characters of a plain value (an e-mail address is at most 254)
REBUILD_PAGE = 5_000
LOCK_TTL_MS = 300_000

HIT, MISS, UNKNOWN = "hit", "miss", "unknown"
SUPPRESSED = "suppressed"  # the routing trace's reason, and the answer's


@dataclass(frozen=True, kw_only=True)
class ListRule:
    """A list as the lead path checks it. A plain list's entries are keyed hashes (`key`, this
    process's SUPPRESSION_KEY; `digest_key`, the id of the key they were made with: None for
    the bare digests sql/018 wrote, until `floodgate suppression rehash`)."""

    id: str
    field: str
    hash: str
    digest_key: str | None = None
    key: bytes = dataclasses.field(default=b"", repr=False)

    @classmethod
    def from_row(cls, row: SuppressionList, key: bytes) -> ListRule:
        return cls(id=row.id, field=row.field, hash=row.hash, digest_key=row.digest_key, key=key)

    @property
    def keyed(self) -> bool:
        return self.hash == "none" and self.digest_key is not None

    @property
    def usable(self) -> bool:
        """Whether this process's key is the one the list's entries were made with."""
        return not self.keyed or self.digest_key == key_id(self.key)

    @property
    def mark(self) -> str:
        """What the list's ready key holds while Redis holds all of it in this rule's form: a
        process that reads another form (a rehash it has not seen yet) answers "unknown"."""
        return f"k:{self.digest_key}" if self.keyed else "1"

    def digest_of(self, value: str) -> bytes:
        """The digest of a consumer key, as this list keeps its entries."""
        data = value.encode()
        if self.hash == "md5":
            return hashlib.md5(data, usedforsecurity=False).digest()
        full = hashlib.sha256(data).digest()
        if self.hash == "sha256":
            return full
        return keyed_digest(self.key, full[:16]) if self.keyed else full[:16]

    def entry(self, raw: Any, where: str) -> bytes:
        """An entry as an admin sends it: a hex digest of the consumer key for a hashed list,
        the value itself for a plain one. ValidationError naming `where`."""
        if not isinstance(raw, str) or len(raw) > MAX_VALUE:
            raise ValidationError(CODE, where, "must be a string")
        if self.hash in HEX_LENGTH:
            text = raw.strip().lower()
            if len(text) != HEX_LENGTH[self.hash] or any(c not in "0123456789abcdef" for c in text):
                raise ValidationError(CODE, where, f"must be the {self.hash} of the normalised {self.field} (hex)")
            return bytes.fromhex(text)
        value = consumer.key(self.field, raw)
        if value is None:
            what = "an e-mail address" if self.field == "email" else "a phone number"
            raise ValidationError(CODE, where, f"is not {what}")
        return self.digest_of(value)


def key_id(key: bytes) -> str:
    """The id a list records of the key its entries are made with (never the key itself)."""
    return hmac.new(key, b"floodgate suppression key id", hashlib.sha256).hexdigest()[:16]


def keyed_digest(key: bytes, bare: bytes) -> bytes:
    """A plain list's entry: HMAC-SHA256 under SUPPRESSION_KEY of the value's bare digest (the
    first 16 bytes of its SHA-256, what sql/018 stored), so a rehash needs only the database."""
    return hmac.new(key, bare, hashlib.sha256).digest()[:16]


def _place(list_id: str, digest: bytes) -> tuple[str, bytes]:
    """(bucket key, field) of a digest in Redis."""
    return keys.suppression_bucket(list_id, digest[:2].hex()), digest[2:]


# --- the lead path -----------------------------------------------------------------------


def check(store: Store, lists: Sequence[ListRule], values: Mapping[str, str | None]) -> dict[str, str]:
    """Each list's verdict on a lead whose consumer keys (webhooks/formats/consumer.py) are `values`:
    HIT (its consumer is on it), MISS, or UNKNOWN (Redis does not hold all of the list in the
    form this process reads: a rebuild is started when it holds none). One pipelined round
    trip for every list; none when the lead has none of their fields."""
    asks: list[tuple[ListRule, str, bytes]] = []
    verdicts: dict[str, str] = {}
    for rule in lists:
        value = values.get(rule.field)
        if not rule.usable:  # entries made under another SUPPRESSION_KEY: nothing here can read them
            log.error("suppression list %s is keyed with another SUPPRESSION_KEY than this process's", rule.id)
            verdicts[rule.id] = UNKNOWN
        elif value is None:
            verdicts[rule.id] = MISS
        else:
            bucket, member = _place(rule.id, rule.digest_of(value))
            asks.append((rule, bucket, member))
    if not asks:
        return verdicts
    pipe = store.redis.pipeline(transaction=False)
    for rule, bucket, member in asks:
        pipe.get(keys.suppression_ready(rule.id))
        pipe.hexists(bucket, member)  # a binary field: redis-py sends bytes as they are
    replies = pipe.execute()
    for i, (rule, _bucket, _member) in enumerate(asks):
        ready, found = replies[2 * i], replies[2 * i + 1]
        mark = ready.decode() if isinstance(ready, bytes) else ready
        verdicts[rule.id] = HIT if found else (MISS if mark == rule.mark else UNKNOWN)
        if ready is None:
            request_rebuild(store, rule)
    return verdicts


# --- the admin API -----------------------------------------------------------------------


def parse_list(body: Any) -> tuple[str, str]:
    """(field, hash) of a PUT body {"field": "email" | "phone", "hash": "md5" | "sha256" | "none"}."""
    if not isinstance(body, dict) or set(body) - {"field", "hash"}:
        raise ValidationError(CODE, "body", 'must be an object {"field": ..., "hash": ...}')
    field, kind = body.get("field"), body.get("hash")
    if field not in FIELDS:
        raise ValidationError(CODE, "field", "must be email or phone")
    if kind not in HASHES:
        raise ValidationError(CODE, "hash", "must be md5, sha256 or none")
    return str(field), str(kind)


def put_list(store: Store, list_id: str, field: str, kind: str, *, key: bytes) -> SuppressionList:
    """Create a list, or keep it as it is; a list that holds entries keeps its field and hash
    (409 suppression_list_in_use: its digests mean nothing under another). A plain list's
    entries are keyed hashes under `key` (SUPPRESSION_KEY)."""
    now, shape = utcnow(), {"field": field, "hash": kind}
    digest_key = key_id(key) if kind == "none" else None
    with db.atomic():
        row = SuppressionList.get_or_none(SuppressionList.id == list_id)
        if row is None:
            row = SuppressionList.create(
                id=list_id, field=field, hash=kind, digest_key=digest_key, size=0, created_at=now, updated_at=now
            )
            audit.record("admin", "suppression_list.create", "suppression_list", list_id, shape)
        elif (row.field, row.hash) != (field, kind):
            if row.size:
                raise Conflict(
                    f"list {list_id!r} holds {row.size} entries as {row.hash} of {row.field}: make another list",
                    code="suppression_list_in_use",
                )
            SuppressionList.update(field=field, hash=kind, digest_key=digest_key, updated_at=now).where(
                SuppressionList.id == list_id
            ).execute()
            audit.record("admin", "suppression_list.update", "suppression_list", list_id, shape)
            row = SuppressionList.get_by_id(list_id)
    rule = ListRule.from_row(row, key)
    if not row.size:  # an empty list: all of it is in Redis, in this form
        store.redis.set(keys.suppression_ready(list_id), rule.mark)
    return row


def get_list(list_id: str) -> SuppressionList:
    row = SuppressionList.get_or_none(SuppressionList.id == list_id) if is_id(list_id) else None
    if row is None:
        raise NotFound(f"no suppression list {list_id!r}")
    return row


def to_json(row: SuppressionList) -> dict[str, Any]:
    return {
        "id": row.id,
        "field": row.field,
        "hash": row.hash,
        "size": row.size,
        "created_at": row.created_at.isoformat() + "Z",
        "updated_at": row.updated_at.isoformat() + "Z",
    }


def parse_entries(rule: ListRule, body: Any) -> tuple[list[bytes], list[bytes]]:
    """(digests to add, digests to remove) of {"add": [...], "remove": [...]}: at most
    MAX_ENTRIES values in all; each refusal names its place (`add[3]`)."""
    if not isinstance(body, dict) or not body or set(body) - {"add", "remove"}:
        raise ValidationError(CODE, "body", 'must be an object {"add": [...], "remove": [...]}')
    out: dict[str, list[bytes]] = {}
    total = 0
    for name in ("add", "remove"):
        values = body.get(name, [])
        if not isinstance(values, list):
            raise ValidationError(CODE, name, "must be a list")
        total += len(values)
        if total > MAX_ENTRIES:
            raise ValidationError(CODE, name, f"at most {MAX_ENTRIES} values per call, added and removed together")
        out[name] = [rule.entry(value, f"{name}[{i}]") for i, value in enumerate(values)]
    return out["add"], out["remove"]


def writable(row: SuppressionList, key: bytes) -> ListRule:
    """The list as an admin change writes it: 409 when its entries are keyed under another
    SUPPRESSION_KEY than this process's (what it would write could never match them)."""
    rule = ListRule.from_row(row, key)
    if not rule.usable:
        raise Conflict(
            f"list {row.id!r} is keyed with another SUPPRESSION_KEY than this process's",
            code="suppression_key_mismatch",
        )
    return rule


def change(store: Store, rule: ListRule, add: list[bytes], remove: list[bytes]) -> dict[str, int]:
    """Add and remove entries: {"added", "removed", "size"} (entries already there, or not
    there, count in neither). Redis first for an add, the database first for a removal: a
    failure between them leaves Redis suppressing more, never less, and the retry finishes.
    Both under the list's row lock, which a rehash takes too: 409 when the list's entries were
    rehashed since `rule` was read (the digests differ), before anything is written."""
    add = [d for d in dict.fromkeys(add) if d not in set(remove)]  # a value both added and removed: removed
    remove = list(dict.fromkeys(remove))
    with writing():
        current = locked(rule.id)
        if current is None or current.digest_key != rule.digest_key:
            raise Conflict(
                f"list {rule.id!r} was rehashed meanwhile: send the change again", code="suppression_list_in_use"
            )
        if add:
            _redis_write(store, rule, add, present=True)
        added = removed = 0
        for chunk in _chunks(add, 1000):
            added += (
                SuppressionEntry.insert_many([{"list_id": rule.id, "digest": d.hex()} for d in chunk])
                .on_conflict_ignore()
                .as_rowcount()
                .execute()
            )
        for chunk in _chunks(remove, 1000):
            removed += (
                SuppressionEntry.delete()
                .where(SuppressionEntry.list_id == rule.id, SuppressionEntry.digest.in_([d.hex() for d in chunk]))
                .execute()
            )
        SuppressionList.update(size=SuppressionList.size + added - removed, updated_at=utcnow()).where(
            SuppressionList.id == rule.id
        ).execute()
        counts = {"added": added, "removed": removed}
        audit.record("admin", "suppression_list.entries", "suppression_list", rule.id, counts)
        size = SuppressionList.get_by_id(rule.id).size
    if remove:
        _redis_write(store, rule, remove, present=False)
    return {"added": added, "removed": removed, "size": int(size)}


def change_values(
    store: Store, rule: ListRule, add: Sequence[tuple[int, str]], remove: Sequence[tuple[int, str]]
) -> dict[str, Any]:
    """Add and remove plain values of many lines (a file, a form), each `(line, value)` read as
    the admin API reads an entry (`entry`) and the valid ones written by `change` in calls of
    at most MAX_ENTRIES: {"added", "removed", "size", "invalid": [{"list", "line", "problem"}]}.
    A value that is not one is named by its line, never written (nor its value repeated)."""
    digests: dict[str, list[bytes]] = {"add": [], "remove": []}
    invalid: list[dict[str, Any]] = []
    for name, values in (("add", add), ("remove", remove)):
        for line, value in values:
            where = f"line {line}"
            try:
                digests[name].append(rule.entry(value, where))
            except ValidationError as exc:
                invalid.append({"list": name, "line": line, "problem": exc.message.removeprefix(f"{where}: ")})
    added = removed = 0
    size = None
    for add_part, remove_part in _batches(digests["add"], digests["remove"]):
        counts = change(store, rule, add_part, remove_part)
        added, removed, size = added + counts["added"], removed + counts["removed"], counts["size"]
    if size is None:
        size = int(SuppressionList.get_by_id(rule.id).size)
    return {"added": added, "removed": removed, "size": size, "invalid": invalid}


def _batches(add: list[bytes], remove: list[bytes]) -> Iterable[tuple[list[bytes], list[bytes]]]:
    """The digests in calls of at most MAX_ENTRIES, removals first (one call when few);
    none when there is nothing to write."""
    if len(add) + len(remove) <= MAX_ENTRIES:
        if add or remove:
            yield add, remove
        return
    for chunk in _chunks(remove, MAX_ENTRIES):
        yield [], chunk
    for chunk in _chunks(add, MAX_ENTRIES):
        yield chunk, []


def writing() -> Any:
    """A transaction that holds what it reads: SQLite's takes the write lock as it begins (db.py
    SQLite: its writers take turns); MySQL locks the rows read FOR UPDATE (`locked`)."""
    return db.atomic()


def locked(list_id: str) -> SuppressionList | None:
    """The list's row, locked until the `writing` transaction ends: a change and a rehash of
    one list take turns."""
    query = SuppressionList.select().where(SuppressionList.id == list_id)
    row: SuppressionList | None = (query.for_update() if is_mysql() else query).first()
    return row


def _chunks(items: list[bytes], n: int) -> Iterable[list[bytes]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _redis_write(store: Store, rule: ListRule, digests: list[bytes], *, present: bool) -> None:
    pipe = store.redis.pipeline(transaction=False)
    for digest in digests:
        bucket, member = _place(rule.id, digest)
        if present:
            pipe.hset(bucket, member, "")  # a binary field
        else:
            pipe.hdel(bucket, member)
    pipe.execute()


# --- after a loss: the list loaded again from the database ---------------------------------


def request_rebuild(store: Store, rule: ListRule) -> bool:
    """Load the list into Redis again in the background unless a load runs; True if started."""
    token = uuid.uuid4().hex
    try:
        if not store.redis.set(keys.suppression_rebuild_lock(rule.id), token, nx=True, px=LOCK_TTL_MS):
            return False
    except REDIS_DOWN:
        return False
    log.warning("suppression list %s is not all in Redis (it lost data?): loading it from the database", rule.id)
    threading.Thread(target=_run_rebuild, args=(store, rule, token), daemon=True).start()
    return True


def _run_rebuild(store: Store, rule: ListRule, token: str) -> None:
    try:
        rebuild(store, rule)
    except Exception:
        log.exception("rebuild of suppression list %s failed; the next lead checked against it tries again", rule.id)
    finally:
        try:
            store.release_claim(keys.suppression_rebuild_lock(rule.id), token)
        except REDIS_DOWN:
            pass


def rebuild(store: Store, rule: ListRule) -> int:
    """Write every entry of the database's list into Redis, a page at a time, then mark the
    list ready; how many entries. (A removal racing the load may leave its entry in Redis:
    suppressing more, never less, until the next load.) Pages go in digest order, which the
    unique (list_id, digest) index serves: a page reads its own entries only, not other lists'.
    The list is read again first: its ready mark is that of the entries loaded (a rehash may
    have changed their form since `rule` was read)."""
    count, after = 0, ""
    with db.connection_context():
        row = SuppressionList.get_or_none(SuppressionList.id == rule.id)
        if row is not None:
            rule = ListRule.from_row(row, rule.key)
        while True:
            page = (
                SuppressionEntry.select(SuppressionEntry.digest)
                .where(SuppressionEntry.list_id == rule.id, SuppressionEntry.digest > after)
                .order_by(SuppressionEntry.digest)
                .limit(REBUILD_PAGE)
            )
            digests: list[str] = [row.digest for row in page]
            if not digests:
                break
            _redis_write(store, rule, [bytes.fromhex(digest) for digest in digests], present=True)
            count += len(digests)
            after = digests[-1]
    store.redis.set(keys.suppression_ready(rule.id), rule.mark)
    log.info("suppression list %s loaded into Redis: %d entries", rule.id, count)
    return count


def parse_ids(code: str, field: str, raw: Any) -> list[str]:
    """A buyer's or publisher's `suppress`: a list of list ids, each of an existing list."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > 20 or not all(isinstance(x, str) and is_id(x) for x in raw):
        raise ValidationError(code, field, "must be a list of at most 20 suppression list ids")
    ids = sorted(set(raw))
    known = {row.id for row in SuppressionList.select(SuppressionList.id).where(SuppressionList.id.in_(ids))}
    missing = [x for x in ids if x not in known]
    if missing:
        raise ValidationError(code, field, f"no suppression list {missing[0]!r}: PUT /v1/admin/suppression-lists/<id>")
    return ids


def load_rules(key: bytes) -> dict[str, ListRule]:
    """Every list, by id (the config snapshot's), read with this process's SUPPRESSION_KEY."""
    return {row.id: ListRule.from_row(row, key) for row in SuppressionList.select()}


def stored_ids(raw: str | None) -> tuple[str, ...]:
    """A stored JSON list of ids (`suppress`, `require_consent`) as a tuple; () for NULL."""
    return tuple(json.loads(raw)) if raw else ()


def stored_json(items: list[str]) -> str | None:
    """What a column of such a list stores: NULL for none."""
    return json.dumps(items) if items else None
