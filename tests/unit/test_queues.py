"""A job's place in its Kueue queue, from the Workloads recorded from the real Kueue
(kueue-*.json), with more of the queue's Workloads made from the recorded pending one;
Kueue's evictions (PodsReadyTimeout and its requeueAt, AdmissionCheck) only as recorded."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from kubetrain.domain.diagnosis import JobFacts
from kubetrain.domain.queues import flavor_quota, pending_in_order, queued
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.unit.diagnosis_helpers import dump, items, run, the_job

pytestmark = pytest.mark.unit

R = ReasonCode


def _pending(data: dict[str, Any]) -> dict[str, Any]:
    """The fixture's own pending Workload (its Job's is kt-<fixture>)."""
    (workload,) = [
        w
        for w in items(data, "Workload")
        if w["metadata"]["ownerReferences"][0]["name"].startswith("kt-")
    ]
    return workload


def _another(
    data: dict[str, Any], name: str, *, priority: int, created: str, namespace: str | None = None
) -> dict[str, Any]:
    """One more pending Workload of the queue, as Kueue makes it for a Job `name`."""
    workload = copy.deepcopy(_pending(data))
    meta = workload["metadata"]
    meta["name"], meta["uid"], meta["creationTimestamp"] = f"job-{name}-0", f"uid-{name}", created
    meta["ownerReferences"][0].update(name=name, uid=f"job-uid-{name}")
    if namespace is not None:
        meta["namespace"] = namespace
        local = copy.deepcopy(items(data, "LocalQueue")[0])
        local["metadata"]["namespace"] = namespace
        data["items"].append(local)
    workload["spec"]["priority"] = priority
    data["items"].append(workload)
    return workload


def test_the_queue_orders_by_priority_then_creation_as_kueue_does() -> None:
    data = dump("kueue-waiting")
    mine = _pending(data)["metadata"]["creationTimestamp"]  # 2026-12-04T22:27:07Z
    _another(data, "urgent", priority=1000, created="2026-12-04T22:30:00Z")
    _another(data, "older", priority=0, created="2026-12-04T22:00:00Z", namespace="other-team")
    _another(data, "newer", priority=0, created="2026-12-04T23:00:00Z")
    assert mine < "2026-12-04T23:00:00Z"
    d = run(data)
    assert (d.reason, d.waitable) == (R.WAITING_FOR_QUOTA, True)
    blocker = d.blockers[0].to_json()
    assert blocker["position"] == 3
    # A higher priority first, whatever its age; then the older; another namespace named.
    assert blocker["ahead"] == ["urgent", "other-team/older"]
    assert "position 3 in the queue, behind urgent, other-team/older" in d.explanation
    assert "reserved by first-in-line" in d.explanation


def test_a_pending_workload_of_another_cluster_queue_is_not_ahead() -> None:
    data = dump("kueue-waiting")
    elsewhere = _another(data, "elsewhere", priority=1000, created="2026-12-04T22:00:00Z")
    elsewhere["spec"]["queueName"] = "no-such-local-queue"
    assert run(data).blockers[0].position == 1


def test_queued_reads_the_cluster_queue_through_the_local_queue() -> None:
    data = dump("kueue-waiting")
    locals_ = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q for q in items(data, "LocalQueue")
    }
    workloads = [queued(w, locals_) for w in items(data, "Workload")]
    assert {w.cluster_queue for w in workloads} == {"gpus"}
    assert [w.job for w in pending_in_order(workloads, "gpus")] == ["kt-kueue-waiting"]
    assert [w.job for w in workloads if w.reserved] == ["first-in-line"]
    (cluster_queue,) = items(data, "ClusterQueue")
    quota = flavor_quota(cluster_queue, "default-flavor", "nvidia.com/gpu")
    assert quota is not None
    assert (quota.nominal, quota.reserved, quota.most) == (Decimal(8), Decimal(8), Decimal(8))
    assert flavor_quota(cluster_queue, "default-flavor", "example.com/fpga") is None


def test_borrowing_in_a_cohort_raises_what_the_queue_may_ever_hold() -> None:
    data = dump("kueue-never-fits")
    (cluster_queue,) = items(data, "ClusterQueue")
    cluster_queue["spec"]["cohort"] = "research"
    gpu = cluster_queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]
    assert gpu["name"] == "nvidia.com/gpu"
    gpu["borrowingLimit"] = "4"
    d = run(data)
    blocker = d.blockers[0].to_json()
    assert (blocker["nominal"], blocker["borrowing_limit"], blocker["limit"]) == ("8", "4", "12")
    assert "plus up to 4 borrowed from cohort research" in d.explanation


def test_a_preemptor_not_in_the_snapshot_goes_unnamed() -> None:
    data = dump("kueue-preempted")
    data["items"] = [
        i
        for i in data["items"]
        if not (i["kind"] == "Workload" and "urgent" in i["metadata"]["name"])
    ]
    d = run(data)
    assert "ClusterQueue gpus preempted the job (a higher-priority job" in d.explanation


def test_a_stopped_local_queue_is_the_platforms_to_restart() -> None:
    data = dump("kueue-stopped-cluster-queue")
    for queue in items(data, "ClusterQueue"):
        queue["spec"]["stopPolicy"] = "None"
    for queue in items(data, "LocalQueue"):
        queue["spec"]["stopPolicy"] = "HoldAndDrain"
    d = run(data)
    assert (d.reason, d.waitable, str(d.actor)) == (R.QUEUE_INACTIVE, False, "platform")
    assert "LocalQueue held is stopped (stopPolicy HoldAndDrain)" in d.explanation


def test_what_admitted_jobs_reserve_is_read_from_their_workloads_not_the_lagging_status() -> None:
    # Live, Kueue updates the ClusterQueue's status a moment after it admits a Workload:
    # the testbed caught `flavorsReservation` at 0 with the first job already admitted.
    data = dump("kueue-waiting")
    (cluster_queue,) = items(data, "ClusterQueue")
    for flavor in cluster_queue["status"]["flavorsReservation"]:
        for resource in flavor["resources"]:
            resource["total"] = "0"
    d = run(data)
    assert d.blockers[0].used == "8"
    assert "8 reserved by first-in-line" in d.explanation


def test_an_admitted_workload_whose_job_is_not_resumed_yet_is_starting_not_waiting() -> None:
    # Live, the syncer caught the moment between Kueue's admission (of a preempted job,
    # again) and Kueue resuming its Job: the Job still suspended, the Workload admitted.
    data = dump("kueue-admitted")
    job = the_job(data)
    job["spec"]["suspend"] = True
    (suspended,) = the_job(dump("kueue-waiting"))["status"]["conditions"]
    job["status"]["conditions"] = [suspended]  # the Job controller's, recorded
    data["items"] = [i for i in data["items"] if i["kind"] != "Pod"]  # none before resuming
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (BusinessState.QUEUED, R.SCHEDULING, True)
    assert (d.raw_reason, d.raw_message) == ("Admitted", "The workload is admitted")
    assert "ClusterQueue gpus admitted the job; Kueue is resuming its Job" in d.explanation


def test_a_just_preempted_workload_asks_for_what_its_pod_sets_request() -> None:
    # Live, the Queues page caught the preempted job before Kueue's scheduler had written
    # its status.resourceRequests again (Kueue clears them while a Workload is admitted).
    data = dump("kueue-preempted")
    locals_ = {
        (q["metadata"]["namespace"], q["metadata"]["name"]): q for q in items(data, "LocalQueue")
    }
    (mine,) = [w for w in items(data, "Workload") if "kt-kueue-preempted" in w["metadata"]["name"]]
    recorded = queued(mine, locals_).requests
    assert recorded == {"cpu": Decimal(2), "memory": Decimal(8 * 2**30), "nvidia.com/gpu": 8}
    del mine["status"]["resourceRequests"]
    assert queued(mine, locals_).requests == recorded
    mine["spec"]["podSets"][0]["count"] = 2
    assert queued(mine, locals_).requests["nvidia.com/gpu"] == 16


def test_the_preemptors_diagnosis_names_the_jobs_it_preempted() -> None:
    data = dump("kueue-preempted")
    (urgent,) = [j for j in items(data, "Job") if j["metadata"]["name"] == "urgent"]
    ns = urgent["metadata"]["namespace"]
    urgent_facts = JobFacts(name="urgent", k8s_name="urgent", namespace=ns, dispatched=True)
    d = run(data, urgent_facts)
    assert d.preempted == ("kt-kueue-preempted",)
    assert d.to_json("urgent")["preempted"] == ["kt-kueue-preempted"]
    assert run(data).preempted == ()  # the preempted job preempted nobody
    # Re-admitted, Kueue turns its Preempted condition False ("Previously: …").
    (victim,) = [
        w for w in items(data, "Workload") if "kt-kueue-preempted" in w["metadata"]["name"]
    ]
    for condition in victim["status"]["conditions"]:
        if condition["type"] == "Preempted":
            condition["status"] = "False"
    assert run(data, urgent_facts).preempted == ()


def test_a_workload_of_an_earlier_job_of_the_same_name_is_not_this_jobs() -> None:
    # A gang's ended attempt left its Workload (until the garbage collector removes it),
    # admitted: matched by name, it made the new suspended Job read "Kueue is resuming".
    data = dump("kueue-waiting")
    old = copy.deepcopy(_pending(data))
    old["metadata"].update(name=old["metadata"]["name"] + "-old", uid="uid-old-workload")
    old["metadata"]["ownerReferences"][0]["uid"] = "uid-of-attempt-1"
    old["status"]["conditions"] = [
        {
            "type": t,
            "status": "True",
            "reason": t,
            "message": "",
            "lastTransitionTime": "2026-12-04T22:00:00Z",
        }
        for t in ("QuotaReserved", "Admitted")
    ]
    data["items"].insert(0, old)
    d = run(data)
    assert (d.state, d.reason) == (BusinessState.QUEUED, R.WAITING_FOR_QUOTA)
    assert "resuming" not in d.explanation
    assert d.blockers[0].position == 1


def _workload_of(data: dict[str, Any], job: str) -> dict[str, Any]:
    (workload,) = [
        w for w in items(data, "Workload") if w["metadata"]["ownerReferences"][0]["name"] == job
    ]
    return workload


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = workload["status"]["conditions"]
    (condition,) = [c for c in conditions if c["type"] == kind]
    return condition


def _moment(value: str) -> datetime:
    return datetime.fromisoformat(value)  # Kueue's RFC 3339, with Z


def test_an_admission_check_eviction_requeues_at_the_eviction_as_kueue_orders() -> None:
    # Recorded: an AdmissionCheck sent the running job back (Retry); Kueue evicted it
    # and gave the GPUs it freed to second-in-line, then held it behind third-in-line,
    # both created after it (StrictFIFO, Ordering.GetQueueOrderTimestamp).
    data = dump("kueue-admission-check-retry")
    mine, third = (
        _workload_of(data, "kt-kueue-admission-check-retry"),
        _workload_of(data, "third-in-line"),
    )
    evicted = _condition(mine, "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("True", "AdmissionCheck")
    created = mine["metadata"]["creationTimestamp"]
    # By creation it would be first: only the eviction puts it behind third-in-line.
    assert created < third["metadata"]["creationTimestamp"] < evicted["lastTransitionTime"]
    assert _condition(_workload_of(data, "second-in-line"), "QuotaReserved")["status"] == "True"
    d = run(data, now=_moment(evicted["lastTransitionTime"]))
    assert (d.state, d.reason, d.waitable) == (BusinessState.QUEUED, R.WAITING_FOR_QUOTA, True)
    assert (d.blockers[0].position, d.blockers[0].ahead) == (2, ("third-in-line",))
    assert "AdmissionCheck fixture-check of its ClusterQueue asked for a retry" in d.explanation
    # No requeueAt (the Retry named no retry time): in line at once, nothing to wait out.
    assert "requeueState" not in mine["status"]
    assert "out of the queue" not in d.explanation


def test_a_workload_in_kueues_backoff_is_out_of_the_line_until_requeue_at() -> None:
    # Recorded: Kueue's waitForPodsReady evicted the job (its Pod never placed) and set
    # its backoff (requeueState: the first requeue, about 60 s after the eviction).
    data = dump("kueue-pods-ready-timeout")
    mine = _workload_of(data, "kt-kueue-pods-ready-timeout")
    evicted = _condition(mine, "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("True", "PodsReadyTimeout")
    assert mine["status"]["requeueState"]["count"] == 1
    requeue_at = _moment(mine["status"]["requeueState"]["requeueAt"])
    # At the recording's moment (the eviction): out of the line until requeueAt.
    d = run(data, now=_moment(evicted["lastTransitionTime"]))
    assert (d.state, d.reason, d.waitable) == (BusinessState.QUEUED, R.WAITING_FOR_QUOTA, True)
    assert d.blockers[0].position is None
    assert (
        f"out of the queue until {requeue_at:%Y-%m-%d %H:%M:%S}Z (Kueue's backoff" in d.explanation
    )
    assert "not all its Pods were ready within Kueue's waitForPodsReady timeout" in d.explanation
    # Once requeueAt has passed: back in the line, first (nothing else waits in `gpus`).
    d = run(data, now=requeue_at + timedelta(seconds=1))
    assert (d.blockers[0].position, d.blockers[0].ahead) == (1, ())
    assert "out of the queue" not in d.explanation
    # Kueue orders it by the eviction (requeuingStrategy.timestamp Eviction), not creation.
    workload = queued(mine, {})
    assert workload.ordered_at == _moment(evicted["lastTransitionTime"])
    assert workload.ordered_at != _moment(mine["metadata"]["creationTimestamp"])
