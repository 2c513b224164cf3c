"""A gang on real kubelets: two workers, one per real node, a real torchrun between them.

kubetrain renders the Indexed Job, its headless Service and torchrun's PET_ environment;
each worker's `kubetrain run` preflight waits for rank 0 through cluster DNS (CoreDNS,
over the headless Service), then execs torchrun, whose static rendezvous and gloo
all-reduce go over the Pod network between the nodes. The all-reduce's sum can only be
right if both ranks' tensors crossed it.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from kubetrain.domain.manifest import LABEL_JOB_ID, MASTER_PORT, job_name
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import assert_valid_path, business_path, get
from tests.kube import eventually
from tests.realnode.test_real_pool import job, project, submit, wait_for

pytestmark = pytest.mark.realnode

# The user's training script: each rank contributes 10**rank, so the sum 11 holds both.
ALL_REDUCE = """\
import socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: torchrun's MASTER_ADDR, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
tensor = torch.tensor([10.0**rank])
dist.all_reduce(tensor)
print(f"rank {rank} of {world} on {socket.gethostname()}: all_reduce {tensor.item():g}", flush=True)
dist.destroy_process_group()
"""

# Each node has 2 cpu allocatable: two workers of 1.2 cpu cannot share one, so the
# scheduler must put one on each (kubetrain's spec has no anti-affinity).
WORKER = {"requests": {"cpu": "1200m", "memory": "1536Mi"}}


def _allocatable_cpu(kube: Client) -> list[str]:
    return [
        str(n.status.allocatable["cpu"])
        for n in kube.list(Node)
        if (n.metadata.labels or {}).get("type") == "real"
    ]


def test_two_workers_on_two_real_nodes_find_rank_0_by_dns_and_all_reduce(
    real_server: Server, real_kube: Client
):
    # The sizing above rests on this: neither node fits two workers.
    assert _allocatable_cpu(real_kube) == ["2", "2"]
    p = project()
    body = job(
        "gang",
        p,
        workers=2,
        resources=WORKER,
        env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        args=["torchrun", "--no-python", "python", "-c", ALL_REDUCE],
    )
    job_id = submit(real_server, body)
    name = job_name(job_id)

    # The Pods' addresses while they run: a finished Pod's status may drop them.
    pod_ips: dict[int, str] = {}

    def running() -> bool:
        with real_server.client() as http:
            doc = http.get(f"/api/v1/projects/{p}/jobs/{job_id}").json()
        for pod in real_kube.list(Pod, namespace=p, labels={LABEL_JOB_ID: job_id}):
            rank = int(pod.metadata.annotations["batch.kubernetes.io/job-completion-index"])
            if pod.status.podIP:
                pod_ips[rank] = pod.status.podIP
        return doc["business_status"] in ("RUNNING", "SUCCEEDED") and len(pod_ips) == 2

    eventually(running, 120, what="both workers to run, with their Pod IPs")
    done = wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED", timeout=180)
    assert done["exit_code"] == 0

    path = business_path(real_server, p, job_id)
    assert_valid_path(path)
    # RUNNING's reasons change (preflight, ranks meeting, training): one state all along.
    states = [state for state, _ in itertools.groupby(s for s, _ in path)]
    assert states == ["CREATED", "QUEUED", "RUNNING", "SUCCEEDED"], path
    # Once training, it stays so: rank 0 exits first (the others wait in torchrun's exit
    # barrier), which once read as RENDEZVOUS again.
    reasons = [reason for state, reason in path if state == "RUNNING"]
    assert "TRAINING" in reasons, path
    assert set(reasons[reasons.index("TRAINING") :]) == {"TRAINING"}, path

    attempts: list[dict[str, Any]] = get(real_server, p, job_id, "/attempts")["items"]
    assert sorted((a["attempt"], a["rank"]) for a in attempts) == [(1, 0), (1, 1)]
    nodes = {a["rank"]: a["node"] for a in attempts}
    assert sorted(nodes.values()) == ["real-0", "real-1"]  # one worker per real node
    assert all(a["exit_code"] == 0 for a in attempts), attempts

    master = f"{name}-0.{name}.{p}.svc"
    logs = {}
    for rank in (0, 1):
        out = real_server.cli("logs", job_id, "--project", p, "--worker", str(rank))
        assert out.returncode == 0, out.stderr
        logs[rank] = out.stdout
    # Rank 0 found its own name through CoreDNS, at its own Pod's address...
    resolved = re.search(
        rf"rendezvous-reachable passed \(.*\): rank 0 of 2: {re.escape(master)} "
        r"resolves to ([0-9.]+);",
        logs[0],
    )
    assert resolved, logs[0]
    assert resolved.group(1) == pod_ips[0]
    # ...and rank 1, on the other node, reached rank 0's port there.
    answered = re.search(
        rf"rendezvous-reachable passed \(.*\): rank 1 of 2: rank 0 at "
        rf"{re.escape(master)}:{MASTER_PORT} \(([0-9.]+)\) answered",
        logs[1],
    )
    assert answered, logs[1]
    assert answered.group(1) == pod_ips[0]
    assert pod_ips[0] != pod_ips[1]
    # 10**0 + 10**1 on both ranks: each got the other's tensor over the Pod network.
    for rank in (0, 1):
        assert f"rank {rank} of 2 on {name}-{rank}: all_reduce 11" in logs[rank], logs[rank]
