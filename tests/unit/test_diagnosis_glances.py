"""What the diagnosis keeps of each Pod it read (`glance_of`): one reading per version
of a Pod, never a stale one, and let go with the Pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubetrain.domain.diagnosis import diagnose, reading
from kubetrain.domain.diagnosis.reading import forget_pods, glance_of, kept_glances
from kubetrain.domain.snapshot import Snapshot
from tests.unit.diagnosis_helpers import NOW, dump, facts, items

pytestmark = pytest.mark.unit


def _pod(name: str = "gang-running") -> dict[str, Any]:
    return items(dump(name), "Pod")[0]


def test_a_pod_version_is_read_once_and_a_new_version_anew() -> None:
    pod = _pod()
    first = glance_of(pod)
    assert glance_of(pod) is first
    # The same version as another dict around the same objects (the cache's `_typed`).
    assert glance_of({"kind": "Pod", **pod}) is first
    # A watch delivers a new version as new objects: read again, whatever it says.
    newer = copy.deepcopy(pod)
    newer["status"]["phase"] = "Failed"
    read = glance_of(newer)
    assert read is not first
    assert read.phase == "Failed"
    # Only the new status object is new (same metadata and spec): read again too.
    edited = {**newer, "status": {**newer["status"], "phase": "Succeeded"}}
    assert glance_of(edited).phase == "Succeeded"


def test_forget_pods_lets_go_of_a_pod_and_what_is_kept_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = _pod()
    uid = pod["metadata"]["uid"]
    glance_of(pod)
    assert uid in reading._glances
    forget_pods([uid])
    assert uid not in reading._glances
    monkeypatch.setattr(reading, "_KEPT_GLANCES", 8)
    forget_pods(list(reading._glances))
    for n in range(20):
        glance_of({**pod, "metadata": {**pod["metadata"], "uid": f"uid-{n}"}})
        assert kept_glances() <= 8
    assert "uid-19" in reading._glances  # the newest are kept
    forget_pods(list(reading._glances))


def _diagnosed(data: dict[str, Any]) -> dict[str, Any]:
    job = facts(data)
    snap = Snapshot.from_list(data)
    return diagnose(job, snap.for_job(job.k8s_name, job.namespace), NOW).to_json(job.name)


@pytest.mark.parametrize("how", ["new Pod object", "new status object"])
def test_a_gang_diagnosed_again_after_one_rank_changed_reads_that_rank_anew(how: str) -> None:
    data = dump("gang-running")
    before = _diagnosed(data)
    assert _diagnosed(data) == before  # read again from what was kept: the same
    pods = items(data, "Pod")
    rank = pods[-1]
    status = copy.deepcopy(rank["status"])
    status["phase"] = "Failed"
    (main,) = [s for s in status["containerStatuses"] if s["name"] == "trainer"]
    started = main["state"]["running"]["startedAt"]
    main["state"] = {
        "terminated": {
            "exitCode": 3,
            "reason": "Error",
            "startedAt": started,
            "finishedAt": started,
        }
    }
    if how == "new Pod object":
        data["items"][data["items"].index(rank)] = {**copy.deepcopy(rank), "status": status}
    else:
        rank["status"] = status  # the same Pod dict, its status replaced
    after = _diagnosed(data)
    forget_pods([p["metadata"]["uid"] for p in pods])
    fresh = _diagnosed(data)  # nothing kept: every Pod read afresh
    assert after == fresh
    assert after != before
    assert any(a["exit_code"] == 3 for a in after["attempts"])


def test_ranks_without_the_annotation_are_read_from_each_pods_own_name() -> None:
    data = dump("gang-running")
    for pod in items(data, "Pod"):
        del pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    attempts = _diagnosed(data)["attempts"]
    assert len(attempts) == 2
    for row in attempts:
        assert row["pod"].startswith(f"kt-gang-running-{row['rank']}-")
    assert {row["rank"] for row in attempts} == {0, 1}
