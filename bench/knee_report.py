"""bench/knee.py's report: the markdown of a run (its steps, CPU and invariants, and a run
before a change beside the one after it) and its plot."""

from __future__ import annotations

from pathlib import Path


def table(headings: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def render(d: dict) -> str:
    t, inv = d["throughput"], d["invariants"]
    out = [
        "### Payment deliveries at 50 connections (wrk; 2,000 payments × 5, shuffled)",
        "",
        table(
            ["", "req/s", "p50 ms", "p99 ms"],
            [
                ["bare Flask endpoint", t["bare"]["rps"], t["bare"]["p50_ms"], t["bare"]["p99_ms"]],
                ["payment deliveries", t["payments"]["rps"], t["payments"]["p50_ms"], t["payments"]["p99_ms"]],
            ],
        ),
        "",
        f"Ratio to the bare ceiling: **{t['ratio']}**. CPU per delivery (ms): "
        + ", ".join(f"{k} {v}" for k, v in t["cpu_ms_per_delivery"].items())
        + f". Both queues drained {t['drain_s']} s after the run. The p50 and p99 here are wrk's, "
        "corrected for coordinated omission (part 35); the open-loop latencies below are each "
        "request's own, from when it was due.",
        "",
    ]
    for name, steps, unit in (("Payment deliveries", d["payments"], "deliveries/s"), ("Leads", d["leads"], "leads/s")):
        out += [
            f"### {name}: open loop, {d['step_seconds']:.0f} s per offered rate",
            "",
            table(
                [
                    f"offered {unit}",
                    "achieved",
                    "p50 ms",
                    "p95 ms",
                    "p99 ms",
                    "answers",
                    "peak queued settlements",
                    "peak queued audit rows",
                    "drained after s",
                ],
                [
                    [
                        s["offered_rate"],
                        s["achieved_rate"],
                        s["p50_ms"],
                        s["p95_ms"],
                        s["p99_ms"],
                        ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items())),
                        s["queue_peaks"].get("settlements", 0),
                        s["queue_peaks"].get("audit_rows", 0),
                        s["drain_s"],
                    ]
                    for s in steps
                ],
            ),
            "",
        ]
        if all("cpu_ms" in s for s in steps):
            names = list(steps[0]["cpu_ms"])
            out += [
                f"CPU ms per answered request by process for each step (its whole CPU, the drain of "
                f"its queues after it included, over the {unit.split('/')[0]} answered; the load "
                f"generator shares the two cores):",
                "",
                table(
                    [f"offered {unit}", *names, "all", "cores busy"],
                    [
                        [
                            s["offered_rate"],
                            *(s["cpu_ms"][n] for n in names),
                            round(sum(s["cpu_ms"].values()), 3),
                            round(sum(s["cpu_ms"].values()) * s["achieved_rate"] / 1000, 2),
                        ]
                        for s in steps
                    ],
                ),
                "",
            ]
    if d.get("before"):
        out += before_after(d["before"], d)
    out += [
        f"Invariants of the same run: {inv['payments_expected']} distinct payments made, "
        f"{inv['payment_rows']} in the ledger (wrk stops after its seconds: the rest of its list is "
        f"never sent; every open-loop payment was answered: {inv.get('credited_answers_open_loop', '?')} "
        f"credited), {inv['wallets_checked']} wallets checked against the payments the ledger holds "
        f"for them, **{inv['wallets_off']} off** ({inv['unexpected_wallets']} unexpected); "
        f"{inv['leads_answered']} leads answered in the open loop, {inv['leads_settled']} settled, "
        f"**{inv['leads_missing']} missing**.",
        "",
        "![latency over offered rate](figures/knee.png)",
        "",
    ]
    return "\n".join(out)


def before_after(before: dict, after: dict) -> list[str]:
    """The payment rows of a run of the code before the payment gate (same bench, run just
    before or after this one on the same machine) beside this run's."""

    def step(d: dict, rate: float) -> dict:
        return next((s for s in d["payments"] if s["offered_rate"] == rate), {})

    rows = [
        [
            "deliveries/s at 50 connections (wrk)",
            before["throughput"]["payments"]["rps"],
            after["throughput"]["payments"]["rps"],
        ],
        ["ratio to the bare endpoint", before["throughput"]["ratio"], after["throughput"]["ratio"]],
        [
            "web CPU ms per delivery",
            before["throughput"]["cpu_ms_per_delivery"]["web (2 gunicorn workers)"],
            after["throughput"]["cpu_ms_per_delivery"]["web (2 gunicorn workers)"],
        ],
        [
            "mariadbd CPU ms per delivery",
            before["throughput"]["cpu_ms_per_delivery"]["mariadbd"],
            after["throughput"]["cpu_ms_per_delivery"]["mariadbd"],
        ],
    ]
    for rate in (300.0, 500.0, 600.0):
        b, a = step(before, rate), step(after, rate)
        if b and a:
            rows.append(
                [
                    f"open loop {rate:.0f}/s: p50 / p99 ms",
                    f"{b['p50_ms']} / {b['p99_ms']}",
                    f"{a['p50_ms']} / {a['p99_ms']}",
                ]
            )
    return [
        "### Payments before and after the Redis-only repeats",
        "",
        f"Before: the code as it was ({before.get('commit', '?')}), every repeat writing its audit row "
        "and four Redis round trips per first delivery; after: one script for dedupe + claim + the "
        "repeat's queued row, one for marker + release. Same bench, run back to back.",
        "",
        table(["", "before", "after"], rows),
        "",
    ]


def plot(d: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    # the p99 targets (bench/report.py's Targets): payments at 300/s, leads at 600/s
    for ax, (name, steps, target) in zip(axes, (("payment deliveries", d["payments"], 50), ("leads", d["leads"], 100))):
        rates = [s["offered_rate"] for s in steps]
        ax.plot(rates, [s["p50_ms"] for s in steps], "o-", label="p50")
        ax.plot(rates, [s["p99_ms"] for s in steps], "s-", label="p99")
        ax.axhline(target, color="grey", ls=":", label=f"p99 target {target} ms")
        ax.set_yscale("log")
        ax.set_xlabel(f"offered {name}/s (open loop)")
        ax.set_ylabel("latency from due time, ms")
        ax2 = ax.twinx()
        ax2.plot(rates, [s["achieved_rate"] for s in steps], "^--", color="tab:green", alpha=0.6)
        ax2.set_ylabel("achieved/s", color="tab:green")
        ax.set_title(name)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
