"""The soak's processes (soak/run.py): the Procfile stack on a private Redis and a throw-away
MariaDB database (on the local server, or on a Galera cluster of its own: `galera`) behind a
proxy that can cut it, its supervisor, its buyers, and the sampler of their memory and
queues."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlparse

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent

from testkit.config import LOOPBACK_PARTNERS, NO_PROVIDER_APIS, SECRETS
from testkit.galera import GaleraCluster
from testkit.payments import child_pids, encode, signed_headers
from testkit.servers import (
    Proc,
    RedisServer,
    WebServer,
    create_mysql_db,
    free_port,
    mysql_admin_url,
    venv_bin,
    wait_until,
)
from webhooks.storage.live import keys

ADMIN = "soak-admin-token-0123456789"
API_KEY = "pk_soak_0123456789abcdef"
PUBLISHER = "soak"
BUYER_TIMEOUT_MS = 1500
RESTART_DELAY_S = 2
START_TIMEOUT_S = 120  # gunicorn's first answer, on a machine busy with other work


def buyers_config(minutes: float, url, lead_rate: float = 150) -> dict[str, dict]:
    """Four buyers in a waterfall. Caps scale with the run (up to an hour) and with the offered
    lead rate (150/s the reference) so that each binds within it, a one-minute run at a small
    load included: acme's hourly cap is about 70% of an hour of its expected flow."""
    m = min(minutes, 60) * lead_rate / 150
    rules = {  # buyer id: (price, time zone, states (None: all), caps), in priority order
        "acme": ("12.50", "America/Chicago", ["TX", "OK", "CA"], {"hourly": 4100, "daily": 6000, "monthly": 100000}),
        "flaky": ("9.00", "Europe/London", None, {"hourly": 2200, "weekly": 30000}),
        "slow": ("7.25", "Asia/Tokyo", ["CA", "NY", "FL"], {"daily": 900}),
        "steady": ("5.00", "UTC", None, {"hourly": 1000}),
    }
    out = {}
    for priority, (bid, (price, tz, states, caps)) in enumerate(rules.items(), start=1):
        out[bid] = {"name": bid.title(), "endpoint_url": url(bid), "priority": priority, "price": price}
        out[bid] |= {"timezone": tz, "caps": {k: max(1, int(v * m)) for k, v in caps.items()}}
        if states:
            out[bid]["states"] = states
    out["steady"]["caps"]["daily_budget"] = f"{max(5.0, 5 * 500 * m):.2f}"
    return out


class Supervised:
    """A process of the Procfile restarted RESTART_DELAY_S after it exits, as scripts/run's
    `supervise` loop does. Every exit and start is logged with its time."""

    def __init__(self, name: str, argv: list[str], env: dict, run_dir: Path, events: list):
        self.name, self.argv, self.env, self.run_dir, self.events = name, argv, env, run_dir, events
        self.proc: Proc | None = None
        self.starts = 0
        self.stopping = False
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.proc = Proc(self.argv, self.env, self.run_dir / f"{self.name}-{self.starts}.log")
        self.events.append({"at": time.time(), "process": self.name, "event": "start", "pid": self.proc.pid})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def replaced(self, pid: int) -> bool:
        """A new process runs in the place of `pid`."""
        return self.pid != pid and self.proc.alive()

    def check(self) -> None:
        if self.stopping or self.proc.alive():
            return
        exited = {"process": self.name, "event": "exit", "pid": self.proc.pid, "rc": self.proc.proc.returncode}
        self.events.append({"at": time.time(), **exited})
        self.proc.stop()
        time.sleep(RESTART_DELAY_S)
        if not self.stopping:
            self.start()

    def stop(self) -> None:
        self.stopping = True
        if self.proc:
            self.proc.stop()


class Stack:
    """Every process of the soak, set up and torn down by an ExitStack."""

    def __init__(self, es: ExitStack, run_dir: Path, minutes: float, lead_rate: float = 150, galera: bool = False):
        self.run_dir = run_dir
        self.events: list[dict] = []  # process exits and starts
        self.redis = RedisServer(run_dir / "redis")
        self.redis.start()
        es.callback(self.redis.kill)
        self.galera: GaleraCluster | None = GaleraCluster() if galera else None
        if self.galera:
            es.callback(self.galera.stop)  # its datadirs under /tmp go; its logs are kept, below
            es.callback(self.keep_galera_logs)
            self.galera.start()
        admin = self.galera.proxy_url if self.galera else mysql_admin_url()
        if not admin:
            raise SystemExit("MariaDB/MySQL is not reachable (FG_TEST_MYSQL): the soak runs on MariaDB")
        self.db_url, drop = create_mysql_db(admin)
        self.keep_db = False  # set when the analysis fails, to analyse again (--reanalyse)
        es.callback(lambda: self.keep_db or drop())
        a = urlparse(admin)
        port_file = run_dir / "dbproxy.port"
        proxy = ["-m", "soak.dbproxy", a.hostname or "127.0.0.1", str(a.port or 3306), str(port_file)]
        self.proxy = Proc([venv_bin("python"), *proxy], dict(os.environ), run_dir / "dbproxy.log")
        es.callback(self.proxy.stop)
        wait_until(
            lambda: port_file.exists() and port_file.read_text(), timeout=START_TIMEOUT_S, what="the database proxy"
        )
        d = urlparse(self.db_url)
        auth = d.netloc.rsplit("@", 1)[0] + "@" if "@" in d.netloc else ""
        self.proxy_url = f"{d.scheme}://{auth}127.0.0.1:{port_file.read_text()}{d.path}"
        self.buyer_port = free_port()
        self.events_url = f"http://127.0.0.1:{self.buyer_port}/_events"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("ACCESS_LOG", "WEB_CONCURRENCY")},
            **SECRETS,
            **NO_PROVIDER_APIS,
            **LOOPBACK_PARTNERS,
            "REDIS_URL": self.redis.url,
            "DATABASE_URL": self.proxy_url,
            "ADMIN_TOKEN": ADMIN,
            "PYTHONUNBUFFERED": "1",
            "PUBLISHER_RATE_LIMIT": "off",
            "BUYER_TIMEOUT_MS": str(BUYER_TIMEOUT_MS),
            "PROMETHEUS_MULTIPROC_DIR": str(run_dir / "prometheus"),
            "PAYMENT_EVENTS_URL": self.events_url,
            "PAYMENT_EVENTS_SECRET": SECRETS["STANDARD_WEBHOOK_SECRET"],
            "PYTHONPATH": str(ROOT),
        }  # this tree's code, before the installed (editable) one
        (run_dir / "prometheus").mkdir(parents=True, exist_ok=True)
        upgrade = [venv_bin("flask"), "--app", "wsgi", "db", "upgrade"]
        subprocess.run(upgrade, env=self.env, cwd=ROOT, check=True, capture_output=True)
        buyers = ["-m", "soak.buyers", str(self.buyer_port), str(run_dir / "buyers.jsonl"), str(BUYER_TIMEOUT_MS)]
        self.buyers = Proc([venv_bin("python"), *buyers], self.env, run_dir / "buyers.log")
        es.callback(self.buyers.stop)
        self.web = WebServer(self.env, run_dir / "web.log", workers=2, start_timeout=START_TIMEOUT_S)
        es.callback(self.web.stop)
        worker = ["worker", "--url", self.redis.url, "--with-scheduler", "-w", "rq.worker.SimpleWorker"]
        worker += ["floodgate", "floodgate-events"]
        self.worker = Supervised("rq-worker", [venv_bin("rq"), *worker], self.env, run_dir, self.events)
        es.callback(self.worker.stop)
        self.scheduler = Supervised(
            "scheduler", [venv_bin("python"), "-m", "workers.schedule"], self.env, run_dir, self.events
        )
        es.callback(self.scheduler.stop)
        self._stop = threading.Event()
        es.callback(self._stop.set)
        threading.Thread(target=self._supervise, daemon=True).start()
        self.buyer_rules = buyers_config(minutes, lambda name: f"http://127.0.0.1:{self.buyer_port}/{name}", lead_rate)
        self._configure()

    def _supervise(self) -> None:
        while not self._stop.wait(0.25):
            for proc in (self.worker, self.scheduler):
                proc.check()

    def admin(self, method: str, path: str, **kw) -> requests.Response:
        resp = requests.request(
            method, self.web.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10, **kw
        )
        resp.raise_for_status()
        return resp

    def _configure(self) -> None:
        self.admin(
            "PUT",
            f"/v1/admin/publishers/{PUBLISHER}",
            json={"name": "Soak", "api_key": API_KEY, "commission_pct": "10"},
        )
        for buyer_id, rule in self.buyer_rules.items():
            self.admin("PUT", f"/v1/admin/buyers/{buyer_id}", json=rule)
        time.sleep(1.5)  # every web process has the config

    def has_refunds(self) -> bool:
        """Refunds exist in the running code when a refund of an unknown payment is 409
        payment_not_found (without them it is a valid event that credits nothing: 200)."""
        data = {"reference": "probe-rf-1", "payment_reference": "probe-pay-none", "amount_minor": 1, "currency": "NGN"}
        raw = encode({"type": "payment.refunded", "data": data | {"customer": {"email": "probe@example.com"}}})
        resp = requests.post(
            self.web.url + "/v1/webhooks/standard",
            data=raw,
            timeout=10,
            headers={"Content-Type": "application/json", **signed_headers("standard", raw)},
        )
        body = resp.json() if resp.headers.get("Content-Type", "").startswith("application/json") else {}
        code = body.get("status") or (body.get("error") or {}).get("code")
        return resp.status_code == 409 and code == "payment_not_found"

    def has_outbox(self) -> bool:
        """The payment-events outbox exists when the configuration reads PAYMENT_EVENTS_URL."""
        from dataclasses import fields

        from webhooks import config

        cfg = config.load(self.env)
        return any(getattr(cfg, f.name) == self.events_url for f in fields(cfg))

    def keep_galera_logs(self) -> None:
        """HAProxy's log (a line as each node goes down or up) and each node's error log, into
        the run's folder."""
        for path in (self.galera.haproxy_log, *(n.log for n in self.galera.nodes.values())):
            if path.exists():
                rel = str(path.relative_to(self.galera.dir)).replace("/", "-")
                shutil.copy(path, self.run_dir / f"galera-{rel}")

    def redis_client(self) -> redis.Redis:
        return redis.Redis(port=self.redis.port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)

    def pids(self) -> dict[str, int]:
        """Role:pid of every process whose memory is sampled."""
        out = {f"web master:{self.web.pid}": self.web.pid}
        for pid in child_pids(self.web.pid):
            out[f"web worker:{pid}"] = pid
        out[f"rq worker:{self.worker.pid}"] = self.worker.pid
        out[f"scheduler:{self.scheduler.pid}"] = self.scheduler.pid
        if self.redis.proc:
            out["redis-server"] = self.redis.proc.pid
        out["buyers"] = self.buyers.pid
        out["db proxy"] = self.proxy.pid
        return out


def proc_stats(pid: int) -> tuple[int, float] | None:
    """(RSS kB, CPU seconds) of a live process, from /proc."""
    try:
        rss = next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


class Sampler:
    """Every 5 s: RSS and CPU of each process, queue lengths and Redis memory."""

    def __init__(self, stack: Stack, t0: float, extra_pids: dict[str, int]):
        self.stack, self.t0, self.extra = stack, t0, extra_pids
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(5)

    def sample(self) -> dict:
        s = {"t": round(time.time() - self.t0, 1), "rss_kb": {}, "cpu_s": {}}
        for role, pid in {**self.stack.pids(), **self.extra}.items():
            stats = proc_stats(pid)
            if stats:
                s["rss_kb"][role], s["cpu_s"][role] = stats
        try:
            r = self.stack.redis_client()
            processing = list(r.scan_iter(match=keys.settle_processing("*"), count=1000))
            s.update(
                pending=r.llen(keys.SETTLE_PENDING),
                processing=sum(r.llen(k) for k in processing),
                redis_keys=r.dbsize(),
                redis_used_mb=round(r.info("memory")["used_memory"] / 2**20, 1),
            )
        except redis.RedisError:
            s.update(redis_down=True)
        return s

    def stop(self) -> list[dict]:
        self._stop.set()
        self.thread.join(10)
        return self.samples
