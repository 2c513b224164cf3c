"""A gang's restart, decided from its failed Job (domain/diagnosis/gang.py): a disrupted worker
restarts the whole gang without using a retry, a failed one restarts it while retries remain,
and the job fails only then; meanwhile the job is QUEUED with the ended attempt's cause.

Variants of the recorded `gang-worker-failed` dump (rank 1 exited 1, the Job failed by its
podFailurePolicy), with the attempt label and retry annotations kubetrain's gang Jobs carry
and, for a disruption, the DisruptionTarget condition Pod GC writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubetrain.domain.diagnosis import Diagnosis, GangRestart
from kubetrain.domain.diagnosis.gang import next_attempt
from kubetrain.domain.diagnosis.reading import GangAttempt
from kubetrain.domain.manifest import (
    ANNOTATION_RESTART,
    ANNOTATION_RETRIES,
    ANNOTATION_RETRIES_USED,
    IN_PLACE,
    LABEL_ATTEMPT,
)
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.unit.diagnosis_helpers import dump, items, run, the_job

pytestmark = pytest.mark.unit

R, S = ReasonCode, BusinessState


def gang(attempt: int = 1, retries: int = 0, used: int = 0) -> GangAttempt:
    return GangAttempt(attempt, retries, used, "uid-1")


def test_a_disruption_restarts_the_gang_without_counting():
    assert next_attempt(gang(1, retries=0), disrupted=True) == GangRestart(2, False, 0, "uid-1")
    # Even with every retry used: a lost node is not the job's fault.
    assert next_attempt(gang(4, 2, 2), disrupted=True) == GangRestart(5, False, 2, "uid-1")


def test_a_failure_restarts_the_gang_while_retries_remain_and_counts_one():
    assert next_attempt(gang(1, 2, 0), disrupted=False) == GangRestart(2, True, 1, "uid-1")
    assert next_attempt(gang(3, 2, 1), disrupted=False) == GangRestart(4, True, 2, "uid-1")
    assert next_attempt(gang(4, 2, 2), disrupted=False) is None
    assert next_attempt(gang(1, 0, 0), disrupted=False) is None


def failed_gang(attempt: int = 1, retries: int = 1, used: int = 0) -> dict[str, Any]:
    data = dump("gang-worker-failed")
    job = the_job(data)
    job["metadata"]["labels"][LABEL_ATTEMPT] = str(attempt)
    job["metadata"].setdefault("annotations", {}).update(
        {ANNOTATION_RETRIES: str(retries), ANNOTATION_RETRIES_USED: str(used)}
    )
    return data


def rank_pod(data: dict[str, Any], rank: int) -> dict[str, Any]:
    name = the_job(data)["metadata"]["name"]
    (pod,) = [p for p in items(data, "Pod") if p["metadata"]["name"].startswith(f"{name}-{rank}-")]
    return pod


def test_a_failed_worker_with_a_retry_left_queues_the_gang_for_attempt_2():
    data = failed_gang(retries=1)
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.EXIT_NONZERO, True)
    assert d.restart == GangRestart(2, True, 1, the_job(data)["metadata"]["uid"])
    assert "Retrying: attempt 2 of the whole gang starts (1 of 1 retries used)" in d.explanation
    assert "rank 1 (Pod " in d.explanation  # the ended attempt's cause, rank by rank
    assert d.raw_message == "NCCL error: unhandled system error"
    assert d.to_json("g")["restart"] == {"attempt": 2, "counted": True, "retries_used": 1}
    # Every Pod of the ended attempt is attempt 1, one per rank.
    assert sorted((a.number, a.rank) for a in d.attempts) == [(1, 0), (1, 1)]


def test_a_failed_worker_with_no_retry_left_fails_the_gang():
    d = run(failed_gang(attempt=2, retries=1, used=1))
    assert (d.state, d.reason, d.restart) == (S.FAILED, R.EXIT_NONZERO, None)
    assert sorted((a.number, a.rank) for a in d.attempts) == [(2, 0), (2, 1)]


@pytest.mark.parametrize("reason", ["DeletionByPodGC", "PreemptionByScheduler"])
def test_a_disrupted_worker_restarts_the_gang_without_a_retry(reason: str):
    data = failed_gang(retries=0)
    rank_pod(data, 1)["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": "disrupted",
            "lastTransitionTime": "2026-12-04T22:12:55Z",
        }
    )
    d = run(data)
    assert d.state is S.QUEUED
    assert d.reason in (R.NODE_LOST, R.PREEMPTED)
    assert d.restart is not None
    assert (d.restart.attempt, d.restart.counted, d.restart.retries_used) == (2, False, 0)
    assert "(a disruption, not counted against retries)" in d.explanation


def preflight_failed(data: dict[str, Any], rank: int) -> None:
    """Rank `rank` ended as the real preflight ends where no GPU is visible (exit 86, the
    termination message naming the check), and the Job's podFailurePolicy names it."""
    pod = rank_pod(data, rank)
    (status,) = pod["status"]["containerStatuses"]
    status["state"]["terminated"].update(
        exitCode=86,
        reason="Error",
        message="preflight failed: gpu-visible: expected 8 GPUs, found 0",
    )
    job = the_job(data)
    for condition in job["status"]["conditions"]:
        if condition["reason"] == "PodFailurePolicy":
            condition["message"] = (
                f"Container trainer for pod {pod['metadata']['namespace']}/"
                f"{pod['metadata']['name']} failed with exit code 86 matching FailJob rule "
                "at index 1"
            )


def test_a_failed_preflight_of_any_rank_fails_the_gang_at_once_without_a_retry():
    # retries: 2 left, as in the issue: none is spent on what would fail the same way.
    data = failed_gang(retries=2)
    preflight_failed(data, 1)
    d = run(data)
    assert (d.state, d.reason, d.restart) == (S.FAILED, R.PREFLIGHT_FAILED, None)
    # The rank and the check named.
    assert "Rank 1 (Pod " in d.explanation
    assert "preflight failed: gpu-visible: expected 8 GPUs, found 0" in d.explanation


def test_a_failed_preflight_read_from_the_jobs_message_when_the_pod_is_gone():
    data = failed_gang(retries=2)
    preflight_failed(data, 1)
    name = rank_pod(data, 1)["metadata"]["name"]
    data["items"] = [o for o in data["items"] if o["metadata"].get("name") != name]
    d = run(data)
    assert (d.state, d.reason, d.restart) == (S.FAILED, R.PREFLIGHT_FAILED, None)


def test_every_class_of_the_gang_failure_table_has_its_action():
    from kubetrain.domain.failures import GangAction, gang_action

    assert gang_action(R.PREFLIGHT_FAILED, "trainer") is GangAction.FAIL
    for reason in (R.NODE_LOST, R.PREEMPTED, R.EVICTED):
        assert gang_action(reason, "trainer") is GangAction.RESTART
    for other in (R.EXIT_NONZERO, R.OOM_KILLED, None):
        assert gang_action(other, "trainer") is GangAction.RETRY


def test_a_gang_job_kubetrain_does_not_restart_fails_as_recorded():
    # As recorded: no attempt label (another's Indexed Job, or one from before restarts).
    d: Diagnosis = run(dump("gang-worker-failed"))
    assert (d.state, d.reason, d.restart) == (S.FAILED, R.EXIT_NONZERO, None)


def test_a_cancelled_gang_is_not_restarted():
    d = run(failed_gang(retries=1), cancel_requested=True)
    assert (d.state, d.restart) == (S.FAILED, None)


def in_place_gang(attempt: int = 1, retries: int = 1, used: int = 0) -> dict[str, Any]:
    """The failed gang as a gang restarted in place sees it the moment rank 1 ended: its
    Job lives on (the trainer's failure counted short of the limit, no Failed condition),
    and carries the in-place mark; every Pod is of the Job's attempt."""
    data = failed_gang(attempt, retries, used)
    job = the_job(data)
    job["metadata"]["annotations"][ANNOTATION_RESTART] = IN_PLACE
    job["status"]["conditions"] = [
        c
        for c in job["status"].get("conditions", [])
        if c["type"] not in ("Failed", "FailureTarget")
    ]
    for pod in items(data, "Pod"):
        pod["metadata"].setdefault("labels", {})[LABEL_ATTEMPT] = str(attempt)
    return data


def test_a_gang_restarted_in_place_restarts_on_its_failed_rank_while_its_job_lives():
    data = in_place_gang(retries=1)
    d = run(data)
    assert (d.state, d.reason, d.waitable) == (S.QUEUED, R.EXIT_NONZERO, True)
    # The same Job (its uid) is the one to restart: suspended and resumed, not replaced.
    assert d.restart == GangRestart(2, True, 1, the_job(data)["metadata"]["uid"])
    assert "Retrying: attempt 2 of the whole gang starts (1 of 1 retries used)" in d.explanation
    assert "rank 1 (Pod " in d.explanation


def test_a_gang_restarted_in_place_with_no_retry_left_fails():
    d = run(in_place_gang(attempt=2, retries=1, used=1))
    assert (d.state, d.reason, d.restart) == (S.FAILED, R.EXIT_NONZERO, None)


def test_a_gang_restarted_in_place_reads_its_current_attempts_pods_only():
    # Resumed as attempt 2: attempt 1's Pods, failed, are still the Job's, and are history.
    data = in_place_gang(retries=1)
    the_job(data)["metadata"]["labels"][LABEL_ATTEMPT] = "2"
    d = run(data)
    assert d.restart is None
    assert d.state is S.QUEUED
    assert d.reason is not R.EXIT_NONZERO
