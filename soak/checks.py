"""The soak's checks (soak/run.py): the invariants, from the ledger (MariaDB), what the
buyers' servers accepted (soak/buyers.py) and every answer the clients got (soak/traffic.py);
latency, memory and errors over time. soak/report.py writes them up."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

from bench.common import mysql_kwargs, percentiles


def connect(db_url: str):
    """A PyMySQL connection to the database of a mysql:// URL."""
    import pymysql

    return pymysql.connect(**mysql_kwargs(db_url))


def query(db_url: str, sql: str, args: tuple = ()) -> tuple:
    """The first row of one statement, on a connection of its own (None: no row)."""
    conn = connect(db_url)
    try:
        with conn.cursor() as c:
            c.execute(sql, args)
            return c.fetchone()
    finally:
        conn.close()


QUIET_S = 10  # a fault's errors are over after this long without one
# A web worker's settlement journal fills for JOURNAL_KEEP_S (600 s): judge its memory after
# that; other processes after their first minute. A trend needs 200 s of samples between two
# faults that step memory up: a Redis restart (its recovery: rebuilds, the re-pushed queue)
# and a database outage (the requests held while it lasts). Those steps are high-water marks
# of a process's allocator (bench/rss_outages.py repeats each fault in one process's life:
# one step, then flat); a trend between them is what a leak looks like. The writing node's
# death (--galera) is taken as an outage (pooled connections cut, requests held for seconds;
# its own step not measured apart).
# An RQ worker steps up once, about 90 s in, when its first periodic jobs load what they use.
RSS_SETTLE_S = {"web worker": 660, "rq worker": 120}
RSS_SETTLE_DEFAULT_S = 60
RSS_MIN_SPAN_S = 200
RSS_AFTER_FAULT_S = {"redis_restart": 150, "db_outage": 70, "writer_kill": 70}  # each one's recovery over by then


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by a kill
    return out


def _ledger(db_url: str, publisher: str, tag: str) -> dict:

    conn = connect(db_url)
    with conn.cursor() as c:
        c.execute("SELECT lead_id, status, buyer_id, price, sold_at FROM leads WHERE publisher_id=%s", (publisher,))
        leads = {row[0]: row[1:] for row in c.fetchall()}
        c.execute("SELECT COUNT(*) FROM (SELECT 1 FROM leads GROUP BY publisher_id, lead_id HAVING COUNT(*) > 1) d")
        dup_leads = c.fetchone()[0]
        c.execute(
            "SELECT lead_id, buyer_id, outcome FROM lead_attempts WHERE publisher_id=%s "
            "AND outcome IN ('unknown', 'timeout')",
            (publisher,),
        )
        attempts = {(row[0], row[1]): row[2] for row in c.fetchall()}  # unknown wins: it comes last
        unknown = [lead for (lead, _b), outcome in attempts.items() if outcome == "unknown"]
        c.execute("SHOW COLUMNS FROM payments")
        columns = {row[0] for row in c.fetchall()}
        refunded = ", refunded_minor" if "refunded_minor" in columns else ", 0"
        c.execute(
            f"SELECT provider, reference, amount_minor, currency, customer, status{refunded} FROM payments "
            "WHERE reference LIKE %s",
            (tag + "-%",),
        )
        payments = {(row[0], row[1]): row[2:] for row in c.fetchall()}
        c.execute("SELECT customer, currency, balance_minor FROM wallets WHERE customer LIKE %s", (tag + "-%",))
        wallets = {(row[0], row[1]): row[2] for row in c.fetchall()}
    conn.close()
    return {
        "leads": leads,
        "dup_leads": dup_leads,
        "unknown": unknown,
        "attempts": attempts,
        "payments": payments,
        "wallets": wallets,
    }


def _windows(sold_at: datetime, tz: str) -> dict[str, str]:
    local = sold_at.replace(tzinfo=timezone.utc).astimezone(ZoneInfo(tz))
    monday = local.date() - timedelta(days=local.weekday())
    return {
        "hourly": local.strftime("%Y-%m-%dT%H%z"),
        "daily": local.date().isoformat(),
        "weekly": monday.isoformat(),
        "monthly": local.strftime("%Y-%m"),
    }


def _check(name: str, ok: bool, figures: str, **data) -> dict:
    return {"name": name, "ok": bool(ok), "figures": figures, **data}


def check_leads(meta: dict, ledger: dict, buyer_log: list[dict], outcomes: list[dict]) -> tuple[list, dict]:
    buyers = meta["buyers"]
    sold = defaultdict(set)  # buyer -> lead ids sold to it in the ledger
    used = Counter()  # (buyer, cap, window) -> sold leads; daily_budget in cents
    for lead_id, (status, buyer, price, sold_at) in ledger["leads"].items():
        if status != "sold":
            continue
        sold[buyer].add(lead_id)
        for cap, window in _windows(sold_at, buyers[buyer]["timezone"]).items():
            used[(buyer, cap, window)] += 1
            if cap == "daily":
                used[(buyer, "daily_budget", window)] += int(Decimal(price) * 100)
    caps_rows, over = [], []
    for (buyer, cap, window), n in sorted(used.items()):
        limit = buyers[buyer]["caps"].get(cap)
        if limit is None:
            continue
        limit_units = int(Decimal(limit) * 100) if cap == "daily_budget" else int(limit)
        if n > limit_units:
            over.append(f"{buyer} {cap} {window}: {n} > {limit_units}")
        row = {"buyer": buyer, "cap": cap, "window": window, "limit": limit, "full": "yes" if n == limit_units else ""}
        caps_rows.append(row | {"sold": f"{n / 100:.2f}" if cap == "daily_budget" else n})
    checks = [
        _check(
            "sold per buyer per window <= cap",
            not over,
            f"{len(caps_rows)} (buyer, cap, window) pairs, {sum(r['full'] == 'yes' for r in caps_rows)} "
            f"filled exactly to the cap, {len(over)} over",
            over=over[:20],
            windows=caps_rows,
        )
    ]

    accepted, on_time, late, arrivals, hung = defaultdict(set), defaultdict(set), defaultdict(set), Counter(), 0
    for rec in buyer_log:
        if rec["b"] not in buyers:
            continue
        arrivals[rec["k"]] += 1
        hung += rec["a"] == "hung"
        if rec["a"] == "accept":
            lead_id = rec["k"].split(":")[1]
            accepted[rec["b"]].add(lead_id)
            (late if rec.get("late") else on_time)[rec["b"]].add(lead_id)
    # An accepted lead the ledger did not sell to that buyer is explained only by the contract:
    # Floodgate recorded the attempt `timeout` (the accept came after its hard deadline; the
    # lead went on down the waterfall), or `unknown` (the routing died, the re-offer was not
    # confirmed: unsold, flagged for review). Anything else is a lead lost or doubled.
    outcome_of = ledger["attempts"]
    rows, mismatch, explained = [], [], defaultdict(set)
    for buyer in buyers:
        missing = on_time[buyer] - sold[buyer]  # the buyer took it in time, the ledger did not sell it
        for lead_id in list(missing):
            why = outcome_of.get((lead_id, buyer))
            if why in ("timeout", "unknown"):
                explained[why].add((lead_id, buyer))
                missing.discard(lead_id)
        extra = sold[buyer] - accepted[buyer]  # sold to a buyer that never accepted it
        only_late = late[buyer] - on_time[buyer]
        row = {"buyer": buyer, "accepted": len(accepted[buyer]), "sold": len(sold[buyer]), "missing": len(missing)}
        row |= {why: sum(1 for _l, b in explained[why] if b == buyer) for why in ("timeout", "unknown")}
        rows.append(row | {"extra": len(extra), "late": len(only_late), "late_sold": len(only_late & sold[buyer])})
        if missing or extra:
            mismatch.append({"buyer": buyer, "missing": sorted(missing)[:10], "extra": sorted(extra)[:10]})
    checks.append(
        _check(
            "sold per buyer = accepted by its server (a repeated key once)",
            not mismatch,
            "; ".join(
                f"{r['buyer']} {r['sold']} sold / {r['accepted']} accepted "
                f"({r['timeout']} after Floodgate's deadline, {r['unknown']} unknown, "
                f"{r['missing'] + r['extra']} unexplained)"
                for r in rows
            ),
            mismatch=mismatch,
        )
    )

    owners = defaultdict(list)
    for buyer, ids in on_time.items():
        for lead_id in ids:
            owners[lead_id].append(buyer)
    twice = {
        k: v
        for k, v in owners.items()
        if len([b for b in v if (k, b) not in explained["timeout"] | explained["unknown"]]) > 1
    }
    timed_out_twice = sum(1 for k, v in owners.items() if len(v) > 1) - len(twice)
    not_in_ledger = [k for k in owners if k not in ledger["leads"]]
    checks.append(
        _check(
            "every accepted lead in the ledger exactly once",
            not twice and not not_in_ledger and ledger["dup_leads"] == 0,
            f"{len(owners)} leads accepted, {len(not_in_ledger)} not in the ledger, "
            f"{len(twice)} sold to two buyers ({timed_out_twice} accepted by a second buyer after "
            f"the first's accept came past Floodgate's deadline), {ledger['dup_leads']} duplicate "
            "ledger rows",
            twice=dict(list(twice.items())[:10]),
            not_in_ledger=not_in_ledger[:10],
        )
    )

    final = Counter(o["final"] for o in outcomes if o["k"] == "L")
    wrong = []
    for o in outcomes:
        if o["k"] != "L" or o["final"] not in ("sold", "unsold"):
            continue
        row = ledger["leads"].get(o["id"])
        if row is None or row[0] != o["final"] or (o["final"] == "sold" and row[1] != o.get("buyer")):
            wrong.append(
                {
                    "lead": o["id"],
                    "answer": [o["final"], o.get("buyer")],
                    "ledger": None if row is None else [row[0], row[1]],
                }
            )
    no_answer = sum(n for k, n in final.items() if k not in ("sold", "unsold"))
    settled_ok = not wrong and no_answer == 0 and meta["settled_after_s"] is not None and meta["rq_failed_jobs"] == 0
    checks.append(
        _check(
            "every settlement queued was settled",
            settled_ok,
            f"{final['sold'] + final['unsold']} answers, {len(wrong)} not in the ledger as answered, "
            f"{no_answer} leads without an answer, queue empty after "
            f"{meta['settled_after_s']} s, {meta['rq_failed_jobs']} failed RQ jobs",
            wrong=wrong[:20],
            finals=dict(final),
        )
    )
    reoffers = sum(1 for k, n in arrivals.items() if n > 1)
    client_unknown = sum(1 for o in outcomes if o["k"] == "L" and "unknown" in o.get("outcomes", []))
    extra = {
        "reoffers": reoffers,
        "unknown_attempts_ledger": len(ledger["unknown"]),
        "unknown_in_answers": client_unknown,
        "hung_posts": hung,
        "lead_finals": dict(final),
        "replayed_answers": sum(1 for o in outcomes if o["k"] == "L" and o.get("replayed")),
        "per_buyer": rows,
        "timeout_accepts": len(explained["timeout"]),
        "unknown_accepts": len(explained["unknown"]),
        "accepted_twice_past_deadline": timed_out_twice,
    }
    return checks, extra


def check_payments(meta: dict, ledger: dict, outcomes: list[dict], events: list[dict]) -> tuple[list, dict]:
    credited, got_200, sent, ignored = Counter(), set(), {}, set()
    for o in outcomes:
        if o["k"] != "P":
            continue
        ref = (o["prov"], o["ref"])
        sent[ref] = o
        if not o["ok"]:
            ignored.add(ref)
        credited[ref] += o["final"] == "credited"
        if o["final"] in ("credited", "duplicate"):
            got_200.add(ref)
    debited, refunds_200 = Counter(), {}
    for o in outcomes:
        if o["k"] == "R":
            debited[o["ref"]] += o["final"] == "debited"
            if o["final"] in ("debited", "duplicate"):
                refunds_200[o["ref"]] = o
    stored = ledger["payments"]
    twice = [r for r, n in credited.items() if n > 1] + [r for r, n in debited.items() if n > 1]
    lost = [r for r in got_200 if r not in stored]
    unanswered = [r for r, o in sent.items() if o["ok"] and r not in got_200]
    unanswered_stored = [r for r in unanswered if r in stored]
    # a failed charge credited; a payment still being retried when the run stopped has no
    # outcome line yet, so a ledger row without one is not a phantom
    phantom = [r for r in stored if r in ignored]
    no_outcome = [r for r in stored if r not in sent]
    checks = [
        _check(
            "every payment that got a 200 is credited once",
            not twice and not lost and not phantom and not unanswered,
            f"{len(got_200)} payments answered 200 ({sum(credited.values())} `credited`), "
            f"{len(lost)} of them not in the ledger, {len(twice)} credited twice, "
            f"{len(unanswered)} never answered 200 ({len(unanswered_stored)} of those in the ledger), "
            f"{len(phantom)} failed charges credited; {len(no_outcome)} credited whose deliveries were "
            "still being retried when the run stopped",
            twice=twice[:10],
            lost=lost[:10],
            unanswered=unanswered[:10],
            phantom=phantom[:10],
        )
    ]

    expected = Counter()  # wallet -> credits - refunds, from the ledger rows
    for (_prov, _ref), (amount, currency, customer, _status, refunded) in stored.items():
        expected[(customer, currency)] += amount - (refunded or 0)
    client = Counter()  # wallet -> what the clients were told: 200 credits minus 200 debits
    for r in got_200:
        o = sent[r]
        client[(o["cust"], o["cur"])] += o["amt"]
    for o in refunds_200.values():
        client[(o["cust"], o["cur"])] -= o["amt"]
    for r, (amount, currency, customer, _status, _refunded) in stored.items():
        if r not in got_200:  # credited, but its 200 never reached the client (it is still retrying)
            client[(customer, currency)] += amount
    wallets = ledger["wallets"]
    off = [w for w in set(expected) | set(wallets) if wallets.get(w, 0) != expected.get(w, 0)]
    off_client = [w for w in set(client) | set(wallets) if wallets.get(w, 0) != client.get(w, 0)]
    minus = "minus refunds " if meta["refunds"] else ""
    checks.append(
        _check(
            f"wallets = sum of credits {minus}".strip(),
            not off and not off_client,
            f"{len(wallets)} wallets, total {sum(wallets.values())} minor units; {len(off)} differ from "
            f"the ledger's payments{' minus refunds' if meta['refunds'] else ''}, {len(off_client)} "
            "from the 200 answers plus the ledger's credits whose answer was lost",
            off=[list(w) for w in off[:10]],
            off_client=[list(w) for w in off_client[:10]],
        )
    )
    if meta["outbox"]:
        seen = {(e.get("type"), e.get("ref")) for e in events}
        want = {("wallet.credited", ref) for (_p, ref) in stored} | {
            ("wallet.debited", o["ref"]) for o in refunds_200.values()
        }
        missing = sorted(want - seen)
        checks.append(
            _check(
                "every outbox event reached the receiver",
                not missing,
                f"{len(want)} wallet changes, {len(seen & want)} announced, {len(missing)} missing, "
                f"{len(events)} deliveries ({len({e.get('id') for e in events})} distinct webhook-id); "
                f"outbox empty {meta.get('outbox_delivered_after_s')} s after the ledger settled",
                missing=missing[:10],
            )
        )
    else:
        checks.append(
            _check(
                "every outbox event reached the receiver",
                True,
                "not applicable yet: the running code has no payment-events outbox "
                "(its configuration does not read PAYMENT_EVENTS_URL)",
                not_applicable=True,
            )
        )
    finals = Counter(f"{o['k']}:{o['final']}" for o in outcomes if o["k"] in ("P", "R"))
    return checks, {
        "payment_finals": dict(finals),
        "payments_stored": len(stored),
        "wallets": len(wallets),
        "refunds_answered": len(refunds_200),
    }


def is_error(kind: str, result: str) -> bool:
    """A request that failed: anything but a 200, except the 409 in_flight that a payment's
    concurrent repeat gets by design (the provider retries it)."""
    return result != "200" and not (kind == "P" and result == "409:in_flight")


def timeline(meta: dict, requests: list[dict], t0: float) -> dict:
    end = max((r["t"] for r in requests), default=t0) - t0
    minutes = int(end // 60) + 1
    lat = {k: defaultdict(list) for k in ("L", "P")}
    lat10 = {k: defaultdict(list) for k in ("L", "P")}
    errors_by_kind, err10, error_times = Counter(), Counter(), []
    fault_times = [f["t"] for f in meta["faults"]]
    by_window = defaultdict(Counter)
    for r in requests:
        t = r["t"] - t0
        k = "P" if r["k"] in ("P", "R") else "L"
        lat[k][int(t // 60)].append(r["ms"])
        lat10[k][int(t // 10)].append(r["ms"])
        if r["r"] != "200":
            name = {"L": "lead", "P": "payment", "R": "refund"}[r["k"]] + " " + r["r"]
            errors_by_kind[name] += 1
            window = sum(1 for ft in fault_times if ft <= t)
            by_window[window][name] += 1
            if is_error(r["k"], r["r"]):
                err10[int(t // 10)] += 1
                error_times.append(t)
    per_minute = []
    rss = rss_by_minute(meta["samples"])
    for m in range(minutes):
        row = {"minute": m + 1}
        for k, label in (("L", "lead"), ("P", "pay")):
            p = percentiles(lat[k].get(m, []))
            row[f"{label}_n"], row[f"{label}_p50"], row[f"{label}_p99"] = len(lat[k].get(m, [])), p["p50"], p["p99"]
        row["errors"] = sum(1 for t in error_times if m * 60 <= t < (m + 1) * 60)
        row.update(rss.get(m, {}))
        per_minute.append(row)
    series10 = {
        k: sorted((b * 10 + 5, percentiles(v)["p50"], percentiles(v)["p99"]) for b, v in lat10[k].items())
        for k in lat10
    }
    error_times.sort()
    faults = []
    for i, f in enumerate(meta["faults"]):
        nxt = fault_times[i + 1] if i + 1 < len(fault_times) else end
        in_window = [t for t in error_times if f["t"] <= t < nxt]
        quiet, start = 0.0, f["t"]
        for t in in_window:
            if t - start < QUIET_S:
                quiet = t - f["t"] + 0.001
                start = t
            else:
                break
        row = {"n": i + 1, **{k: f[k] for k in ("kind", "t", "detail", "milestones")}}
        row |= {"healed_s": f["milestones"].get("healed"), "errors_quiet_after_s": round(quiet, 1)}
        faults.append(row | {"errors_in_window": len(in_window)})
    windows = [
        {"window": "before the first fault" if w == 0 else f"{w} {meta['faults'][w - 1]['kind']}", **dict(c)}
        for w, c in sorted(by_window.items())
    ]
    return {
        "per_minute": per_minute,
        "series10": series10,
        "errors_by_kind": dict(errors_by_kind.most_common()),
        "errors_by_window": windows,
        "err10": sorted(err10.items()),
        "faults": faults,
        "lead_latency": percentiles([r["ms"] for r in requests if r["k"] == "L"]),
        "payment_latency": percentiles([r["ms"] for r in requests if r["k"] != "L"]),
    }


ROLES = ("web worker", "web master", "rq worker", "scheduler", "redis-server", "buyers", "traffic")


def rss_by_minute(samples: list[dict]) -> dict[int, dict]:
    """Per minute and role, the largest RSS (MB) of any process of that role."""
    out = defaultdict(dict)
    for s in samples:
        m = int(s["t"] // 60)
        for key, kb in s["rss_kb"].items():
            role = key.split(":")[0]
            col = "rss_" + role.replace(" ", "_").replace("-", "_")
            out[m][col] = max(out[m].get(col, 0), round(kb / 1024, 1))
    return out


def rss_trend(samples: list[dict], resets: list[tuple[float, float]] = ()) -> list[dict]:
    """Per process (role:pid) that lived long enough: the RSS slope after its warm-up, fitted
    between the faults that step memory up (`resets`: (when, how long its recovery lasts)),
    see RSS_AFTER_FAULT_S."""
    series = defaultdict(list)
    for s in samples:
        for key, kb in s["rss_kb"].items():
            series[key].append((s["t"], kb / 1024))
    out = []
    for key, points in series.items():
        role = key.split(":")[0]
        if role not in ("web worker", "rq worker", "scheduler", "web master"):
            continue
        first = points[0][0]
        warm = first + RSS_SETTLE_S.get(role, RSS_SETTLE_DEFAULT_S)
        row = {
            "process": key,
            "lived_min": round((points[-1][0] - first) / 60, 1),
            "first_mb": round(points[0][1], 1),
            "last_mb": round(points[-1][1], 1),
            "max_mb": round(max(mb for _, mb in points), 1),
        }
        starts = [warm] + [t + settle for t, settle in sorted(resets) if t + settle > warm]
        ends = sorted(t for t, _ in resets)
        slopes = []
        for start in starts:
            end = next((t for t in ends if t > start), math.inf)
            seg = [(t, mb) for t, mb in points if start <= t < end]
            if len(seg) > 2 and seg[-1][0] - seg[0][0] >= RSS_MIN_SPAN_S:
                n = len(seg)
                mt, mm = sum(t for t, _ in seg) / n, sum(mb for _, mb in seg) / n
                slope = sum((t - mt) * (mb - mm) for t, mb in seg) / sum((t - mt) ** 2 for t, _ in seg) * 3600
                slopes.append((slope, mm))
        if slopes:
            slope, mm = max(slopes)
            row["slope_mb_per_h"] = round(slope, 2)
            row["growing"] = slope > max(10.0, 0.1 * mm)
        out.append(row)
    return out


def analyse(run_dir: Path, meta: dict, db_url: str) -> dict:
    traffic_cfg = json.loads((run_dir / "traffic.json").read_text())
    requests = _jsonl(run_dir / "requests.jsonl")
    outcomes = _jsonl(run_dir / "outcomes.jsonl")
    buyer_log = _jsonl(run_dir / "buyers.jsonl")
    ledger = _ledger(db_url, meta["publisher"], traffic_cfg["tag"])
    # the orchestrator's clock, which the faults and samples are timed on
    t0 = meta.get("t0") or meta.get("traffic", {}).get("t0") or min((r["t"] for r in requests), default=0)
    lead_checks, lead_figures = check_leads(meta, ledger, buyer_log, outcomes)
    events = [r for r in buyer_log if r["b"] == "_events"]
    pay_checks, pay_figures = check_payments(meta, ledger, outcomes, events)
    trend, rss_check = judge_rss(meta["samples"], meta["faults"])
    return {
        "meta": {k: v for k, v in meta.items() if k != "samples"},
        "samples": meta["samples"],
        "checks": lead_checks + pay_checks + [rss_check],
        "leads": lead_figures,
        "payments": pay_figures,
        "timeline": timeline(meta, requests, t0),
        "rss_trend": trend,
        "requests": len(requests),
    }


def judge_rss(samples: list[dict], faults: list[dict]) -> tuple[list[dict], dict]:
    """(rss_trend, the RSS check) of a run."""
    trend = rss_trend(
        samples, [(f["t"], RSS_AFTER_FAULT_S[f["kind"]]) for f in faults if f["kind"] in RSS_AFTER_FAULT_S]
    )
    judged = [r for r in trend if "growing" in r]
    growing = [r["process"] for r in judged if r["growing"]]
    return trend, _check(
        "no RSS growth trend in Floodgate's processes",
        not growing,
        f"{len(judged)} processes were judged ({RSS_MIN_SPAN_S} s or more of samples between "
        f"Redis restarts and database outages, past their warm-up: a web worker's "
        f"{RSS_SETTLE_S['web worker'] // 60} min, its settlement journal filling); "
        f"growing: {growing or 'none'}"
        if judged
        else "not judged: no process lived long enough past its warm-up",
        not_applicable=not judged,
    )
