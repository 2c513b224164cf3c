"""A leader whose connection to the API server stalls stops acting before a standby takes
its Lease over, and the two never act at once.

Only the leader's connection stalls: its kubeconfig points at a loopback TCP proxy in front
of the testbed's kube-apiserver (TLS passes through untouched; the serving certificate names
127.0.0.1), which at one moment stops passing bytes while keeping every connection open, as
a network that drops packets would. The standby reaches the API server directly, and both
reach the database. Who acted is read from what each process wrote, never from what it
believes: every row written to the database is noted, at commit, with the PostgreSQL
`application_name` of the process that wrote it (the submissions go through a third,
API-only process), and the Kubernetes Jobs are read with their creation times.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace
from psycopg import sql
from sqlalchemy import make_url

from kubetrain.store import Database
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server
from tests.kube import eventually
from tests.pg import PostgresServer
from tests.reliability.test_faults import (
    _history,
    _job,
    _submit,
    _wait_all_finished,
    assert_consistent,
)

pytestmark = [pytest.mark.testbed, pytest.mark.faults]

LEASE_DURATION = 15.0  # LeaderElector's defaults, which `kubetrain serve` uses
RENEW_DEADLINE = 10.0


class StallingProxy:
    """A loopback TCP proxy to `port` on its own event loop thread; `stall()` stops it
    passing bytes either way, for good, while every connection stays open (a stall, not
    a reset: nothing is closed until `close()`)."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.port = 0
        self.stalled_at: float | None = None  # time.time() of the stall
        self.last_forwarded = 0.0  # time.time() of the last chunk passed on, either way
        self.open = 0  # connections open now
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stall = threading.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> StallingProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stall(self) -> float:
        self.stalled_at = time.time()
        self._stall.set()
        return self.stalled_at

    def close(self) -> None:
        async def shut() -> None:
            assert self._server is not None
            self._server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        self._call(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open += 1
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
            try:
                await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
            finally:
                server_w.close()
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # close(): ends as done, or asyncio logs the cancelled callback task
        finally:
            client_w.close()
            self.open -= 1
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not self._stall.is_set():
            data = await reader.read(65536)
            if not data:
                # The other side closed: pass the half-close on, unless stalled by now.
                if not self._stall.is_set():
                    writer.write_eof()
                break
            if self._stall.is_set():
                break  # what arrives once stalled is never passed on
            writer.write(data)
            self.last_forwarded = time.time()
            await writer.drain()
        if self._stall.is_set():
            await asyncio.Event().wait()  # hold the connection open, silent, until closed


def _kubeconfig_via(kubeconfig: Path, port: int, path: Path) -> Path:
    """A copy of `kubeconfig` whose server is 127.0.0.1:`port` (the same name the API
    server's certificate is valid for, so TLS verifies unchanged)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


# Every committed row write, noted with the writer's application_name and the commit's time:
# deferred constraint triggers run at COMMIT, so a write counts when others can see it.
AUDIT = """
CREATE TABLE writes (
    seq bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    app text NOT NULL DEFAULT current_setting('application_name'),
    tbl text NOT NULL,
    op text NOT NULL,
    row_data jsonb
);
CREATE FUNCTION note_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO writes (tbl, op, row_data) VALUES (
        TG_TABLE_NAME, TG_OP, to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END)
    );
    RETURN NULL;
END $$;
"""


def _audit_writes(database_url: str) -> psycopg.Connection[tuple[Any, ...]]:
    url = make_url(database_url)
    conn = psycopg.connect(
        host=url.host, port=url.port, user=url.username, dbname=url.database, autocommit=True
    )
    conn.execute(AUDIT)
    tables = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        " AND tablename NOT IN ('writes', 'alembic_version')"
    ).fetchall()
    for (table,) in tables:
        conn.execute(
            sql.SQL(
                "CREATE CONSTRAINT TRIGGER note_write AFTER INSERT OR UPDATE OR DELETE ON {}"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION note_write()"
            ).format(sql.Identifier(table))
        )
    return conn


@dataclass
class Write:
    at: datetime
    app: str
    table: str
    op: str
    row: dict[str, Any] = field(repr=False)


def _writes(conn: psycopg.Connection[tuple[Any, ...]]) -> list[Write]:
    rows = conn.execute("SELECT at, app, tbl, op, row_data FROM writes ORDER BY seq").fetchall()
    return [Write(*row) for row in rows]


def _logged(log: Path, needle: str) -> tuple[datetime, str] | None:
    """When this replica's JSON log first has a message containing `needle`, and it."""
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if needle in entry.get("message", ""):
                at = datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
                return at, entry["message"]
    return None


def _entered(server: Server, project: str, job_id: str) -> tuple[datetime, datetime]:
    """When the job was submitted and when it first left CREATED (its Job made: QUEUED, or
    RUNNING when the syncer saw its Pod run before the dispatcher recorded the create)."""
    rows = [r for r in _history(server, project, job_id) if r.get("kind", "business") == "business"]
    at = [datetime.fromisoformat(r["at"].replace("Z", "+00:00")) for r in rows]
    made = next(i for i, r in enumerate(rows) if r["to_state"] != "CREATED")
    return at[0], at[made]


@pytest.fixture
def lease_namespace(kube: Client) -> Iterator[str]:
    name = f"stall-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def test_a_leader_cut_off_from_the_api_server_stops_acting_before_the_standby_takes_over(
    testbed: Testbed,
    kube: Client,
    postgres_server: PostgresServer,
    lease_namespace: str,
    tmp_path: Path,
) -> None:
    database_url = postgres_server.create_database()
    db = Database(database_url)
    db.upgrade()
    db.dispose()
    audit = _audit_writes(database_url)
    proxy = StallingProxy(testbed.state().ports.apiserver).start()
    servers: list[Server] = []

    def serve(name: str, args: list[str], kubeconfig: Path | None, token: str = "") -> Server:
        server = Server(
            database_url=database_url,
            log=tmp_path / f"serve-{name}.log",
            kubeconfig=kubeconfig,
            args=args,
            # Names this process's database sessions, and so every row it writes.
            extra_env={"PGAPPNAME": name},
            token=token,
        )
        servers.append(server)
        server.start()
        return server

    stop = threading.Event()
    ids: list[str] = []
    project = f"stall-{uuid.uuid4().hex[:8]}"

    def submit_continuously(api: Server) -> None:
        index = 0
        while not stop.is_set():
            body = _job(f"s{index}", project, "1s")
            ids.append(_submit(api, project, body, f"s-{index}"))
            index += 1
            stop.wait(0.5)

    submitter: threading.Thread | None = None
    try:
        # The API alone (no Lease, no loops): its writes are the submissions, nothing else.
        api = serve("api", ["--no-control"], None)
        loops = ["--no-api", "--lease-namespace", lease_namespace]
        via_proxy = _kubeconfig_via(testbed.kubeconfig, proxy.port, tmp_path / "via-proxy")
        a = serve("replica-a", loops, via_proxy, api.token)
        a_leads = eventually(lambda: _logged(a.log, " is the leader (lease "), 20, what="A leads")
        b = serve("replica-b", loops, testbed.kubeconfig, api.token)
        submitter = threading.Thread(target=submit_continuously, args=(api,), daemon=True)
        submitter.start()

        def a_transitions() -> int:
            return sum(w.app == "replica-a" and w.table == "transitions" for w in _writes(audit))

        # A well into its work: several jobs' transitions written, not just the first.
        eventually(lambda: a_transitions() >= 3, 30, what="A dispatching the first jobs")
        stalled_at = datetime.fromtimestamp(proxy.stall(), UTC)
        b_leads = eventually(
            lambda: _logged(b.log, " is the leader (lease "), LEASE_DURATION + 15, what="B leads"
        )
        held_open = proxy.open  # A's connections, stalled, still open at the takeover
        submitted = len(ids)  # submissions go on after the takeover too
        eventually(lambda: len(ids) >= submitted + 4, 30, what="submissions after the takeover")
        stop.set()
        submitter.join(30)
        assert not submitter.is_alive()
        _wait_all_finished(api, project, len(ids), timeout=90)
        assert_consistent(api, kube, project, ids)

        writes = _writes(audit)
        entered = {job_id: _entered(api, project, job_id) for job_id in ids}
        lease = kube.get(Lease, "kubetrain-controller", namespace=lease_namespace)
        jobs = list(kube.list(Job, namespace=project))
    finally:
        stop.set()
        if submitter is not None:
            submitter.join(30)
        for server in servers:
            server.stop()
        proxy.close()
        audit.close()

    a_identity = a_leads[1].split(" is the leader")[0]
    b_identity = b_leads[1].split(" is the leader")[0]
    assert lease.spec is not None
    assert lease.spec.holderIdentity == b_identity, lease.spec
    takeover = lease.spec.acquireTime  # B's own write of the Lease, to the microsecond
    assert takeover is not None
    # Logged once its loops have ended (cancelled and awaited).
    a_stopped = _logged(a.log, " lost the lease; standing by")
    assert a_stopped is not None, "A never said it stopped acting"

    by_a = [w for w in writes if w.app == "replica-a"]
    by_b = [w for w in writes if w.app == "replica-b"]
    others = {w.app for w in writes} - {"replica-a", "replica-b", "api"}
    assert not others, f"writes by unknown processes: {others}"
    assert by_a, "A never acted"
    assert by_b, "B never acted"
    last_a, first_b = by_a[-1].at, min(w.at for w in by_b)
    print(
        f"A ({a_identity}) led from {a_leads[0]:%T.%f}; proxy stalled at {stalled_at:%T.%f}; "
        f"A's last write {last_a:%T.%f} ({(last_a - stalled_at).total_seconds():.2f} s after), "
        f"A's loops ended at {a_stopped[0]:%T.%f}; B ({b_identity}) acquired the Lease at "
        f"{takeover:%T.%f} ({(takeover - stalled_at).total_seconds():.2f} s after the stall), "
        f"B's first write {first_b:%T.%f}; {len(by_a)} writes by A, {len(by_b)} by B, "
        f"{len(ids)} jobs"
    )
    # The database: every write of A committed before any of B's, and before B's takeover.
    assert last_a < first_b, (by_a[-1], min(by_b, key=lambda w: w.at))
    assert last_a < takeover
    # A stopped by its renew deadline, counted from its last renewal (begun before the
    # stall); a write in flight when its loops were cancelled commits in its thread a
    # moment later. (Before the renewals were bounded, A wrote 11 s after the stall.)
    assert last_a < stalled_at + timedelta(seconds=RENEW_DEADLINE + 0.5)
    assert a_stopped[0] < b_leads[0]
    # B acted only once it held the Lease.
    assert first_b >= takeover
    # And B did not wait out what A had claimed: every job's Job was made within a few
    # seconds of its submission or of the takeover, whichever came later.
    late = {
        job_id: (queued - max(created, takeover)).total_seconds()
        for job_id, (created, queued) in entered.items()
    }
    print(f"the last Job was made {max(late.values()):.1f} s after its job was due to B")
    assert max(late.values()) <= 5, sorted(late.values())
    # Kubernetes: nothing reached the API server through A's connection after the stall, and
    # every Job was created either before the stall (A's) or once B held the Lease (B's),
    # none in between (creationTimestamp has whole seconds).
    assert proxy.last_forwarded <= stalled_at.timestamp()
    assert held_open > 0, "the stall was a reset: A's connections were closed"
    for job in jobs:
        assert job.metadata is not None
        created = job.metadata.creationTimestamp
        assert created is not None
        assert created <= stalled_at or created >= takeover.replace(microsecond=0), (
            job.metadata.name,
            created,
        )
