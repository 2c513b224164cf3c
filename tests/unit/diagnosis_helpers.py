"""Loading recorded fixtures and diagnosing their Job, for the diagnosis tests."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from kubetrain.domain.diagnosis import Diagnosis, JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
# After every recording: "since" and event ages are measured from here.
NOW = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)


@cache
def _raw(name: str) -> str:
    return (SNAPSHOTS / f"{name}.json").read_text()


def dump(name: str) -> dict[str, Any]:
    """A fresh copy of a recorded dump, safe to change in a test."""
    data: dict[str, Any] = json.loads(_raw(name))
    return data


def items(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in data["items"] if isinstance(i, dict) and i.get("kind") == kind]


def the_job(data: dict[str, Any]) -> dict[str, Any]:
    jobs = items(data, "Job")
    if len(jobs) > 1:
        # Kueue's scenarios hold other Jobs of the queue too; the fixture's own is kt-<name>.
        jobs = [j for j in jobs if j["metadata"]["name"].startswith("kt-")]
    assert len(jobs) == 1
    return jobs[0]


def facts(data: dict[str, Any], **overrides: Any) -> JobFacts:
    if items(data, "Job"):
        job = the_job(data)
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    else:
        # Deleted behind our back: the Job's name and namespace, from its events.
        ((namespace, name),) = {
            (e["involvedObject"]["namespace"], e["involvedObject"]["name"])
            for e in items(data, "Event")
            if e["involvedObject"]["kind"] == "Job"
        }
    values: dict[str, Any] = {
        "name": name,
        "k8s_name": name,
        "namespace": namespace,
        "dispatched": True,
    }
    values.update(overrides)
    return JobFacts(**values)


def run(
    data: dict[str, Any], job: JobFacts | None = None, now: datetime = NOW, **overrides: Any
) -> Diagnosis:
    job = job or facts(data, **overrides)
    snapshot = Snapshot.from_list(copy.deepcopy(data))
    return diagnose(job, snapshot.for_job(job.k8s_name, job.namespace), now)


def recorded(name: str) -> Diagnosis:
    return run(dump(name))


def recorded_kueue_message(name: str) -> str:
    """The QuotaReserved message on the fixture's own Workload (Kueue v0.17)."""
    (workload,) = [
        w
        for w in items(dump(name), "Workload")
        if any(o["name"] == f"kt-{name}" for o in w["metadata"].get("ownerReferences", []))
    ]
    (reserved,) = [c for c in workload["status"]["conditions"] if c["type"] == "QuotaReserved"]
    message: str = reserved["message"]
    return message
