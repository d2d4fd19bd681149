"""What a publisher's field spec costs per lead: `FieldSpec.apply` (webhooks/leads/quality.py)
on a lead of 8 declared fields (e-mail, phone, ZIP, integer, enum, number, string, boolean)
and on the same lead with every field broken, against the parse the lead path already does
(strict JSON of the body and parse_lead), measured in the same run, interleaved.

    python -m bench.quality_cost [--rounds 7] [--leads 2000]

Prints a table of medians (µs per lead); writes bench/out/quality_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.common import machine_info, write_json
from webhooks import strictjson
from webhooks.errors import InvalidLead
from webhooks.leads.intake import parse_lead
from webhooks.leads.quality import parse_spec

SPEC = {
    "email": {"type": "email", "required": True},
    "phone": {"type": "phone", "required": True, "region": "US"},
    "zip": {"type": "postal_code"},
    "age": {"type": "integer", "min": 18, "max": 99},
    "state": {"type": "enum", "values": ["TX", "OK", "CA", "NY", "FL"], "required": True},
    "loan_amount": {"type": "number", "min": 500, "max": 50000},
    "first_name": {"type": "string", "max_length": 50},
    "homeowner": {"type": "boolean"},
}
GOOD = {
    "lead_id": "surge-000123",
    "email": " Ada.Lovelace@Example.com ",
    "phone": "(512) 555-0100",
    "zip": "73301",
    "age": "42",
    "state": "tx",
    "loan_amount": "12500.50",
    "first_name": "Ada",
    "homeowner": "yes",
    "utm_source": "search",
}
BAD = {**GOOD, "email": "not-an-email", "phone": "12", "zip": "7330", "age": "abc", "state": "ZZ", "loan_amount": "x"}


def per_lead_us(fn, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--leads", type=int, default=2000)
    args = parser.parse_args()
    spec = parse_spec(SPEC)
    assert spec is not None
    good_raw, bad_raw = json.dumps(GOOD).encode(), json.dumps(BAD).encode()

    def parse(raw: bytes) -> dict:
        return parse_lead(strictjson.loads(raw))[1]

    def refused() -> None:
        try:
            spec.apply(parse(bad_raw))
        except InvalidLead:
            return
        raise AssertionError("the broken lead passed")

    arms = {
        "parse only (strict JSON + parse_lead)": lambda: parse(good_raw),
        "parse + spec, a valid lead": lambda: spec.apply(parse(good_raw)),
        "parse + spec, every field broken": refused,
    }
    samples: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):  # interleaved: each round runs every arm once
        for name, fn in arms.items():
            samples[name].append(per_lead_us(fn, args.leads))
    medians = {name: statistics.median(v) for name, v in samples.items()}
    base = medians["parse only (strict JSON + parse_lead)"]
    print(f"| arm | µs per lead (median of {args.rounds} rounds of {args.leads}) | spec's own cost |")
    print("|---|---|---|")
    for name, us in medians.items():
        extra = "" if us == base else f"{us - base:.1f} µs"
        print(f"| {name} | {us:.1f} | {extra} |")
    write_json("quality_cost.json", {"machine": machine_info(), "medians_us": medians, "samples_us": samples})


if __name__ == "__main__":
    main()
