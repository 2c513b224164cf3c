"""One truth: for every recorded scenario the shared testbeds reproduce, live, the
diagnosis the server makes of the job (the syncer's input: the watch caches' snapshot)
equals what `kubetrain why` makes of a `kubectl get … -o json` dump of the same cluster
taken at the same moment; and so with the runtime's reports (kubetrain's record, which no dump
holds), given alike to both: none, every Pod in its preflight, every Pod training, the
first training and the others in their preflight.

"The same moment": the dump is taken between two readings of the caches that agree,
so the cluster did not change (as the server saw it) while the dump was taken.
Fields that legitimately differ: none so far; were one to, it would be named in
`DIFFERING` with the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube import Client, operators
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod

from kubetrain.cluster.cache import ClusterCache
from kubetrain.cluster.client import http_client, load_config
from kubetrain.domain.diagnosis import JobFacts, PodReport, diagnose
from kubetrain.domain.manifest import LABEL_JOB_ID
from kubetrain.domain.snapshot import Snapshot
from kubetrain.testbed.cluster import Testbed
from tests.fixtures.record import (
    LIVE_SCENARIOS,
    Scenario,
    clean_up,
    device_plugin_stopped,
    kueue_snapshot,
    reproduce,
    snapshot,
)
from tests.kube import eventually

pytestmark = pytest.mark.testbed

# Fields of the diagnosis JSON allowed to differ between the two, with the reason.
DIFFERING: dict[str, str] = {}
NOW = datetime(2030, 1, 1, tzinfo=UTC)  # one clock for both sides


def dump(kube: Client, ns: str, scenario: Scenario) -> dict[str, Any]:
    """What `why --kubeconfig` reads: the namespace's dump (with Kueue's objects for a
    queued scenario) and every bound Pod."""
    listing = kueue_snapshot(kube, ns) if scenario.queue else snapshot(kube, ns)
    seen = {i["metadata"]["uid"] for i in listing["items"] if i["kind"] == "Pod"}
    for pod in kube.list(Pod, namespace="*", fields={"spec.nodeName": operators.not_equal("")}):
        data: dict[str, Any] = pod.to_dict()
        if data["metadata"]["uid"] in seen or data["status"].get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        listing["items"].append({"apiVersion": "v1", "kind": "Pod", **data})
    return listing


def with_reports(facts: JobFacts, pods: list[str]) -> list[JobFacts]:
    """The job as the server knows it with what its Pods' runtime reported: nothing;
    every Pod in its preflight (naming a check); every Pod training; the first training
    and the others in their preflight (a gang's rank still waiting for rank 0)."""
    if not pods:
        return [facts]
    first, *rest = pods
    return [
        facts,
        replace(
            facts, pod_reports=tuple(PodReport(p, "PREFLIGHT", NOW, "gpu-visible") for p in pods)
        ),
        replace(
            facts,
            pod_reports=tuple(PodReport(p, "TRAINING", NOW) for p in pods),
            reported_phase=(pods[-1], "TRAINING", NOW),
        ),
        replace(
            facts,
            pod_reports=(
                PodReport(first, "TRAINING", NOW),
                *(PodReport(p, "PREFLIGHT", NOW, "rendezvous-reachable") for p in rest),
            ),
            reported_phase=(first, "TRAINING", NOW),
        ),
    ]


def answer(facts: JobFacts, snap: Snapshot) -> list[dict[str, Any]]:
    """The diagnosis of the job, with each set of runtime reports (pure: cheap)."""
    mine = snap.for_job(facts.k8s_name, facts.namespace)
    pods = sorted(
        str(p["metadata"]["name"])
        for p in mine.index.pods_by_job.get((facts.namespace, facts.k8s_name), [])
    )
    return [
        {k: v for k, v in diagnose(f, mine, NOW).to_json(f.name).items() if k not in DIFFERING}
        for f in with_reports(facts, pods)
    ]


@pytest.mark.parametrize("scenario", LIVE_SCENARIOS, ids=lambda s: s.name)
def test_the_server_and_a_dump_of_the_same_moment_say_the_same(
    scenario: Scenario, request: pytest.FixtureRequest
) -> None:
    bed: Testbed = request.getfixturevalue(
        "kueue_testbed"
        if scenario.queue is not None
        else {"default": "testbed", "no-gpu": "no_gpu_testbed", "real": "real_testbed"}[
            scenario.pool
        ]
    )
    kube = Client(config=KubeConfig.from_file(bed.kubeconfig), field_manager="one-truth")
    name = f"kt-{scenario.name}"
    job_ids = [f"fixture-{scenario.name}"]  # record.manifest's job-id label
    made: list[str] = []
    # The same scenario's Job from another module (its namespace still being torn down)
    # carries the same job id, and the server's cache follows one Job per id.
    eventually(
        lambda: not list(kube.list(Job, namespace="*", labels={LABEL_JOB_ID: job_ids[0]})),
        120,
        what=f"an earlier {name} to go",
    )

    async def compare() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        # The server watches while the scenario happens, as it would in a cluster.
        http = http_client(load_config(bed.kubeconfig))
        cache = ClusterCache(http)
        running = asyncio.create_task(cache.run())
        try:
            await cache.wait_synced(60)
            with device_plugin_stopped(bed, scenario):
                ns, _ = await asyncio.to_thread(reproduce, kube, scenario)
            made.append(ns)
            facts = JobFacts(name=name, k8s_name=name, namespace=ns, dispatched=True)
            differed: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
            for _ in range(20):
                before = answer(facts, cache.snapshot(job_ids))
                listing = await asyncio.to_thread(dump, kube, ns, scenario)
                from_dump = answer(facts, Snapshot.from_list(listing))
                # What the dump saw reaches the watches moments later: until the server
                # says the same, for at most 2 s (a real difference fails below).
                after = answer(facts, cache.snapshot(job_ids))
                for _ in range(40):
                    if after == from_dump:
                        break
                    await asyncio.sleep(0.05)
                    after = answer(facts, cache.snapshot(job_ids))
                if before == after == from_dump:
                    return after, from_dump
                if before == after:  # held still, and yet they differ: try another moment
                    differed = (after, from_dump)
            # A difference at every moment the cluster held still is a real one.
            if differed is not None:
                return differed
            raise AssertionError("the cluster never held still for one dump")
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await http.aclose()

    try:
        server, from_dump = asyncio.run(compare())
    finally:
        for ns in made:
            clean_up(kube, ns, scenario)
    assert server == from_dump
