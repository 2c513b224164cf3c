"""forecast() over every recorded scenario: the job's Job is taken out of the dump
(with its Pods, events and Workloads), forecast against the rest, and the forecast
must name what the job then met (the recorded diagnosis).

Scenarios whose reason comes from the job's own past (a lost node, a preemption)
or from a link the forecast does not play (the kubelet, PodSecurity, Pod affinity)
are listed with why; every other QUEUED scenario must agree.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubetrain.domain.forecast import Verdict, forecast
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.unit.diagnosis_helpers import NOW, SNAPSHOTS, dump, facts, items, recorded, the_job

pytestmark = pytest.mark.unit

R = ReasonCode

# Not forecastable before the job exists, by design (docs/api.md, "Dry run").
BEYOND = {
    "node-lost": "the job's own node was deleted under it",
    "kueue-preempted": "Kueue preempted the job after it ran",
    "kueue-pods-ready-timeout": "Kueue evicted the job when its Pods were not ready in time",
    "placement-rules": "Pod (anti-)affinity depends on other Pods' placement: not evaluated",
    "pod-security": "Namespace labels (PodSecurity) are not in the snapshot",
    "container-creating": "what the kubelet meets after binding",
    "real-config-error": "what the kubelet meets after binding",
    "real-crash-loop": "what the kubelet meets after binding",
    "real-image-pull-failed": "what the kubelet meets after binding",
    "real-mount-failed": "what the kubelet meets after binding",
    "real-mount-driver-missing": "what the kubelet meets after binding",
    "real-mount-local-path-missing": "what the kubelet meets after binding",
    "real-mount-missing-configmap": "what the kubelet meets after binding",
    "real-mount-missing-hostpath": "what the kubelet meets after binding",
    "real-mount-missing-projected": "what the kubelet meets after binding",
    "real-mount-multi-attach": "the attach/detach controller, after binding",
    "real-init-failed": "what the kubelet meets after binding",
}


def _without_job(data: dict[str, Any], k8s_name: str) -> dict[str, Any]:
    def mine(item: dict[str, Any]) -> bool:
        kind, meta = item.get("kind"), item.get("metadata", {})
        if kind == "Job":
            return bool(meta.get("name") == k8s_name)
        if kind in ("Pod", "Workload"):
            return any(o.get("name") == k8s_name for o in meta.get("ownerReferences", []))
        if kind == "Event":
            return str(item.get("involvedObject", {}).get("name", "")).startswith(k8s_name)
        return False

    return {**data, "items": [i for i in data["items"] if not mine(i)]}


def _queued_scenarios() -> list[str]:
    names = []
    for path in sorted(SNAPSHOTS.glob("*.json")):
        data = dump(path.stem)
        jobs = items(data, "Job")
        if not jobs or not [j for j in jobs if j["metadata"]["name"].startswith("kt-")]:
            continue
        if recorded(path.stem).state is BusinessState.QUEUED and path.stem not in BEYOND:
            names.append(path.stem)
    return names


def _forecast(name: str) -> Any:
    data = dump(name)
    job = the_job(data)
    fresh = copy.deepcopy(job)
    fresh.pop("status", None)
    rest = Snapshot.from_list(_without_job(data, job["metadata"]["name"]))
    return forecast(fresh, facts(data), rest, NOW)


@pytest.mark.parametrize("name", _queued_scenarios())
def test_the_forecast_names_what_the_recorded_job_met(name: str) -> None:
    met = recorded(name)
    predicted = _forecast(name)
    assert predicted.diagnosis.reason is met.reason
    expected = Verdict.NEVER_FITS if met.waitable is False else Verdict.WAITS
    assert predicted.verdict is expected
    assert predicted.diagnosis.waitable == met.waitable


def test_every_scenario_left_out_exists() -> None:
    assert all((SNAPSHOTS / f"{name}.json").exists() for name in BEYOND)


def test_a_job_that_fits_starts_now_with_a_node_per_worker() -> None:
    predicted = _forecast("container-creating")
    assert predicted.verdict is Verdict.STARTS_NOW
    assert [(p.rank, p.node) for p in predicted.placements] == [(0, "gpu-h100-0")]
    assert predicted.to_json("x")["placements"] == [{"rank": 0, "node": "gpu-h100-0"}]


def test_waits_names_who_holds_the_gpus_and_the_quota() -> None:
    gpus = _forecast("gpu-busy")
    assert gpus.verdict is Verdict.WAITS
    assert [(h.job, h.holds) for h in gpus.held_by] == [
        ("other-team-0", {"nvidia.com/gpu": "8"}),
        ("other-team-1", {"nvidia.com/gpu": "8"}),
    ]
    assert gpus.held_by_total == 2
    quota = _forecast("quota-busy")
    assert [h.job for h in quota.held_by] == ["other-team-0"]


def test_under_kueue_waits_says_the_position_and_the_admitted_jobs() -> None:
    predicted = _forecast("kueue-waiting")
    assert predicted.verdict is Verdict.WAITS
    assert predicted.queue == {"cluster_queue": "gpus", "position": 1, "ahead": []}
    assert [h.kubernetes_job for h in predicted.held_by] == ["first-in-line"]


def test_a_gang_that_can_never_be_placed_whole_never_fits() -> None:
    predicted = _forecast("gang-partial")
    assert predicted.verdict is Verdict.NEVER_FITS
    assert predicted.diagnosis.reason is R.INSUFFICIENT_GPU
    reasons = [b.reason for b in predicted.diagnosis.blockers]
    assert R.GANG_PARTIAL in reasons


def test_the_forecast_changes_nothing_it_is_given() -> None:
    data = dump("gpu-busy")
    job = copy.deepcopy(the_job(data))
    job.pop("status", None)
    before = copy.deepcopy(job)
    snapshot = Snapshot.from_list(_without_job(data, job["metadata"]["name"]))
    pods = len(snapshot.pods)
    forecast(job, facts(data), snapshot, NOW)
    assert job == before
    assert len(snapshot.pods) == pods
