"""A private MariaDB Galera cluster for the tests: three mariadbd nodes on 127.0.0.1, each with
ports of its own, behind HAProxy sending every connection to one writing node (API.md "The
ledger on a cluster").

    cluster = GaleraCluster()
    cluster.start()                      # about 15 s: a line per node as it joins
    url = cluster.proxy_url              # mysql://root@127.0.0.1:<proxy> (no database)
    cluster.kill(cluster.writer())       # SIGKILL the node the proxy writes to
    cluster.wait_writer_moved("n1")      # until HAProxy sends to a backup
    cluster.start_node("n1")             # rejoins (IST or SST), waits for Synced
    cluster.stop()                       # every process killed, every datadir removed

Nodes are named n1, n2, n3 (wsrep_node_name); n1 bootstraps the cluster and is HAProxy's
primary, n2 and n3 its backups in that order.

The datadirs live in a folder of their own under /tmp, not in pytest's temporary folders:
mariadbd runs as `mysql` (the rsync SST refuses to run as root) and pytest's folders are
root's alone (mode 0700).

Why HAProxy rather than a proxy of the tests' own (testkit.servers.TcpProxy): it is what an
operator puts in front of Galera, and the failure this cluster exists to test lives in its
behaviour: when the writer dies it closes the sessions it held and sends new connections to
a backup, so a client's pooled connections are dead while new ones work.

One limit of `option mysql-check`, the health check HAProxy ships with: it sees a node answer
a handshake, not whether that node is Synced. A node rejoining is marked up as soon as its SQL
port opens; start_node waits for Synced before it returns, so a test that waits for it never
writes to a node still catching up.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql

from testkit.servers import free_port, listening, wait_until

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
NAMES = ("n1", "n2", "n3")
CHECK_USER = "haproxy_check"  # the user HAProxy's mysql-check logs in as (no password, no rights)
JOIN_TIMEOUT_S = 120.0  # a joiner's state transfer on a busy 2-core machine
MOVE_TIMEOUT_S = 30.0
INSTALL_LOCK = "/tmp/floodgate-tests-haproxy.lock"  # one apt-get at a time, across xdist workers

# Galera notices a dead peer after evs.suspect_timeout (default 5 s) and, until the survivors
# form a view without it, a commit on them waits. Shorter here so that a test's writer dies in
# about 2 s; not shorter still: on a busy machine a live node's keepalives must not look late.
EVS_OPTIONS = (
    "evs.keepalive_period=PT0.5S",
    "evs.inactive_check_period=PT0.5S",
    "evs.suspect_timeout=PT2S",
    "evs.inactive_timeout=PT4S",
    "evs.install_timeout=PT4S",
    "gcache.size=64M",
)


def mariadbd() -> str | None:
    return shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")


def missing() -> str | None:
    """What this machine lacks to run a cluster (Debian's mariadb-server and galera-4), if anything."""
    if mariadbd() is None:
        return "no mariadbd (Debian's mariadb-server)"
    if not Path(PROVIDER).exists():
        return f"no {PROVIDER} (Debian's galera-4)"
    return None


def haproxy_binary() -> str:
    """Debian's haproxy, installed with apt-get the first time (as the e2e tier installs
    Chromium), under a lock file so that two xdist workers do not both run dpkg."""
    import fcntl

    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if found:
            return found
        if shutil.which("apt-get") is None:
            raise RuntimeError("haproxy is missing and apt-get is not there to install Debian's haproxy")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for args in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "haproxy"]):
            done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if not found:
            raise RuntimeError("apt-get installed haproxy, yet no haproxy binary is on PATH")
        return found


@dataclass
class Node:
    name: str
    dir: Path
    port: int  # SQL
    gmcast: int  # group communication
    ist: int  # incremental state transfer, received
    sst: int  # full state transfer (rsync), received
    proc: subprocess.Popen | None = None

    @property
    def datadir(self) -> Path:
        return self.dir / "data"

    @property
    def cnf(self) -> Path:
        return self.dir / "my.cnf"

    @property
    def log(self) -> Path:
        return self.dir / "error.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class GaleraCluster:
    """Three Galera nodes and HAProxy in front of them; see the module docstring."""

    def __init__(self, workdir: Path | None = None, echo=None):
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="fg-galera-", dir="/tmp"))
        self.echo = echo or _to_stderr
        self.nodes = {
            name: Node(name, self.dir / name, free_port(), free_port(), free_port(), free_port()) for name in NAMES
        }
        self.proxy_port = free_port()
        self.haproxy: subprocess.Popen | None = None
        self._haproxy_log = None
        self._stopped = False
        atexit.register(self.stop)  # a session that dies before its teardown leaves no server behind

    # -- addresses ---------------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        """The admin URL through HAProxy, without a database (as testkit.servers.mysql_admin_url)."""
        return f"mysql://root@127.0.0.1:{self.proxy_port}"

    def node_url(self, name: str) -> str:
        return f"mysql://root@127.0.0.1:{self.nodes[name].port}"

    @property
    def stats_socket(self) -> Path:
        return self.dir / "haproxy.sock"

    @property
    def haproxy_log(self) -> Path:
        """HAProxy's log: a line `Server galera/n1 is DOWN` / `is UP` at each change."""
        return self.dir / "haproxy.log"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> GaleraCluster:
        started = time.monotonic()
        try:
            haproxy = haproxy_binary()
            for node in self.nodes.values():
                self._prepare(node, self._cnf(node))
            first = self.nodes[NAMES[0]]
            self._install_db(first)
            self._start(first, bootstrap=True)
            self._create_users(first)
            self.echo(f"galera: {first.name} bootstrapped on :{first.port} ({time.monotonic() - started:.1f} s)")
            for name in NAMES[1:]:
                # the joiners' datadirs start empty: the rsync state transfer fills them from a donor
                self._start(self.nodes[name])
                self.echo(f"galera: {name} joined on :{self.nodes[name].port} ({time.monotonic() - started:.1f} s)")
            self.wait_size(len(NAMES))
            self._start_haproxy(haproxy)
            wait_until(lambda: self.writer() == NAMES[0], timeout=MOVE_TIMEOUT_S, what="HAProxy sending to n1")
            self.echo(f"galera: HAProxy on :{self.proxy_port}, writer n1 ({time.monotonic() - started:.1f} s)")
        except BaseException:
            self.stop(keep_dir=True)
            self.echo(f"galera: start failed; logs under {self.dir}")
            raise
        return self

    def start_single(self) -> str:
        """Node n1 alone with wsrep off, from the same my.cnf as a cluster node: the fairest
        anchor to set the cluster against (the same binary and settings, no replication).
        Its admin URL; stop() ends it."""
        node = self.nodes[NAMES[0]]
        self._prepare(node, "".join(f"{x}\n" for x in self._cnf(node).splitlines() if not x.startswith("wsrep_")))
        self._install_db(node)
        self._start(node, wsrep=False)
        self._create_users(node)
        return self.node_url(node.name)

    def _prepare(self, node: Node, cnf: str) -> None:
        """`node`'s folders, owned by mysql (mariadbd runs as mysql), and its my.cnf."""
        mysql = pwd.getpwnam("mysql")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        node.datadir.mkdir(parents=True, exist_ok=True)
        os.chown(node.dir, mysql.pw_uid, mysql.pw_gid)
        os.chown(node.datadir, mysql.pw_uid, mysql.pw_gid)
        node.cnf.write_text(cnf)

    def kill(self, name: str) -> None:
        """SIGKILL node `name` (and the state transfer it may be running), as a host dying."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            _kill_group(node.proc)
        self.echo(f"galera: killed {name}")

    def start_node(self, name: str) -> None:
        """Start node `name` again; it rejoins the cluster. Returns once it is Synced and the
        cluster counts every node again."""
        node = self.nodes[name]
        if node.alive():
            return
        started = time.monotonic()
        self._start(node)
        self.wait_size(len(NAMES))
        self.echo(f"galera: {name} rejoined ({time.monotonic() - started:.1f} s)")

    def stop(self, keep_dir: bool = False) -> None:
        """Kill HAProxy and every node; remove the datadirs (unless `keep_dir`, to read logs)."""
        if self.haproxy is not None and self.haproxy.poll() is None:
            _kill_group(self.haproxy)
        if self._haproxy_log is not None:
            self._haproxy_log.close()
            self._haproxy_log = None
        for node in self.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                _kill_group(node.proc)
        if not keep_dir and not self._stopped:
            shutil.rmtree(self.dir, ignore_errors=True)
        self._stopped = True

    # -- what the cluster says ---------------------------------------------------------------

    def status(self, name: str) -> dict[str, str]:
        """SHOW STATUS LIKE 'wsrep_%' of node `name` ({} when it does not answer)."""
        try:
            conn = self._connect(self.nodes[name].port, timeout=2)
        except pymysql.MySQLError:
            return {}
        try:
            with conn.cursor() as c:
                c.execute("SHOW STATUS LIKE 'wsrep_%'")
                return dict(c.fetchall())
        except pymysql.MySQLError:
            return {}
        finally:
            conn.close()

    def synced(self, name: str, size: int | None = None) -> bool:
        status = self.status(name)
        return (
            status.get("wsrep_local_state_comment") == "Synced"
            and status.get("wsrep_ready") == "ON"
            and (size is None or status.get("wsrep_cluster_size") == str(size))
        )

    def size(self) -> int:
        """wsrep_cluster_size as the live nodes see it (0 when none answers)."""
        for name in self.live():
            status = self.status(name)
            if status.get("wsrep_cluster_status") == "Primary":
                return int(status["wsrep_cluster_size"])
        return 0

    def wait_size(self, size: int, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Until every live node is Synced in a primary component of `size` nodes."""
        wait_until(
            lambda: len(self.live()) == size and all(self.synced(n, size) for n in self.live()),
            timeout=timeout,
            interval=0.2,
            what=f"a Galera cluster of {size} Synced nodes",
        )

    def live(self) -> list[str]:
        return [name for name, node in self.nodes.items() if node.alive()]

    def proxy_states(self) -> dict[str, str]:
        """Each server's state as HAProxy's stats socket reports it ("UP", "DOWN", "UP 1/2"...)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(self.stats_socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {r["svname"]: r["status"] for r in rows if r["svname"] in self.nodes}

    def writer(self) -> str | None:
        """The node a new connection through the proxy lands on now (None when none does)."""
        try:
            conn = self._connect(self.proxy_port, timeout=2)
        except pymysql.MySQLError:
            return None
        try:
            with conn.cursor() as c:
                c.execute("SELECT @@wsrep_node_name")
                return c.fetchone()[0]
        except pymysql.MySQLError:
            return None
        finally:
            conn.close()

    def wait_writer_moved(self, away_from: str, timeout: float = MOVE_TIMEOUT_S) -> str:
        """Until HAProxy sends new connections to a node other than `away_from`, and that node
        takes writes (the survivors have formed a primary component without the dead one).
        Returns the new writer's name."""

        def moved() -> str | None:
            now = self.writer()
            if now is None or now == away_from or not self.synced(now, size=len(self.live())):
                return None
            return now

        started = time.monotonic()
        now = wait_until(moved, timeout=timeout, interval=0.1, what=f"HAProxy moving away from {away_from}")
        self.echo(f"galera: writer moved from {away_from} to {now} ({time.monotonic() - started:.1f} s)")
        return now

    # -- inner workings ----------------------------------------------------------------------

    def _cnf(self, node: Node) -> str:
        peers = ",".join(f"127.0.0.1:{n.gmcast}" for n in self.nodes.values())
        options = ";".join(
            (f"gmcast.listen_addr=tcp://127.0.0.1:{node.gmcast}", f"ist.recv_addr=127.0.0.1:{node.ist}", *EVS_OPTIONS)
        )
        return f"""[mysqld]
user = mysql
datadir = {node.datadir}
socket = {node.dir}/mysqld.sock
pid-file = {node.dir}/mysqld.pid
log-error = {node.log}
port = {node.port}
bind-address = 127.0.0.1
skip-name-resolve
performance_schema = OFF
max_connections = 500
# what Galera needs: row events, InnoDB only, interleaved auto-increment locks
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
# small, three nodes share a test machine; the cluster is the durability, not each disk
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
innodb_flush_log_at_trx_commit = 2
wsrep_on = ON
wsrep_provider = {PROVIDER}
wsrep_cluster_name = floodgate-test
wsrep_cluster_address = gcomm://{peers}
wsrep_node_name = {node.name}
wsrep_node_address = 127.0.0.1
wsrep_provider_options = "{options}"
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:{node.sst}
wsrep_slave_threads = 2
"""

    def _install_db(self, node: Node) -> None:
        """The system tables, made by a server that never loads Galera: with the node's own
        settings (wsrep on, the provider loaded) mariadbd --bootstrap segfaulted now and then."""
        plain = node.dir / "install.cnf"
        plain.write_text(
            f"[mysqld]\ndatadir = {node.datadir}\ninnodb_buffer_pool_size = 64M\ninnodb_log_file_size = 48M\n"
        )
        done = subprocess.run(
            [
                "mariadb-install-db",
                f"--defaults-file={plain}",
                "--user=mysql",
                f"--datadir={node.datadir}",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def _start(self, node: Node, bootstrap: bool = False, wsrep: bool = True) -> None:
        args = [mariadbd() or "mariadbd", f"--defaults-file={node.cnf}"]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        with open(node.dir / "stdout.log", "ab") as out:
            node.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            if not node.alive():
                raise AssertionError(f"mariadbd {node.name} exited:\n{_tail(node.log)}")
            # through the socket as root: the TCP user exists only once the first node made it
            return self._synced_by_socket(node, wsrep)

        wait_until(ready, timeout=JOIN_TIMEOUT_S, interval=0.2, what=f"galera node {node.name} Synced")

    def _synced_by_socket(self, node: Node, wsrep: bool = True) -> bool:
        """Whether `node` answers on its socket and, with `wsrep`, says it is Synced."""
        if not listening(node.port):
            return False  # not up yet (and pymysql would leave its unix socket unclosed on a refusal)
        try:
            conn = pymysql.connect(unix_socket=str(node.dir / "mysqld.sock"), user="root", connect_timeout=2)
        except pymysql.MySQLError:
            return False
        if not wsrep:
            conn.close()
            return True
        try:
            with conn.cursor() as c:
                c.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
                row = c.fetchone()
                return row is not None and row[1] == "Synced"
        except pymysql.MySQLError:
            return False
        finally:
            conn.close()

    def _create_users(self, node: Node) -> None:
        """The tests' TCP user (root from 127.0.0.1, no password) and HAProxy's check user;
        made on the first node, they reach the others with the state transfer."""
        conn = pymysql.connect(unix_socket=str(node.dir / "mysqld.sock"), user="root")
        try:
            with conn.cursor() as c:
                c.execute("CREATE USER 'root'@'127.0.0.1'")
                c.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
                c.execute(f"CREATE USER '{CHECK_USER}'@'127.0.0.1'")
        finally:
            conn.close()

    def _start_haproxy(self, binary: str) -> None:
        cfg = self.dir / "haproxy.cfg"
        servers = "\n".join(
            f"    server {n.name} 127.0.0.1:{n.port} check" + ("" if i == 0 else " backup")
            for i, n in enumerate(self.nodes.values())
        )
        cfg.write_text(f"""global
    maxconn 4000
    stats socket {self.stats_socket} mode 600 level admin
    log stdout format raw local0 info

defaults
    mode tcp
    log global
    option tcplog
    timeout connect 2s
    # a pool keeps connections idle for long: a proxy that cut idle ones would fail requests
    # no Galera node failed
    timeout client 8h
    timeout server 8h
    timeout check 1s

listen galera
    bind 127.0.0.1:{self.proxy_port}
    # a handshake and a login as {CHECK_USER}, then QUIT: the node's server answers
    option mysql-check user {CHECK_USER} post-41
    # inter 300: a check every 300 ms; fall 2 / rise 2: two checks in a row change a state,
    # so a node is down in about 0.6 s after it dies, never on one slow answer.
    # on-marked-down shutdown-sessions: the connections to a node marked down are closed at
    # once, rather than left waiting on a dead peer for TCP's timeouts.
    # on-marked-up shutdown-backup-sessions: when the primary comes back, the connections
    # held by a backup are closed, so that one node only takes writes (Galera's safe shape,
    # issue 66) rather than the old backup and the primary both.
    default-server inter 300 fall 2 rise 2 on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions
{servers}
""")
        self._haproxy_log = open(self.haproxy_log, "ab")  # noqa: SIM115  (open for the life of HAProxy)
        self.haproxy = subprocess.Popen(
            [binary, "-db", "-f", str(cfg)],
            stdout=self._haproxy_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _connect(self, port: int, timeout: float) -> pymysql.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=port,
            user="root",
            connect_timeout=timeout,
            read_timeout=timeout,
            write_timeout=timeout,
        )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


if __name__ == "__main__":  # python -m testkit.galera: start a cluster, print its URLs, hold it until ^C
    cluster = GaleraCluster().start()
    _to_stderr("\n".join([cluster.proxy_url, *(cluster.node_url(n) for n in NAMES)]))
    try:
        signal.pause()
    finally:
        cluster.stop()
