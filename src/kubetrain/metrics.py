"""What an operator graphs and alerts on, in Prometheus' text format at /metrics.

The definitions only: the loops count into these process-wide metrics as things
happen (dispatches, watch restarts, sync lag, request latency); the store
observes the time spent per state (store/metrics.py, which also counts the jobs
by state and reason in the database at each scrape); the API times requests
(api/timing.py) and serves /metrics (api/metrics.py). This module imports no
other part of kubetrain, so any room may count into it. The list, with the
meaning of each metric, is in docs/operations.md.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# From a second (a job dispatched at once) to days (a job queued for GPUs).
_STATE_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
# The syncer aims at seconds; the long tail shows a backlog.
_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

DISPATCHER_CREATED = Counter(
    "kubetrain_dispatcher_jobs_created", "Kubernetes Jobs the dispatcher created"
)
DISPATCHER_FAILURES = Counter(
    "kubetrain_dispatcher_create_failures",
    "Job creations that failed (each is retried with backoff), by raw reason",
    ["reason"],
)
DISPATCHER_RETRIES = Counter(
    "kubetrain_dispatcher_retries",
    "Job creations attempted again after an earlier attempt for the same job failed",
)
WATCH_EVENTS = Counter("kubetrain_watch_events", "Watch events received", ["resource"])
WATCH_RESTARTS = Counter(
    "kubetrain_watch_restarts",
    "Watches (or lists) that failed and were reconnected after a backoff",
    ["resource"],
)
WATCH_RELISTS = Counter(
    "kubetrain_watch_relists",
    "Full lists of a resource: at start, and after 410 Gone (events were lost)",
    ["resource", "cause"],
)
WATCH_CONNECTED = Gauge(
    "kubetrain_watch_connected",
    "1 while the watch stream of a resource is open and its cache is synced",
    ["resource"],
)
LEADER = Gauge(
    "kubetrain_leader", "1 while this process holds the Lease and runs the control loops"
)
SYNC_LAG = Histogram(
    "kubetrain_sync_lag_seconds",
    "From the watch event that marked a job to the commit of its business change",
    buckets=_LAG_BUCKETS,
)
SYNC_JOBS = Counter(
    "kubetrain_sync_jobs",
    "Jobs the syncer diagnosed, by what marked them: a watch event of the job's own "
    "objects (event), or a cluster-wide change or the periodic resync (background)",
    ["trigger"],
)
SYNC_ROUND = Histogram(
    "kubetrain_sync_round_seconds",
    "Where each syncer round's time goes: wait (from its oldest mark to its start), "
    "load (the records), snapshot, diagnose, write (one transaction)",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
JOB_STATE_SECONDS = Histogram(
    "kubetrain_job_state_seconds",
    "Time jobs spent in a business state, observed when they leave it",
    ["state"],
    buckets=_STATE_BUCKETS,
)
HTTP_DURATION = Histogram(
    "kubetrain_http_request_duration_seconds",
    "API request latency, by route template (not the raw path: ids would explode the series)",
    ["method", "route", "status"],
)
