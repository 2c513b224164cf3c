"""diagnose() on what the testbed cannot make: the record's own facts, Kueue, kubelet verdicts.

Each case starts from a recorded dump and changes what a real kubelet, Kueue or
a later release would have written differently (a DisruptionTarget condition,
an eviction, a newer scheduler wording). These are variants of recordings for
code paths KWOK and the testbed cannot reach, not fixtures.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.domain.diagnosis import (
    ChainState,
    JobFacts,
    cancel_for_no_progress,
    cancel_for_non_finite_loss,
    diagnose,
)
from kubetrain.domain.events import EventType
from kubetrain.domain.manifest import pod_failure_policy
from kubetrain.domain.notifications import event_types_for
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState, Link, ReasonCode
from tests.unit.diagnosis_helpers import (
    NOW,
    dump,
    facts,
    items,
    recorded_kueue_message,
    run,
    the_job,
)

pytestmark = pytest.mark.unit

R = ReasonCode
S = BusinessState


def without(data: dict[str, Any], *kinds: str) -> dict[str, Any]:
    data["items"] = [i for i in data["items"] if i.get("kind") not in kinds]
    return data


# -- what kubetrain's record knows --------------------------------------------------


def gone(**overrides: Any) -> tuple[dict[str, Any], JobFacts]:
    """The running dump without its Job (and so without its Pods and events)."""
    data = dump("running")
    job = facts(data, **overrides)
    return without(data, "Job", "Pod", "Event"), job


def test_no_job_and_never_dispatched_is_created_with_the_dispatch_error() -> None:
    # The API server's RBAC refusal (k8s.io/apiserver pkg/endpoints/handlers/
    # responsewriters/errors.go forbiddenMessage, v1.33), as a dispatch error keeps it.
    error = (
        'jobs.batch is forbidden: User "system:serviceaccount:kubetrain:kubetrain" cannot '
        'create resource "jobs" in API group "batch" in the namespace "vision"'
    )
    d = run(*gone(dispatched=False, dispatch_error=error))
    assert (d.state, d.reason, d.link) == (S.CREATED, R.JOB_NOT_CREATED, Link.CONTROL_PLANE)
    assert d.raw_message == error
    assert "forbidden" in d.blockers[0].detail
    assert d.waitable is None  # an error: waiting may or may not help
    quiet = run(*gone(dispatched=False))
    assert (quiet.reason, quiet.waitable, quiet.raw_message) == (R.JOB_NOT_CREATED, True, None)


def test_no_job_after_dispatch_is_job_deleted() -> None:
    d = run(*gone())
    assert (d.state, d.reason) == (S.FAILED, R.JOB_DELETED)


def test_cancel_requested_is_cancelled_with_or_without_the_job() -> None:
    assert run(dump("running"), cancel_requested=True).reason is R.CANCELLED
    d = run(*gone(cancel_requested=True))
    assert (d.state, d.reason) == (S.CANCELLED, R.CANCELLED)
    assert ChainState.BLOCKING not in {m.state for m in d.chain}


def test_a_job_that_finished_before_the_cancel_keeps_its_outcome() -> None:
    assert run(dump("succeeded"), cancel_requested=True).state is S.SUCCEEDED


def test_gpu_hint_is_used_when_no_pod_exists() -> None:
    data = dump("waiting-for-quota")
    assert run(data, gpus=4).reason is R.WAITING_FOR_QUOTA


def test_the_users_job_name_is_in_the_json() -> None:
    d = run(dump("running"), name="train-policy-v12")
    assert d.to_json("train-policy-v12")["job"] == "train-policy-v12"


# -- Kueue ----------------------------------------------------------------------------


def suspended(data: dict[str, Any]) -> dict[str, Any]:
    data = without(data, "Pod", "Event")
    job = the_job(data)
    job["spec"]["suspend"] = True
    job["status"] = {
        "conditions": [
            {
                "type": "Suspended",
                "status": "True",
                "reason": "JobSuspended",
                "message": "Job suspended",
                "lastTransitionTime": "2026-12-02T15:14:40Z",
            }
        ]
    }
    return data


def workload(job: dict[str, Any], message: str, reason: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": f"job-{job['metadata']['name']}-1a2b3",
            "namespace": job["metadata"]["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job["metadata"]["name"],
                    "uid": job["metadata"]["uid"],
                }
            ],
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": "2026-12-02T15:14:41Z",
                }
            ]
        },
    }


def test_a_suspended_job_is_queued_waiting_for_quota_never_failed() -> None:
    d = run(suspended(dump("running")))
    assert (d.state, d.reason) == (S.QUEUED, R.WAITING_FOR_QUOTA)
    assert d.raw_reason == "JobSuspended"
    assert any("Workload" in n for n in d.notes)


@pytest.mark.parametrize(
    ("message", "waitable"),
    [
        (recorded_kueue_message("kueue-waiting"), True),
        # Kueue's pkg/scheduler/flavorassigner/flavorassigner.go before v0.14 (v0.17
        # writes the wording of kueue-never-fits.json).
        (
            "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
            "flavor default-flavor, request > maximum capacity (16 > 8)",
            False,
        ),
    ],
)
def test_kueue_workload_says_whether_waiting_helps(message: str, waitable: bool) -> None:
    data = suspended(dump("running"))
    data["items"].append(workload(the_job(data), message))
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.WAITING_FOR_QUOTA, waitable)
    assert (d.raw_reason, d.raw_message) == ("Pending", message)
    if not waitable:
        assert d.blockers[0].limit == "8"


@pytest.mark.parametrize("queue", [None, "team-a"])
def test_a_cluster_queue_without_quota_for_the_resource_is_not_waitable_and_named(
    queue: str | None,
) -> None:
    # Kueue's flavor assigner when no resource group covers the resource
    # (flavorassigner.go findFlavorForPodSetResource, Kueue v0.17), as its
    # QuotaReserved condition carries it.
    message = (
        "couldn't assign flavors to pod set main: resource nvidia.com/gpu unavailable in "
        "ClusterQueue"
    )
    data = suspended(dump("running"))
    wl = workload(the_job(data), message)
    wl["spec"] = {"queueName": "team-a-local"}
    if queue:
        wl["status"]["admission"] = {"clusterQueue": queue}
    data["items"].append(wl)
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.WAITING_FOR_QUOTA, False)
    assert (d.raw_reason, d.raw_message) == ("Pending", message)
    named = f"ClusterQueue {queue}" if queue else "the ClusterQueue behind LocalQueue team-a-local"
    assert f"{named} (Kueue) has no quota for nvidia.com/gpu" in d.blockers[0].detail
    assert "ResourceQuota" not in d.action
    assert "namespace" not in d.explanation
    assert d.blockers[0].resource == "nvidia.com/gpu"


def test_an_admitted_job_off_its_flavors_nodes_is_the_platforms_flavor() -> None:
    d = run(dump("kueue-admitted-unplaceable"))
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.FLAVOR_NODE_MISMATCH, False)
    assert d.actor.value == "platform"
    assert d.raw_reason == "Unschedulable"  # the scheduler's verdict, kept raw
    assert "ResourceFlavor nvidia-a100's nodeLabels (accelerator=nvidia-a100)" in d.action
    assert "WAITING_FOR_QUOTA" not in {b.reason.value for b in d.blockers}


def test_without_the_flavor_in_the_snapshot_the_selector_stays_the_jobs() -> None:
    # An older dump without ResourceFlavors: whose selector it is cannot be told.
    d = run(without(dump("kueue-admitted-unplaceable"), "ResourceFlavor"))
    assert (d.state, d.reason) == (S.QUEUED, R.NODE_SELECTOR_MISMATCH)
    assert "flavor" not in d.blockers[0].detail.split(";")[0]


def test_a_flavor_whose_nodes_exist_leaves_the_jobs_own_selector_to_blame() -> None:
    # A node carries the flavor's label, but the job's own selector (zone=b, which no
    # node has) keeps every node out: the user's NODE_SELECTOR_MISMATCH.
    data = dump("kueue-admitted-unplaceable")
    node = next(n for n in items(data, "Node") if n["metadata"]["name"] == "gpu-h100-0")
    node["metadata"]["labels"]["accelerator"] = "nvidia-a100"
    items(data, "Pod")[0]["spec"]["nodeSelector"]["zone"] = "b"
    d = run(data)
    assert (d.state, d.reason) == (S.QUEUED, R.NODE_SELECTOR_MISMATCH)


def _pods_ready(data: dict[str, Any]) -> dict[str, Any]:
    (wl,) = [w for w in items(data, "Workload") if w["metadata"]["name"].startswith("job-kt-")]
    (condition,) = [c for c in wl["status"]["conditions"] if c["type"] == "PodsReady"]
    found: dict[str, Any] = condition
    return found


def test_kueue_waiting_for_pods_ready_is_said_only_while_it_counts() -> None:
    d = run(dump("kueue-gang-partial"))
    assert "waitForPodsReady will evict the whole gang" in d.explanation
    assert "waitForPodsReady" not in d.blockers[1].detail  # said once, by the primary
    data = dump("kueue-gang-partial")
    _pods_ready(data)["status"] = "True"
    assert "waitForPodsReady" not in run(data).explanation
    # Without waitForPodsReady Kueue writes no PodsReady condition at all.
    data = dump("kueue-gang-partial")
    for wl in items(data, "Workload"):
        wl["status"]["conditions"] = [
            c for c in wl["status"]["conditions"] if c["type"] != "PodsReady"
        ]
    d = run(data)
    assert "waitForPodsReady" not in d.explanation
    assert (d.reason, d.blockers[1].reason) == (R.INSUFFICIENT_GPU, R.GANG_PARTIAL)


def test_kueue_counts_a_recovery_from_the_pods_failing() -> None:
    # Kueue's PodsReady reason once a Pod failed after all were ready (WaitForRecovery,
    # workload_types.go, Kueue v0.17): its timeout counts from that condition's change.
    data = dump("kueue-gang-partial")
    condition = _pods_ready(data)
    condition["reason"] = "WaitForRecovery"
    condition["lastTransitionTime"] = "2026-12-05T01:40:00Z"
    d = run(data)
    assert "counted from its Pods failing at 2026-12-05 01:40:00Z" in d.explanation


def test_a_resource_quota_refusal_names_the_resource_quota() -> None:
    d = run(dump("waiting-for-quota"))
    assert "ResourceQuota gpu-quota: needs 4 requests.nvidia.com/gpu" in d.explanation


# -- what kubelets and controllers write that KWOK does not ---------------------------


def failed_pod(data: dict[str, Any], **status: Any) -> dict[str, Any]:
    """The recorded running Pod, ended the way a kubelet or controller ends it."""
    pod = items(data, "Pod")[0]
    pod["status"]["phase"] = "Failed"
    pod["status"].update(status)
    return pod


def disruption(reason: str, message: str) -> dict[str, Any]:
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-02T15:20:00Z",
    }


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("PreemptionByScheduler", R.PREEMPTED),
        ("DeletionByTaintManager", R.NODE_LOST),
        ("DeletionByPodGC", R.NODE_LOST),
        ("EvictionByEvictionAPI", R.NODE_LOST),
    ],
)
def test_a_disrupted_pod_awaiting_its_replacement_is_queued(reason: str, code: ReasonCode) -> None:
    data = dump("running")
    # kubetrain's Jobs: a disruption uses no retry (without the policy, the recorded
    # backoffLimit 0 would fail the Job).
    the_job(data)["spec"]["podFailurePolicy"] = pod_failure_policy()
    pod = failed_pod(data)
    pod["status"]["conditions"].append(disruption(reason, "disrupted"))
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (S.QUEUED, code, reason)
    assert d.waitable is True


def test_the_replacement_pod_is_attempt_two_and_the_node_loss_explains_the_wait() -> None:
    data = dump("running")
    old = failed_pod(data)
    old["status"]["conditions"].append(
        disruption("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")
    )
    new = copy.deepcopy(old)
    new["metadata"]["name"] = old["metadata"]["name"][:-5] + "zzzzz"
    new["metadata"]["uid"] = "0000-new"
    new["metadata"]["creationTimestamp"] = "2026-12-02T15:21:00Z"
    new["spec"].pop("nodeName")
    new["status"] = {"phase": "Pending", "conditions": []}
    data["items"].append(new)
    d = run(data)
    assert (d.state, d.reason) == (S.QUEUED, R.NODE_LOST)
    assert [(a.number, a.pod_uid) for a in d.attempts][-1] == (2, "0000-new")
    assert R.SCHEDULING in [b.reason for b in d.blockers]


def test_a_job_failed_after_an_eviction_says_evicted() -> None:
    data = dump("real-oom-killed")
    pod = items(data, "Pod")[0]
    pod["status"]["reason"] = "Evicted"
    # The kubelet's eviction manager (pkg/kubelet/eviction/helpers.go nodeLowMessageFmt,
    # v1.33), the node short of disk rather than an emptyDir past its limit
    # (real-evicted.json).
    pod["status"]["message"] = "The node was low on resource: ephemeral-storage. "
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (S.FAILED, R.EVICTED, "Evicted")
    assert [b.reason for b in d.blockers] == [R.EVICTED, R.BACKOFF_LIMIT_EXCEEDED]


def test_a_node_pressure_eviction_says_the_kubelets_words_not_its_condition() -> None:
    # Under node pressure the eviction manager also sets DisruptionTarget
    # (TerminationByKubelet) with the same message (pkg/kubelet/eviction/
    # eviction_manager.go synchronize, v1.33); for an emptyDir past its limit, as
    # recorded, it sets none. The message: nodeLowMessageFmt, thresholdMetMessageFmt
    # and containerMessageFmt of pkg/kubelet/eviction/helpers.go, v1.33.
    data = dump("real-evicted")
    pod = items(data, "Pod")[0]
    message = (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 64Mi. "
        "Container trainer was using 300Mi, request is 256Mi, has larger consumption of memory. "
    )
    pod["status"]["message"] = message
    pod["status"]["conditions"].append(disruption("TerminationByKubelet", message))
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (S.FAILED, R.EVICTED, "Evicted")
    assert d.raw_message == message
    assert "Container trainer was using 300Mi, request is 256Mi" in d.explanation
    assert {m.link: m.state for m in d.chain}[Link.GPU_NODE] is ChainState.FAILED
    # The condition's time, not the container's end, says since when.
    assert d.since == datetime(2026, 12, 2, 15, 20, tzinfo=UTC)


def test_pod_failure_policy_with_the_preflight_exit_code_and_no_pod_left() -> None:
    # The recorded Job's own condition (kubetrain's podFailurePolicy), its Pod gone.
    data = without(dump("real-preflight-failed"), "Pod")
    assert the_job(data)["status"]["conditions"][-1]["reason"] == "PodFailurePolicy"
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (S.FAILED, R.PREFLIGHT_FAILED, "PodFailurePolicy")


def unfinished(name: str, backoff_limit: int) -> dict[str, Any]:
    """The recorded failed Job a moment before the Job controller decides: its Pod
    failed, no Failed (or FailureTarget) condition yet, `backoff_limit` retries."""
    data = dump(name)
    job = the_job(data)
    job["spec"]["backoffLimit"] = backoff_limit
    job["status"] = {"active": 0, "failed": 1, "startTime": job["status"]["startTime"]}
    return data


def test_a_failed_attempt_with_a_retry_pending_is_queued_and_says_it_retries() -> None:
    d = run(unfinished("real-oom-killed", backoff_limit=1))
    assert (d.state, d.reason) == (S.QUEUED, R.OOM_KILLED)
    assert d.blockers[0].detail.startswith("retrying: attempt 1: container trainer was OOM-killed")


def test_exit_nonzero_with_a_retry_pending_says_retrying_with_the_exit_code() -> None:
    d = run(unfinished("real-exit-nonzero", backoff_limit=1))
    assert (d.state, d.reason) == (S.QUEUED, R.EXIT_NONZERO)
    assert d.blockers[0].detail.startswith(
        "retrying: attempt 1: container trainer exited with code 1"
    )


@pytest.mark.parametrize("name", ["real-exit-nonzero", "real-oom-killed", "real-evicted"])
def test_a_failed_attempt_with_no_retry_left_is_failed_never_queued(name: str) -> None:
    # backoffLimit 0 and one failed Pod: the Job controller fails the Job next
    # (failed > backoffLimit); until it writes so, the job is not back in the queue.
    d = run(unfinished(name, backoff_limit=0))
    final = run(dump(name))
    assert (d.state, d.reason, d.waitable) == (S.FAILED, final.reason, None)
    assert [b.reason for b in d.blockers] == [b.reason for b in final.blockers]
    assert d.blockers[0].detail == final.blockers[0].detail


def test_a_pod_failure_policy_fail_job_match_is_failed_before_the_job_says_so() -> None:
    data = unfinished("real-preflight-failed", backoff_limit=3)
    assert the_job(data)["spec"]["podFailurePolicy"]["rules"][1]["action"] == "FailJob"
    d = run(data)
    assert (d.state, d.reason) == (S.FAILED, R.PREFLIGHT_FAILED)
    assert [b.reason for b in d.blockers] == [R.PREFLIGHT_FAILED]


def test_failures_ignored_by_the_policy_do_not_use_up_retries() -> None:
    data = unfinished("real-exit-nonzero", backoff_limit=0)
    job = the_job(data)
    job["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}}]
    }
    job["status"]["failed"] = 0
    d = run(data)
    assert (d.state, d.reason) == (S.QUEUED, R.EXIT_NONZERO)
    assert d.blockers[0].detail.startswith("retrying: ")


def test_an_out_of_gpu_admission_is_gpu_allocation_failed() -> None:
    # The kubelet's own resource check at admission (its allocatable shrank since the
    # scheduler counted): reason OutOf<resource>, on the recorded rejected Pod.
    data = dump("real-gpu-allocation-failed")
    pod = items(data, "Pod")[0]
    pod["status"]["reason"] = "OutOfnvidia.com/gpu"
    # pkg/kubelet/kubelet.go rejectPod and lifecycle/predicate.go
    # InsufficientResourceError, v1.33.
    pod["status"]["message"] = (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, "
        "used: 0, capacity: 0"
    )
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (
        S.FAILED,
        R.GPU_ALLOCATION_FAILED,
        "OutOfnvidia.com/gpu",
    )


def test_a_pod_without_a_verdict_yet_is_scheduling() -> None:
    data = without(dump("insufficient-gpu"), "Event")
    items(data, "Pod")[0]["status"] = {"phase": "Pending"}
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.SCHEDULING, True)


def test_a_job_without_pods_or_events_waits_for_the_job_controller() -> None:
    d = run(without(dump("insufficient-gpu"), "Pod", "Event"))
    assert (d.state, d.reason) == (S.QUEUED, R.SCHEDULING)


# -- scheduler wordings of other releases -------------------------------------------


def reworded(name: str, old: str, new: str) -> dict[str, Any]:
    data = dump(name)
    for item in data["items"]:
        for cond in (item.get("status") or {}).get("conditions") or []:
            if cond.get("message"):
                cond["message"] = cond["message"].replace(old, new)
        if item.get("kind") == "Event":
            item["message"] = item["message"].replace(old, new)
    return data


@pytest.mark.parametrize(
    "wording",
    [
        "had untolerated taint(s)",  # late 2025: no key
        "had taint {nvidia.com/gpu: present}, that the pod didn't tolerate",  # 1.18-1.24
        "had taints that the pod didn't tolerate",  # before 2020
    ],
)
def test_every_taint_wording_finds_the_taint_from_the_nodes(wording: str) -> None:
    data = reworded("untolerated-taint", "had untolerated taint {nvidia.com/gpu: present}", wording)
    d = run(data)
    assert (d.reason, d.waitable) == (R.UNTOLERATED_TAINT, False)
    assert "nvidia.com/gpu=present:NoSchedule" in d.blockers[0].detail
    assert not [n for n in d.notes if "does not agree" in n]


def test_an_unknown_verdict_part_is_kept_and_said() -> None:
    data = reworded(
        "node-selector-mismatch",
        "node(s) didn't match Pod's node affinity/selector",
        "node(s) are on the moon",
    )
    d = run(data)
    assert d.state is S.QUEUED
    assert "are on the moon" in (d.raw_message or "")
    assert any("does not know" in n and "on the moon" in n for n in d.notes)


def test_a_stale_verdict_is_noticed_when_the_nodes_disagree() -> None:
    # The other team's Pods are gone since the verdict: the table finds room.
    data = dump("gpu-busy")
    data["items"] = [i for i in data["items"] if not i["metadata"]["name"].startswith("other-team")]
    d = run(data)
    assert d.reason is R.INSUFFICIENT_GPU
    assert any("could take the Pod now" in n or "does not agree" in n for n in d.notes)


def test_a_preempted_pod_already_deleted_is_read_from_its_events() -> None:
    # The victim is deleted at once; the scheduler's Preempted event remains, and
    # the replacement (attempt 2) waits without a verdict yet.
    data = dump("running")
    old = items(data, "Pod")[0]
    name, uid = old["metadata"]["name"], old["metadata"]["uid"]
    data["items"].remove(old)
    new = copy.deepcopy(old)
    new["metadata"].update(
        name=name[:-5] + "zzzzz", uid="0000-new", creationTimestamp="2026-12-02T15:30:00Z"
    )
    new["spec"].pop("nodeName")
    new["status"] = {"phase": "Pending"}
    data["items"].append(new)
    involved = {"kind": "Pod", "name": name, "namespace": old["metadata"]["namespace"], "uid": uid}
    data["items"].append(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.preempted", "namespace": involved["namespace"]},
            "involvedObject": involved,
            "reason": "Preempted",
            "type": "Normal",
            "message": "Preempted by pod 1234 on node gpu-h100-1",
            "lastTimestamp": "2026-12-02T15:29:59Z",
        }
    )
    d = run(data)
    assert (d.state, d.reason, d.raw_reason) == (S.QUEUED, R.PREEMPTED, "Preempted")
    assert [a.pod_name for a in d.attempts] == [name, new["metadata"]["name"]]


def test_a_succeeded_pod_before_the_job_says_complete_is_still_running():
    # Recorded from the succeeded dump, as the syncer sees it for a moment: the Pod
    # has exited 0 and the Job controller has not yet written its Complete condition.
    data = dump("succeeded")
    job = the_job(data)
    job["status"] = {
        "active": 0,
        "ready": 0,
        "startTime": job["status"]["startTime"],
        "uncountedTerminatedPods": {"succeeded": ["x"]},
    }
    diagnosis = run(data)
    assert (diagnosis.state, diagnosis.reason) == (S.RUNNING, R.TRAINING)


def test_a_running_pod_that_reports_preflight_is_in_preflight_not_training() -> None:
    data = dump("running")
    pod = items(data, "Pod")[-1]["metadata"]["name"]
    since = datetime(2026, 12, 2, 15, 59, tzinfo=UTC)
    d = run(data, reported_phase=(pod, "PREFLIGHT", since))
    assert (d.state, d.reason, d.link, d.since) == (S.RUNNING, R.PREFLIGHT, Link.PREFLIGHT, since)
    # TRAINING reported, or PREFLIGHT from an earlier Pod of the job: training.
    said = run(data, reported_phase=(pod, "TRAINING", since))
    assert said.reason == R.TRAINING
    assert "no report" not in said.explanation
    # Nothing reported by this Pod: counted as training, and the words say it is unconfirmed.
    for unsaid in (run(data, reported_phase=("kt-old-pod", "PREFLIGHT", since)), run(data)):
        assert unsaid.reason == R.TRAINING
        assert "no report from kubetrain's runtime in the container yet" in unsaid.explanation


# -- init containers and sidecars (a kubelet's doing; KWOK reports main containers only) --


def initializing(name: str, init: dict[str, Any], *, restart_policy: str | None = None) -> Any:
    """The recorded Pod of `name`, its failing container moved into an init container
    `setup` (a sidecar when restart_policy is Always), as a real kubelet reports it:
    the main container waits "PodInitializing" and Initialized is False
    (pkg/kubelet/kubelet_pods.go convertToAPIContainerStatuses and
    pkg/kubelet/status/generate.go GeneratePodInitializedCondition, Kubernetes 1.32)."""
    data = dump(name)
    pod = items(data, "Pod")[0]
    spec = {"name": "setup", "image": "registry.example/setup:1", **init}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    pod["spec"]["initContainers"] = [spec]
    (status,) = pod["status"]["containerStatuses"]
    main = copy.deepcopy(status)
    status["name"], status["image"] = "setup", spec["image"]
    main.update(lastState={}, restartCount=0, state={"waiting": {"reason": "PodInitializing"}})
    pod["status"]["initContainerStatuses"] = [status]
    pod["status"]["containerStatuses"] = [main]
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "Initialized":
            condition.update(
                status="False",
                reason="ContainersNotInitialized",
                # pkg/kubelet/status/generate.go, v1.33
                message="containers with incomplete status: [setup]",
            )
    return data


def test_an_init_container_without_its_config_map_is_a_config_error_naming_it() -> None:
    # A missing ConfigMap in envFrom: the kubelet's configMapManager answers
    # `configmap "train-config" not found` (pkg/kubelet/util/manager/
    # watch_based_manager.go, groupResource "configmap" from configmap/configmap_manager.go,
    # v1.33), set as the waiting message with CreateContainerConfigError.
    data = initializing(
        "real-config-error", {"envFrom": [{"configMapRef": {"name": "train-config"}}]}
    )
    status = items(data, "Pod")[0]["status"]["initContainerStatuses"][0]
    status["state"]["waiting"]["message"] = 'configmap "train-config" not found'
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.CONTAINER_CONFIG_ERROR, False)
    assert d.raw_reason == "CreateContainerConfigError"
    assert 'init container setup: configmap "train-config" not found' in d.blockers[0].detail


def test_an_init_container_whose_image_cannot_be_pulled_names_its_image() -> None:
    d = run(initializing("real-image-pull-failed", {}))
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.IMAGE_PULL_FAILED, False)
    assert d.raw_reason == "ImagePullBackOff"
    assert "init container setup: image registry.example/setup:1" in d.blockers[0].detail


def test_a_crash_looping_sidecar_is_a_crash_loop_naming_the_sidecar() -> None:
    d = run(initializing("real-crash-loop", {}, restart_policy="Always"))
    assert (d.state, d.reason) == (S.QUEUED, R.CRASH_LOOP)
    assert "sidecar setup: last exit code 1" in d.blockers[0].detail


def test_a_running_init_container_is_creating_and_says_which() -> None:
    data = initializing("real-config-error", {})
    status = items(data, "Pod")[0]["status"]["initContainerStatuses"][0]
    status["state"] = {"running": {"startedAt": "2026-12-02T15:14:50Z"}}
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.CONTAINER_CREATING, True)
    assert (d.raw_reason, d.raw_message) == (
        "ContainersNotInitialized",
        "containers with incomplete status: [setup]",
    )
    assert "init container setup has not finished" in d.blockers[0].detail


def test_of_several_main_containers_the_failing_one_is_named() -> None:
    data = dump("real-config-error")
    pod = items(data, "Pod")[0]
    (trainer,) = pod["status"]["containerStatuses"]
    logger = copy.deepcopy(trainer)
    logger["name"] = "logger"
    trainer["state"] = {"waiting": {"reason": "ContainerCreating"}}
    pod["status"]["containerStatuses"] = [trainer, logger]
    pod["spec"]["containers"].append({"name": "logger", "image": "registry.example/logger:1"})
    d = run(data)
    assert (d.state, d.reason) == (S.QUEUED, R.CONTAINER_CONFIG_ERROR)
    assert 'container logger: secret "wandb" not found' in d.blockers[0].detail


# -- a training job whose steps stopped -----------------------------------------------
# NOW is 16:00: the Pod of running.json reported TRAINING at 15:15.

TRAINING_AT = datetime(2026, 12, 2, 15, 15, tzinfo=UTC)


def stalling(**overrides: Any) -> Any:
    data = dump("running")
    pod = items(data, "Pod")[-1]["metadata"]["name"]
    values: dict[str, Any] = {"reported_phase": (pod, "TRAINING", TRAINING_AT), "stall_after": 600}
    return run(data, **(values | overrides))


def test_a_training_job_with_no_step_for_longer_than_its_threshold_is_no_progress() -> None:
    last = datetime(2026, 12, 2, 15, 48, 30, tzinfo=UTC)  # 11.5 minutes before NOW
    d = stalling(last_step=(800, last))
    assert (d.state, d.reason, d.link, d.since) == (S.RUNNING, R.NO_PROGRESS, Link.TRAINING, last)
    assert d.waitable is None  # running: it is not waiting for anything
    assert "No step for over 10m: the last, step 800, came at 2026-12-02 15:48:30Z." in (
        d.explanation
    )
    assert {m.link: m.state for m in d.chain}[Link.TRAINING] == ChainState.BLOCKING
    # A running job lists what troubles it, the stall alone here.
    assert [b.reason for b in d.blockers] == [R.NO_PROGRESS]


def test_steps_within_the_threshold_or_reported_again_are_training() -> None:
    assert stalling(last_step=(800, datetime(2026, 12, 2, 15, 51, tzinfo=UTC))).reason == (
        R.TRAINING
    )
    # The same stalled facts with a new step: back to training.
    assert stalling(last_step=(801, datetime(2026, 12, 2, 15, 59, tzinfo=UTC))).reason == (
        R.TRAINING
    )


def test_a_new_attempt_gets_its_own_threshold_from_its_training_report() -> None:
    # The last step came from attempt 1 an hour ago; this Pod began training at 15:55.
    old = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
    began = datetime(2026, 12, 2, 15, 55, tzinfo=UTC)
    assert stalling(last_step=(800, old), reported_phase=None).reason == R.TRAINING
    data = dump("running")
    pod = items(data, "Pod")[-1]["metadata"]["name"]
    fresh = run(
        data, reported_phase=(pod, "TRAINING", began), stall_after=600, last_step=(800, old)
    )
    assert fresh.reason == R.TRAINING
    # No step at all since training began 45 minutes ago.
    d = stalling()
    assert d.reason == R.NO_PROGRESS
    assert f"since Pod {pod} began training at 2026-12-02 15:15:00Z" in d.explanation


def test_silence_means_nothing_without_a_threshold_or_a_training_report() -> None:
    old = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
    assert stalling(last_step=(800, old), stall_after=None).reason == R.TRAINING
    # An image without kubetrain's runtime never reports: it trains, as far as we know.
    assert stalling(last_step=None, reported_phase=None).reason == R.TRAINING
    # Preflight has its own code; a report from an earlier Pod says nothing of this one.
    assert stalling(reported_phase=("x", "PREFLIGHT", old)).reason == R.TRAINING
    assert stalling(reported_phase=("kt-old-pod", "TRAINING", old)).reason == R.TRAINING


def test_a_stalled_job_is_cancelled_once_no_progress_for_its_cancel_after_stall() -> None:
    # No step since 15:48:30 with a 10m threshold: NO_PROGRESS from 15:58:30; NOW is 16:00.
    last = datetime(2026, 12, 2, 15, 48, 30, tzinfo=UTC)
    d = stalling(last_step=(800, last))
    assert (d.reason, d.since) == (R.NO_PROGRESS, last)

    def due(cancel_after: int | None, reason: R = d.reason) -> str | None:
        return cancel_for_no_progress(
            reason, d.since, stall_after=600, cancel_after_stall=cancel_after, now=NOW
        )

    assert due(60) == (
        "cancelled for no progress: NO_PROGRESS for over 1m (spec.cancelAfterStall), "
        "no step since 2026-12-02 15:48:30Z (stall threshold 10m)"
    )
    assert due(90) is None  # NO_PROGRESS for 90 s exactly: not over it yet
    assert due(120) is None
    assert due(None) is None  # the option unset: never cancelled for it
    assert due(60, R.TRAINING) is None  # reports came back


def test_no_cancel_for_no_progress_without_a_stall_threshold() -> None:
    long_ago = datetime(2026, 12, 1, tzinfo=UTC)
    assert (
        cancel_for_no_progress(
            R.NO_PROGRESS, long_ago, stall_after=None, cancel_after_stall=60, now=NOW
        )
        is None
    )


def test_an_attempt_is_bound_when_its_pod_scheduled_condition_turned_true() -> None:
    # GPU-seconds count from here (domain/usage.py).
    (attempt,) = run(dump("running")).attempts
    assert attempt.bound_at == datetime(2026, 12, 2, 15, 14, 40, tzinfo=UTC)
    assert attempt.to_json()["bound_at"] == "2026-12-02T15:14:40Z"
    # Never bound (the scheduler refused it): nothing held.
    assert all(a.bound_at is None for a in run(dump("insufficient-gpu")).attempts)


@pytest.mark.parametrize(
    "name", ["real-succeeded", "real-exit-nonzero", "real-oom-killed", "real-preflight-failed"]
)
def test_a_pod_whose_container_ended_before_its_phase_is_still_running(name: str) -> None:
    """A real kubelet writes the main container's terminated state about a second
    before the Pod's terminal phase (seen in every real-node run): the attempt that
    ran is finishing, and the job does not go back to the queue meanwhile."""
    data = dump(name)
    pod = items(data, "Pod")[-1]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]
    pod["status"]["phase"] = "Running"
    job = the_job(data)
    job["status"] = {
        "active": 1,
        "startTime": job["status"]["startTime"],
        "uncountedTerminatedPods": {},
    }
    d = run(data)
    assert (d.state, d.reason) == (S.RUNNING, R.TRAINING), (d.state, d.reason, d.explanation)


# -- a training job whose loss diverged ------------------------------------------------


def test_a_running_job_whose_last_loss_is_nan_is_loss_not_finite() -> None:
    at = datetime(2026, 12, 2, 15, 59, tzinfo=UTC)
    d = stalling(last_step=(2, at), non_finite_loss=(2, "loss", "NaN", at))
    assert (d.state, d.reason, d.link) == (S.RUNNING, R.LOSS_NOT_FINITE, Link.TRAINING)
    assert d.waitable is False  # the user's to act on: waiting will not mend it
    assert d.actor.value == "user"
    assert "Step 2 reported loss = NaN." in d.explanation
    assert d.since == at
    message = cancel_for_non_finite_loss(d, cancel=True)
    assert message == (
        "cancelled for a non-finite loss: Step 2 reported loss = NaN (spec.cancelOnNonFiniteLoss)"
    )
    assert cancel_for_non_finite_loss(d, cancel=False) is None


def test_a_diverged_loss_goes_before_a_stall_and_only_while_running() -> None:
    old = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)
    diverged = stalling(last_step=(9, old), non_finite_loss=(9, "train/loss", "Infinity", old))
    assert diverged.reason is R.LOSS_NOT_FINITE
    finished = run(dump("succeeded"), non_finite_loss=(9, "loss", "NaN", old))
    assert finished.reason is R.COMPLETED


def test_the_reason_change_to_loss_not_finite_is_a_webhook_event() -> None:
    found = event_types_for(
        "RUNNING",
        "RUNNING",
        "TRAINING",
        "LOSS_NOT_FINITE",
        waitable_before=None,
        waitable_now=False,
    )
    assert EventType.REASON_CHANGED in found
    assert EventType.NOT_WAITABLE in found


# -- a native sidecar that keeps failing (real-sidecar-restarting.json) ---------------


def _sidecar(data: dict[str, Any]) -> dict[str, Any]:
    pod = items(data, "Pod")[-1]
    status: dict[str, Any] = pod["status"]["initContainerStatuses"][0]
    return status


def test_a_sidecar_running_again_between_failures_stays_named() -> None:
    data = dump("real-sidecar-restarting")
    status = _sidecar(data)
    status["lastState"] = {"terminated": status["state"]["terminated"]}
    status["state"] = {"running": {"startedAt": "2026-12-06T03:30:30Z"}}
    status["restartCount"] = 3
    d = run(data)
    assert (d.state, d.reason) == (S.RUNNING, R.SIDECAR_RESTARTING)
    assert "Sidecar log-shipper restarted 3 times; last exit code 1 (Error)" in d.explanation


def test_a_sidecar_that_restarted_once_and_runs_again_leaves_the_job_training() -> None:
    data = dump("real-sidecar-restarting")
    status = _sidecar(data)
    status["lastState"] = {"terminated": status["state"]["terminated"]}
    status["state"] = {"running": {"startedAt": "2026-12-06T03:30:30Z"}}
    status["restartCount"] = 1
    d = run(data)
    assert (d.state, d.reason, d.blockers) == (S.RUNNING, R.TRAINING, ())


def test_a_stall_comes_before_a_restarting_sidecar() -> None:
    data = dump("real-sidecar-restarting")
    pod = items(data, "Pod")[-1]["metadata"]["name"]
    at = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
    job = facts(data, reported_phase=(pod, "TRAINING", at), last_step=(5, at), stall_after=60)
    d = diagnose(
        job, Snapshot.from_list(data).for_job(job.k8s_name, job.namespace), at.replace(hour=4)
    )
    assert d.reason is R.NO_PROGRESS
    assert [b.reason for b in d.blockers] == [R.NO_PROGRESS, R.SIDECAR_RESTARTING]
