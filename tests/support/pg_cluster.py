"""A real PostgreSQL 15 cluster for the tests, started and stopped by the test session itself.

The session starts one cluster (``initdb`` + ``pg_ctl`` of the OS package, which ``tools/setup``
installs) in a temporary directory, listening on a free loopback port and on a unix socket in
that directory, with ``fsync`` on (the tests prove durability, so the cluster must give it).
The directory is under ``TMPDIR``, which ``tools/test`` puts in RAM when it can: the server still
fsyncs, the medium returns at once (docs/testing.md, "Where the time goes").
Each test gets a database of its own. The tests never use a cluster they did not start, and a
missing PostgreSQL is a failure, never a skip.

Run as root (CI), ``initdb`` refuses to run, so the cluster is owned by and run as the
``postgres`` user through ``runuser -u postgres --``; run as anyone else, it is that user's.
The superuser has a random password that reaches libpq through a password file
(``PGPASSFILE``), as a deployment passes it: never on a command line or in a connection string.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path(os.environ.get("ENGRAM_PG_BIN", "/usr/lib/postgresql/15/bin"))
SUPERUSER = "engram_test"
SETUP_HINT = "run tools/setup --tests (it installs the postgresql-15 package when it is missing)"


class PostgresMissing(RuntimeError):
    """The PostgreSQL 15 binaries the tests need are not installed."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Database:
    """One database of the test cluster: its libpq connection string (no password: that is in
    the password file ``env`` names) and the environment a client needs."""

    name: str
    conninfo: str
    env: dict[str, str]
    cluster: PgCluster

    def connect(self, **kw: object):  # -> psycopg.Connection
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=True, **kw)  # type: ignore[arg-type]


class PgCluster:
    """One PostgreSQL cluster in a temporary directory (``start``/``stop``/``restart``)."""

    def __init__(self) -> None:
        for tool in ("initdb", "pg_ctl", "postgres", "pg_dump"):
            if not (PG_BIN / tool).exists():
                raise PostgresMissing(f"PostgreSQL 15 is not installed ({PG_BIN / tool} is missing): {SETUP_HINT}")
        self._as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="engram-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "run"
        self.password = secrets.token_urlsafe(24)
        self.port = 0
        self._counter = 0
        self._template: str | None = None  # the migrated template (``migrated_database``), made on first use
        self._template_lock = threading.Lock()
        # The client side (root or the current user): the password file libpq reads (0600).
        self.client_dir = Path(tempfile.mkdtemp(prefix="engram-pg-client-"))
        self.passfile = self.client_dir / "pgpass"
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run_as_owner(["mkdir", "-m", "0700", str(self.socket_dir)])

    # -- running the server's tools as the cluster's owner ---------------------------------------
    def _run_as_owner(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]

    def _owner_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}

    def start(self) -> PgCluster:
        pwfile = self.root / "initdb.pw"
        self._run_as_owner(["sh", "-c", f"umask 077 && cat > {pwfile}"], input=self.password + "\n")
        try:
            self._run_as_owner([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--pwfile", str(pwfile),
                                "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"],
                               env=self._owner_env())
        finally:
            self._run_as_owner(["rm", "-f", str(pwfile)])
        # What the tests need of the server, appended to its own configuration (the defaults are
        # kept otherwise: fsync and synchronous_commit on, full_page_writes on).
        conf = "\n".join([
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.socket_dir}'",
            "fsync = on", "synchronous_commit = on", "full_page_writes = on",
            "max_connections = 300", "shared_buffers = 64MB",
            "log_min_messages = warning", "logging_collector = off",
            "deadlock_timeout = 200ms",
        ])
        self._run_as_owner(["sh", "-c", f"cat >> {self.data / 'postgresql.conf'}"], input=conf + "\n")
        for attempt in range(5):
            self.port = _free_port()
            try:
                self._pg_ctl("start", "-w", "-t", "60", "-o", f"-p {self.port}")
                break
            except subprocess.CalledProcessError:
                if attempt == 4:
                    raise RuntimeError("PostgreSQL did not start:\n" + self.log_tail()) from None
        with open(os.open(self.passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            # Any port of loopback: tests put proxies in front of the server (tests/store/pg_wire.py).
            f.write(f"127.0.0.1:*:*:{SUPERUSER}:{self.password}\n")
            f.write(f"{self.socket_dir}:{self.port}:*:{SUPERUSER}:{self.password}\n")
        return self

    def _pg_ctl(self, *args: str) -> None:
        self._run_as_owner([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), *args],
                           env=self._owner_env())

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("stop", "-w", "-m", mode)

    def resume(self) -> None:
        """Start the server again after ``stop`` (same data directory, same port)."""
        self._pg_ctl("start", "-w", "-t", "60", "-o", f"-p {self.port}")

    def restart(self, mode: str = "fast") -> None:
        """Stop (``immediate``: a crash, recovered from the WAL at start) and start again."""
        self.stop(mode)
        self._pg_ctl("start", "-w", "-t", "60", "-o", f"-p {self.port}")

    def destroy(self) -> None:
        try:
            self.stop("fast")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.client_dir, ignore_errors=True)

    # -- clients -----------------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """What a client process needs: the password file (libpq reads it; nothing else carries it)."""
        return {"PGPASSFILE": str(self.passfile)}

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def admin(self):  # -> psycopg.Connection
        import psycopg

        os.environ.setdefault("PGPASSFILE", str(self.passfile))
        return psycopg.connect(self.conninfo(), autocommit=True)

    def create_database(self, prefix: str = "t") -> Database:
        """A new, empty database (from ``template0``: nothing the session did before is in it)."""
        self._counter += 1
        name = f"{prefix}_{os.getpid()}_{self._counter}"
        with self.admin() as con:
            con.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return Database(name, self.conninfo(name), self.env, self)

    def migrated_database(self, prefix: str = "t") -> Database:
        """A new database holding Engram's schema and nothing else: a copy (``CREATE DATABASE …
        TEMPLATE``) of the session's migrated template, which is made the first time one is asked
        for. What a core would find after its first open's migrations, without running them per
        core. Tests about migrations or an empty database use ``create_database``.

        Nothing in the copy must be unique per store: the migrations are SQL alone and write no
        key, salt or identifier (``engram_core/store/postgres/migrations.py``: their only rows are
        the ledger's, ``applied_at_ms`` included, and ``host_key_trust``'s version 0); the
        key vault's rows (``vault_state``, ``vault_rings``, ``vault_keys``) and ``store_meta`` are
        written by the first core that opens the copy, as they are on a database it migrated."""
        template = self._migrated_template()
        self._counter += 1
        name = f"{prefix}_{os.getpid()}_{self._counter}"
        with self.admin() as con:
            con.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return Database(name, self.conninfo(name), self.env, self)

    def _migrated_template(self) -> str:
        """The template ``migrated_database`` copies: an empty database migrated by the product's own
        path (``engram admin migrate --store URL``: ``engines.migrate_schema``, which opens the
        engine, applies every migration and closes it). It then takes no connection: PostgreSQL copies
        a template only while nobody is connected to it."""
        with self._template_lock:
            if self._template is None:
                from engram_core.app.engines import migrate_schema

                db = self.create_database("engram_migrated")
                os.environ.setdefault("PGPASSFILE", str(self.passfile))
                migrate_schema(db.conninfo)  # its connection is closed when it returns
                with self.admin() as con:
                    con.execute(f'ALTER DATABASE "{db.name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
                self._template = db.name
            return self._template

    def drop_database(self, db: Database) -> None:
        with self.admin() as con:
            con.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')

    def database_dir(self, db: Database) -> Path:
        """The directory of ``db``'s heap files (``$PGDATA/base/<oid>``)."""
        with db.connect() as con:
            oid = con.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]  # type: ignore[index]
        return self.data / "base" / str(oid)

    def pg_dump(self, db: Database) -> bytes:
        """A plain-format dump of ``db`` (as an operator's backup would take it)."""
        env = {**os.environ, **self.env}
        return subprocess.run([str(PG_BIN / "pg_dump"), "--format=plain", "--dbname", db.conninfo],
                              check=True, capture_output=True, env=env, timeout=120).stdout


# WAL page layout (PostgreSQL 15, src/include/access/xlog_internal.h): 8 KiB pages, each opening
# with a header (24 bytes MAXALIGNed; 40 on a segment's first page, flagged XLP_LONG_HEADER).
_WAL_PAGE = 8192
_XLP_LONG_HEADER = 0x0002


def wal_stream(segments: list[Path]) -> bytes:
    """The WAL ``segments``' record bytes (pass them in name order: LSN order) with every page header cut out.

    A record that crosses a page boundary is written in two pieces with the next page's header
    between them, so a sealed blob of a few hundred bytes is split in the raw files a few percent
    of the time (tests/store/test_postgres_forget.py's positive controls failed once that way). Cutting the headers out makes
    every record contiguous again; what is searched is then a superset of what a reader of the
    files could reassemble, which is what the negative checks need too.
    """
    out = bytearray()
    for segment in segments:
        data = segment.read_bytes()
        for at in range(0, len(data) - _WAL_PAGE + 1, _WAL_PAGE):
            info = int.from_bytes(data[at + 2:at + 4], "little")
            out += data[at + (40 if info & _XLP_LONG_HEADER else 24):at + _WAL_PAGE]
    return bytes(out)



def start_cluster() -> PgCluster:
    cluster = PgCluster()
    try:
        return cluster.start()
    except BaseException:
        cluster.destroy()
        raise


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02) -> bool:  # noqa: ANN001
    """Poll ``predicate`` until it is true (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
