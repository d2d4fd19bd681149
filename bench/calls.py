"""CPU and Python calls per first payment delivery, or per lead sold, in one process: the whole
Flask app (the request id, the view, and for a payment verification, parsing, the gate, the
credit, the finish, the answer; for a lead its claim, routing, the buyer's post, the lease's
end and the settlement queued) on MariaDB and a private Redis, without gunicorn, gevent's
monkey-patching or a load generator. The end-to-end benches resolve a change of about 5 % at
best on this shared machine; the calls a request makes (cProfile) are the same run after run,
and CPU per request with nothing else in the process moves by 2-3 %, so a lever of a few per
cent shows here first.

    python -m bench.calls [--path payments|leads] [--base-rev REV] [--deliveries 1500]
                          [--batches 7] [--rounds 2] [--shared N | --epl] [--buyer-delay-ms 0]

Each arm is a child process on a worktree of its revision (HEAD, and REV when given), with a
database and a Redis of its own (and for leads the buyer stub, answering at once, in a
process of its own); the arms alternate for `--rounds`. A child sends fresh requests (signed
Paystack payments from testkit/payments.py, or leads without an id), 300 to warm up, then
`--batches` batches of `--deliveries`, timing each with `time.process_time`; then one more
batch under cProfile for the calls. Writes bench/out/calls.md and calls.json (calls-leads.*
for leads). With `--shared N` (leads), the arms are HEAD twice: its buyer exclusive, and N
shared buyers at the same stub that each buy every lead (the publisher's max_sales N): what a
shared lead costs beside an exclusive one, per lead and per sale (calls-shared.*). With `--epl`,
HEAD twice with three buyers alike: routed by priority (waterfall), and by `epl` (calls-epl.*).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # run as a script (a child): bench/ itself off the path, where its
    # profile.py would stand for the standard library's (cProfile imports it)
    if sys.path and Path(sys.path[0]).resolve() == ROOT / "bench":
        sys.path.pop(0)
    if "--child" not in sys.argv:
        sys.path.insert(0, str(ROOT))

# Nothing of bench/ or testkit/ at the top: a child imports them from its arm's worktree, which
# may predate any name imported here (a child of c94b12a failed on `bench.stack.log`). The parent
# imports what it needs where it needs it; a child uses only webhooks/ and testkit/payments.py.

STDLIB = os.path.dirname(os.__file__) + "/"


def package(filename: str) -> str:
    """Where a profiled function lives: a site-package, a module of webhooks/, the standard
    library's module, or `~` for built-ins."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/webhooks/" in filename:
        return "webhooks/" + filename.split("/webhooks/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if filename.startswith(STDLIB):
        return "stdlib " + filename[len(STDLIB) :].split("/", 1)[0].removesuffix(".py")
    return "built-ins" if filename == "~" else filename.rsplit("/", 1)[-1]


def _environ(path: str, raw: bytes, headers: dict[str, str]) -> dict:
    """A POST as gunicorn hands it to the app (the body read whole: wsgi.input_terminated)."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input_terminated": True,
        "wsgi.errors": sys.stderr,
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
    }
    for name, value in headers.items():
        if name.lower() != "content-type":
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    return environ


def _sell_to(app, network: list) -> None:
    """bench/stack.py's network (the admin PUTs of its publisher and buyer), set up through the
    admin API in process; returns once a lead is sold (the app has read it). The parent passes
    the PUTs: a child's bench/ is its arm's worktree, which may predate stack.network."""
    client, admin = app.test_client(), {"Authorization": f"Bearer {os.environ['ADMIN_TOKEN']}"}
    for path, body in network:
        answer = client.put(path, headers=admin, json=body)
        if answer.status_code >= 300:
            raise SystemExit(f"PUT {path}: {answer.status_code} {answer.get_data(as_text=True)}")
    deadline = time.monotonic() + 60
    while True:
        answer = client.post(
            "/v1/leads", headers={"Authorization": f"Bearer {_api_key(network)}"}, json={"state": "TX"}
        )
        if answer.status_code == 200 and answer.get_json().get("status") == "sold":
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the app does not sell: {answer.status_code} {answer.get_data(as_text=True)}")
        time.sleep(0.2)


def _api_key(network: list) -> str:
    """The publisher's key, from the PUTs the parent passed (not imported: see _sell_to)."""
    return str(next((body["api_key"] for _, body in network if "api_key" in body), ""))


def child(deliveries: int, batches: int, path: str = "payments", network: list | None = None) -> dict:
    """Measure the code this process imports (the caller set sys.path and the environment)."""
    import cProfile
    import pstats
    import random

    from testkit.payments import encode, payload, signed_headers
    from webhooks import create_app

    app = create_app()
    rng = random.Random(16)
    tag = f"calls{os.getpid()}"
    sent = 0
    if path == "leads":
        _sell_to(app, network or [])

    def batch(n: int) -> list[tuple[dict, bytes]]:
        nonlocal sent
        out = []
        for i in range(sent, sent + n):
            if path == "leads":  # no lead_id: every lead is new
                raw = json.dumps({"state": "TX", "email": f"l{i}@x.io"}).encode()
                out.append((_environ("/v1/leads", raw, {"Authorization": f"Bearer {_api_key(network or [])}"}), raw))
                continue
            raw = encode(payload("paystack", f"{tag}-{i}", rng.randint(100, 50_000_000), "NGN", f"p{i % 500}@x.io"))
            out.append((_environ("/v1/webhooks/paystack", raw, signed_headers("paystack", raw)), raw))
        sent += n
        return out

    statuses: Counter[str] = Counter()

    def start_response(status: str, headers: list, exc_info: object = None) -> object:
        statuses[status] += 1
        return lambda _data: None

    def answer(environ: dict, raw: bytes) -> Iterable[bytes]:
        return app(dict(environ, **{"wsgi.input": io.BytesIO(raw)}), start_response)

    def send(requests: list[tuple[dict, bytes]]) -> None:
        for environ, raw in requests:
            for _ in answer(environ, raw):
                pass

    def outcomes(requests: list[tuple[dict, bytes]]) -> Counter[str]:
        """What the app answered these requests: their "status"."""
        return Counter(json.loads(b"".join(answer(environ, raw)))["status"] for environ, raw in requests)

    quick = os.environ.get("FG_BENCH_QUICK") == "1"  # bench.common.quick's test, which a child lacks
    send(batch(10 if quick else 300))  # warm-up
    cpu_us, wall_ms = [], []
    for _ in range(batches):
        requests = batch(deliveries)
        started, clock = time.process_time(), time.perf_counter()
        send(requests)
        cpu_us.append((time.process_time() - started) / deliveries * 1e6)
        wall_ms.append((time.perf_counter() - clock) / deliveries * 1e3)
    requests = batch(deliveries)
    profile = cProfile.Profile()
    profile.enable()
    send(requests)
    profile.disable()
    calls: Counter[str] = Counter()
    for (filename, _line, _name), (_cc, ncalls, *_rest) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        calls[package(filename)] += ncalls
    wanted = "sold" if path == "leads" else "credited"
    checked = outcomes(batch(10 if quick else 100))  # after the timed batches: what they were answered too
    if set(statuses) != {"200 OK"} or set(checked) != {wanted}:
        raise SystemExit(f"not every request was {wanted}: {dict(statuses)}, {dict(checked)}")
    return {
        "cpu_us": [round(x, 1) for x in cpu_us],
        "cpu_us_median": round(statistics.median(cpu_us), 1),
        "wall_ms_median": round(statistics.median(wall_ms), 2),
        "calls": round(sum(calls.values()) / deliveries, 1),
        "calls_by_package": {k: round(v / deliveries, 1) for k, v in calls.most_common()},
    }


def varied_network(network: list[tuple[str, dict]], variant: dict) -> list[tuple[str, dict]]:
    """bench/stack.py's network as an arm varies it: its publisher with `variant["publisher"]`'s
    fields, its one buyer in `variant["copies"]` copies at the same stub (priorities 1..), each
    with `variant["buyer"]`'s fields."""
    out = []
    for path, body in network:
        if path.startswith("/v1/admin/publishers/"):
            out.append((path, {**body, **variant.get("publisher", {})}))
        else:
            copies = variant.get("copies", 1)
            out += [
                (f"{path}{i or ''}", {**body, "priority": i + 1, **variant.get("buyer", {})}) for i in range(copies)
            ]
    return out


def shared(sales: int) -> dict:
    """The variant whose publisher sells each lead to `sales` shared buyers, each buying it."""
    return {"publisher": {"sell": {"max_sales": sales}}, "copies": sales, "buyer": {"contract": "shared"}}


def one_arm(
    code: Path, deliveries: int, batches: int, path: str = "payments", variant: dict | None = None, delay_ms: int = 0
) -> dict:
    """A child process measuring `code` on its own Redis and database (and buyer stub, replying
    after `delay_ms`); its network varied as `variant` says (varied_network)."""
    from bench import stack as stack_mod  # in the parent (the working tree's bench/), see _sell_to
    from testkit.servers import venv_bin

    with ExitStack() as es:
        tmp = Path(es.enter_context(tempfile.TemporaryDirectory(prefix="fg-calls-")))
        base = stack_mod.base(es, tmp, {"BUYER_DELAY_MS": str(delay_ms)}, mysql_only=True, code=code)
        network = stack_mod.network(base.buyer_stub(es)[1]) if path == "leads" else []
        buyer = ["--network", json.dumps(varied_network(network, variant) if variant else network)] if network else []
        # This file, run as a script, imports webhooks/ (and testkit/) from `code`: a revision
        # from before bench/calls.py existed can be measured too.
        out = subprocess.run(
            [venv_bin("python"), __file__, "--child", "--deliveries", str(deliveries), "--batches", str(batches)]
            + ["--path", path, *buyer],
            env={**base.env, "PYTHONPATH": str(code), "LOG_LEVEL": "warning"},
            cwd=code,
            capture_output=True,
            text=True,
            check=True,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])


def render(d: dict) -> str:
    arms = d["arms"]
    leads = d.get("path") == "leads"
    what, each = ("leads sold", "lead") if leads else ("first Paystack deliveries", "delivery")
    lines = [
        f"### CPU and Python calls per {'lead sold' if leads else 'first payment delivery'}, in process "
        "(bench/calls.py)",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in d['machine'].items())}.",
        "",
        f"{d['rounds']} rounds, arms alternated; per round {d['batches']} batches of {d['deliveries']} {what} "
        "through the Flask app (MariaDB, a private Redis"
        + (
            f"; the buyer stub, in a process of its own, replying after {d.get('buyer_delay_ms') or 0} ms"
            if leads
            else ""
        )
        + f"), CPU per {each} the median of the batches; then one batch under cProfile for the calls. "
        + ", ".join(f"{name} at {rev}" for name, rev in d["revs"].items())
        + ".",
        "",
        f"| arm | CPU µs per {each}, each round | calls per {each} | ms per {each}, each round |",
        "|---|---|---|---|",
    ]
    for name, rounds in arms.items():
        cpu = ", ".join(f"{r['cpu_us_median']:g}" for r in rounds)
        wall = ", ".join(f"{r['wall_ms_median']:g}" for r in rounds if "wall_ms_median" in r)
        lines.append(f"| {name} | {cpu} | {rounds[-1]['calls']:g} | {wall} |")
    if d.get("buyer_delay_ms"):
        lines += ["", f"The buyer stub replied after {d['buyer_delay_ms']} ms: ms per {each} is one at a time."]
    if len(arms) == 2:
        (a, ra), (b, rb) = arms.items()
        ratio = statistics.median(r["cpu_us_median"] for r in rb) / statistics.median(r["cpu_us_median"] for r in ra)
        lines += ["", f"{b} / {a}: CPU per {each} **{ratio:.2f}** (medians of the rounds)."]
        if d.get("shared"):
            per_sale = ratio / d["shared"]
            lines += [f"Per sale, a shared lead of {d['shared']} sales costs **{per_sale:.2f}** of an exclusive lead."]
    packages = sorted(
        {p for rounds in arms.values() for p in rounds[-1]["calls_by_package"]},
        key=lambda p: -max(rounds[-1]["calls_by_package"].get(p, 0) for rounds in arms.values()),
    )[:15]
    lines += ["", f"| calls per {each} in | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for p in packages:
        lines.append(
            f"| {p} | " + " | ".join(f"{rounds[-1]['calls_by_package'].get(p, 0):g}" for rounds in arms.values()) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=["payments", "leads"], default="payments")
    ap.add_argument("--base-rev", help="a revision to set beside HEAD")
    ap.add_argument("--deliveries", type=int, default=1500)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shared", type=int, default=0, help="leads: HEAD exclusive beside HEAD with N shared buyers")
    ap.add_argument("--epl", action="store_true", help="leads: HEAD's waterfall beside its epl routing")
    ap.add_argument("--buyer-delay-ms", type=int, default=0, help="leads: the buyer stub replies after this long")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--network", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        from testkit.config import SECRETS

        os.environ.update(SECRETS)
        print(json.dumps(child(args.deliveries, args.batches, args.path, json.loads(args.network or "[]"))))
        return 0
    from bench.common import OUT, head_rev, machine_info, worktrees, write_json, write_md
    from bench.stack import log

    if (args.shared or args.epl) and (args.path != "leads" or args.base_rev):
        ap.error("--shared and --epl measure HEAD's lead path: with --path leads, without --base-rev")
    revs = {"head": head_rev()}
    if args.base_rev:
        revs = {"base": args.base_rev, **revs}
    # arm name -> (its revision's name, how its network varies bench/stack.py's: varied_network)
    plan: dict[str, tuple[str, dict | None]] = {name: (name, None) for name in revs}
    if args.shared:
        plan = {"exclusive": ("head", None), f"shared x{args.shared}": ("head", shared(args.shared))}
    if args.epl:  # three buyers alike, ranked by priority or by what each earns
        plan = {routing: ("head", {"publisher": {"routing": routing}, "copies": 3}) for routing in ("waterfall", "epl")}
    arms: dict[str, list] = {name: [] for name in plan}
    with worktrees(revs, "fg-calls") as codes:
        for i in range(args.rounds):
            for name in list(plan) if i % 2 == 0 else list(reversed(plan)):
                rev, variant = plan[name]
                arms[name].append(
                    one_arm(codes[rev], args.deliveries, args.batches, args.path, variant, args.buyer_delay_ms)
                )
                log(f"round {i + 1} {name}: {arms[name][-1]['cpu_us_median']} µs, {arms[name][-1]['calls']} calls")
    data = {
        "path": args.path,
        "shared": args.shared,
        "buyer_delay_ms": args.buyer_delay_ms,
        "revs": revs,
        "rounds": args.rounds,
        "batches": args.batches,
        "deliveries": args.deliveries,
        "arms": arms,
        "machine": machine_info(),
    }
    name = (
        "calls"
        if args.path == "payments"
        else "calls-shared"
        if args.shared
        else "calls-epl"
        if args.epl
        else "calls-leads"
    )
    write_json(f"{name}.json", data)
    write_md(f"{name}.md", render(data))
    log(f"wrote {OUT / (name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
