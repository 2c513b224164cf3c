"""A gang's failures on real kubelets, where a Pod told to stop takes its grace period:

* a gang whose GPUs are not there fails its preflight on every rank: the job is
  FAILED/PREFLIGHT_FAILED after one attempt, no retry spent, though `retries: 2`
  would allow two more (each taking every GPU of the gang again);
* a gang whose rank 1 fails once ends SUCCEEDED on attempt 2, and no Pod of attempt 2
  is ever alive alongside one of attempt 1 (sampled all along): attempt 1's rank 0
  ignores SIGTERM, as a rank stuck in a collective does, and lingers for seconds after
  its Job failed; attempt 2's Job is made only once it has ended.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from kubetrain.domain.manifest import LABEL_ATTEMPT, LABEL_JOB_ID, MASTER_PORT
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import get
from tests.realnode.test_real_pool import job, project, submit, wait_for

pytestmark = pytest.mark.realnode

SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}}

# Attempt 1: rank 1 fails after a moment; rank 0 ignores SIGTERM and lingers. Attempt 2:
# both exit 0. Rank 0 listens on the rendezvous port, so rank 1's preflight passes.
FAILS_ONCE = f"""\
import os, signal, socket, sys, time
attempt, rank = os.environ["KUBETRAIN_ATTEMPT"], int(os.environ["PET_NODE_RANK"])
if rank == 0:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", {MASTER_PORT}))
    listener.listen()
print(f"attempt {{attempt}} rank {{rank}} runs", flush=True)
if attempt == "1":
    if rank == 1:
        time.sleep(3)
        sys.exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(15)
time.sleep(2)
"""


def test_a_gang_whose_gpus_are_not_there_fails_after_one_attempt_with_no_retry_spent(
    real_server: Server,
):
    p = project()
    body = job(
        "no-gpus",
        p,
        workers=2,
        retries=2,
        resources={**SMALL, "gpus": 1},
        args=["python", "-c", "print('training')"],
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "PREFLIGHT_FAILED", timeout=120)
    assert (done["attempt"], done["retries_used"]) == (1, 0)
    attempts = get(real_server, p, job_id, "/attempts")["items"]
    assert {a["attempt"] for a in attempts} == {1}
    diagnosis = get(real_server, p, job_id, "/diagnosis")
    # The rank and the check named.
    assert re.search(
        r"Rank [01] \(Pod [^)]+\) failed first: preflight failed: gpu-visible",
        diagnosis["explanation"],
    ), diagnosis["explanation"]


def _alive_attempts(kube: Client, namespace: str, job_id: str) -> set[str]:
    """The attempts of the job's Pods that have not ended."""
    return {
        (pod.metadata.labels or {}).get(LABEL_ATTEMPT, "?")
        for pod in kube.list(Pod, namespace=namespace, labels={LABEL_JOB_ID: job_id})
        if pod.metadata is not None
        and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))
    }


def test_a_gang_whose_rank_1_fails_once_succeeds_on_attempt_2_never_beside_attempt_1(
    real_server: Server, real_kube: Client
):
    p = project()
    body = job("fails-once", p, workers=2, retries=1, resources=SMALL)
    body["spec"]["args"] = ["python", "-c", FAILS_ONCE]
    job_id = submit(real_server, body)
    samples: list[set[str]] = []
    state: dict[str, Any] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        samples.append(_alive_attempts(real_kube, p, job_id))
        with real_server.client() as http:
            state = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
        if state["business_status"] in ("SUCCEEDED", "FAILED"):
            break
        time.sleep(0.2)
    assert (state["business_status"], state["reason"]) == ("SUCCEEDED", "COMPLETED"), state
    assert (state["attempt"], state["retries_used"]) == (2, 1)
    # Both attempts were seen alive, never together.
    assert any("1" in s for s in samples)
    assert any("2" in s for s in samples)
    overlapping = [s for s in samples if len(s) > 1]
    assert not overlapping, overlapping
    rows = get(real_server, p, job_id, "/history")["items"]
    (waited,) = [r for r in rows if r["raw_reason"] == "PreviousAttemptEnded"]
    assert waited["attempt"] == 1
    # It waited for the lingering rank 0 of attempt 1.
    assert waited["detail"]["pods"], waited
    assert any("-0-" in pod for pod in waited["detail"]["pods"]), waited
