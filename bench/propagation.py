"""Propagation latency: a Pod turning Running in the API server -> RUNNING in our database.

On a `large` pool testbed (520 nodes), `kubetrain serve` with its control loops
(dispatcher, syncer, leader election) gets --jobs CPU-only jobs through the
API; KWOK starts their Pods (fate `hang` by default: they stay Running, so no
job can skip RUNNING on its way to SUCCEEDED). Measured per job, all on this
host's wall clock:

* `watch_at`: when a bare watch client in this process (httpx2 streaming
  `GET /api/v1/pods?watch=1&labelSelector=kubetrain.io/job-id`) first sees the
  Pod Running: the baseline, what any watcher pays;
* `db_at`: the `at` of the job's business transition to RUNNING in the
  `transitions` table (the syncer's clock, read in the transaction that commits it);
* `started_at`: the container's `startedAt` as the API server stores it, which
  is whole seconds (RFC 3339 without fraction), so latencies measured from it
  carry up to 1 s of truncation; both columns carry the same.

--layout split runs the production layout instead of the embedded one: an
API replica (`serve --no-control`) takes the submissions and a control replica
(`serve --no-api`) runs the dispatcher and the syncer, on the same database;
the syncer then shares no process (and no GIL) with the API's requests.

Figures: p50/p99 of `db_at - watch_at` (kubetrain's lag behind a bare watch,
exact), of `watch_at - started_at` and `db_at - started_at`, and the ratio of
the last two p99s, and where the syncer's rounds spent their time (the
server's kubetrain_sync_round_seconds). Prints tables and writes
bench/results/propagation-DATABASE[-split].json.
The server, the testbed and PostgreSQL are stopped at the end, also on error.

    .venv/bin/python bench/propagation.py [--jobs 1000] [--database sqlite|postgresql]
        [--layout one|split]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import ssl
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg

from _common import RESULTS, percentile, table
from _serve import Serve, training_job
from sqlalchemy import select

from kubetrain.store import Database
from kubetrain.store.models import Transition, TransitionKind
from kubetrain.testbed.cluster import Testbed

LABEL = "kubetrain.io/job-id"
FATE = "testbed.kubetrain.io"
TARGET_P99_S = 1.0
TARGET_RATIO = 3.0


class BareWatch(threading.Thread):
    """Streams Pod watch events and records when each job's Pod is first seen Running."""

    def __init__(self, testbed: Testbed) -> None:
        super().__init__(daemon=True)
        context = ssl.create_default_context(cafile=str(testbed.pki.ca_cert))
        context.load_cert_chain(str(testbed.pki.admin_cert), str(testbed.pki.admin_key))
        self.client = httpx.Client(base_url=testbed.server, verify=context, timeout=None)
        self.seen: dict[str, tuple[float, float | None]] = {}  # job id -> (watch_at, started_at)
        self.events = 0
        self.error: str | None = None
        self.ready = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        params = {"watch": "1", "labelSelector": LABEL}
        while not self.stopped.is_set():
            try:
                with self.client.stream("GET", "/api/v1/pods", params=params) as response:
                    response.raise_for_status()
                    self.ready.set()
                    for line in response.iter_lines():
                        if line:
                            self._event(json.loads(line), time.time())
            except Exception as exc:
                if not self.stopped.is_set():
                    self.error = repr(exc)[:300]
                    time.sleep(0.2)

    def _event(self, event: dict[str, Any], now: float) -> None:
        self.events += 1
        pod = event.get("object") or {}
        job_id = (pod.get("metadata", {}).get("labels") or {}).get(LABEL)
        if not job_id or job_id in self.seen:
            return
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            running = (container.get("state") or {}).get("running")
            if running is not None:
                started = running.get("startedAt")
                started_at = datetime.fromisoformat(started).timestamp() if started else None
                self.seen[job_id] = (now, started_at)
                return

    def stop(self) -> None:
        self.stopped.set()
        self.client.close()


def running_transitions(db: Database) -> dict[str, float]:
    with db.read_only() as session:
        rows = session.execute(
            select(Transition.job_id, Transition.at).where(
                Transition.kind == TransitionKind.BUSINESS, Transition.to_state == "RUNNING"
            )
        ).all()
    out: dict[str, float] = {}
    for job_id, at in rows:
        out[job_id] = min(out.get(job_id, at.timestamp()), at.timestamp())
    return out


def submit_all(server: Serve, jobs: int, threads: int, annotations: dict[str, str]) -> list[str]:
    run = uuid.uuid4().hex[:6]
    ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        with server.client() as client:
            for i in range(index, jobs, threads):
                body = training_job(f"p-{run}-{i}", "prop", annotations)
                response = client.post(
                    "/api/v1/projects/prop/jobs",
                    json=body,
                    headers={"Idempotency-Key": f"{run}-{i}"},
                )
                with lock:
                    if response.status_code == 201:
                        ids.append(response.json()["id"])
                    else:
                        errors.append(f"{response.status_code} {response.text[:200]}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} submissions failed, first: {errors[0]}")
    return ids


def syncer_rounds(server: Serve) -> dict[str, dict[str, float]]:
    """The server's kubetrain_sync_round_seconds, per stage: rounds, total and mean seconds."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found: dict[str, dict[str, float]] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    bucket_prefix = 'kubetrain_sync_round_seconds_bucket{le="'
    for line in text.splitlines():
        if line.startswith(bucket_prefix):
            le, rest = line[len(bucket_prefix) :].split('",stage="', 1)
            stage, count = rest.split('"}', 1)
            buckets.setdefault(stage, []).append((float(le), float(count)))
        for suffix in ("_sum", "_count"):
            prefix = f'kubetrain_sync_round_seconds{suffix}{{stage="'
            if line.startswith(prefix):
                stage, value = line[len(prefix) :].split('"}', 1)
                found.setdefault(stage, {})[suffix[1:]] = float(value)
    return {
        stage: {
            "rounds": int(v.get("count", 0)),
            "total_s": round(v.get("sum", 0.0), 3),
            "mean_ms": round(1000 * v.get("sum", 0.0) / v["count"], 2) if v.get("count") else 0.0,
            "p99_le_s": _bucket_quantile(buckets.get(stage, []), 0.99),
        }
        for stage, v in found.items()
    }


def _bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the histogram bucket holding the q-quantile (cumulative counts)."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total and count >= q * total:
            return le
    return math.nan


def stats(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 4),
        "p99_s": round(percentile(values, 99), 4),
        "max_s": round(max(values), 4) if values else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=8, help="submitting client threads")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--pool", default="large")
    parser.add_argument(
        "--layout",
        choices=["one", "split"],
        default="one",
        help="one process (embedded), or an API replica and a control replica",
    )
    parser.add_argument("--run", default="hang", help="a Go duration, or `hang` (default)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for all")
    args = parser.parse_args()
    annotations = {f"{FATE}/fate": "hang"} if args.run == "hang" else {f"{FATE}/run": args.run}
    report: dict[str, Any] = {
        "jobs": args.jobs,
        "pool": args.pool,
        "database": args.database,
        "pod_annotations": annotations,
        "layout": args.layout,
        "server": (
            "kubetrain serve (API + dispatcher + syncer, leader-elected)"
            if args.layout == "one"
            else "kubetrain serve --no-control (API) + kubetrain serve --no-api (control loops)"
        ),
    }
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        if args.database == "sqlite":
            url = f"sqlite:///{root / 'bench.db'}"
        else:
            from tests.pg import PostgresServer

            pg = PostgresServer.start()
            stack.callback(pg.stop)
            url = pg.create_database("kubetrain_bench")
        began = time.monotonic()
        testbed = Testbed.up(root / "testbed", args.pool, timeout=600)
        stack.callback(testbed.down)
        report["testbed_up_s"] = round(time.monotonic() - began, 1)
        print(f"testbed ({args.pool}) up in {report['testbed_up_s']} s", flush=True)
        if args.layout == "one":
            server = control = Serve(url, root / "serve.log", kubeconfig=testbed.kubeconfig)
        else:
            server = Serve(url, root / "api.log", args=["--no-control"])
            control = Serve(
                url, root / "control.log", kubeconfig=testbed.kubeconfig, args=["--no-api"]
            )
            control.start()
            stack.callback(control.stop)
        server.start()
        stack.callback(server.stop)
        watch = BareWatch(testbed)
        watch.start()
        stack.callback(watch.stop)
        if not watch.ready.wait(30):
            raise RuntimeError(f"the bare watch did not connect: {watch.error}")
        db = Database(url)
        stack.callback(db.dispose)

        began = time.monotonic()
        ids = submit_all(server, args.jobs, args.threads, annotations)
        report["submit_s"] = round(time.monotonic() - began, 2)
        submitted_at = time.time()
        print(f"submitted {len(ids)} jobs in {report['submit_s']} s", flush=True)
        deadline = time.monotonic() + args.timeout
        wanted = set(ids)
        in_db: dict[str, float] = {}
        last = -1
        while time.monotonic() < deadline:
            in_db = running_transitions(db)
            done = len(wanted & in_db.keys())
            if done == len(wanted) and wanted <= watch.seen.keys():
                break
            if done // 100 != last // 100:
                print(f"  {done}/{len(wanted)} RUNNING in the database", flush=True)
            last = done
            time.sleep(1)
        report["all_running_s"] = round(time.monotonic() - began, 2)
        report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        report["syncer_rounds"] = syncer_rounds(control)
        server_log = server.log.read_text(errors="replace")
        if control is not server:
            server_log += control.log.read_text(errors="replace")
    # Everything is stopped here (ExitStack), even on error.
    both = [j for j in ids if j in in_db and j in watch.seen]
    behind = [in_db[j] - watch.seen[j][0] for j in both]
    # Split at the end of the submissions: before it, the API writes too (SQLite's one writer).
    during = [in_db[j] - watch.seen[j][0] for j in both if watch.seen[j][0] < submitted_at]
    after = [in_db[j] - watch.seen[j][0] for j in both if watch.seen[j][0] >= submitted_at]
    with_start = [j for j in both if watch.seen[j][1] is not None]
    watch_lag = [watch.seen[j][0] - (watch.seen[j][1] or 0) for j in with_start]
    db_lag = [in_db[j] - (watch.seen[j][1] or 0) for j in with_start]
    report.update(
        running_in_db=len(wanted & in_db.keys()),
        seen_by_watch=len(wanted & watch.seen.keys()),
        watch_events=watch.events,
        db_minus_watch=stats(behind),
        db_minus_watch_while_submitting=stats(during),
        db_minus_watch_after_submitting=stats(after),
        watch_minus_started=stats(watch_lag),
        db_minus_started=stats(db_lag),
        server_log_errors=sum("ERROR" in line for line in server_log.splitlines()),
    )
    ratio = report["db_minus_started"]["p99_s"] / report["watch_minus_started"]["p99_s"]
    report["ratio_p99"] = round(ratio, 2)
    total_p99 = report["db_minus_started"]["p99_s"]
    print(
        f"{len(both)} of {args.jobs} jobs seen by both "
        f"({report['running_in_db']} RUNNING in the DB, {report['seen_by_watch']} by the watch)"
    )
    rows = [
        ["bare watch sees Running - startedAt (baseline)", *_row(report["watch_minus_started"])],
        ["DB RUNNING committed - startedAt", *_row(report["db_minus_started"])],
        ["DB RUNNING committed - bare watch sees it", *_row(report["db_minus_watch"])],
        [
            f"  of which seen while submitting ({len(during)})",
            *_row(report["db_minus_watch_while_submitting"]),
        ],
        [f"  of which seen after ({len(after)})", *_row(report["db_minus_watch_after_submitting"])],
    ]
    print(table(["what", "p50 s", "p99 s", "max s"], rows, [50, 9, 9, 9]))
    print(
        f"ratio of p99s (DB / bare watch, from startedAt): {ratio:.2f} (target <= {TARGET_RATIO}); "
        f"p99 {total_p99:.3f} s (target < {TARGET_P99_S} s); "
        f"p99 behind the watch {report['db_minus_watch']['p99_s']:.3f} s"
    )
    if report["syncer_rounds"]:
        print("syncer rounds (kubetrain_sync_round_seconds):")
        print(
            table(
                ["stage", "rounds", "total s", "mean ms", "p99 <= s"],
                [
                    [k, v["rounds"], v["total_s"], v["mean_ms"], v["p99_le_s"]]
                    for k, v in report["syncer_rounds"].items()
                ],
                [12, 8, 10, 10, 10],
            )
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.layout == "one" else f"-{args.layout}"
    path = RESULTS / f"propagation-{args.database}{suffix}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0 if len(both) == args.jobs else 1


def _row(s: dict[str, float]) -> list[float]:
    return [s["p50_s"], s["p99_s"], s["max_s"]]


if __name__ == "__main__":
    sys.exit(main())
