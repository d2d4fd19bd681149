"""What a provider reconciliation run costs per 1,000 payments in its window: pages, HTTP calls
and wall time, for each provider, with the listers as configured (their page sizes and their
pacing under each provider's documented rate limit), against the local server that plays the
four list APIs (testkit/provider_apis.py). Nothing is credited: the listing alone is measured
(the crediting of a missing payment is a webhook's transaction, bench/bench_payments.py).

    python -m bench.reconcile_cost [--payments 1000] [--rounds 3]

Prints a table; writes bench/out/reconcile_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from bench.common import machine_info, write_json
from testkit.provider_apis import ProviderApis
from webhooks.payments import events, providers

AMOUNT = {"paystack": 250050, "flutterwave": Decimal("2500.50"), "monnify": Decimal("2500.50"), "stripe": 250050}


def measure(provider: str, payments: int, rounds: int) -> dict:
    with ProviderApis() as api:
        for i in range(payments):
            api.add(provider, f"{provider}-{i:06}", AMOUNT[provider], f"payer{i}@example.com")
        lister = providers.listers(api.config())[provider]
        now = datetime.now(timezone.utc)
        seconds, pages, calls, listed = [], 0, 0, 0
        for _ in range(rounds):
            started = time.perf_counter()
            pages = calls = listed = 0
            for page in lister.pages(now - timedelta(days=3), now):
                pages, calls = pages + 1, calls + page.calls
                listed += sum(1 for body in page.bodies if events.parse(provider, body).succeeded)
            seconds.append(time.perf_counter() - started)
        assert listed == payments, (provider, listed)
        return {
            "provider": provider,
            "payments": payments,
            "pages": pages,
            "calls": calls,
            "min_interval_s": lister.min_interval_s,  # type: ignore[attr-defined]
            "seconds_median": statistics.median(seconds),
            "seconds": seconds,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for provider in ("paystack", "flutterwave", "monnify", "stripe"):
        rows.append(measure(provider, args.payments, args.rounds))
        r = rows[-1]
        print(
            f"{provider}: {r['pages']} pages, {r['calls']} calls, {r['seconds_median']:.2f} s (median of {args.rounds})"
        )
    print()
    print(f"| provider | pages | calls | pace between calls | wall time (median of {args.rounds}) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['provider']} | {r['pages']} | {r['calls']} | {r['min_interval_s']} s | {r['seconds_median']:.2f} s |"
        )
    write_json("reconcile_cost.json", {"machine": machine_info(), "rows": rows})


if __name__ == "__main__":
    main()
