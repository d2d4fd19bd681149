"""Assemble bench/REPORT.md from the fragments the benchmarks wrote to bench/out/ (their own
output: no figure here is typed by hand), with the machine's description and the date. Parts
no longer measured are frozen in bench/history/, which the report's History section links."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench.common import OUT, machine_info

REPORT = ROOT / "bench" / "REPORT.md"
FIGURES = ROOT / "bench" / "figures"
PARTS = [
    (
        "matrix",
        "1. The concurrency matrix",
        "The seed article's five ways to enforce a cap of 100, under its chaos test and a harder "
        "burst, against the same MariaDB and Redis in one run (`scripts/bench matrix`, `bench/matrix.py`).",
    ),
    (
        "payments",
        "3. Payment webhooks",
        "2,000 distinct payments, each delivered 5 times concurrently (`bench/bench_payments.py`).",
    ),
    (
        "soak",
        "6. Soak under faults",
        "Hours of mixed traffic on the whole Procfile stack while its processes die (`scripts/soak`, "
        "`soak/run.py`); not part of `scripts/bench`, which takes minutes.",
    ),
    (
        "knee",
        "10. Latency over offered rate (the knee)",
        "Payment deliveries against the bare endpoint, and open-loop latency over stepped offered rates "
        "for both paths, with the invariants of the same run (`bench/knee.py`, wrk, `bench/openloop.py`).",
    ),
    (
        "galera",
        "42. Payments per second: one MariaDB node against the Galera cluster",
        "Payment webhooks on one private mariadbd and on the 3-node Galera cluster behind HAProxy, arms "
        "alternated in one run (`python -m bench.galera`, `bench/galera.py`; issue 66).",
    ),
    (
        "levers",
        "11. One lever at a time",
        "A lever's effect on both paths, A/B in one run with the arms alternated (`bench/levers.py`).",
    ),
    (
        "profile",
        "12. What bounds each path",
        "Where a web worker's CPU goes at 50 connections, by py-spy (`bench/profile.py`).",
    ),
]


INDEX = """\
What is here, and the command that measures it again (each part names its own; `scripts/bench`
runs them all, `scripts/bench --quick` each briefly):

- [Targets](#targets): the performance targets, each with its latest figure.
- [1. The concurrency matrix](#1-the-concurrency-matrix): `scripts/bench matrix`.
- [3. Payment webhooks](#3-payment-webhooks): `python -m bench.bench_payments`.
- [6. Soak under faults](#6-soak-under-faults): `scripts/soak --minutes 60`.
- [10. The knee](#10-latency-over-offered-rate-the-knee): `python -m bench.knee`.
- [42. One MariaDB node against the Galera cluster](#42-payments-per-second-one-mariadb-node-against-the-galera-cluster): `python -m bench.galera`.
- [24. The lead search at 6 million ledger rows](#24-the-lead-search-at-6-million-ledger-rows): a one-off, script last in `0898d73`.
- [44. Every console and portal page at 6 million leads](#44-every-console-and-portal-page-at-6-million-leads): `python -m bench.pages`.
- Floodgate against the plain seed: `python -m bench.versus`.
- 41. The latest part (the lead path's batches): `bench.levers`, `bench.profile`, `bench.calls`.
- [History](#history): every older part as text, with the commit to rerun it from.
"""


def _median(rows: list[dict], key: str) -> float | None:
    values = sorted(r[key] for r in rows if r.get(key) is not None)
    return values[len(values) // 2] if values else None


def _step(steps: list[dict], rate: float) -> dict | None:
    return next((s for s in steps if float(s.get("offered_rate", -1)) == rate), None)


def summary() -> list[str]:
    """The performance targets (issue "Performance"), each with the figure of the last run that
    measured it (bench/out/levers-*.json: the arm running this checkout, medians of its rounds;
    bench/out/knee.json: open loop) and whether it is met."""
    rows: list[tuple[str, str, str, str]] = []  # target, figure, met, from
    lever = None
    for path in sorted(OUT.glob("levers-*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        data = json.loads(path.read_text())
        if data.get("mix") == "first":
            lever = data
            break
    if lever is not None:
        arm = lever["arms"].get(lever["lever"]) if lever["lever"] == "code" else lever["arms"]["base"]
        where = f"levers ({lever['lever']}; {lever['machine'].get('date', '?')[:10]})"
        for target, key, limit, better in (
            ("lead path ≥ 0.2 of bare (c=50, 20 ms buyer)", "lead_ratio", 0.2, "high"),
            ("web CPU per lead ≤ 1.2 ms", "lead_web_cpu_ms", 1.2, "low"),
            ("first payment deliveries ≥ 0.2 of bare (6,000 Paystack × 5)", "pay_ratio", 0.2, "high"),
        ):
            value = _median(arm or [], key)
            met = (
                "—"
                if value is None
                else ("met" if (value >= limit if better == "high" else value <= limit) else "not met")
            )
            rows.append((target, "—" if value is None else f"{value:g}", met, where))
    else:
        rows += [(t, "not measured", "—", "") for t in ("lead path ≥ 0.2 of bare", "first payments ≥ 0.2 of bare")]
    knee = OUT / "knee.json"
    if knee.exists():
        data = json.loads(knee.read_text())
        where = f"knee ({data['machine'].get('date', '?')[:10]})"
        lead = _step(data.get("leads", []), 600.0)
        rows.append(
            (
                "lead p99 < 100 ms at 600 leads/s offered",
                "not measured" if lead is None else f"{lead['p99_ms']} ms (achieved {lead['achieved_rate']}/s)",
                "—" if lead is None else ("met" if lead["p99_ms"] < 100 else "not met"),
                where,
            )
        )
        pay = _step(data.get("payments", []), 300.0)
        first = data.get("payment_repeats", 5) == 1
        rows.append(
            (
                "payment p99 < 50 ms at 300 first deliveries/s offered",
                "not measured"
                if pay is None
                else f"{pay['p99_ms']} ms ({'first deliveries' if first else 'each payment 5 times'})",
                "—" if pay is None or not first else ("met" if pay["p99_ms"] < 50 else "not met"),
                where,
            )
        )
    versus = OUT / "versus.json"
    if versus.exists():
        data = json.loads(versus.read_text())
        where = f"versus ({data['machine'].get('date', '?')[:10]})"
        for target, key in (
            ("leads ≥ 1.0× the plain seed (c=50, same run)", "lead_rps"),
            ("first payment deliveries ≥ 1.0× the plain seed", "first_rps"),
            ("duplicate-heavy payments ≥ 1.0× the plain seed", "dup_rps"),
        ):
            ours, theirs = _median(data["arms"]["floodgate"], key), _median(data["arms"]["plain"], key)
            if ours is None or not theirs:
                rows.append((target, "not measured", "—", where))
                continue
            rows.append((target, f"{ours / theirs:.2f}", "met" if ours >= theirs else "not met", where))
    out = ["## Targets", "", "| target | figure | met | measured by |", "|---|---|---|---|"]
    out += [f"| {t} | {f} | {m} | {w} |" for t, f, m, w in rows]
    return out + [""]


def _part_text(name: str) -> str | None:
    """A part's markdown from bench/out: `levers` is every lever measured (levers-*.md, oldest
    first), the others their own <name>.md."""
    if name == "levers":
        found = sorted(OUT.glob("levers-*.md"), key=lambda p: p.stat().st_mtime)
        if found:
            return "\n\n".join(p.read_text().strip() for p in found)
    md = OUT / f"{name}.md"
    return md.read_text() if md.exists() else None


def _fragment(text: str) -> str:
    """A part's own markdown, nested under its section: headings one level down (two #s
    more), and its image lines dropped (the report links the copied figure itself)."""
    lines = []
    for line in text.strip().splitlines():
        if line.startswith("!["):
            continue
        lines.append("##" + line if line.startswith("#") else line)
    return "\n".join(lines).strip()


def _sections(report: str) -> dict[str, str]:
    """The body of each `## <title>` section of an existing report."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in report.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {title: "\n".join(lines).strip() for title, lines in sections.items()}


def main() -> int:
    FIGURES.mkdir(exist_ok=True)
    info = machine_info()
    out = [
        "# Floodgate benchmarks",
        "",
        f"Generated by `scripts/bench` on {info['date']}: {info['nproc']} CPUs ({info['cpu_model']}), "
        f"{info['os']}, Python {info['python']}. The machine is shared and noisy; compare figures "
        "within one run (each part measures its baseline in the same run), and read each part's "
        "load average.",
        "",
        INDEX,
        *summary(),
    ]
    kept = _sections(REPORT.read_text()) if REPORT.exists() else {}
    kept.pop("Targets", None)
    for name, title, intro in PARTS:
        text, data = _part_text(name), OUT / f"{name}.json"
        if text is None:
            if title in kept:  # not measured in this run: keep the section of the last run that did
                out += [f"## {title}", "", kept[title], ""]
            continue
        out += [f"## {title}", "", intro, ""]
        if data.exists():
            machine = json.loads(data.read_text()).get("machine", {})
            if machine:
                out += [
                    f"Measured {machine.get('date', '?')}; load average {machine.get('loadavg_1m_5m_15m')}; "
                    + ", ".join(
                        f"{k} {v}" for k, v in machine.items() if k in ("redis", "database", "mariadb", "redis_version")
                    ),
                    "",
                ]
        out += [_fragment(text), ""]
        png = OUT / f"{name}.png"
        if png.exists():
            shutil.copy(png, FIGURES / png.name)
            out += [f"![{title}](figures/{png.name})", ""]
    # Parts written by hand (a bench that writes no fragment, e.g. part 23's micro-benchmark
    # table, or part 24's run against a loaded ledger): kept as they are, in their order.
    generated = {title for _, title, _ in PARTS} | {"Targets", "History"}
    for title, text in kept.items():
        if title not in generated:
            out += [f"## {title}", "", text, ""]
    if "History" in kept:
        out += ["## History", "", kept["History"], ""]
    REPORT.write_text("\n".join(out))
    print(f"wrote {REPORT}")
    return 0


def splice_part(name: str) -> int:
    """Put one part's section into the existing report, leaving every other section as it is
    (`--part soak`: a soak runs alone, for an hour, not with scripts/bench)."""
    title, intro = next((t, i) for n, t, i in PARTS if n == name)
    text = _part_text(name)
    if text is None:
        print(f"no {OUT / name}.md: run the part first")
        return 1
    FIGURES.mkdir(exist_ok=True)
    section = [f"## {title}", "", intro, "", _fragment(text), ""]
    png = OUT / f"{name}.png"
    if png.exists():
        shutil.copy(png, FIGURES / png.name)
        section += [f"![{title}](figures/{png.name})", ""]
    lines = REPORT.read_text().rstrip("\n").split("\n") if REPORT.exists() else ["# Floodgate benchmarks", ""]
    start = next((i for i, line in enumerate(lines) if line == f"## {title}"), None)
    if start is None:
        lines += [""] + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    targets = summary()
    start = next((i for i, line in enumerate(lines) if line == "## Targets"), None)
    if start is None:  # above the first section
        start = end = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    lines[start:end] = targets
    REPORT.write_text("\n".join(lines).rstrip("\n") + "\n")
    print(f"wrote the {title!r} section and the targets of {REPORT}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--part":
        sys.exit(splice_part(sys.argv[2]))
    sys.exit(main())
