"""The Queues surfaces' reading of Kueue (api/queues.py), on dumps recorded from the
real Kueue: positions the same as the diagnosis gives, reservations summed from the
admitted Workloads, borrowing above the nominal quota, and the bars drawn from them."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kubetrain.api.context import ApiContext
from kubetrain.api.queues import pending_counts, queue_boards, queues_view
from kubetrain.api.web import views
from tests.api.builders import NEVER_FITS_NAMESPACE, WAITING_NAMESPACE, kueue_cluster
from tests.unit.diagnosis_helpers import dump, facts, items, run

pytestmark = pytest.mark.unit


def _job(listing: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The listing narrowed to one namespace's kt- Job, everything else kept."""
    data = dict(listing)
    data["items"] = [
        i
        for i in listing["items"]
        if i["kind"] != "Job"
        or (i["metadata"]["namespace"] == namespace and i["metadata"]["name"].startswith("kt-"))
    ]
    return data


def test_positions_are_the_ones_the_diagnosis_gives() -> None:
    listing = kueue_cluster()
    (gpus, _stopped) = queue_boards(listing, None)
    boards = {p.workload.namespace: p.position for p in gpus.pending}
    assert boards == {WAITING_NAMESPACE: 1, NEVER_FITS_NAMESPACE: 2}
    # `why` on the waiting job, with every Workload of the queue in view, says the same.
    data = _job(listing, WAITING_NAMESPACE)
    diagnosis = run(data, facts(data))
    assert diagnosis.blockers[0].to_json()["position"] == boards[WAITING_NAMESPACE]


def test_reserved_is_summed_from_admissions_and_borrowed_is_above_nominal() -> None:
    listing = kueue_cluster()
    (gpus,) = [q for q in items(listing, "ClusterQueue") if q["metadata"]["name"] == "gpus"]
    # The recorded queue, put in a cohort with a smaller nominal quota of GPUs.
    gpus["spec"]["cohort"] = "pool"
    (quota,) = [
        r
        for r in gpus["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        if r["name"] == "nvidia.com/gpu"
    ]
    quota.update(nominalQuota="6", borrowingLimit="4")
    # The status' reservation is ignored: it lags the admissions.
    gpus["status"]["flavorsReservation"] = []
    (board, _stopped) = queue_boards(listing, None)
    (line,) = [q for q in board.quotas if q.resource == "nvidia.com/gpu"]
    assert (line.reserved, line.nominal, line.borrowed, line.borrowing_limit) == (
        Decimal(8),
        Decimal(6),
        Decimal(2),
        Decimal(4),
    )
    assert board.cohort == "pool"
    assert pending_counts(listing) == {"gpus": 2, "stopped": 1}


def test_only_the_namespaces_asked_are_listed_but_every_pending_job_counts() -> None:
    (gpus, stopped) = queue_boards(kueue_cluster(), {NEVER_FITS_NAMESPACE})
    assert [(p.position, p.workload.job) for p in gpus.pending] == [(2, "kt-kueue-never-fits")]
    assert (gpus.pending_total, stopped.pending, stopped.pending_total) == (2, (), 1)


def test_gpu_quota_is_drawn_as_bars_and_the_rest_said_in_words() -> None:
    listing = kueue_cluster()
    for job in items(listing, "Job"):
        del job["metadata"]["labels"]["kubetrain.io/job-id"]  # no kubetrain job to look up
    # Without kubetrain jobs to name, nothing is read from the database.
    answer = queues_view(cast(ApiContext, SimpleNamespace()), queue_boards(listing, None))
    cards = views.queue_cards(answer.cluster_queues)
    (bar,) = cards["gpus"].bars
    assert (bar.label, bar.used, bar.total, bar.level) == (
        "default-flavor · nvidia.com/gpu",
        Decimal(8),
        Decimal(8),
        "full",
    )
    assert bar.text() == "8 of 8 nominal admitted"
    assert cards["gpus"].others == [
        "cpu (default-flavor) 2 of 100",
        "memory (default-flavor) 8Gi of 1Ti",
    ]
    borrowing = views.QueueBar(
        "x", Decimal(8), Decimal(6), borrowed=Decimal(2), borrowing_limit=Decimal(4)
    )
    assert borrowing.text() == "8 of 6 nominal admitted, 2 borrowed (may borrow up to 4)"
    assert borrowing.percent == 100.0


def test_a_workload_in_kueues_backoff_is_listed_apart_until_requeue_at() -> None:
    listing = kueue_cluster()
    # Recorded: Kueue's waitForPodsReady evicted a job of ClusterQueue `gpus` and set
    # its requeueAt; its namespace joins the cluster's.
    evicted = dump("kueue-pods-ready-timeout")
    listing["items"] += [i for i in evicted["items"] if "namespace" in i["metadata"]]
    (workload,) = items(evicted, "Workload")
    requeue_at = workload["status"]["requeueState"]["requeueAt"]
    (at,) = [c for c in workload["status"]["conditions"] if c["type"] == "Evicted"]
    recorded = datetime.fromisoformat(at["lastTransitionTime"])  # the eviction
    until = datetime.fromisoformat(requeue_at)
    namespace = workload["metadata"]["namespace"]
    (gpus, _stopped) = queue_boards(listing, None, recorded)
    # Out of the line, as in Kueue's own queue, and said apart with the moment.
    assert [(p.position, p.workload.namespace) for p in gpus.pending] == [
        (1, WAITING_NAMESPACE),
        (2, NEVER_FITS_NAMESPACE),
    ]
    assert [(r.workload.namespace, r.workload.requeue_at) for r in gpus.requeuing] == [
        (namespace, until)
    ]
    assert pending_counts(listing, recorded)["gpus"] == 2
    for job in items(listing, "Job"):
        del job["metadata"]["labels"]["kubetrain.io/job-id"]  # no kubetrain job to look up
    answer = queues_view(cast(ApiContext, SimpleNamespace()), queue_boards(listing, None, recorded))
    (view, _) = answer.cluster_queues
    assert [r.model_dump(mode="json")["requeue_at"] for r in view.requeuing] == [requeue_at]
    # Once requeueAt has passed, back in line at its place (ordered by its eviction).
    later = until + timedelta(seconds=1)
    (gpus, _stopped) = queue_boards(listing, None, later)
    assert [(p.position, p.workload.namespace) for p in gpus.pending][-1] == (3, namespace)
    assert gpus.requeuing == ()
