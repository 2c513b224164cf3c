"""A real PostgreSQL server for the tests, and fixtures giving each test a fresh database.

By default the session starts its own throwaway server from the distribution's
binaries (Debian: `apt-get install postgresql`, found through `pg_config
--bindir` or /usr/lib/postgresql/*/bin): `initdb` into a temporary directory,
`pg_ctl start` on a free loopback port with its Unix socket in that directory,
trust authentication, fsync off. It is stopped and removed at session end.

initdb and postgres refuse to run as root, so as root the server runs as the
`postgres` system user (which the Debian package creates), or `nobody`
without it, via `runuser`; the directory is made outside pytest's root-only
temporary tree and handed to that user.

KUBETRAIN_TEST_POSTGRES_URL=postgresql://user@host:port/db uses an existing
server instead; its user must be allowed to CREATE DATABASE.

Use from a conftest.py: `from tests.pg import backend, database_url, db, postgres_server`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import URL, make_url

from kubetrain.store import Database
from kubetrain.testbed.postgres import find_pg_bindir
from kubetrain.testbed.postgres import run_as as _run
from kubetrain.testbed.postgres import server_user as _server_user
from kubetrain.testbed.processes import pick_free_ports

POSTGRES_URL_ENV = "KUBETRAIN_TEST_POSTGRES_URL"
SUPERUSER = "kubetrain"
# Durability is worthless for a throwaway server, and fsync dominates its cost.
SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",  # 20-thread tests, with a pool per test database
}
START_TRIES = 3  # another process can take the free port between our probe and the bind


class PostgresServer:
    """A PostgreSQL server we may create and drop databases on."""

    def __init__(
        self,
        admin_url: URL,
        *,
        directory: Path | None = None,
        bindir: Path | None = None,
        user: str | None = None,
    ) -> None:
        self.admin_url = admin_url  # a maintenance database, for CREATE/DROP DATABASE
        self.directory = directory  # data, socket and log of a server we started
        self._bindir = bindir
        self._user = user
        self._template: str | None = None
        self._start_args: list[str] = []  # pg_ctl start's, to resume on the same port

    @classmethod
    def existing(cls, url: str) -> PostgresServer:
        return cls(make_url(url).set(drivername="postgresql+psycopg"))

    @classmethod
    def start(cls) -> PostgresServer:
        bindir = find_pg_bindir()
        user = _server_user()
        # Not under pytest's tmp_path: that tree is private to root, and the
        # server user must reach its data directory.
        base = Path(tempfile.mkdtemp(prefix="kubetrain-pg-"))
        try:
            if user is not None:
                entry = pwd.getpwnam(user)
                os.chown(base, entry.pw_uid, entry.pw_gid)
            data = str(base / "data")
            initdb = [f"--pgdata={data}", f"--username={SUPERUSER}", "--auth=trust", "--no-sync"]
            _run(user, base, str(bindir / "initdb"), *initdb, "--encoding=UTF8", "--locale=C")
            error: subprocess.CalledProcessError | None = None
            for _ in range(START_TRIES):
                port = pick_free_ports(1)[0]
                options = " ".join(
                    [f"-c listen_addresses=127.0.0.1 -p {port} -k {base}"]
                    + [f"-c {key}={value}" for key, value in SERVER_SETTINGS.items()]
                )
                start = [f"--pgdata={data}", f"--log={base / 'server.log'}", f"--options={options}"]
                try:
                    _run(user, base, str(bindir / "pg_ctl"), "start", "--wait", *start)
                except subprocess.CalledProcessError as exc:
                    error = exc
                    continue
                admin = URL.create(
                    "postgresql+psycopg",
                    username=SUPERUSER,
                    host="127.0.0.1",
                    port=port,
                    database="postgres",
                )
                server = cls(admin, directory=base, bindir=bindir, user=user)
                server._start_args = start
                return server
            log_file = base / "server.log"
            log = log_file.read_text(errors="replace")[-2000:] if log_file.exists() else ""
            raise RuntimeError(f"PostgreSQL did not start: {error}\n{error and error.stderr}{log}")
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    def stop(self) -> None:
        """Stop and remove a server we started; an existing server is left alone."""
        if self.directory is None or self._bindir is None:
            return
        try:
            data = f"--pgdata={self.directory / 'data'}"
            _run(
                self._user, self.directory, str(self._bindir / "pg_ctl"), "stop", data, "-m", "fast"
            )
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def halt(self) -> None:
        """Stop a server we started, keeping its data, as a restart or failover does;
        `resume` starts it again on the same port."""
        if self.directory is None or self._bindir is None:
            raise RuntimeError("only a server these tests started can be halted")
        data = f"--pgdata={self.directory / 'data'}"
        _run(self._user, self.directory, str(self._bindir / "pg_ctl"), "stop", data, "-m", "fast")

    def resume(self) -> None:
        if self.directory is None or self._bindir is None:
            raise RuntimeError("only a server these tests started can be resumed")
        pg_ctl = str(self._bindir / "pg_ctl")
        _run(self._user, self.directory, pg_ctl, "start", "--wait", *self._start_args)

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        url = self.admin_url
        return psycopg.connect(
            host=url.host,
            port=url.port,
            user=url.username,
            password=url.password,
            dbname=url.database,
            autocommit=True,  # CREATE/DROP DATABASE cannot run in a transaction
        )

    def create_database(self, name: str | None = None, *, template: str | None = None) -> str:
        """A new database (a copy of `template`, else empty); returns its SQLAlchemy URL."""
        name = name or f"kubetrain_test_{uuid.uuid4().hex[:12]}"
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template is not None:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with self._admin() as connection:
            connection.execute(statement)
        return self.admin_url.set(database=name).render_as_string(hide_password=False)

    def drop_database(self, name: str) -> None:
        with self._admin() as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def migrated_template(self) -> str:
        """A database at the head revision, made once, to copy for each test.

        Copying it takes a quarter of the time of creating a database and
        migrating it, and the migrations themselves are tested separately.
        """
        if self._template is None:
            name = f"kubetrain_template_{uuid.uuid4().hex[:12]}"
            database = Database(self.create_database(name))
            try:
                database.upgrade()
            finally:
                database.dispose()  # a template must have no connections when copied
            self._template = name
        return self._template

    def clean_up(self) -> None:
        """Drop what this session made (on a server we started, `stop` removes everything)."""
        if self._template is not None:
            self.drop_database(self._template)
            self._template = None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    if url := os.environ.get(POSTGRES_URL_ENV):
        server = PostgresServer.existing(url)
        yield server
        server.clean_up()
        return
    try:
        server = PostgresServer.start()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))  # never a silent skip: PostgreSQL is a supported database
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """The database kind; narrow a test with `@pytest.mark.parametrize("backend", [...],
    indirect=True)`."""
    return str(request.param)


def _sqlite_template(request: pytest.FixtureRequest) -> Path:
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    path = factory.getbasetemp() / "sqlite-template" / "kubetrain.db"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        partial = path.with_name("partial.db")
        partial.unlink(missing_ok=True)
        database = Database(f"sqlite:///{partial}")
        database.upgrade()
        database.dispose()  # the last connection closed: no WAL file beside it
        partial.rename(path)
    return path


@contextmanager
def _fresh_database(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool
) -> Iterator[str]:
    if backend == "sqlite":
        path = tmp_path / "kubetrain.db"
        if migrated:
            # A copy of a database migrated once per worker, as PostgreSQL's template:
            # running every migration per test cost most of an API test's time.
            shutil.copyfile(_sqlite_template(request), path)
        yield f"sqlite:///{path}"
        return
    # The server starts only when a PostgreSQL case runs (`-k sqlite` needs none).
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"kubetrain_test_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name, template=server.migrated_template() if migrated else None)
    try:
        yield url
    finally:
        server.drop_database(name)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database, once per backend: a SQLite file, a PostgreSQL database."""
    with _fresh_database(backend, request, tmp_path, migrated=False) as url:
        yield url


@pytest.fixture
def db(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh database at the head revision, once per backend."""
    with _fresh_database(backend, request, tmp_path, migrated=True) as url:
        database = Database(url)
        try:
            yield database
        finally:
            database.dispose()
