"""Scale: how kubetrain's costs grow with the number of jobs it tracks.

On a `large` pool testbed (500 nodes x 8 GPUs, 20 CPU nodes), one `kubetrain
serve` (API, dispatcher, syncer, leader election; SQLite) gets jobs of 1 GPU
through the API in steps, ramping the total to each of --sizes; every job runs
through KWOK's stages (Pending, Running for --run, Succeeded) to SUCCEEDED
before the next step starts. Per step, in the same run:

* submission: the step's POSTs per second (8 client threads);
* dispatcher: Kubernetes Jobs created per second (the dispatcher's
  CREATED -> QUEUED commits), against a bare client making the same objects
  for as many jobs, 50 at a time (the dispatcher's batch), in another
  namespace of the same API server just after: each job's Job as kubetrain
  renders it (its labels renamed, so that kubetrain serve does not take them
  for its own), and for a gang (--workers > 1) its headless Service, as the
  dispatcher's one request per Job (two for a gang), through the connections
  the dispatcher creates on (cluster/wire.py, on uvloop): the two differ by
  what kubetrain does around a create, not by their HTTP clients. Judged
  against the bare client's suspended Jobs (the creates alone); the same Jobs
  running as the dispatcher's do are measured and shown beside, and judged
  too the whole way: each side's Jobs per second from its first create (the
  dispatcher's first QUEUED) to the last of its Jobs seen with a Pod Running,
  the cluster's work on the Pods in both windows. The server
  reports to itself (KUBETRAIN_STATUS_URL), as deployed, so its Jobs carry
  the Pods' projected token. Within a step the
  dispatcher cannot outrun the submissions, so after the ramp --backlog jobs
  are committed in one transaction and the dispatcher's rate through that
  backlog is measured against the bare client's for as many jobs, run once
  the backlog's jobs have SUCCEEDED (so that the server's work on them does not
  share the bare client's window), and the backlog's propagation (below). In each
  of these windows the cores each process group used (the API server, etcd, the
  rest of the testbed, kubetrain serve, this bench) and the API server's CPU per
  Job made are reported: where the two cores went. With --pin, kubetrain serve
  and this bench (the bare client) run on the last CPU and the testbed on the
  others from the backlog on, as a controller runs apart from its control plane;
* propagation, p50/p99: the `at` of the RUNNING and SUCCEEDED transitions,
  each against when a bare watch in this process saw the Pod Running or the Job
  Complete; both from the API server's own timestamps (container `startedAt`,
  Job `completionTime`, whole seconds);
* the server process: CPU seconds used in the step (per job), RSS after it;
* the database's size (SQLite's pages in use).

Before the ramp, --warmup jobs (default 200) run the same way and are not a
step: a server that has not yet served a request grows by a one-time amount
on its first jobs (imports, statement caches, the allocator's arenas), which
is not growth per tracked job. Memory is judged from the RSS after the
warm-up: KB per job added, step by step, and the slope of a least-squares
line through (jobs tracked, RSS) at the warm-up and every step; the growth
of the idle server over the warm-up is reported beside them.

Growth is judged per job: KB of RSS per job added, CPU ms per job, and the
propagation p99 at each size. Prints a table, writes bench/results/scale.json
and bench/results/scale.svg. Everything is stopped at the end, also on error.

    .venv/bin/python bench/scale.py [--sizes 500,1000,2000] [--run 2s] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import signal
import ssl
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec
import uvloop
from _common import RESULTS, percentile, table
from _plots import line_panels
from _serve import Serve, training_job
from sqlalchemy import select, text

from kubetrain.cluster.wire import Connections
from kubetrain.domain.manifest import LABEL_JOB_ID, RenderOptions, render_job, render_service
from kubetrain.domain.spec import TrainingJob, parse_training_job, spec_digest
from kubetrain.store import Database, submit_job
from kubetrain.store.models import Job, Transition, TransitionKind
from kubetrain.testbed.cluster import Testbed

FATE = "testbed.kubetrain.io"
PROJECT = "scale"
TARGET_RATIO = 3.0  # propagation p99 against the bare watch's
TARGET_KB_PER_JOB = 20.0  # issue #28's line
TARGET_DISPATCH = 0.8  # the dispatcher through the backlog against the bare client
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _ts(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


class BareWatch(threading.Thread):
    """A plain watch of one path: when each job first met `seen`, and the API server's
    own timestamp for it."""

    def __init__(self, testbed: Testbed, path: str, seen: Any) -> None:
        super().__init__(daemon=True)
        context = ssl.create_default_context(cafile=str(testbed.pki.ca_cert))
        context.load_cert_chain(str(testbed.pki.admin_cert), str(testbed.pki.admin_key))
        self.client = httpx.Client(base_url=testbed.server, verify=context, timeout=None)
        self.path, self.predicate = path, seen
        self.seen: dict[str, tuple[float, float | None]] = {}  # job id -> (seen_at, k8s time)
        self.error: str | None = None
        self.ready = threading.Event()
        self.stopped = threading.Event()

    def run(self) -> None:
        params = {"watch": "1", "labelSelector": LABEL_JOB_ID}
        while not self.stopped.is_set():
            try:
                with self.client.stream("GET", self.path, params=params) as response:
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
        obj = event.get("object") or {}
        job_id = (obj.get("metadata", {}).get("labels") or {}).get(LABEL_JOB_ID)
        if job_id and job_id not in self.seen:
            found, at = self.predicate(obj)
            if found:
                self.seen[job_id] = (now, at)

    def stop(self) -> None:
        self.stopped.set()
        self.client.close()


def pod_running(pod: dict[str, Any]) -> tuple[bool, float | None]:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        running = (container.get("state") or {}).get("running")
        if running is not None:
            return True, _ts(running.get("startedAt"))
    return False, None


def job_complete(job: dict[str, Any]) -> tuple[bool, float | None]:
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Complete" and condition.get("status") == "True":
            return True, _ts(status.get("completionTime") or condition.get("lastTransitionTime"))
    return False, None


def transitions(db: Database, state: str) -> dict[str, float]:
    """Job id -> the `at` of its first business transition into `state`."""
    with db.read_only() as session:
        rows = session.execute(
            select(Transition.job_id, Transition.at).where(
                Transition.kind == TransitionKind.BUSINESS, Transition.to_state == state
            )
        ).all()
    out: dict[str, float] = {}
    for job_id, at in rows:
        out[job_id] = min(out.get(job_id, at.timestamp()), at.timestamp())
    return out


def all_succeeded(
    db: Database, ids: list[str], jobs: BareWatch, deadline: float
) -> dict[str, float]:
    """When each job went SUCCEEDED, once all have and the bare watch saw every Job
    complete, or at `deadline` (monotonic) with those that have."""
    while True:
        succeeded = transitions(db, "SUCCEEDED")
        done = all(j in succeeded for j in ids) and all(j in jobs.seen for j in ids)
        if done or time.monotonic() >= deadline:
            return succeeded
        time.sleep(1)


def submit(server: Serve, names: list[str], threads: int, run: str) -> dict[str, float]:
    """POST each job; job id -> when its 201 came back."""
    done: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        with server.client() as client:
            for name in names[index::threads]:
                body = training_job(name, PROJECT, {f"{FATE}/run": run})
                body["spec"]["resources"]["gpus"] = 1
                reply = client.post(
                    f"/api/v1/projects/{PROJECT}/jobs", json=body, headers={"Idempotency-Key": name}
                )
                with lock:
                    if reply.status_code == 201:
                        done[reply.json()["id"]] = time.time()
                    else:
                        errors.append(f"{reply.status_code} {reply.text[:200]}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} submissions failed, first: {errors[0]}")
    return done


def backlog_job(name: str, run: str, workers: int) -> TrainingJob:
    """A backlog's job: 1 GPU per worker, running for `run` on KWOK."""
    body = training_job(name, PROJECT, {f"{FATE}/run": run})
    body["spec"]["resources"]["gpus"] = 1
    if workers > 1:
        body["spec"]["workers"] = workers
    return parse_training_job(body, project=PROJECT)


encode = msgspec.json.Encoder().encode


def foreign(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest of kubetrain's with its labels renamed (same sizes), so that kubetrain
    serve's watches of its own Jobs and Pods do not take the bare client's for its own:
    it sees them as any other workload of the cluster (Events, bound Pods), no more."""

    def renamed(labels: dict[str, str]) -> dict[str, str]:
        return {
            key.replace("kubetrain", "bareclnt"): value.replace("kubetrain", "bareclnt")
            for key, value in labels.items()
        }

    meta = manifest["metadata"]
    meta["labels"] = renamed(meta.get("labels") or {})
    template = (manifest.get("spec") or {}).get("template")
    if template is not None:
        template["metadata"]["labels"] = renamed(template["metadata"].get("labels") or {})
    selector = (manifest.get("spec") or {}).get("selector")
    if manifest["kind"] == "Service" and selector:
        manifest["spec"]["selector"] = renamed(selector)
    return manifest


def bare_creates(
    testbed: Testbed,
    count: int,
    status_url: str,
    *,
    workers: int = 1,
    concurrency: int = 50,
    run: str | None = None,
    meter: Meter | None = None,
) -> BareRun:
    """A bare client making what the dispatcher makes for `count` jobs (their Jobs as
    kubetrain renders them; a gang's Service too) in a namespace of its own (deleted
    after), `concurrency` in flight as the dispatcher's batch. Suspended (no Pods: the
    creates alone) unless `run` is given: then they run for `run` on KWOK as the
    dispatcher's do, so the cluster's work on their Pods shares the window too, and
    the rate to the last of their Pods seen Running (a watch of the namespace, open
    before the first create) is measured as well. With a `meter`, also where the cores
    went in each window."""
    context = ssl.create_default_context(cafile=str(testbed.pki.ca_cert))
    context.load_cert_chain(str(testbed.pki.admin_cert), str(testbed.pki.admin_key))
    namespace = f"scale-bare-{uuid.uuid4().hex[:6]}"
    options = RenderOptions(status_url=status_url)
    job = backlog_job("bare", run or "1s", workers)

    def manifest(i: int) -> dict[str, Any]:
        rendered = render_job(f"bare-{i}", job, namespace, dataset=None, options=options)
        rendered["spec"]["suspend"] = run is None
        return foreign(rendered)

    async def go() -> BareRun:
        # The creates on the connections the dispatcher uses (cluster/wire.py), so that
        # the two differ by what kubetrain does around a create, not by the HTTP client.
        creates = Connections(testbed.server, context, None, timeout_s=60)
        async with httpx.AsyncClient(base_url=testbed.server, verify=context, timeout=60) as http:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            (await http.post("/api/v1/namespaces", json=body)).raise_for_status()
            limit = asyncio.Semaphore(concurrency)
            path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
            services = f"/api/v1/namespaces/{namespace}/services"

            async def one(i: int) -> None:
                async with limit:
                    created = await creates.post(path, encode(manifest(i)))
                    if not created.ok:
                        raise RuntimeError(f"{created.status} {created.body[:200]!r}")
                    if workers > 1:
                        uid = json.loads(created.body)["metadata"]["uid"]
                        service = foreign(render_service(f"bare-{i}", namespace, uid))
                        made = await creates.post(services, encode(service))
                        if not made.ok:
                            raise RuntimeError(f"{made.status} {made.body[:200]!r}")

            running: dict[str, float] = {}  # Job -> when this watch saw a Pod of it Running
            watching = asyncio.Event()
            watch = (
                asyncio.create_task(_watch_running(http, namespace, running, count, watching))
                if run is not None
                else None
            )
            if watch is not None:
                await asyncio.wait_for(watching.wait(), 60)
            whole = copy.copy(meter) if meter is not None and watch is not None else None
            for each in (meter, whole):
                if each is not None:
                    each.start()
            began = time.monotonic()
            await asyncio.gather(*(one(i) for i in range(count)))
            result = BareRun(count / (time.monotonic() - began))
            result.cpu = meter.stop(count) if meter is not None else None
            if watch is not None:
                await asyncio.wait_for(watch, 300)
                result.running_per_s = count / (max(running.values()) - began)
                result.running_cpu = whole.stop(count) if whole is not None else None
            await creates.aclose()
            await http.delete(f"/api/v1/namespaces/{namespace}")
            # Gone before what is measured next: its Jobs' deletion would share that window.
            while (await http.get(f"/api/v1/namespaces/{namespace}")).status_code != 404:
                await asyncio.sleep(0.5)
            return result

    return uvloop.run(go())


@dataclass
class BareRun:
    """What one bare client's run measured."""

    create_per_s: float
    cpu: dict[str, Any] | None = None  # where the cores went while it created
    # With `run`: Jobs per second from its first create to the last Job seen with a Pod
    # Running, and where the cores went in that window.
    running_per_s: float | None = None
    running_cpu: dict[str, Any] | None = None


async def _watch_running(
    http: httpx.AsyncClient,
    namespace: str,
    running: dict[str, float],
    jobs: int,
    watching: asyncio.Event,
) -> None:
    """Note when each Job of `namespace` is first seen with a Pod Running (as the bare
    watch of the dispatcher's Pods notes each job), until `jobs` have been."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    async with http.stream("GET", path, params={"watch": "1"}, timeout=None) as response:
        response.raise_for_status()
        watching.set()
        async for line in response.aiter_lines():
            if not line:
                continue
            pod = json.loads(line).get("object") or {}
            labels = (pod.get("metadata") or {}).get("labels") or {}
            job = labels.get("batch.kubernetes.io/job-name")
            if job and job not in running and pod_running(pod)[0]:
                running[job] = time.monotonic()
                if len(running) >= jobs:
                    return


def database_bytes(db: Database) -> int:
    """The database's size as SQLite counts it (pages in use, the WAL's included), not the
    files' (the WAL file grows and shrinks with checkpoints, whatever the data)."""
    with db.read_only() as session:
        pages = session.execute(text("PRAGMA page_count")).scalar_one()
        free = session.execute(text("PRAGMA freelist_count")).scalar_one()
        size = session.execute(text("PRAGMA page_size")).scalar_one()
    return int((pages - free) * size)


def process_sample(pid: int) -> tuple[float, int]:
    """(CPU seconds so far, RSS bytes) of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return cpu, rss


# How the processes in a window are grouped: the API server and etcd on their own, the
# rest of the testbed together (controllers, scheduler, KWOK, Kueue when it runs).
_APART = ("kube-apiserver", "etcd")
CLUSTER = "rest of the cluster"
SERVER = "kubetrain serve"
BENCH = "this bench (bare client, bare watches)"


class Meter:
    """Cores each process group used through a window, and the API server's CPU per Job
    made in it: where the two cores went while the dispatcher worked through the backlog
    and while the bare client made as many Jobs."""

    def __init__(self, testbed: Testbed, server_pid: int) -> None:
        pids = testbed.state().pids
        self.groups: dict[str, list[int]] = {name: [] for name in (*_APART, CLUSTER, SERVER, BENCH)}
        for component, pid in pids.items():
            if Path(f"/proc/{pid}").exists():
                self.groups[component if component in _APART else CLUSTER].append(pid)
        self.groups[SERVER].append(server_pid)
        self.groups[BENCH].append(os.getpid())
        self._began: tuple[float, dict[str, float]] | None = None

    def _cpu(self) -> dict[str, float]:
        return {
            name: sum(process_sample(pid)[0] for pid in pids) for name, pids in self.groups.items()
        }

    def start(self) -> None:
        self._began = (time.monotonic(), self._cpu())

    def stop(self, jobs: int) -> dict[str, Any]:
        assert self._began is not None, "start the meter first"
        began, cpu0 = self._began
        seconds, cpu1 = time.monotonic() - began, self._cpu()
        used = {name: cpu1[name] - cpu0[name] for name in cpu0}
        return {
            "window_s": round(seconds, 2),
            "cpu_s": {name: round(cpu, 2) for name, cpu in used.items()},
            "cores": {name: round(cpu / seconds, 2) for name, cpu in used.items()},
            "apiserver_ms_per_job": round(1000 * used["kube-apiserver"] / max(1, jobs), 2),
        }


def pin(testbed: Testbed, server_pid: int) -> dict[str, list[int]]:
    """Each client on a core of its own, as a controller runs on a machine apart from the
    control plane's: kubetrain serve and this process (the bare client, the bare watches)
    on the last CPU, every testbed process on the others; all their threads (a thread
    made later takes its maker's). Returns the CPUs given to each side."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("--pin needs two CPUs at least")
    client, cluster = {cpus[-1]}, set(cpus[:-1])
    for pid in testbed.state().pids.values():
        _pin_threads(pid, cluster)
    for pid in (server_pid, os.getpid()):
        _pin_threads(pid, client)
    return {"clients": sorted(client), "cluster": sorted(cluster)}


def _pin_threads(pid: int, cpus: set[int]) -> None:
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):  # a thread ended
            os.sched_setaffinity(int(task.name), cpus)


def stats(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_s": round(percentile(values, 50), 3),
        "p99_s": round(percentile(values, 99), 3),
    }


def lags(ids: list[str], db_at: dict[str, float], watch: BareWatch) -> dict[str, dict[str, float]]:
    both = [j for j in ids if j in db_at and j in watch.seen and watch.seen[j][1] is not None]
    return {
        "watch": stats([watch.seen[j][0] - (watch.seen[j][1] or 0) for j in both]),
        "db": stats([db_at[j] - (watch.seen[j][1] or 0) for j in both]),
        "db_minus_watch": stats([db_at[j] - watch.seen[j][0] for j in both]),
    }


def step(
    args: argparse.Namespace,
    server: Serve,
    db: Database,
    testbed: Testbed,
    watches: tuple[BareWatch, BareWatch],
    size: int,
    previous: int,
    prefix: str = "s",
) -> dict[str, Any]:
    pods, jobs = watches
    assert server.proc is not None
    cpu0, _ = process_sample(server.proc.pid)
    names = [f"{prefix}{i}" for i in range(previous, size)]
    began = time.monotonic()
    submitted = submit(server, names, args.threads, args.run)
    submit_s = time.monotonic() - began
    ids = list(submitted)
    print(f"  {len(ids)} submitted in {submit_s:.1f} s", flush=True)
    succeeded = all_succeeded(db, ids, jobs, time.monotonic() + args.timeout)
    all_done_s = time.monotonic() - began
    finished = sum(j in succeeded for j in ids)
    cpu1, rss = process_sample(server.proc.pid)
    queued = transitions(db, "QUEUED")
    dispatched = sorted(queued[j] for j in ids if j in queued)
    dispatch_lag = [queued[j] - submitted[j] for j in ids if j in queued]
    dispatch_rate = (
        len(dispatched) / (dispatched[-1] - dispatched[0]) if len(dispatched) > 1 else 0.0
    )
    bare_rate = bare_creates(testbed, min(len(ids), args.bare_max), args.status_url).create_per_s
    db_bytes = database_bytes(db)
    result = {
        "jobs_total": size,
        "jobs_added": len(ids),
        "finished": finished,
        "submit_per_s": round(len(ids) / submit_s, 1),
        "dispatch_per_s": round(dispatch_rate, 1),
        "bare_create_per_s": round(bare_rate, 1),
        "dispatch_lag": stats(dispatch_lag),
        "running": lags(ids, transitions(db, "RUNNING"), pods),
        "succeeded": lags(ids, succeeded, jobs),
        "step_s": round(all_done_s, 1),
        "cpu_s": round(cpu1 - cpu0, 1),
        "cpu_ms_per_job": round(1000 * (cpu1 - cpu0) / max(1, len(ids)), 1),
        "rss_mb": round(rss / 2**20, 1),
        "db_mb": round(db_bytes / 2**20, 2),
    }
    print(
        f"  {finished}/{len(ids)} SUCCEEDED, step {all_done_s:.0f} s; "
        f"RSS {result['rss_mb']} MB, DB {result['db_mb']} MB",
        flush=True,
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,1000,2000", help="total jobs at each point")
    parser.add_argument("--run", default="2s", help="how long each Pod runs (a Go duration)")
    parser.add_argument("--threads", type=int, default=8, help="submitting client threads")
    parser.add_argument("--pool", default="large")
    parser.add_argument("--bare-max", type=int, default=1000, help="at most this many bare Jobs")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per step, at most")
    parser.add_argument(
        "--warmup", type=int, default=200, help="jobs run before the ramp, not a step"
    )
    parser.add_argument(
        "--backlog", type=int, default=1000, help="jobs committed at once after the ramp"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="workers of each backlog job (> 1: gangs)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="through the backlog and the bare clients, kubetrain serve and this bench "
        "(the bare client) on the last CPU, the testbed on the others",
    )
    args = parser.parse_args()
    # Stopped early (SIGTERM), the testbed and the server still go, and the steps so far stay.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, not {args.sizes!r}")
    if not sizes or sizes[0] <= 0:
        parser.error("--sizes needs positive sizes")
    report: dict[str, Any] = {
        "sizes": sizes,
        "pool": args.pool,
        "run": args.run,
        "database": "sqlite",
        "server": "kubetrain serve (API + dispatcher + syncer, leader-elected)",
        "steps": [],
    }
    with tempfile.TemporaryDirectory(prefix="kubetrain-scale-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        url = f"sqlite:///{root / 'scale.db'}"
        began = time.monotonic()
        testbed = Testbed.up(root / "testbed", args.pool, timeout=600)
        stack.callback(testbed.down)
        report["testbed_up_s"] = round(time.monotonic() - began, 1)
        print(f"testbed ({args.pool}) up in {report['testbed_up_s']} s", flush=True)
        server = Serve(url, root / "serve.log", kubeconfig=testbed.kubeconfig)
        # As deployed: the Pods report to it, so its Jobs carry their projected token.
        server.extra_env["KUBETRAIN_STATUS_URL"] = args.status_url = server.url
        server.start()
        stack.callback(server.stop)
        watches = (
            BareWatch(testbed, "/api/v1/pods", pod_running),
            BareWatch(testbed, "/apis/batch/v1/jobs", job_complete),
        )
        for watch in watches:
            watch.start()
            stack.callback(watch.stop)
            if not watch.ready.wait(30):
                raise RuntimeError(f"a bare watch did not connect: {watch.error}")
        db = Database(url)
        stack.callback(db.dispose)
        assert server.proc is not None
        report["rss_mb_idle"] = round(process_sample(server.proc.pid)[1] / 2**20, 1)
        report["warmup_jobs"] = args.warmup
        if args.warmup:
            print(f"warm-up: {args.warmup} jobs", flush=True)
            report["warmup"] = step(args, server, db, testbed, watches, args.warmup, 0, "w")
        previous = 0
        for size in sizes:
            print(f"step to {size} jobs", flush=True)
            result = step(args, server, db, testbed, watches, size, previous)
            report["steps"].append(result)
            previous = size
            _save(report)  # a long run keeps what it measured so far
            if result["finished"] < result["jobs_added"]:
                print("  not all finished within --timeout: stopping the ramp", flush=True)
                break
        if args.backlog:
            print(f"backlog: {args.backlog} jobs committed at once", flush=True)
            report["backlog"] = backlog(args, db, testbed, watches, server.proc.pid)
        server_log = server.log.read_text(errors="replace")
    report["server_log_errors"] = sum('"ERROR"' in line for line in server_log.splitlines())
    verdict = judge(report)
    report["verdict"] = verdict
    _save(report)
    print_table(report)
    for line in verdict["lines"]:
        print(line)
    print(f"wrote {RESULTS / 'scale.json'} and {RESULTS / 'scale.svg'}")
    return 0 if all(s["finished"] == s["jobs_added"] for s in report["steps"]) else 1


def backlog(
    args: argparse.Namespace,
    db: Database,
    testbed: Testbed,
    watches: tuple[BareWatch, BareWatch],
    server_pid: int,
) -> dict[str, Any]:
    """The dispatcher's own throughput: `--backlog` jobs committed to the outbox in one
    transaction (what a burst of submissions leaves behind when it outruns the
    dispatcher), Jobs created per second from the first to the last QUEUED; then, once
    the backlog's jobs have SUCCEEDED, a bare client creating as many Jobs, and the
    backlog's propagation beside the bare watches': the syncer's rounds wait for a
    backlog (control/runner.py, BACKLOG_FIRST), and this is what that costs them."""
    with db.read_only() as session:
        # The namespace the server gave the ramp's jobs (from its settings).
        ours = select(Job.namespace).where(Job.project == PROJECT).limit(1)
        namespace = session.scalars(ours).one()
    ids = []
    with db.transaction() as session:
        for i in range(args.backlog):
            job = backlog_job(f"b{i}", args.run, args.workers)
            submission = submit_job(
                session,
                project=PROJECT,
                name=f"b{i}",
                owner="bench",
                namespace=namespace,
                spec=job.model_dump(mode="json"),
                digest=spec_digest(job),
            )
            ids.append(submission.job.id)
    pinned = pin(testbed, server_pid) if args.pin else None
    meter = Meter(testbed, server_pid)
    whole = copy.copy(meter)  # to the last job Running
    meter.start()
    whole.start()
    committed = time.time()
    deadline = time.monotonic() + args.timeout
    queued: dict[str, float] = {}
    while time.monotonic() < deadline:
        queued = transitions(db, "QUEUED")
        if all(j in queued for j in ids):
            break
        time.sleep(0.25)
    # The backlog's Jobs only: `queued` holds the warm-up's and the ramp's too.
    times = sorted(queued[j] for j in ids if j in queued)
    dispatch_cpu = meter.stop(len(times))
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    # Through to Running: the backlog's jobs per second from the first QUEUED to the last
    # job the bare watch saw with a Pod Running (when it saw it, not the whole second of
    # startedAt): the cluster's work on the Pods in the window, as in the bare client's.
    pods, jobs = watches
    while time.monotonic() < deadline and not all(j in pods.seen for j in ids):
        time.sleep(0.1)
    seen_running = [pods.seen[j][0] for j in ids if j in pods.seen]
    to_running = len(seen_running) / (max(seen_running) - times[0]) if times else 0.0
    running_cpu = whole.stop(len(seen_running))
    # The bare client once the backlog's jobs are recorded SUCCEEDED: the server's work on
    # them then no longer shares the cores with the bare client's creates.
    succeeded = all_succeeded(db, ids, jobs, deadline)
    count = min(args.backlog, args.bare_max)
    bare = bare_creates(testbed, count, args.status_url, workers=args.workers, meter=meter)
    # Then the same Jobs running, as the dispatcher's ran: their Pods made, scheduled and
    # run by the cluster on the same two cores while the creates go on (after the
    # suspended ones, whose namespace is gone by then: nothing of theirs runs).
    running = bare_creates(
        testbed, count, args.status_url, workers=args.workers, run=args.run, meter=meter
    )
    result = {
        "jobs": args.backlog,
        "workers": args.workers,
        "pinned": pinned,
        "queued": len(times),
        "first_queued_after_commit_s": round(times[0] - committed, 2) if times else None,
        "dispatch_per_s": round(rate, 1),
        # The server's CPU from the commit to the last QUEUED (the syncer's work on the
        # backlog's jobs made so far included), per job: kubetrain's own cost, which the
        # ratio shows only through what the API server is left of the two cores.
        "server_cpu_ms_per_job": round(
            1000 * dispatch_cpu["cpu_s"][SERVER] / max(1, len(times)), 2
        ),
        "bare_create_per_s": round(bare.create_per_s, 1),
        "bare_running_create_per_s": round(running.create_per_s, 1),
        # The whole way, each side's Jobs to Running (the cluster's work on the Pods in
        # both windows), judged beside the creates.
        "to_running_per_s": round(to_running, 1),
        "bare_to_running_per_s": round(running.running_per_s or 0.0, 1),
        # Where the two cores went in each window (the dispatcher's: from the commit to
        # the last QUEUED seen, polled every 0.25 s; to Running: from the commit, and from
        # the bare client's first create, to the last job seen Running).
        "cpu": {
            "dispatcher": dispatch_cpu,
            "bare": bare.cpu,
            "bare_running": running.cpu,
            "dispatcher_to_running": running_cpu,
            "bare_to_running": running.running_cpu,
        },
        "running": lags(ids, transitions(db, "RUNNING"), pods),
        "succeeded": lags(ids, succeeded, jobs),
    }
    print(f"  {result}", flush=True)
    return result


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """The targets, and how each cost grows from the first to the last step."""
    steps = report["steps"]
    lines = []
    ratios = [
        s[which]["db"]["p99_s"] / s[which]["watch"]["p99_s"]
        for s in steps
        for which in ("running", "succeeded")
        if s[which]["watch"]["n"]
    ]
    worst = max(ratios, default=float("nan"))
    lines.append(
        f"propagation p99 / bare watch p99: worst {worst:.2f} (target <= {TARGET_RATIO}): "
        + ("met" if worst <= TARGET_RATIO else "MISSED")
    )
    kb_per_job = []
    warmup = report.get("warmup")
    rss_before = warmup["rss_mb"] if warmup else report["rss_mb_idle"]
    for s in steps:
        kb_per_job.append(round(1024 * (s["rss_mb"] - rss_before) / s["jobs_added"], 1))
        rss_before = s["rss_mb"]
    # (jobs the server tracks, RSS) from the warm-up on: the slope is the growth per job.
    tracked = report.get("warmup_jobs", 0)
    points = [(tracked, warmup["rss_mb"])] if warmup else []
    points += [(tracked + s["jobs_total"], s["rss_mb"]) for s in steps]
    slope_kb = round(1024 * _slope(points), 1) if len(points) > 1 else float("nan")
    if warmup:
        lines.append(
            f"idle server to warmed up ({tracked} jobs): "
            f"{report['rss_mb_idle']} -> {warmup['rss_mb']} MB (one-time, not judged)"
        )
    lines.append(
        f"RSS growth per job added, by step: {kb_per_job} KB; least-squares slope "
        f"{slope_kb} KB/job (target < {TARGET_KB_PER_JOB}, the slope): "
        + ("met" if slope_kb < TARGET_KB_PER_JOB else "MISSED")
    )
    if "backlog" in report:
        b = report["backlog"]
        lines.append(
            f"dispatcher through a backlog of {b['jobs']} jobs of {b.get('workers', 1)} "
            f"worker(s): {b['dispatch_per_s']} Jobs/s; bare client {b['bare_create_per_s']}/s "
            f"suspended ({b['dispatch_per_s'] / b['bare_create_per_s']:.2f} of it, target >= "
            f"{TARGET_DISPATCH}: "
            + (
                "met"
                if b["dispatch_per_s"] >= TARGET_DISPATCH * b["bare_create_per_s"]
                else "MISSED"
            )
            + ")"
        )
        if b.get("pinned"):
            lines.append(
                f"  pinned: kubetrain serve and the bare client on CPU {b['pinned']['clients']}, "
                f"the testbed on {b['pinned']['cluster']}"
            )
        if "server_cpu_ms_per_job" in b:
            lines.append(f"  the server's CPU through it: {b['server_cpu_ms_per_job']} ms per job")
        if "bare_running_create_per_s" in b:
            lines.append(
                f"  the bare client's Jobs running as the dispatcher's do: "
                f"{b['bare_running_create_per_s']}/s "
                f"({b['dispatch_per_s'] / b['bare_running_create_per_s']:.2f} of it)"
            )
        if b.get("bare_to_running_per_s"):
            whole = b["to_running_per_s"] / b["bare_to_running_per_s"]
            lines.append(
                f"the whole way, each side's Jobs to a Pod Running (the cluster's work on "
                f"the Pods in both windows): dispatcher {b['to_running_per_s']} Jobs/s, "
                f"bare client {b['bare_to_running_per_s']}/s ({whole:.2f} of it, target >= "
                f"{TARGET_DISPATCH}: " + ("met" if whole >= TARGET_DISPATCH else "MISSED") + ")"
            )
            cpu = b["cpu"]["dispatcher_to_running"]
            lines.append(
                f"  the server's CPU through it: "
                f"{1000 * cpu['cpu_s'][SERVER] / max(1, b['jobs']):.2f} ms per job"
            )
        if "cpu" in b:
            windows = {k: v for k, v in b["cpu"].items() if v is not None}
            groups = list(next(iter(windows.values()))["cores"])
            lines.append(f"  cores through each window ({' / '.join(groups)}):")
            for window, cpu in windows.items():
                lines.append(
                    f"    {window}: "
                    + " / ".join(f"{cpu['cores'][g]:.2f}" for g in groups)
                    + f" in {cpu['window_s']} s; the API server's CPU "
                    f"{cpu['apiserver_ms_per_job']} ms per Job"
                )
        if "running" in b:  # not judged: what the backlog's priority costs the syncer
            lines.append(
                "  its jobs' propagation, p50/p99 s, DB (bare watch): RUNNING "
                f"{b['running']['db']['p50_s']}/{b['running']['db']['p99_s']} "
                f"({b['running']['watch']['p50_s']}/{b['running']['watch']['p99_s']}), "
                f"SUCCEEDED {b['succeeded']['db']['p50_s']}/{b['succeeded']['db']['p99_s']} "
                f"({b['succeeded']['watch']['p50_s']}/{b['succeeded']['watch']['p99_s']})"
            )
    if len(steps) > 1:
        first, last = steps[0], steps[-1]
        growth = {
            "cpu_ms_per_job": round(last["cpu_ms_per_job"] / first["cpu_ms_per_job"], 2),
            "db_bytes_per_job": round(
                (last["db_mb"] / last["jobs_total"]) / (first["db_mb"] / first["jobs_total"]), 2
            ),
            "succeeded_p99": round(
                last["succeeded"]["db"]["p99_s"] / first["succeeded"]["db"]["p99_s"], 2
            ),
        }
        lines.append(
            f"per-job cost at {last['jobs_total']} jobs / at {first['jobs_total']} "
            f"(1.0 = linear total): {growth}"
        )
    else:
        growth = {}
    return {
        "worst_ratio_p99": worst,
        "rss_kb_per_job": kb_per_job,
        "rss_kb_per_job_slope": slope_kb,
        "growth": growth,
        "lines": lines,
    }


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0


def print_table(report: dict[str, Any]) -> None:
    header = [
        "jobs",
        "submit/s",
        "dispatch/s",
        "bare/s",
        "RUN p50",
        "RUN p99",
        "watch p99",
        "SUCC p50",
        "SUCC p99",
        "watch p99",
        "CPU ms/job",
        "RSS MB",
        "DB MB",
    ]
    rows = [
        [
            s["jobs_total"],
            s["submit_per_s"],
            s["dispatch_per_s"],
            s["bare_create_per_s"],
            s["running"]["db"]["p50_s"],
            s["running"]["db"]["p99_s"],
            s["running"]["watch"]["p99_s"],
            s["succeeded"]["db"]["p50_s"],
            s["succeeded"]["db"]["p99_s"],
            s["succeeded"]["watch"]["p99_s"],
            s["cpu_ms_per_job"],
            s["rss_mb"],
            s["db_mb"],
        ]
        for s in report["steps"]
    ]
    print(table(header, rows, [7, 10, 11, 8, 9, 9, 10, 9, 9, 10, 11, 8, 8]))
    print(
        "propagation in s from the API server's timestamp (startedAt / completionTime) to the "
        "DB transition; `watch` is the bare watch's, same timestamp"
    )


def _save(report: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(report, indent=2))
    if report["steps"]:
        plot(report, RESULTS / "scale.svg")


def plot(report: dict[str, Any], path: Path) -> None:
    """Four line charts against the job count, each with its bare-client baseline."""
    steps = report["steps"]
    panels = [
        (
            "throughput",
            "jobs per second",
            {
                "submit (POST)": [s["submit_per_s"] for s in steps],
                "dispatch (kubetrain)": [s["dispatch_per_s"] for s in steps],
                "bare client's creates": [s["bare_create_per_s"] for s in steps],
            },
            ["bare client's creates"],
        ),
        (
            "propagation to the database, p99",
            "seconds",
            {
                "RUNNING, database": [s["running"]["db"]["p99_s"] for s in steps],
                "RUNNING, bare watch": [s["running"]["watch"]["p99_s"] for s in steps],
                "SUCCEEDED, database": [s["succeeded"]["db"]["p99_s"] for s in steps],
                "SUCCEEDED, bare watch": [s["succeeded"]["watch"]["p99_s"] for s in steps],
            },
            ["RUNNING, bare watch", "SUCCEEDED, bare watch"],
        ),
        (
            "server memory and database size",
            "MB",
            {"server RSS": [s["rss_mb"] for s in steps], "database": [s["db_mb"] for s in steps]},
            [],
        ),
        (
            "server CPU per job",
            "ms",
            {"CPU": [s["cpu_ms_per_job"] for s in steps]},
            [],
        ),
    ]
    line_panels(
        path,
        "kubetrain against a bare client, by jobs in the cluster",
        [s["jobs_total"] for s in steps],
        "jobs in the cluster",
        panels,
    )


if __name__ == "__main__":
    sys.exit(main())
