"""A simulated lead market: `epl` routing against fixed orders and an oracle (issue #63).

Six buyers with hidden accept and return rates and prices (BUYERS), two of which change midway;
two are ping/post buyers that bid on some leads only, a bid drawn per lead around their stated
bid, one of which bids high and takes few of the posts it wins. Each lead is offered in a
policy's order and the first yes buys it at its price now (a waterfall, every buyer offered
unless `--depth` cuts it); the sale is returned, some leads later, with the buyer's return rate.
Every policy sees the same market: each lead's bids and each buyer's yes and return are drawn
once per seed, so two policies differ only by their orders. Policies:

- epl: the product's own `earnings.rank` over `earnings.Tally`s counted as settlement and
  returns count them: an offer, a yes and its price in the lead's day, a return (its price out)
  in its sale's day; the window is the publisher's default 7 days, a day being DAY leads, its
  days weighed by `earnings.weigh` with the default half-life (12 hours); `epl flat` weighs them
  alike (EPL_HALF_LIFE_HOURS 0);
- price: highest price now first (a ping/post buyer's bid for this lead), Floodgate's `price`;
- bid: the stated prices and bids as a fixed order (a `waterfall` set up by them);
- oracle: the true price now x accept x (1 - return) of each buyer, highest first;
- net: the true price now x (1 - return), highest first, which is the most a whole waterfall
  can earn (swapping two neighbours changes only leads both would take: the better price wins).

Revenue is each lead's sale price unless it is returned, per 1,000 leads.

    python -m bench.market [--leads 50000] [--seeds 5] [--depth 0 2]
"""

from __future__ import annotations

import argparse
import heapq
import random
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import common
from webhooks.config import Config
from webhooks.leads.rules import earnings

DAY = 1_000  # leads a day: a publisher of ~1,000 leads a day, so 50,000 leads are 7 weeks
WINDOW = 7  # days, the default epl_window_days: today and the 6 days before
BLOCK = 1_000  # leads per point of the plot
POLICIES = ("epl", "epl flat", "price", "bid", "oracle", "net")
# epl's half-life (days): the product's default EPL_HALF_LIFE_HOURS; "epl flat" weighs the
# window's days alike (EPL_HALF_LIFE_HOURS 0), as the contract's figure does
HALF_LIFE = {"epl": Config.epl_half_life_hours / 24, "epl flat": 0.0}


@dataclass(frozen=True)
class Buyer:
    id: str
    price: float  # its price; a ping/post buyer's stated bid (each of its bids drawn around it)
    accept: float  # chance it says yes to an offer (a ping/post buyer: to the post of a won ping)
    returns: float  # chance a sale to it is returned
    change: tuple[float, float, float] | None = None  # (from which share of the run, accept, returns)
    bids: float = 0.0  # a ping/post buyer: chance it bids on a lead (0: a fixed price)

    def rates(self, i: int, leads: int) -> tuple[float, float]:
        if self.change and i >= self.change[0] * leads:
            return self.change[1], self.change[2]
        return self.accept, self.returns


BUYERS = (
    Buyer("steady", 12.0, 0.80, 0.05),
    Buyer("cheap", 8.0, 0.95, 0.02),
    Buyer("fades", 20.0, 0.90, 0.05, change=(0.5, 0.10, 0.05)),  # yes 0.9 -> 0.1 at lead 25,000
    Buyer("mends", 24.0, 0.60, 0.50, change=(0.7, 0.60, 0.05)),  # returns 0.5 -> 0.05 at 35,000
    Buyer("overbids", 30.0, 0.15, 0.10, bids=0.7),  # bids high, takes few posts
    Buyer("pingpost", 16.0, 0.70, 0.10, bids=0.8),
)
CHANGES = sorted({b.change[0] for b in BUYERS if b.change})

# One lead: per buyer (its price now, or None without a bid; the draw its yes must beat; the
# draw its return must beat), and how many leads after its sale a return arrives
Lead = tuple[list[tuple[float | None, float, float]], int]


def market(seed: int, leads: int) -> list[Lead]:
    rng = random.Random(seed)
    out = []
    for _ in range(leads):
        row = []
        for b in BUYERS:
            bid = round(b.price * rng.uniform(0.7, 1.3), 2) if not b.bids or rng.random() < b.bids else None
            row.append((bid, rng.random(), rng.random()))
        out.append((row, rng.randrange(1, 3 * DAY)))
    return out


def run(policy: str, lead_list: list[Lead], seed: int, depth: int) -> list[float]:
    """Each lead's revenue net of its return under `policy`."""
    n, rng = len(lead_list), random.Random(f"epl {seed}")  # Thompson's draws, apart from the market's
    days: dict[int, dict[str, list[int]]] = {}  # day: buyer: [offers, accepted, returned, earned_cents]
    window: dict[str, list[int]] = {b.id: [0, 0, 0, 0] for b in BUYERS}  # their sum over the window
    returns: list[tuple[int, int, str, int]] = []  # (due lead, sale's day, buyer, cents), a heap

    def count(day: int, buyer: str, change: tuple[int, int, int, int], today: int) -> None:
        if day <= today - WINDOW:  # a return of a sale whose day has left the window
            return
        for sums in (days.setdefault(day, {}).setdefault(buyer, [0, 0, 0, 0]), window[buyer]):
            for k in range(4):
                sums[k] += change[k]

    net: list[float] = []
    past: dict[str, earnings.Tally] = {}  # the days before today, weighed by age (earnings.weigh)
    stale = True
    for i, (row, delay) in enumerate(lead_list):
        today = i // DAY
        if i % DAY == 0:  # a new day: the oldest leaves the window
            for buyer, sums in days.pop(today - WINDOW, {}).items():
                window[buyer] = [w - s for w, s in zip(window[buyer], sums, strict=True)]
            stale = True
        while returns and returns[0][0] <= i:
            _, day, buyer, cents = heapq.heappop(returns)
            count(day, buyer, (0, 0, 1, -cents), today)
            stale = stale or day < today  # a past day changed: weighed again before the next order
        offers = [(b, p, u_yes, u_back) for b, (p, u_yes, u_back) in zip(BUYERS, row, strict=True) if p is not None]
        if policy in HALF_LIFE and stale:  # the product's weighing, today (age 0) left out for now
            before = [_tallies(days.get(d, {})) for d in range(today - WINDOW + 1, today)]
            past, stale = earnings.weigh([*before, {}], HALF_LIFE[policy]), False
        if policy in HALF_LIFE:  # what the claim's round trip reads: the past, and today in full
            now = earnings.weigh([past, _tallies(days.get(today, {}))], 0)
            order = earnings.rank(offers, now, rng, key=lambda o: (o[0].id, o[1], 0))
        else:
            order = ORDERS[policy](offers, i, n, window, rng)
        sold = 0.0
        for b, price, u_yes, u_back in order[: depth or None]:
            accept, back = b.rates(i, n)
            yes = u_yes < accept
            count(today, b.id, (1, int(yes), 0, round(price * 100) * yes), today)
            if yes:
                if u_back < back:
                    heapq.heappush(returns, (i + delay, today, b.id, round(price * 100)))
                else:
                    sold = price
                break
        net.append(sold)
    return net


def _tallies(day: dict[str, list[int]]) -> dict[str, earnings.Tally]:
    return {b: earnings.Tally(*sums) for b, sums in day.items()}


def _true(o, i, n, with_accept):  # what an offer earns by the buyer's true rates now
    accept, back = o[0].rates(i, n)
    return o[1] * (accept if with_accept else 1) * (1 - back)


ORDERS: dict[str, Callable[..., list]] = {
    "price": lambda offers, *_: sorted(offers, key=lambda o: (-o[1], o[0].id)),
    "bid": lambda offers, *_: sorted(offers, key=lambda o: (-o[0].price, o[0].id)),
    "oracle": lambda offers, i, n, *_: sorted(offers, key=lambda o: (-_true(o, i, n, True), o[0].id)),
    "net": lambda offers, i, n, *_: sorted(offers, key=lambda o: (-_true(o, i, n, False), o[0].id)),
}


def per_1000(net: list[float], start: int, end: int) -> float:
    """Revenue per 1,000 leads over leads start..end (cut at the run's end)."""
    return sum(net[start:end]) * 1000 / max(1, len(net[start:end]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--leads", type=int, default=common.quick(50_000, 5_000))
    ap.add_argument("--seeds", type=int, default=common.quick(5, 1))
    ap.add_argument("--depth", type=int, nargs="+", default=[0, 2], help="most buyers offered a lead (0: all)")
    args = ap.parse_args(argv)
    n, seeds = args.leads, range(1, args.seeds + 1)
    markets = {seed: market(seed, n) for seed in seeds}
    parts, curves, goals = [], {}, {}
    for depth in args.depth:
        nets = {(p, s): run(p, markets[s], s, depth) for s in seeds for p in POLICIES}
        text, curves[depth], goals[depth] = summary(nets, seeds, n, depth)
        parts.append(text)
    head = f"{len(seeds)} seeds (medians), {n:,} leads; {DAY:,} leads a day, a window of {WINDOW} days"
    text = "\n\n".join([head, *parts])
    print(text)
    common.write_md("market.md", text)
    common.write_json("market.json", {"machine": common.machine_info(), "args": vars(args), "goals": goals})
    plot(curves, n, head)
    return 0


def summary(nets: dict[tuple[str, int], list[float]], seeds: range, n: int, depth: int) -> tuple[str, dict, list]:
    """One depth's table (a row per tenth of the run), its goals, and its plot's curves."""

    def ratio(start: int, end: int, to: str = "oracle") -> float:
        return statistics.median(
            per_1000(nets["epl", s], start, end) / per_1000(nets[to, s], start, end) for s in seeds
        )

    def curve(p: str, step: int) -> list[float]:
        return [statistics.median(per_1000(nets[p, s], k, k + step) for s in seeds) for k in range(0, n, step)]

    span = max(BLOCK, n // 10)
    tenths = {p: curve(p, span) for p in POLICIES}
    rows = [
        {"leads": f"{k * span:,}–{min(n, (k + 1) * span):,}", "ratio": f"{ratio(k * span, (k + 1) * span):.3f}"}
        | {p: f"{tenths[p][k]:,.0f}" for p in POLICIES}
        for k in range(len(tenths["epl"]))
    ]
    warm = min(2_000, n // 2)
    aims = {"oracle": " (goal ≥ 0.95)", "price": " (goal > 1)", "bid": " (goal > 1)", "net": "", "epl flat": ""}
    goals = [f"epl / {p} over leads {warm:,}–{n:,}: {ratio(warm, n, p):.3f}{aims[p]}" for p in POLICIES[1:]]
    for share in CHANGES:
        c = int(share * n)
        after = [f"{ratio(c + k, c + k + BLOCK):.3f}" for k in range(0, 3 * BLOCK, BLOCK) if c + k < n]
        goals.append(
            f"change at lead {c:,}: epl / oracle in each 1,000 leads after it: {', '.join(after)} (goal: ≥ 0.95 by the third)"
        )
    cols = (("leads", "leads"), *((f"{p} /1,000", p) for p in POLICIES), ("epl / oracle", "ratio"))
    title = f"Depth {depth or 'all'}: {'every buyer' if not depth else f'at most {depth} buyers'} offered a lead"
    text = "\n".join([f"### {title}", "", common.markdown_table(rows, cols), "", *(f"- {g}" for g in goals)])
    return text, {p: curve(p, BLOCK) for p in POLICIES}, goals


def plot(curves: dict[int, dict[str, list[float]]], n: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False, sharey=True)
    for ax, (depth, by_policy) in zip(axes[0], curves.items(), strict=True):
        for policy, ys in by_policy.items():
            ax.plot([(k + 0.5) * BLOCK for k in range(len(ys))], ys, label=policy, lw=2.5 if policy == "epl" else 1)
        for share in CHANGES:
            ax.axvline(share * n, color="grey", ls=":")
        ax.set(xlabel="lead", title=f"depth {depth or 'all'}")
    axes[0][0].set_ylabel("revenue net of returns per 1,000 leads")
    axes[0][0].legend()
    fig.suptitle(title, fontsize=9)
    png = common.OUT / "market.png"
    fig.savefig(png, dpi=100, bbox_inches="tight")
    if not common.QUICK:  # the report's copy
        shutil.copy(png, Path(__file__).resolve().parent / "figures" / "market.png")
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
