"""The soak's report (soak/run.py): a run's markdown and plot from what soak/checks.py found,
and soak.md, the Soak part of bench/REPORT.md, assembled from every run on disk."""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

from bench import common
from bench.common import markdown_table
from soak.checks import ROLES, RSS_AFTER_FAULT_S, RSS_MIN_SPAN_S, RSS_SETTLE_S, judge_rss

# scripts/soak runs the soak from an export of the committed code; its results still go here
OUT = Path(os.environ.get("FG_SOAK_OUT") or common.OUT)


def table(rows: list[dict], columns: str) -> str:
    """markdown_table with its columns written "heading=key|heading=key|...", in order."""
    return markdown_table(rows, tuple((h, k) for h, k in (c.split("=", 1) for c in columns.split("|"))))


def write_out(name: str, text: str) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(text.rstrip("\n") + "\n")


def rejudge_rss(name: str) -> bool:
    """Judge the memory of a finished run again (bench/out/<name>.json) with the rules above,
    and write it again; whether every invariant holds."""
    res = json.loads((OUT / f"{name}.json").read_text())
    res["rss_trend"], check = judge_rss(res["samples"], res["meta"]["faults"])
    res["checks"] = [c for c in res["checks"] if c["name"] != check["name"]] + [check]
    return write(res, name)


# -- writing --------------------------------------------------------------------------------


def render(res: dict) -> str:
    meta, tl = res["meta"], res["timeline"]
    ok = all(c["ok"] for c in res["checks"])
    m = meta["machine"]
    lines = [
        f"**{meta['minutes']:g}-minute run** of commit `{str(meta.get('commit', '?'))[:10]}` "
        f"({m['date']}, {m['nproc']} CPUs, load average "
        f"{m['loadavg_1m_5m_15m']} at the end; redis {m.get('redis')}, {m.get('database')}): offered "
        f"{meta['lead_rate']:g} leads/s and {meta['payment_rate']:g} payment deliveries/s; refunds "
        f"{'sent' if meta['refunds'] else 'not sent (not in the running code)'}; "
        f"{len(meta['faults'])} faults. Invariants: **{'all hold' if ok else 'NOT all hold'}**.",
        "",
        table(
            [
                {"check": c["name"], "ok": "yes" if c["ok"] else "**NO**", "figures": c["figures"]}
                for c in res["checks"]
            ],
            "invariant=check|holds=ok|figures=figures",
        ),
        "",
    ]
    lf = res["leads"]
    lines += [
        f"Leads: answers {lf['lead_finals']}; {lf['replayed_answers']} answers were replays. Re-offers (a "
        f"repeated Idempotency-Key at a buyer): **{lf['reoffers']}**; `unknown` attempts: "
        f"**{lf['unknown_attempts_ledger']}** in the ledger ({lf['unknown_in_answers']} in answers); "
        f"{lf['hung_posts']} posts held by the hung buyer.",
        "",
        table(
            lf["per_buyer"],
            "buyer=buyer|accepted by its server=accepted|sold in the ledger=sold|accepted, recorded `timeout`=timeout"
            "|accepted, left `unknown`=unknown|accepted, not sold, unexplained=missing|sold, not accepted=extra"
            "|accepted after the deadline=late|of those sold=late_sold",
        ),
        "",
        "Caps, per window (the buyer's local time):",
        "",
        table(res["checks"][0]["windows"], "buyer=buyer|cap=cap|window=window|limit=limit|sold=sold|full=full"),
        "",
        f"Payments: {res['payments']['payment_finals']}; {res['payments']['payments_stored']} in the "
        f"ledger, {res['payments']['wallets']} wallets.",
        "",
    ]
    lines += [
        f"Latency over the whole run (ms, each request; a first try from the moment it was due): leads p50 "
        f"{tl['lead_latency']['p50']}, p99 {tl['lead_latency']['p99']}; payments p50 "
        f"{tl['payment_latency']['p50']}, p99 {tl['payment_latency']['p99']}.",
        "",
        "Faults (seconds from the start; `healed`: the fault's own probe — a new process up, Redis "
        "counters rebuilt, the database answering /readyz, the hung buyer selling again, the killed "
        "worker's batch gone; `errors quiet`: until the clients saw 10 s without an error):",
        "",
        table(
            [{**f, "milestones": ", ".join(f"{k} {v}" for k, v in f["milestones"].items())} for f in tl["faults"]],
            "#=n|fault=kind|at s=t|what=detail|healed after s=healed_s|milestones s=milestones"
            "|errors quiet after s=errors_quiet_after_s|errors in its window=errors_in_window",
        ),
        "",
        "Process exits and restarts (supervisor): "
        + (
            ", ".join(
                f"{e['process']} {e['event']} at {e['t']} s" + (f" (rc {e['rc']})" if "rc" in e else "")
                for e in meta["process_events"]
                if e["t"] > 0
            )
            or "none"
        ),
        "",
        "Errors by kind (requests that did not get a 200; a payment's `409:in_flight` is the designed "
        "answer to a concurrent repeat and is not counted as an error elsewhere):",
        "",
        table([{"kind": k, "n": n} for k, n in tl["errors_by_kind"].items()], "kind=kind|requests=n"),
        "",
    ]
    kinds = list(tl["errors_by_kind"])[:8]
    if kinds:
        lines += [
            "Errors by fault window (from a fault to the next):",
            "",
            table(
                [{**{k: w.get(k, 0) for k in kinds}, "window": w["window"]} for w in tl["errors_by_window"]],
                "window=window" + "".join(f"|{k}={k}" for k in kinds),
            ),
            "",
        ]
    rss_cols = sorted({k for row in tl["per_minute"] for k in row if k.startswith("rss_")})
    lines += [
        "Per minute: requests, latency (ms), errors, and the largest RSS (MB) of each kind of process:",
        "",
        table(
            tl["per_minute"],
            "min=minute|leads=lead_n|lead p50=lead_p50|lead p99=lead_p99|payments=pay_n|pay p50=pay_p50"
            "|pay p99=pay_p99|errors=errors" + "".join(f"|{c[4:].replace('_', ' ')}={c}" for c in rss_cols),
        ),
        "",
        "Memory trend per process (MB; the steepest slope fitted between Redis restarts and database "
        f"outages, after its warm-up — a web worker's first {RSS_SETTLE_S['web worker'] // 60} minutes, "
        "while its settlement journal fills, another's first minute — and "
        f"{RSS_AFTER_FAULT_S['redis_restart']} s after each restart, {RSS_AFTER_FAULT_S['db_outage']} s "
        "after each outage, whose recovery steps memory up to a high-water mark; a process needs "
        f"{RSS_MIN_SPAN_S} s of samples between them to be judged):",
        "",
        table(
            [
                {
                    **r,
                    "slope": r.get("slope_mb_per_h", "not judged (lived too short)"),
                    "growing": {True: "**yes**", False: "no"}.get(r.get("growing"), ""),
                }
                for r in res["rss_trend"]
            ],
            "process=process|lived min=lived_min|first=first_mb|last=last_mb|max=max_mb|slope MB/h=slope"
            "|growing=growing",
        ),
    ]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = res["timeline"]
    fig, (a, b, c) = plt.subplots(3, 1, figsize=(13, 11), sharex=True)
    for k, label in (("L", "leads"), ("P", "payments")):
        pts = tl["series10"][k]
        if pts:
            t = [p[0] / 60 for p in pts]
            a.plot(t, [p[1] for p in pts], lw=1, label=f"{label} p50")
            a.plot(t, [p[2] for p in pts], lw=1, label=f"{label} p99")
    title = f"Soak, {res['meta']['minutes']:g} minutes: latency, memory, errors; faults marked"
    a.set(yscale="log", ylabel="ms (per 10 s)", title=title)
    a.legend(loc="upper left", fontsize=8, ncol=4)
    series = defaultdict(list)
    for s in res["samples"]:
        for key, kb in s["rss_kb"].items():
            series[key].append((s["t"] / 60, kb / 1024))
    colours = dict(zip(ROLES, ("tab:blue", "tab:cyan", "tab:orange", "tab:green", "tab:red", "tab:gray", "tab:purple")))
    labelled = set()
    for key, pts in series.items():
        role = key.split(":")[0]
        label = None if role in labelled else role
        b.plot([p[0] for p in pts], [p[1] for p in pts], lw=1, color=colours.get(role, "k"), label=label)
        labelled.add(role)
    b.set(ylabel="RSS MB (each process)")
    b.legend(loc="upper left", fontsize=8, ncol=4)
    if tl["err10"]:
        xs, heights = [e[0] * 10 / 60 + 1 / 12 for e in tl["err10"]], [e[1] for e in tl["err10"]]
        c.bar(xs, heights, width=1 / 6, color="tab:red", label="failed requests per 10 s")
    c2 = c.twinx()
    pend = [(s["t"] / 60, s.get("pending", 0) + s.get("processing", 0)) for s in res["samples"] if "pending" in s]
    if pend:
        c2.plot([p[0] for p in pend], [p[1] for p in pend], color="tab:green", lw=1, label="settlements queued")
    c.set(xlabel="minutes", ylabel="failed requests / 10 s")
    c2.set_ylabel("settlements queued")
    c.legend(loc="upper left", fontsize=8)
    c2.legend(loc="upper right", fontsize=8)
    short = {"web_worker_kill": "web -9", "buyer_hang": "hang", "rq_worker_kill": "rq -9", "db_outage": "db cut"}
    short |= {"scheduler_kill": "sched -9", "redis_restart": "redis empty", "writer_kill": "writer -9"}
    for f in tl["faults"]:
        for ax in (a, b, c):
            ax.axvline(f["t"] / 60, color="k", alpha=0.35, lw=0.8, ls="--")
        a.annotate(
            short.get(f["kind"], f["kind"]),
            (f["t"] / 60, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=7,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(res: dict, name: str) -> bool:
    """bench/out/<name>.{json,md,png}, then the Soak part (soak.md, soak.png) from every run
    on disk; return whether every invariant held."""
    write_out(f"{name}.json", json.dumps(res, indent=2, default=str))
    write_out(f"{name}.md", render(res))
    plot(res, OUT / f"{name}.png")
    assemble()
    return all(c["ok"] for c in res["checks"])


def assemble() -> None:
    """soak.md: one line per run on disk, then the detail of the longest run with faults."""
    runs = [(path.stem, json.loads(path.read_text())) for path in sorted(OUT.glob("soak-*m.json"))]
    if not runs:
        return
    rows = []
    for _stem, d in runs:
        m, tl, lf = d["meta"], d["timeline"], d["leads"]
        failed = [c["name"] for c in d["checks"] if not c["ok"]]
        row = {"run": f"{m['minutes']:g} min", "date": m["machine"]["date"], "faults": len(m["faults"])}
        row["holds"] = "**not: " + ", ".join(failed) + "**" if failed else "all"
        row["leads"] = sum(lf["lead_finals"].get(k, 0) for k in ("sold", "unsold"))
        row |= {"sold": lf["lead_finals"].get("sold", 0), "payments": d["payments"]["payments_stored"]}
        row["lat"] = f"{tl['lead_latency']['p50']} / {tl['lead_latency']['p99']}"
        row["plat"] = f"{tl['payment_latency']['p50']} / {tl['payment_latency']['p99']}"
        rows.append(row | {"reoffers": lf["reoffers"], "unknown": lf["unknown_attempts_ledger"]})
    main_stem, main = max(runs, key=lambda r: r[1]["meta"]["minutes"])
    text = [
        "`scripts/soak --minutes N` (`soak/run.py`): the Procfile stack — gunicorn with 2 gevent workers, "
        "the RQ worker and the scheduler each restarted by a supervisor when they die — on a throw-away "
        "MariaDB database behind a TCP proxy and a private redis-server, under open-loop traffic from a "
        "process of its own (leads to 4 capped buyers, one flaky and one slow; payment deliveries from the "
        "six providers with repeats), retried as publishers and providers do, while faults are injected "
        "in turn: kill -9 of a gunicorn worker, a buyer hanging 30 s, kill -9 of the RQ worker, the database "
        "cut for 10 s, kill -9 of the scheduler, Redis restarted empty. Then the invariants are checked "
        "against the ledger, the buyers' own records and every answer the clients got.",
        "",
        table(
            rows,
            "run=run|date=date|invariants=holds|faults=faults|leads answered=leads|sold=sold|payments credited=payments|lead p50 / p99 ms=lat|payment p50 / p99 ms=plat|re-offers=reoffers|unknown=unknown",
        ),
        "",
    ]
    notes = Path(__file__).resolve().parent / "NOTES.md"  # the analysis of the runs, by hand
    if notes.exists():
        text += [notes.read_text().strip(), ""]
    text += [f"### The {main['meta']['minutes']:g}-minute run", "", render(main), ""]
    write_out("soak.md", "\n".join(text))
    png = OUT / f"{main_stem}.png"
    if png.exists():
        shutil.copy(png, OUT / "soak.png")


if __name__ == "__main__":  # re-assemble soak.md from the runs on disk
    assemble()
    print(f"wrote {OUT / 'soak.md'}")
